"""Personal models: what an algorithm makes of (server state, client k's persistent state) for client k.

An algorithm with a personal model (FedSoup's patched model, FedFomo's, local normalization) carries a
`Personalizer` (core/contract.py); every other algorithm's personal model is the global one (FedAvg, FedProx,
...). Server wrappers (SWA, WiMA) leave the client state alone and pass the personalizer through; local
normalization wraps the inner one. Evaluation (evaluation/personalized.py) and the analysis tools ask
`personal_params`.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_flat.core.contract import Personalizer

__all__ = ['Personalizer', 'global_params', 'if_seen', 'personal_params', 'personalizer_name']


def if_seen(seen, personal, fallback):
  """`personal` where the flag `seen` > 0, else `fallback` (leaf by leaf, a selection: the bits of one or the
  other). Traceable, so a personalizer that uses it maps over stacked client states."""
  return jax.tree_util.tree_map(lambda a, b: jnp.where(jnp.asarray(seen) > 0, a, b), personal, fallback)


def global_params(algorithm, server_state):
  return algorithm.eval_models(server_state)['global'][0]


def personal_params(algorithm, server_state, client_state):
  """Client's personalized model: the algorithm's personalizer, else the global model."""
  if algorithm.personalizer is None:
    return global_params(algorithm, server_state)
  return algorithm.personalizer.fn(algorithm, server_state, client_state)


def personalizer_name(algorithm) -> Optional[str]:
  """The name of the algorithm's personal model ('fedsoup', 'fedsoup+localnorm', 'fedbn'), or None (global)."""
  return None if algorithm.personalizer is None else algorithm.personalizer.name
