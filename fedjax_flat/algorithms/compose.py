"""Composition helpers: a new algorithm as a small change of an existing one.

  map_upload(alg, fn)        every client's upload passes through fn(bcast, upload) -> upload before the server
                             reduces it (clipping, compression, noise: what a client sends, not how it trains)
  clip_by_global_norm(t, c)  t * min(1, c / ||t||_2): the L2 projection of a pytree onto the ball of radius c

`upload` is client_final's out: {'weighted': pytree, 'uniform': pytree} (core/contract.py); the engine then
takes the example-weighted mean of 'weighted' and the plain mean of 'uniform' over the round's clients.
Everything stays a pure function inside the round program: `fn` sees one client's traced values (the engine
vmaps or scans it over the clients), so it must not convert them to Python numbers.
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from fedjax_flat.algorithms.common import global_norm
from fedjax_flat.core.contract import FederatedAlgorithm


def clip_by_global_norm(tree, max_norm):
  """The pytree scaled to L2 norm at most `max_norm` (unchanged inside the ball; a zero tree stays zero)."""
  norm = global_norm(tree)
  scale = jnp.minimum(1.0, max_norm / jnp.maximum(norm, jnp.finfo(jnp.float32).tiny))
  return jax.tree_util.tree_map(lambda x: (x * scale).astype(x.dtype), tree)


def map_upload(alg: FederatedAlgorithm, fn: Callable, name: Optional[str] = None) -> FederatedAlgorithm:
  """`alg` whose clients send fn(bcast, out) instead of out (client_final's upload); the client state it
  keeps is unchanged. `name`: the built algorithm's name (default: alg's)."""
  def client_final(bcast, local, client_state, **kw):
    out, client_state = alg.client_final(bcast, local, client_state, **kw)
    return fn(bcast, out), client_state
  return alg.replace(client_final=client_final, name=name or alg.name)
