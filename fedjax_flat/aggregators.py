"""Cohort-level aggregators: pure, jit-able reductions of a round's stacked uploads (`ff.aggregators`).

Every aggregator takes the round's uploads stacked over the clients, a pytree with leaves [C, ...], their weights
[C] (the engine's client weights: N_k, 1 or min(N_k, cap); 0 for padding clients) and a validity mask [C] (False
for padding clients and clients that did not report), and returns one pytree shaped like a single upload. Masked
clients are never counted, whatever their values (NaN included). The number of valid clients n is traced, so one
compiled program serves every round.

  mean(u, w, mask)                              sum_k w_k u_k / sum_k w_k            (the streaming mean's value)
  median(u, w, mask)                            coordinate-wise median of the valid clients (Yin et al. 2018;
                                                unweighted; even n: the mean of the two middle values)
  trimmed_mean(u, w, mask, trim_fraction)       coordinate-wise: drop the k = floor(trim_fraction n) smallest and
                                                largest values, average the rest (unweighted; Yin et al. 2018)
  krum(u, w, mask, f)                           the upload with the smallest score: the sum of squared distances
                                                to its n - f - 2 nearest other uploads (Blanchard et al. 2017)
  multi_krum(u, w, mask, f, m=0)                the plain mean of the m best-scored uploads (m = 0: n - f)
  geometric_median(u, w, mask, iters, eps)      the w-weighted geometric median by smoothed Weiszfeld iterations
                                                (RFA, Pillutla et al. 2022): z <- sum b_k u_k / sum b_k with
                                                b_k = w_k / max(eps, ||z - u_k||), from the weighted mean, `iters`
                                                fixed iterations
  bulyan(u, w, mask, f)                         Bulyan (El Mhamdi et al. 2018): theta = n - 2f uploads chosen by
                                                Krum applied recursively (each pick removed, Krum re-scored on
                                                the rest), then coordinate-wise the mean of the beta = theta - 2f
                                                chosen values closest to their median (unweighted; n >= 4f + 3)
  centered_clipping(u, w, mask, center, tau, iters)
                                                centered clipping (Karimireddy et al. 2021): from v = center,
                                                `iters` times v <- v + (1/n) sum_k (u_k - v) min(1, tau /
                                                ||u_k - v||) (unweighted: each client moves v by at most tau / n)
  norm_bounding(u, w, mask, bound)              norm bounding (Sun et al. 2019): each upload scaled to norm at
                                                most M = bound (u_k / max(1, ||u_k|| / M)), then the w-weighted
                                                mean
  rebasin(u, w, mask, reference, iters)         Git Re-Basin weight matching (Ainsworth et al. 2023): each valid
                                                upload, a model, permuted to align with `reference`, then the
                                                w-weighted mean (fedjax_flat/merging.py; the robust wrapper
                                                hands it the client models, global - delta)

Distances and norms (Krum, Bulyan, geometric median, centered clipping, norm bounding) are over the whole upload
tree flattened. Krum's neighbour count is
max(n - f - 2, 1) when fewer than the planned clients report (the config check asks n > 2 f + 2 of the planned
cohort); Bulyan keeps theta = max(n - 2f, 1) and beta = max(theta - 2f, 1) likewise (the check asks n >= 4f + 3).
Ties are broken by the lower client index (the round's client order), so the result does not depend
on how the cohort was split over devices. `AGGREGATORS` maps config.server.aggregator to the function;
docs/aggregation.md has the memory they cost against the streaming mean.
"""
from __future__ import annotations

from typing import Callable, Dict

import jax
import jax.numpy as jnp

from fedjax_flat import merging

__all__ = ['mean', 'median', 'trimmed_mean', 'krum', 'multi_krum', 'geometric_median', 'bulyan', 'centered_clipping',
           'norm_bounding', 'rebasin', 'AGGREGATORS']


def _leaves(uploads):
  return jax.tree_util.tree_leaves(uploads)


def _count(mask):
  return jnp.sum(mask.astype(jnp.int32))


def _bcast(v, x):
  """[C] -> [C, 1, ..., 1] against x [C, ...]."""
  return v.reshape(v.shape + (1,) * (x.ndim - 1))


def _weighted_mean(uploads, coef):
  """sum_k coef_k u_k / sum_k coef_k (coef already 0 for masked clients; masked values never enter)."""
  total = jnp.maximum(jnp.sum(coef), jnp.finfo(jnp.float32).tiny)

  def one(x):
    c = _bcast(coef, x).astype(x.dtype)
    s = jnp.sum(jnp.where(_bcast(coef, x) > 0, c * x, jnp.zeros((), x.dtype)), axis=0)
    return (s / total.astype(x.dtype)).astype(x.dtype)
  return jax.tree_util.tree_map(one, uploads)


