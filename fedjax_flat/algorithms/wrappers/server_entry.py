"""A feature that keeps its own entry in the server state: `with_server_entry(alg, key, ...)`.

Compression, DP, SWA, WiMA and the stateful aggregators wrap any algorithm whose server state is a dict and add
one entry, `state[key]`, that the wrapped algorithm never sees. This file writes that bookkeeping once: the
wrapper gives what it does with its entry, over (the inner state, its entry), and gets the algorithm's
`server_init`, `broadcast`, `server_update`, `eval_models` and `counters` back with the entry split off and put
back. An `init` that returns None keeps no entry (the feature is stateless in this run), and the state is then
the inner algorithm's own, unchanged.

  init(inner_state, params, rng) -> entry | None
  broadcast(inner_state, entry, round_idx, phase) -> bcast            default: the inner algorithm's
  server_update(inner_state, entry, agg, round_idx, phase) -> (inner_state, entry)
                                                                       default: the inner update, entry kept
  eval_models(inner_state, entry) -> models                            default: the inner algorithm's
"""
from __future__ import annotations

from typing import Callable, Optional

from fedjax_flat.core.contract import FederatedAlgorithm


def split(state, key: str):
  """(the inner algorithm's state, the feature's entry or None)."""
  if isinstance(state, dict) and key in state:
    return {k: v for k, v in state.items() if k != key}, state[key]
  return state, None


def join(inner, entry, key: str):
  """The inner state with the feature's entry put back (none when the feature keeps no entry)."""
  return inner if entry is None else {**inner, key: entry}


def with_server_entry(alg: FederatedAlgorithm, key: str, *, init: Callable,
                      broadcast: Optional[Callable] = None, server_update: Optional[Callable] = None,
                      eval_models: Optional[Callable] = None, **replace) -> FederatedAlgorithm:
  """`alg` with the server-side functions above; `replace` sets the other fields (the client side, wrappers)."""

  def server_init(params, rng):
    inner = alg.server_init(params, rng)
    entry = init(inner, params, rng)
    if entry is None:
      return inner
    if not isinstance(inner, dict) or key in inner:
      raise TypeError(f'{key!r} needs a dict server state without a {key!r} key, got {type(inner)}')
    return {**inner, key: entry}

  def bcast(state, round_idx, phase=0):
    inner, entry = split(state, key)
    if broadcast is None:
      return alg.broadcast(inner, round_idx, phase)
    return broadcast(inner, entry, round_idx, phase)

  def update(state, agg, round_idx, phase=0):
    inner, entry = split(state, key)
    if server_update is None:
      return join(alg.server_update(inner, agg, round_idx, phase), entry, key)
    return join(*server_update(inner, entry, agg, round_idx, phase), key)

  def models(state):
    inner, entry = split(state, key)
    return alg.eval_models(inner) if eval_models is None else eval_models(inner, entry)

  counters = None if alg.counters is None else (lambda state: alg.counters(split(state, key)[0]))
  return alg.replace(server_init=server_init, broadcast=bcast, server_update=update, eval_models=models,
                     counters=counters, **replace)
