"""summary.json `messages`: the message counters an algorithm declares (`FederatedAlgorithm.counters`: H-FL's
two tiers)."""
import jax
import numpy as np

from fedjax_flat.training.evals.registry import Evaluation, register


def _final(trainer, summary, reported):
  del reported
  summary['messages'] = {k: float(np.asarray(jax.device_get(v)))
                         for k, v in trainer.algorithm.counters(trainer.server_state).items()}


register(Evaluation('messages', order=30, applies=lambda p: p.algorithm.counters is not None, final=_final))