def mean(uploads, weights, mask):
  """The weighted mean of the valid uploads (weights w_k; masked clients count 0)."""
  coef = jnp.where(mask, weights.astype(jnp.float32), 0.0)
  return _weighted_mean(uploads, coef)


def _sorted_valid(x, mask):
  """x [C, ...] sorted along the clients with every masked entry moved past the valid ones (+inf)."""
  big = jnp.array(jnp.inf, x.dtype)
  return jnp.sort(jnp.where(_bcast(mask, x), x, big), axis=0)


def median(uploads, weights, mask):
  """Coordinate-wise median of the valid uploads (unweighted: `weights` is not read)."""
  del weights
  n = _count(mask)
  lo, hi = jnp.maximum(n - 1, 0) // 2, n // 2

  def one(x):
    s = _sorted_valid(x, mask)
    a = jax.lax.dynamic_index_in_dim(s, lo, axis=0, keepdims=False)
    b = jax.lax.dynamic_index_in_dim(s, jnp.maximum(hi, lo), axis=0, keepdims=False)
    out = (a + b) / jnp.array(2, x.dtype)
    return jnp.where(n > 0, out, jnp.zeros_like(out))
  return jax.tree_util.tree_map(one, uploads)


def trimmed_mean(uploads, weights, mask, trim_fraction: float = 0.1):
  """Coordinate-wise trimmed mean: the k = floor(trim_fraction * n) smallest and largest values of each coordinate
  dropped, the remaining n - 2k averaged (unweighted: `weights` is not read). trim_fraction in [0, 0.5)."""
  del weights
  n = _count(mask)
  k = jnp.floor(jnp.asarray(trim_fraction, jnp.float32) * n.astype(jnp.float32)).astype(jnp.int32)
  k = jnp.minimum(k, jnp.maximum(n - 1, 0) // 2)     # at least one value kept
  kept = jnp.maximum(n - 2 * k, 1)

  def one(x):
    s = _sorted_valid(x, mask)
    pos = jnp.arange(x.shape[0])
    keep = _bcast((pos >= k) & (pos < n - k), s)
    total = jnp.sum(jnp.where(keep, s, jnp.zeros((), x.dtype)), axis=0)
    return (total / kept.astype(x.dtype)).astype(x.dtype)
  return jax.tree_util.tree_map(one, uploads)


def _flat(uploads):
  """[C, P] float32: each client's upload tree flattened."""
  c = _leaves(uploads)[0].shape[0]
  return jnp.concatenate([x.reshape(c, -1).astype(jnp.float32) for x in _leaves(uploads)], axis=1)


def pairwise_sq_distances(uploads):
  """[C, C] squared Euclidean distances between the flattened uploads, row by row (no |a|^2 + |b|^2 - 2ab
  cancellation; memory O(C P), not O(C^2 P))."""
  v = _flat(uploads)
  return jax.lax.map(lambda row: jnp.sum(jnp.square(v - row[None]), axis=1), v)


def krum_scores(uploads, mask, f: int):
  """[C] Krum scores (+inf for masked clients): the sum of a client's max(n - f - 2, 1) smallest squared distances
  to the other valid clients."""
  return _krum_scores_from(pairwise_sq_distances(uploads), mask, f)


def _krum_scores_from(d, mask, f):
  """Krum scores from the [C, C] squared distances, over the clients in `mask` (n = their count)."""
  c = mask.shape[0]
  n = _count(mask)
  other = mask[None, :] & mask[:, None] & ~jnp.eye(c, dtype=bool)
  d = jnp.sort(jnp.where(other, d, jnp.inf), axis=1)
  near = jnp.maximum(n - jnp.int32(f) - 2, 1)
  take = jnp.arange(c)[None, :] < near
  scores = jnp.sum(jnp.where(take & jnp.isfinite(d), d, 0.0), axis=1)
  return jnp.where(mask, scores, jnp.inf)


def _select(uploads, chosen):
  """The plain mean of the uploads where chosen [C] is True (never a masked one)."""
  return _weighted_mean(uploads, chosen.astype(jnp.float32))


def krum(uploads, weights, mask, f: int = 0):
  """Krum (Blanchard et al. 2017): the valid upload with the smallest score (`weights` is not read)."""
  del weights
  scores = krum_scores(uploads, mask, f)
  best = jnp.argmin(scores)                      # the first (lowest index) among equal scores
  chosen = (jnp.arange(mask.shape[0]) == best) & mask
  return _select(uploads, chosen)


def multi_krum(uploads, weights, mask, f: int = 0, m: int = 0):
  """Multi-Krum: the plain mean of the m valid uploads with the smallest Krum scores (m = 0: n - f; at most n)."""
  del weights
  c = mask.shape[0]
  n = _count(mask)
  scores = krum_scores(uploads, mask, f)
  m_eff = jnp.where(jnp.int32(m) > 0, jnp.int32(m), n - jnp.int32(f))
  m_eff = jnp.clip(m_eff, 1, jnp.maximum(n, 1))
  order = jnp.argsort(scores, stable=True)       # ties: the lower client index first
  rank = jnp.zeros((c,), jnp.int32).at[order].set(jnp.arange(c, dtype=jnp.int32))
  chosen = (rank < m_eff) & mask
  return _select(uploads, chosen)


def geometric_median(uploads, weights, mask, iters: int = 8, eps: float = 1e-6):
  """The weights-weighted geometric median of the valid uploads by `iters` smoothed Weiszfeld steps (RFA)."""
  alpha = jnp.where(mask, weights.astype(jnp.float32), 0.0)
  alpha = alpha / jnp.maximum(jnp.sum(alpha), jnp.finfo(jnp.float32).tiny)
  z0 = _weighted_mean(uploads, alpha)

  def step(_, z):
    diff = jax.tree_util.tree_map(lambda x, m: jnp.where(_bcast(mask, x), x - m[None], 0).astype(jnp.float32),
                                  uploads, z)
    dist = jnp.sqrt(sum(jnp.sum(jnp.square(d.reshape(d.shape[0], -1)), axis=1) for d in _leaves(diff)))
    beta = jnp.where(mask, alpha / jnp.maximum(jnp.float32(eps), dist), 0.0)
    return _weighted_mean(uploads, beta)
  return jax.lax.fori_loop(0, int(iters), step, z0)


def _median_of(x, mask):
  """Coordinate-wise median of one leaf x [C, ...] over the rows in mask (even count: the two middles' mean)."""
  n = _count(mask)
  lo, hi = jnp.maximum(n - 1, 0) // 2, n // 2
  s = _sorted_valid(x, mask)
  a = jax.lax.dynamic_index_in_dim(s, lo, axis=0, keepdims=False)
  b = jax.lax.dynamic_index_in_dim(s, jnp.maximum(hi, lo), axis=0, keepdims=False)
  return (a + b) / jnp.array(2, x.dtype)


def bulyan_selection(uploads, mask, f: int):
  """[C] bool: the theta = max(n - 2f, 1) uploads Bulyan's recursive Krum chooses (El Mhamdi et al. 2018, Alg. 1:
  each round Krum, scored over the remaining set, picks one upload, which leaves the set)."""
  c = mask.shape[0]
  theta = jnp.maximum(_count(mask) - 2 * jnp.int32(f), 1)
  d = pairwise_sq_distances(uploads)       # once: the recursion only shrinks the set

  def pick(i, carry):
    remaining, chosen = carry
    best = jnp.argmin(_krum_scores_from(d, remaining, f))   # the lowest index among equal scores
    take = (jnp.arange(c) == best) & remaining & (i < theta)
    return remaining & ~take, chosen | take
  _, chosen = jax.lax.fori_loop(0, c, pick, (mask, jnp.zeros_like(mask)))
  return chosen


def bulyan(uploads, weights, mask, f: int = 0):
  """Bulyan (El Mhamdi et al. 2018): recursive Krum chooses theta = n - 2f uploads; each coordinate is the mean of
  the beta = theta - 2f chosen values closest to the chosen values' median (`weights` is not read)."""
  del weights
  chosen = bulyan_selection(uploads, mask, f)
  theta = _count(chosen)
  beta = jnp.maximum(theta - 2 * jnp.int32(f), 1)

  def one(x):
    med = _median_of(x, chosen)
    dist = jnp.where(_bcast(chosen, x), jnp.abs(x - med[None]), jnp.inf)
    order = jnp.argsort(dist, axis=0, stable=True)          # ties: the lower client index first
    near = jnp.take_along_axis(jnp.where(_bcast(chosen, x), x, jnp.zeros((), x.dtype)), order, axis=0)
    keep = _bcast(jnp.arange(x.shape[0]) < beta, x)
    total = jnp.sum(jnp.where(keep, near, jnp.zeros((), x.dtype)), axis=0)
    return (total / beta.astype(x.dtype)).astype(x.dtype)
  return jax.tree_util.tree_map(one, uploads)


def _row_norms(tree):
  """[C] Euclidean norms of the flattened rows of a [C, ...] tree (float32)."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.reshape(x.shape[0], -1).astype(jnp.float32)), axis=1)
                      for x in _leaves(tree)))


def centered_clipping(uploads, weights, mask, center=None, tau: float = 1.0, iters: int = 1):
  """Centered clipping (Karimireddy et al. 2021, Alg. 2): v <- v + (1/n) sum_k (u_k - v) min(1, tau / ||u_k - v||),
  `iters` times from v = `center` (the previous round's aggregate; None: zero). `weights` is not read: each valid
  client moves v by at most tau / n, which is what bounds a Byzantine client's pull."""
  del weights
  if center is None:
    center = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape[1:], x.dtype), uploads)
  n = jnp.maximum(_count(mask), 1).astype(jnp.float32)

  def step(_, v):
    diff = jax.tree_util.tree_map(lambda x, m: jnp.where(_bcast(mask, x), x - m[None], 0).astype(jnp.float32),
                                  uploads, v)
    dist = _row_norms(diff)
    scale = jnp.where(mask, jnp.minimum(1.0, jnp.float32(tau) / jnp.maximum(dist, jnp.finfo(jnp.float32).tiny)),
                      0.0) / n
    return jax.tree_util.tree_map(lambda m, dx: (m + jnp.tensordot(scale, dx, axes=1)).astype(m.dtype), v, diff)
  return jax.lax.fori_loop(0, int(iters), step, center)


