"""summary.json `validation`: the best validation round's test numbers (retrieval's `val_*` metrics:
training/writers.select_by_validation); nothing when no record has validation metrics."""
from fedjax_flat.training import writers
from fedjax_flat.training.evals.registry import Evaluation, register


def _final(trainer, summary, reported):
  selected = writers.select_by_validation(trainer.records, reported)
  if selected:
    summary['validation'] = selected


register(Evaluation('validation', order=20, applies=lambda p: True, final=_final))
