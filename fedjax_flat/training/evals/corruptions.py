"""config.corruption_eval: the reported model on CIFAR-10-C / 100-C (evaluation/corruption.py) -> summary.json
`corruptions` (its files are located when the trainer is built)."""
from fedjax_flat.evaluation.corruption import evaluate_corruptions
from fedjax_flat.evaluation.evaluator import fixed_batch_size
from fedjax_flat.training.evals.registry import Evaluation, register


def _applies(plan) -> bool:
  ce = plan.config.get('corruption_eval')
  return ce is not None and bool(ce.name)


def _final(trainer, summary, reported):
  c = trainer.config
  params = trainer.algorithm.eval_models(trainer.server_state)[reported][0]
  summary['corruptions'] = evaluate_corruptions(
      trainer.model, params, c.corruption_eval, trainer.plan.eval_transform, fixed_batch_size(c.eval_batch_size),
      trainer.workdir if (trainer.workdir and trainer.recorder.writer) else None)
  summary['corruptions']['model'] = reported


register(Evaluation('corruptions', order=70, applies=_applies, final=_final))
