"""Rounds to 70 / 90% of a centralized run's accuracy (config.centralized: config/centralized.py)."""
from fedjax_flat.config import centralized
from fedjax_flat.training.evals.registry import Evaluation, register


def _final(trainer, summary, reported):
  summary.update(centralized.rounds_to_centralized(trainer.records, trainer.config, reported))


register(Evaluation('centralized_reference', order=10, applies=lambda p: True, final=_final))
