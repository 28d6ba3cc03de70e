"""Retrieval evaluation (FedVPR): database and query descriptors, exact nearest neighbours on the device in
blocks, Recall@K with the task's distance threshold (tasks/retrieval.py).

The test set is one array of images with y [N, 3] = (easting, northing, role): role 1 = query, 0 = database
(data/sources/vpr_synthetic.py, data/sources/msls.py). One compiled program per evaluator: the descriptors of
the query and database images (stacks of padded batches), then the recall counts of every query block
against the (padded) database. The counts are integers added on the host in int64; Recall@K = hits@K /
queries (pooled over every query).

`groups` (optional, one id per image) splits the set into independent retrieval problems: each query is
matched against the database images of its own group only. The validation clients (thesis 6.3: 12 clients
held out, data.val_x / val_y / val_client) are such groups: each client's queries against its own database.
The descriptors are computed once for the whole set; each group then gathers its queries (in blocks) and its
database rows (padded to the largest group's, mask 0), so the nearest-neighbour scan of a group touches only
its own database. Without `groups` the whole set is one group (the server's test cities).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.tasks import retrieval as ret_tasks


def split_roles(x, y):
  """(query images, query positions [Nq, 2], database images, database positions [Nd, 2]) of a test set."""
  y = np.asarray(y, np.float32)
  if y.ndim != 2 or y.shape[1] != 3:
    raise ValueError(f'retrieval test labels must be [N, 3] (easting, northing, role); got {y.shape}')
  q = y[:, 2] == ret_tasks.QUERY_ROLE
  return x[q], y[q, :2], x[~q], y[~q, :2]


def pad_blocks(x, pos, block: int):
  """{'x' [nb, block, ...], 'y' float32 positions [nb, block, 2], 'mask' [nb, block]}: zero padding, mask 0.
  (Not batching.make_eval_batches: positions are float metres, and labels there become int32.)"""
  n = len(pos)
  nb = max(1, -(-n // block))
  xp = np.zeros((nb * block,) + x.shape[1:], x.dtype)
  yp = np.zeros((nb * block, 2), np.float32)
  mp = np.zeros((nb * block,), np.float32)
  xp[:n], yp[:n], mp[:n] = x, pos, 1.0
  shape = lambda a: a.reshape((nb, block) + a.shape[1:])  # noqa: E731
  return {'x': shape(xp), 'y': shape(yp), 'mask': shape(mp)}


def group_rows(group_ids, groups, block: int):
  """(rows [G, n], valid [G, n]): for each group id in `groups`, the positions in `group_ids` of its members,
  padded with row 0 (valid 0) to n = the largest group's size rounded up to a multiple of `block`."""
  members = [np.flatnonzero(group_ids == g) for g in groups]
  n = max(1, -(-max([len(m) for m in members] + [1]) // block)) * block
  rows = np.zeros((len(groups), n), np.int32)
  valid = np.zeros((len(groups), n), np.float32)
  for i, m in enumerate(members):
    rows[i, :len(m)], valid[i, :len(m)] = m, 1.0
  return rows, valid


class RetrievalEvaluator:
  """Recall@K of any params on a fixed set of query and database images (the server's test cities; with
  `groups`, each group's queries against its own database: the validation clients)."""

  def __init__(self, model, x, y, batch_size: int = 256, preprocess=None, task=None, groups=None):
    self.task = task if isinstance(task, ret_tasks.Retrieval) else ret_tasks.Retrieval()
    x = np.asarray(x)
    qx, qpos, dbx, dbpos = split_roles(x, y)
    if not len(qx) or not len(dbx):
      raise ValueError(f'the retrieval test set needs queries and database images; got {len(qx)} queries, '
                       f'{len(dbx)} database images')
    gid = np.zeros(len(x), np.int64) if groups is None else np.asarray(groups, np.int64).reshape(-1)
    if len(gid) != len(x):
      raise ValueError(f'groups holds {len(gid)} ids for {len(x)} images: one group id per image')
    is_q = np.asarray(y, np.float32)[:, 2] == ret_tasks.QUERY_ROLE
    self.block = b = int(batch_size)
    # Images batched (padding rows: mask 0); positions ride along as the batches' labels.
    self.q = jax.device_put(pad_blocks(qx, qpos, b))
    self.db = jax.device_put(pad_blocks(dbx, dbpos, b))
    # Each group with queries: its query rows in blocks [G, nq / b, b] and its database rows [G, nd].
    with_queries = np.unique(gid[is_q])
    self.num_groups = g = len(with_queries)
    q_rows, q_ok = group_rows(gid[is_q], with_queries, b)
    d_rows, d_ok = group_rows(gid[~is_q], with_queries, b)
    self.rows = jax.device_put({'q': q_rows.reshape(g, -1, b), 'q_ok': q_ok.reshape(g, -1, b), 'd': d_rows,
                                'd_ok': d_ok})

    def descriptors(params, batches):
      def one(b):
        v = b['x'] if preprocess is None else preprocess(b['x'])
        return model.apply(params, v, train=False).astype(jnp.float32)
      return jax.lax.map(one, batches)

    def recall(params, q, db, rows):
      flat = lambda a: a.reshape((-1,) + a.shape[2:])  # noqa: E731
      qd, q_pos = flat(descriptors(params, q)), flat(q['y'])
      dd, d_pos = flat(descriptors(params, db)), flat(db['y'])

      def group(r):     # one group: its query blocks against its own database rows
        g_desc, g_pos = dd[r['d']], d_pos[r['d']]

        def one(args):
          i, ok = args
          return self.task.recall_sums(qd[i], q_pos[i], ok, g_desc, g_pos, r['d_ok'], block=b)
        return jax.lax.map(one, (r['q'], r['q_ok']))
      return jax.lax.map(group, rows)

    self.fn = jax.jit(recall)

  def __call__(self, params):
    per_block = jax.device_get(self.fn(params, self.q, self.db, self.rows))
    sums = {k: np.sum(np.asarray(v), dtype=np.int64 if np.issubdtype(np.asarray(v).dtype, np.integer)
                      else np.float64) for k, v in per_block.items()}
    metrics = self.task.recall_metrics({k: np.float64(v) for k, v in sums.items()})
    return {k: float(v) for k, v in metrics.items()}
