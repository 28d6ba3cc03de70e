"""Personal models: what an algorithm makes of (server state, client k's persistent state) for client k.

An algorithm with a personal model (FedSoup's patched model, FedBN's local normalization) registers a
*personalizer* under its name; every other algorithm's personal model is the global one (FedAvg, FedProx, ...).
Server wrappers ('+swa', '+wima') leave the client state alone, so a name is looked up by its longest
registered '+'-prefix. Evaluation (evaluation/personalized.py) and the analysis tools ask `personal_params`.
"""
from __future__ import annotations

from typing import Optional

from fedjax_flat.registry import Registry

# name -> fn(algorithm, server_state, client_state or None) -> params of the client's personal model.
PERSONALIZERS = Registry('personalizer')


def register_personalizer(name: str, fn) -> None:
  PERSONALIZERS.register(name)(fn)


def global_params(algorithm, server_state):
  return algorithm.eval_models(server_state)['global'][0]


def personal_params(algorithm, server_state, client_state):
  """Client's personalized model. Lookup by algorithm name, else by its base name before the first '+'
  (server wrappers such as '+swa' leave the client state alone), else the global model."""
  name = personalizer_name(algorithm.name)
  if name is None:
    return global_params(algorithm, server_state)
  return PERSONALIZERS.get(name)(algorithm, server_state, client_state)


def personalizer_name(name: str) -> Optional[str]:
  """The longest '+'-prefix of `name` with a registered personalizer ('fedsoup+localnorm+swa' ->
  'fedsoup+localnorm'), or None."""
  parts = name.split('+')
  for i in range(len(parts), 0, -1):
    if '+'.join(parts[:i]) in PERSONALIZERS:
      return '+'.join(parts[:i])
  return None
