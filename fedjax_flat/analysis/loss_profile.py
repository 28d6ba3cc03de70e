"""The loss-vs-gradient-weight profile of examples: which examples dominate an update.

SAM's perturbed gradient implicitly up-weights the examples with the largest loss (Andriushchenko & Flammarion
2022, Sec. 4; for a linear model its step is a gradient step with per-example weights growing with the loss).
This measures, at a model, each example's loss l_i and the norm of its own gradient ||grad l_i|| (the weight it
carries in a full-batch gradient), then: their Pearson and Spearman correlations, and a profile over loss-quantile
bins (the examples sorted by loss split into `bins` groups of equal count, the first ones one larger): each bin's
mean loss and mean gradient norm. A run whose high-loss examples carry the large gradients shows a rising profile.
"""
from __future__ import annotations

import functools
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.analysis.hvp import make_loss_fn
from fedjax_flat.models.base import Model, float32_model
from fedjax_flat.tasks import base as tasks_lib


@functools.lru_cache(maxsize=None)
def _per_batch_impl(apply, task):
  # one compiled program per model and task, reused by every call (a lab logs every k rounds)
  loss = make_loss_fn(Model('per_example', None, apply, 0, ()), task=task)

  def one(p, x, y):
    return loss(p, {'x': x[None], 'y': y[None], 'mask': jnp.ones((1,), jnp.float32)})

  def norm_of(g):
    return jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree_util.tree_leaves(g)))

  @jax.jit
  def per_batch(p, x, y):
    vals, grads = jax.vmap(jax.value_and_grad(one), in_axes=(None, 0, 0))(p, x, y)
    return vals, jax.vmap(norm_of)(grads)
  return per_batch


def per_example_loss_gradnorm(model, params, batches, *, task=None):
  """(losses [n], gradient norms [n]) of the valid examples of stacked batches {'x': [nb, B, ...], 'y', 'mask'},
  in order: each example's loss and the norm of its gradient over every parameter (float32 model)."""
  per_batch = _per_batch_impl(float32_model(model).apply, tasks_lib.get_task(task))
  ls, gs = [], []
  for i in range(int(np.shape(batches['mask'])[0])):
    v, g = jax.device_get(per_batch(params, jnp.asarray(batches['x'][i]), jnp.asarray(batches['y'][i])))
    keep = np.asarray(batches['mask'][i]) > 0
    ls.append(np.asarray(v)[keep]), gs.append(np.asarray(g)[keep])
  return np.concatenate(ls), np.concatenate(gs)


def _ranks(a: np.ndarray) -> np.ndarray:
  """Ranks 1..n, ties given their average rank (Spearman's convention)."""
  order = np.argsort(a, kind='stable')
  r = np.empty(len(a), np.float64)
  r[order] = np.arange(1, len(a) + 1)
  for v in np.unique(a[np.r_[np.diff(np.sort(a)) == 0, False]]):     # tied values only
    r[a == v] = r[a == v].mean()
  return r


def _pearson(a, b) -> float:
  a, b = a - a.mean(), b - b.mean()
  den = np.sqrt(np.sum(a * a) * np.sum(b * b))
  return float(np.sum(a * b) / den) if den > 0 else 0.0


def loss_gradnorm_profile(losses, gradnorms, bins: int = 10) -> Dict:
  """{'pearson', 'spearman', 'bins': [{'loss_lo', 'loss_hi', 'count', 'loss_mean', 'gradnorm_mean'}]}: the
  correlations over the examples and the loss-quantile profile (at most min(bins, n) bins; 0 correlation when a
  side is constant)."""
  losses, gradnorms = np.asarray(losses, np.float64), np.asarray(gradnorms, np.float64)
  if losses.shape != gradnorms.shape or losses.ndim != 1 or not len(losses):
    raise ValueError(f'losses {losses.shape} and gradnorms {gradnorms.shape} must be the same non-empty 1-D shape')
  order = np.argsort(losses, kind='stable')
  rows = []
  for idx in np.array_split(order, min(int(bins), len(order))):
    rows.append({'loss_lo': float(losses[idx].min()), 'loss_hi': float(losses[idx].max()), 'count': int(len(idx)),
                 'loss_mean': float(losses[idx].mean()), 'gradnorm_mean': float(gradnorms[idx].mean())})
  return {'pearson': _pearson(losses, gradnorms), 'spearman': _pearson(_ranks(losses), _ranks(gradnorms)),
          'bins': rows}