def norm_bounding(uploads, weights, mask, bound: float = 1.0):
  """Norm bounding (Sun et al. 2019): every valid upload scaled to norm at most `bound`, u_k / max(1, ||u_k|| /
  bound), then their weights-weighted mean."""
  zeroed = jax.tree_util.tree_map(lambda x: jnp.where(_bcast(mask, x), x, jnp.zeros((), x.dtype)), uploads)
  shrink = 1.0 / jnp.maximum(1.0, _row_norms(zeroed) / jnp.float32(bound))
  clipped = jax.tree_util.tree_map(lambda x: (x * _bcast(shrink, x).astype(x.dtype)), zeroed)
  return mean(clipped, weights, mask)


def rebasin(uploads, weights, mask, reference, iters: int = 3):
  """Git Re-Basin merge: the valid uploads (models, not deltas) aligned to `reference` by `iters` sweeps of
  weight matching, then their weights-weighted mean (fedjax_flat/merging.rebasin_merge)."""
  return merging.rebasin_merge(uploads, weights, mask, reference, iters)


def _from_config(server) -> Dict[str, Callable]:
  """config.server -> {name: fn(uploads, weights, mask)} with the section's parameters bound."""
  return {
      'mean': mean,
      'median': median,
      'trimmed_mean': lambda u, w, m: trimmed_mean(u, w, m, float(server.trim_fraction)),
      'krum': lambda u, w, m: krum(u, w, m, int(server.krum_f)),
      'multi_krum': lambda u, w, m: multi_krum(u, w, m, int(server.krum_f), int(server.krum_m)),
      'geometric_median': lambda u, w, m: geometric_median(u, w, m, int(server.gm_iters), float(server.gm_eps)),
      'bulyan': lambda u, w, m: bulyan(u, w, m, int(server.krum_f)),
      'norm_bounding': lambda u, w, m: norm_bounding(u, w, m, float(server.norm_bound)),
  }


