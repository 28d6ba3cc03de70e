"""Visual place recognition as retrieval (FedVPR, thesis 6.3): triplet loss with in-step hard mining, Recall@K.

The model maps an image to an L2-normalised descriptor; it accepts any leading axes (models/vpr.py), so a
training example can be a whole tuple of images.

Training example = one query and its candidates, all from the client's own database (data/sources/vpr_*):
  x [B, T, H, W, 3]   slot 0 the query, then positive candidates, then negative candidates, then empty slots
  y [B, T] int        slot kinds: QUERY, POSITIVE (within 10 m of the query), NEGATIVE (beyond 25 m), EMPTY
  model output        descriptors [B, T, D]
The negative candidates of a tuple are drawn afresh from its pool each time the round's batches are built
(data/vpr_places.py: the client's database beyond 25 m; how this compares with the reference's cache refresh).
Mining (the reference's "partial" mining, done at every step with the current model, as data): the positive
is the candidate nearest to the query in descriptor space, the negatives are the `num_negatives` nearest
negative candidates (the hardest); the choice is `argmin` / `top_k` under `stop_gradient`, so the indices
are values inside the compiled step, never Python control flow.
Two passes (`cache_pass=True`, the default; `training_inputs`): the descriptors of all T slots come from a
forward pass without gradient in evaluation mode (the reference's cache, computed with model.eval()), the
mined slots (query, positive, n negatives) are gathered from the batch's images, and only those 2 + n images
go through the forward and backward pass of the loss: the same loss and gradient as mining inside one pass
with gradient over all T slots (`cache_pass=False`) for a model without batch statistics, at (T - 2 - n) / T
less backward work. The loss over the selected triplets is PyTorch's `TripletMarginLoss(margin=0.1, p=2)`:
  l(q, p, n) = max(||q - p||_2 - ||q - n||_2 + margin, 0)
averaged over the valid triplets (a valid query with >= 1 positive candidate, times min(#negative
candidates, num_negatives)): the reference's sum over the batch's triplets divided by their number.

Test-set evaluation (evaluation/retrieval.py): queries and database images of the server's test cities,
y [N, 3] float = (easting, northing, role) with role QUERY_ROLE = 1 / DATABASE_ROLE = 0. Each query's K
nearest database descriptors (exact Euclidean nearest neighbours, computed on the device in blocks of the
database, `nearest`); a query is a hit at K when one of them lies within `threshold` metres (25 m) of it.
`recall_sums` gives additive hit counts per block of queries; Recall@K = hits / queries.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

import jax
import jax.numpy as jnp

from fedjax_flat.tasks.base import Classification, register
from fedjax_flat.schema import Field, Flag, Int, Num, Section

EMPTY, QUERY, POSITIVE, NEGATIVE = 0, 1, 2, 3
DATABASE_ROLE, QUERY_ROLE = 0.0, 1.0


def pair_distances(q, d):
  """Euclidean distances [..., Nq, Nd] between descriptors q [..., Nq, D] and d [..., Nd, D] (float32)."""
  q = q.astype(jnp.float32)
  d = d.astype(jnp.float32)
  sq = (jnp.sum(q * q, -1)[..., :, None] + jnp.sum(d * d, -1)[..., None, :]
        - 2.0 * jnp.einsum('...qd,...nd->...qn', q, d))
  return jnp.sqrt(jnp.maximum(sq, 0.0))


def _norm(v):
  # sqrt with a floor: the gradient of ||0|| would be NaN (an identical positive, an all-zero padding slot).
  return jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(v), -1), 1e-12))


@register('retrieval')
@dataclasses.dataclass(frozen=True)
class Retrieval(Classification):
  """Triplet training on (query, positive, negatives) tuples and Recall@K evaluation (module docstring)."""
  name: str = 'retrieval'
  margin: float = 0.1
  num_negatives: int = 5          # hardest negatives per query (the reference's negs_num_per_query)
  threshold: float = 25.0         # metres: a retrieved database image within it is a correct match
  recall_ks: Tuple[int, ...] = (1, 5, 10)
  cache_pass: bool = True         # mine from a gradient-free pass; train on the mined slots only

  @property
  def accuracy_name(self) -> str:
    """eval_metrics' 'accuracy' is Recall@(smallest K): the headline metric (tasks/base.metric_names)."""
    return f'R@{min(self.recall_ks)}'

  @property
  def headline(self):
    return ('accuracy', self.accuracy_name)

  # -- training on tuples --------------------------------------------------------------------------------

  def mine(self, desc, kinds):
    """(positive slot [B], negative slots [B, n], negative slot valid [B, n]) chosen from the descriptors
    [B, T, D] (gradient-free): the nearest positive candidate and the n nearest negative candidates."""
    desc = jax.lax.stop_gradient(desc).astype(jnp.float32)
    dist = _norm(desc[:, :1, :] - desc)                          # [B, T] query to every slot
    inf = jnp.float32(jnp.inf)
    pos = jnp.argmin(jnp.where(kinds == POSITIVE, dist, inf), axis=1)
    n = min(self.num_negatives, kinds.shape[1])
    neg_score, neg = jax.lax.top_k(jnp.where(kinds == NEGATIVE, -dist, -inf), n)
    return pos, neg, neg_score > -inf

  def select(self, desc, kinds):
    """(slots [B, 2 + n], their kinds): the query, the mined positive and the n mined negatives of every tuple
    (an unmined slot's kind is EMPTY). The tuple of these slots mines the same triplets again."""
    pos, neg, neg_ok = self.mine(desc, kinds)
    has_pos = jnp.any(kinds == POSITIVE, axis=1)
    slots = jnp.concatenate([jnp.zeros_like(pos)[:, None], pos[:, None], neg.astype(pos.dtype)], axis=1)
    k = jnp.concatenate([jnp.full(pos.shape + (1,), QUERY), jnp.where(has_pos, POSITIVE, EMPTY)[:, None],
                         jnp.where(neg_ok, NEGATIVE, EMPTY)], axis=1)
    return slots, k.astype(kinds.dtype)

  def training_inputs(self, forward, x, labels, mask):
    """With cache_pass: the mined slots' images [B, 2 + n, ...] and kinds (module docstring), from the
    descriptors of `forward` (gradient-free); else the whole tuples."""
    del mask
    if not self.cache_pass:
      return x, labels
    slots, kinds = self.select(forward(x), labels)
    return jnp.take_along_axis(x, slots.reshape(slots.shape + (1,) * (x.ndim - 2)), axis=1), kinds

  def triplet_terms(self, desc, kinds, mask):
    """(per-triplet losses [B, n], weights [B, n]) after mining."""
    pos, neg, neg_ok = self.mine(desc, kinds)
    q = desc[:, 0, :].astype(jnp.float32)
    p = jnp.take_along_axis(desc, pos[:, None, None], axis=1)[:, 0, :].astype(jnp.float32)
    ns = jnp.take_along_axis(desc, neg[:, :, None], axis=1).astype(jnp.float32)      # [B, n, D]
    has_pos = jnp.any(kinds == POSITIVE, axis=1)
    w = (neg_ok & has_pos[:, None] & (mask[:, None] > 0)).astype(jnp.float32)
    loss = jnp.maximum(_norm(q - p)[:, None] - _norm(q[:, None, :] - ns) + self.margin, 0.0)
    return loss, w

  def unit_losses(self, logits, labels, mask):
    return self.triplet_terms(logits, labels, mask)

  def unit_count(self, labels, mask):
    """Valid triplets: valid queries with a positive candidate x min(#negative candidates, num_negatives)."""
    has_pos = jnp.any(labels == POSITIVE, axis=1)
    negs = jnp.minimum(jnp.sum(labels == NEGATIVE, axis=1), self.num_negatives)
    return jnp.sum(jnp.where(has_pos & (mask > 0), negs, 0).astype(jnp.float32))

  def eval_sums(self, logits, labels, mask) -> Dict[str, jax.Array]:
    """On training tuples (a client's own data): the triplet loss and the fraction of mined triplets already
    ordered (d(q, p) < d(q, n)) as 'accuracy'."""
    loss, w = self.triplet_terms(logits, labels, mask)
    ordered = (loss < self.margin).astype(jnp.float32)        # loss < margin <=> d(q,p) < d(q,n)
    valid = w > 0
    return {'loss_sum': jnp.sum(jnp.where(valid, loss * w, 0.0)),
            'correct': jnp.sum(jnp.where(valid, ordered, 0.0)), 'count': jnp.sum(w)}

  # -- evaluation: nearest neighbours and Recall@K ----------------------------------------------------------

  def nearest(self, q_desc, db_desc, db_valid, k: int, block: int, q_pos=None, db_pos=None):
    """Exact k nearest database rows of every query: (distances [Nq, k] ascending, indices [Nq, k]), and
    with positions also the descriptor distance of each query's nearest database image within `threshold`
    metres and beyond it ([Nq] each, inf when there is none).

    The database [Nd, D] is scanned in blocks of `block` rows (Nd a multiple of it: pad with db_valid = 0),
    each block's candidates merged with the running k best, so memory is [Nq, block + k], not [Nq, Nd].
    """
    nq = q_desc.shape[0]
    nd = db_desc.shape[0]
    if nd % block:
      raise ValueError(f'{nd} database rows are not a multiple of block={block}: pad them (db_valid = 0)')
    k = min(k, nd)
    geo = q_pos is not None
    if not geo:
      q_pos, db_pos = jnp.zeros((nq, 2), jnp.float32), jnp.zeros((nd, 2), jnp.float32)
    blocks = (db_desc.reshape(nd // block, block, -1), db_valid.reshape(nd // block, block),
              jnp.arange(nd, dtype=jnp.int32).reshape(nd // block, block), db_pos.reshape(nd // block, block, 2))
    inf = jnp.float32(jnp.inf)

    def body(carry, blk):
      best_d, best_i, near, far = carry
      d_desc, d_ok, d_idx, d_pos = blk
      ok = d_ok[None, :] > 0
      dist = jnp.where(ok, pair_distances(q_desc, d_desc), inf)
      cand_d = jnp.concatenate([best_d, dist], axis=1)
      cand_i = jnp.concatenate([best_i, jnp.broadcast_to(d_idx, (nq, block))], axis=1)
      neg, pos = jax.lax.top_k(-cand_d, k)
      gps = pair_distances(q_pos, d_pos)
      near = jnp.minimum(near, jnp.min(jnp.where(gps <= self.threshold, dist, inf), axis=1))
      far = jnp.minimum(far, jnp.min(jnp.where(gps > self.threshold, dist, inf), axis=1))
      return (-neg, jnp.take_along_axis(cand_i, pos, axis=1), near, far), None

    init = (jnp.full((nq, k), inf), jnp.full((nq, k), -1, jnp.int32), jnp.full((nq,), inf), jnp.full((nq,), inf))
    (dist, idx, near, far), _ = jax.lax.scan(body, init, blocks)
    return (dist, idx, near, far) if geo else (dist, idx)

  def recall_sums(self, q_desc, q_pos, q_valid, db_desc, db_pos, db_valid, block: int):
    """Additive statistics of one block of queries: {'hits@K' (int32) for each K, 'queries' (int32),
    'loss_sum', 'loss_count'}; the loss is the triplet loss of the nearest database image within `threshold`
    against the nearest one beyond it (over the queries that have both): how far the whole database is from
    ranking this query right."""
    q_pos = q_pos.astype(jnp.float32)
    db_pos = db_pos.astype(jnp.float32)
    dist, idx, near, far = self.nearest(q_desc, db_desc, db_valid, max(self.recall_ks), block, q_pos, db_pos)
    found = jnp.isfinite(dist)
    where = db_pos[jnp.maximum(idx, 0)]                                       # [Nq, k, 2]
    gps = jnp.sqrt(jnp.sum(jnp.square(where - q_pos[:, None, :]), -1))
    close = found & (gps <= self.threshold)
    ok = q_valid > 0
    both = ok & jnp.isfinite(near) & jnp.isfinite(far)
    trip = jnp.where(both, jnp.maximum(near - far + self.margin, 0.0), 0.0)
    out = {'queries': jnp.sum(ok, dtype=jnp.int32), 'loss_sum': jnp.sum(trip),
           'loss_count': jnp.sum(both, dtype=jnp.int32)}
    for k in self.recall_ks:
      out[f'hits@{k}'] = jnp.sum(ok & jnp.any(close[:, :k], axis=1), dtype=jnp.int32)
    return out

  def recall_metrics(self, sums) -> Dict[str, jax.Array]:
    n = jnp.maximum(jnp.asarray(sums['queries'], jnp.float32), 1.0)
    out = {f'recall@{k}': jnp.asarray(sums[f'hits@{k}'], jnp.float32) / n for k in self.recall_ks}
    out['accuracy'] = out[f'recall@{min(self.recall_ks)}']      # the headline metric: R@1
    out['loss'] = jnp.asarray(sums['loss_sum'], jnp.float32) / jnp.maximum(
        jnp.asarray(sums['loss_count'], jnp.float32), 1.0)
    out['count'] = jnp.asarray(sums['queries'], jnp.float32)
    return out

  def with_config(self, config) -> 'Retrieval':
    """This task with the run's settings (config.retrieval: margin, negatives, threshold), when present."""
    rc = config.get('retrieval') if hasattr(config, 'get') else None
    if rc is None:
      return self
    return dataclasses.replace(self, margin=float(rc.margin), num_negatives=int(rc.num_negatives),
                               threshold=float(rc.threshold), cache_pass=bool(rc.get('cache_pass', True)))


# config.retrieval: declared with the code that reads it (config/schema.py collects it)
SECTION = Section('retrieval', (
    Field('margin', Num(0.1, lo=0), 'triplet margin'),
    Field('num_negatives', Int(5, lo=1), 'hardest negative candidates per query tuple used in the loss'),
    Field('threshold', Num(25.0, lo=0, lo_open=True), 'metres: a database image within it is a match (Recall@K)'),
    Field('cache_pass', Flag(True, message='True or False'),
          'mine from a gradient-free pass, train on the mined slots only'),
), doc="the 'retrieval' task (tasks/retrieval.py: FedVPR)")
