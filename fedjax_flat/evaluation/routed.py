"""Test-time routing for clustered models (LADD, thesis §5.3 step 5): each test image is evaluated by the model of
the cluster whose style centroid is nearest to the image's own style.

  s(x)  = the image's FDA style (data/transforms/fda.extract_styles, one image: the release's test-time
          `StyleAugment(1, ...)`), flattened
  c(x)  = argmin_c || s(x) - mu_c ||_2                       (grouping/style_clusters.route; KMeans.predict)
  metrics = the task's additive sums of every image under its cluster's model, then `eval_metrics` (mIoU
            over the whole test set: one confusion matrix)

`evaluate_routed(model, params_of, ...)`: `params_of(c)` gives cluster c's params; a single model is
`lambda c: params` with one centroid. Images are padded to a fixed batch (one compiled shape) and masked.
"""
from __future__ import annotations

from typing import Callable, Dict

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.data.transforms import fda
from fedjax_flat.evaluation.evaluator import host_add, host_metrics
from fedjax_flat.grouping import style_clusters


def image_styles(x, b: int = fda.FDA_B, batch_size: int = 32) -> np.ndarray:
  """One style per image: x uint8 / [0, 1] `[N, H, W, C]` -> `[N, (2b+1)^2 C]` float32."""
  fn = jax.jit(lambda a: fda.extract_styles(fda.to_unit(a), b))
  out = [np.asarray(fn(x[lo:lo + batch_size])) for lo in range(0, len(x), batch_size)]
  return np.concatenate(out).reshape(len(x), -1)


def routes(x, centroids, b: int = fda.FDA_B) -> np.ndarray:
  return style_clusters.route(image_styles(x, b), centroids)


def evaluate_routed(model, params_of: Callable[[int], object], x, y, task, route_ids, *, prep: Callable,
                    batch_size: int = 16) -> Dict[str, np.ndarray]:
  """Task metrics of images x [N, ...] with labels y, image i evaluated with params_of(route_ids[i])."""
  route_ids = np.asarray(route_ids)

  @jax.jit
  def sums_fn(params, xb, yb, mb):
    logits = model.apply(params, prep(xb), train=False)
    return task.eval_sums(logits, yb, mb)

  total = None
  for c in np.unique(route_ids):
    idx = np.nonzero(route_ids == c)[0]
    params = params_of(int(c))
    for lo in range(0, len(idx), batch_size):
      sel = idx[lo:lo + batch_size]
      pad = batch_size - len(sel)
      xb = np.concatenate([x[sel], np.zeros((pad,) + x.shape[1:], x.dtype)]) if pad else x[sel]
      yb = np.concatenate([y[sel], np.zeros((pad,) + y.shape[1:], y.dtype)]) if pad else y[sel]
      mb = np.concatenate([np.ones(len(sel), np.float32), np.zeros(pad, np.float32)])
      s = sums_fn(params, jnp.asarray(xb), jnp.asarray(yb), jnp.asarray(mb))
      total = s if total is None else jax.tree_util.tree_map(jnp.add, total, s)
  out = {k: np.asarray(v) for k, v in task.eval_metrics(total).items()}
  out['routes'] = route_ids
  return out


def routed_batches(route_ids, batch_size: int):
  """Host plan of a routed evaluation: (cluster id [NB], image indices [NB, B], mask [NB, B]); every batch holds
  the images of one cluster, padded (index 0, mask 0) to batch_size, so one compiled shape serves every batch."""
  route_ids = np.asarray(route_ids)
  cids, idx, mask = [], [], []
  for c in np.unique(route_ids):
    sel = np.nonzero(route_ids == c)[0]
    for lo in range(0, len(sel), batch_size):
      part = sel[lo:lo + batch_size]
      pad = batch_size - len(part)
      cids.append(int(c))
      idx.append(np.concatenate([part, np.zeros(pad, np.int64)]))
      mask.append(np.concatenate([np.ones(len(part), np.float32), np.zeros(pad, np.float32)]))
  return (np.asarray(cids, np.int32), np.stack(idx).astype(np.int64) if idx else np.zeros((0, batch_size), np.int64),
          np.stack(mask) if mask else np.zeros((0, batch_size), np.float32))


class RoutedEvaluator:
  """The trainer's routed evaluation of a clustered run: `__call__(stacked)` with the G cluster models stacked on
  a leading axis [G, ...] -> the task's metrics of every test image under its route's model, pooled over the
  whole test set (one confusion matrix; = `evaluate_routed`).

  One jitted program per batch shape: it picks the batch's cluster model from the stack (a gather inside jit,
  so a new round's models never recompile) and returns the task's additive sums; the sums are added on the
  host in int64 / float64 (evaluation/evaluator.host_add), exact however many batches. The test images stay on
  the host and go to the device one batch at a time."""

  def __init__(self, model, x, y, route_ids, *, task, preprocess=None, batch_size: int = 16):
    self.x, self.y = x, y
    self.route_ids = np.asarray(route_ids, np.int32)
    if self.route_ids.shape != (len(x),):
      raise ValueError(f'route_ids has shape {self.route_ids.shape}; expected one route per test image ({len(x)},)')
    self.task = task
    self.plan = routed_batches(self.route_ids, int(batch_size))

    def sums(stacked, cid, xb, yb, mb):
      params = jax.tree_util.tree_map(lambda t: t[cid], stacked)
      xb = xb if preprocess is None else preprocess(xb)
      return task.eval_sums(model.apply(params, xb, train=False), yb, mb)
    self.sums_fn = jax.jit(sums)

  def __call__(self, stacked) -> dict:
    total = None
    for cid, idx, mb in zip(*self.plan):
      s = self.sums_fn(stacked, jnp.int32(cid), jnp.asarray(self.x[idx]), jnp.asarray(self.y[idx]), jnp.asarray(mb))
      total = host_add(total, s)
    out = {}
    for k, v in jax.device_get(host_metrics(self.task, total)).items():
      out[k] = float(v) if np.ndim(v) == 0 else np.asarray(v).tolist()
    return out