AGGREGATORS = ('mean', 'median', 'trimmed_mean', 'krum', 'multi_krum', 'geometric_median', 'bulyan',
               'centered_clipping', 'norm_bounding', 'rebasin')
# Aggregators that merge the client models (global - delta) against the global model as their reference.
MODEL_MERGES = ('rebasin',)
# Aggregators that read the previous round's aggregate (kept in the server state by algorithms/wrappers/robust.py).
STATEFUL = ('centered_clipping',)


def from_config(server) -> Callable:
  """The aggregator config.server.aggregator names, its parameters (trim_fraction, krum_f, krum_m, gm_iters,
  gm_eps, norm_bound; cc_tau, cc_iters; rebasin_iters) bound: fn(uploads [C, ...], weights [C], mask [C]) -> one
  upload; a STATEFUL one takes the previous aggregate too: fn(uploads, weights, mask, center); a MODEL_MERGES one
  the reference model: fn(models, weights, mask, reference)."""
  name = str(server.aggregator)
  if name == 'rebasin':
    return lambda u, w, m, ref: rebasin(u, w, m, ref, int(server.get('rebasin_iters', 3)))
  if name == 'centered_clipping':
    return lambda u, w, m, c: centered_clipping(u, w, m, c, float(server.cc_tau), int(server.cc_iters))
  return _from_config(server)[name]
