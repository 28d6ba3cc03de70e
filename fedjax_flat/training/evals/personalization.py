"""config.personalized: every protocol of evaluation/personalized.py on the clients' personal models, + fine-tuning
(training/personalized_eval.py) -> summary.json `personalized` and personalized.png."""
import os

from fedjax_flat.training import personalized_eval, writers
from fedjax_flat.training.evals.registry import Evaluation, register


def _applies(plan) -> bool:
  pc = plan.config.get('personalized')
  return pc is not None and bool(pc.enabled)


def _final(trainer, summary, reported):
  del reported
  summary['personalized'] = res = personalized_eval.evaluate_trainer(trainer)
  if trainer.workdir and trainer.recorder.writer and isinstance(res, dict):
    writers.plot_personalized(res, os.path.join(trainer.workdir, 'personalized.png'),
                              title=f'{trainer.algorithm.label} on {trainer.plan.dataset_name}')


register(Evaluation('personalized', order=60, applies=_applies, final=_final))
