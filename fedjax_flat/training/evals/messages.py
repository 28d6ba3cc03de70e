"""summary.json `messages`: the message counters an algorithm keeps in its server state (scalars named
`messages_*`: H-FL's two tiers)."""
import jax
import numpy as np

from fedjax_flat.training.evals.registry import Evaluation, register


def _counters(state) -> dict:
  if not isinstance(state, dict):
    return {}
  return {k: float(np.asarray(jax.device_get(v))) for k, v in state.items()
          if k.startswith('messages_') and np.ndim(v) == 0}


def _final(trainer, summary, reported):
  msgs = _counters(trainer.server_state)
  if msgs:
    summary['messages'] = msgs


register(Evaluation('messages', order=30, applies=lambda t: True, final=_final))
