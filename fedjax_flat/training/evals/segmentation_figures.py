"""config.segmentation.predictions: predictions.png (test images, true and predicted masks of the reported
model; training/seg_figures.py) for a segmentation run whose evaluator gives predictions."""
import os

from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.training import seg_figures
from fedjax_flat.training.evals.registry import Evaluation, register


def _applies(plan) -> bool:
  return (isinstance(plan.task, seg_tasks.Segmentation) and bool(plan.config.segmentation.predictions)
          and hasattr(plan.evaluator, 'predictions'))


def _final(trainer, summary, reported):
  del summary
  if not (trainer.workdir and trainer.recorder.writer):
    return
  c = trainer.config
  params = trainer.algorithm.eval_models(trainer.server_state)[reported][0]
  seg_figures.write_predictions(os.path.join(trainer.workdir, 'predictions.png'),
                                trainer.plan.evaluator.predictions(params, c.segmentation.predictions),
                                trainer.data.num_classes, title=f'{trainer.algorithm.label} ({reported} model)')


register(Evaluation('segmentation_figures', order=90, applies=_applies, final=_final))
