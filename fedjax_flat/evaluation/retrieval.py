"""Retrieval evaluation (FedVPR): database and query descriptors, exact nearest neighbours on the device in
blocks, Recall@K with the task's distance threshold (tasks/retrieval.py).

The test set is one array of images with y [N, 3] = (easting, northing, role): role 1 = query, 0 = database
(data/sources/vpr_synthetic.py, data/sources/msls.py). Two compiled programs per run: descriptors of a stack
of image batches, and the recall counts of a stack of query blocks against the whole (padded) database. The
counts are integers added on the host in int64; Recall@K = hits@K / queries.
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


class RetrievalEvaluator:
  """Recall@K of any params on a fixed test set (the server's query and database images)."""

  def __init__(self, model, x, y, batch_size: int = 256, preprocess=None, task=None):
    self.task = task if isinstance(task, ret_tasks.Retrieval) else ret_tasks.Retrieval()
    qx, qpos, dbx, dbpos = split_roles(np.asarray(x), y)
    if not len(qx) or not len(dbx):
      raise ValueError(f'the retrieval test set needs queries and database images; got {len(qx)} queries, '
                       f'{len(dbx)} database images')
    self.block = int(batch_size)
    # Images batched (padding rows: mask 0); positions ride along as the batches' labels.
    self.q = jax.device_put(pad_blocks(qx, qpos, self.block))
    self.db = jax.device_put(pad_blocks(dbx, dbpos, self.block))

    def descriptors(params, batches):
      def one(b):
        v = b['x'] if preprocess is None else preprocess(b['x'])
        return model.apply(params, v, train=False).astype(jnp.float32)
      return jax.lax.map(one, batches)

    def recall(params, q, db):
      d = descriptors(params, db)
      nb, b = db['mask'].shape
      flat = lambda a: a.reshape((nb * b,) + a.shape[2:])  # noqa: E731
      qd = descriptors(params, q)

      def one(args):
        desc, blk = args
        return self.task.recall_sums(desc, blk['y'], blk['mask'], flat(d), flat(db['y']), flat(db['mask']),
                                     block=b)
      return jax.lax.map(one, (qd, q))

    self.fn = jax.jit(recall)

  def __call__(self, params):
    per_block = jax.device_get(self.fn(params, self.q, self.db))
    sums = {k: np.sum(np.asarray(v), dtype=np.int64 if np.issubdtype(np.asarray(v).dtype, np.integer)
                      else np.float64) for k, v in per_block.items()}
    metrics = self.task.recall_metrics({k: np.float64(v) for k, v in sums.items()})
    return {k: float(v) for k, v in metrics.items()}
