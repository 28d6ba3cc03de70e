"""Client drift and update sparsity of one round: how far, how aligned and how sparse the clients' updates are.

An update is Delta_k = w_k - w, client k's local model minus the model it started from (the broadcast global model),
flattened (`jax.flatten_util.ravel_pytree` order). The aggregate is the weighted mean Delta = sum_k p_k Delta_k,
p_k = n_k / sum n (FedAvg's weights; uniform when no weights are given). Per client: the drift ||Delta_k|| and
the cosine of Delta_k with Delta (0 where either is zero: no direction); over the cohort their mean / max / min.
Sparsity: the fraction of Delta_k's entries with |Delta_k,i| <= threshold * max_i |Delta_k,i| (relative to the
update's own largest entry, so it is scale-free: 0 for a dense update, near 1 when a few coordinates carry it; an
all-zero update counts as fully sparse). Pure jnp functions of arrays, jittable.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree


def flat_updates(start_params, client_params: Sequence) -> jax.Array:
  """[K, dim] float32: the rows ravel(w_k) - ravel(w) for each client's params w_k and the start params w."""
  w = ravel_pytree(start_params)[0].astype(jnp.float32)
  return jnp.stack([ravel_pytree(p)[0].astype(jnp.float32) - w for p in client_params])


def _weights(k: int, weights) -> jax.Array:
  if weights is None:
    return jnp.full((k,), 1.0 / k, jnp.float32)
  w = jnp.asarray(weights, jnp.float32)
  return w / jnp.maximum(jnp.sum(w), 1e-30)


def _cos(a, b):
  na, nb = jnp.linalg.norm(a, axis=-1), jnp.linalg.norm(b, axis=-1)
  ok = (na > 0) & (nb > 0)
  return jnp.where(ok, jnp.sum(a * b, axis=-1) / jnp.where(ok, na * nb, 1.0), 0.0)


def update_drift(deltas, weights: Optional[jax.Array] = None) -> Dict[str, jax.Array]:
  """Drift of the updates `deltas` [K, dim] with aggregation weights [K] (None: uniform).

  Returns {'norms' [K]: ||Delta_k||, 'cosines' [K]: cos(Delta_k, Delta), 'aggregate' [dim]: Delta,
  'aggregate_norm', 'norm_mean', 'norm_max', 'cos_mean', 'cos_min'} (means unweighted over the cohort)."""
  d = jnp.asarray(deltas, jnp.float32)
  agg = _weights(d.shape[0], weights) @ d
  norms, cos = jnp.linalg.norm(d, axis=1), _cos(d, agg[None])
  return {'norms': norms, 'cosines': cos, 'aggregate': agg, 'aggregate_norm': jnp.linalg.norm(agg),
          'norm_mean': jnp.mean(norms), 'norm_max': jnp.max(norms), 'cos_mean': jnp.mean(cos),
          'cos_min': jnp.min(cos)}


def update_sparsity(deltas, threshold: float = 1e-3) -> jax.Array:
  """[K]: the fraction of each update's entries with |x| <= threshold * max |x| of that update."""
  d = jnp.abs(jnp.asarray(deltas, jnp.float32))
  return jnp.mean(d <= threshold * jnp.max(d, axis=-1, keepdims=True), axis=-1)
