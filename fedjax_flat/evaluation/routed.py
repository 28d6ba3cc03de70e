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
from fedjax_flat.grouping import style_clusters


def image_styles(x, b: int = fda.FDA_B, batch_size: int = 32) -> np.ndarray:
  """One style per image: x uint8 / [0, 1] [N, H, W, C] -> [N, (2b+1)^2 C] float32."""
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
