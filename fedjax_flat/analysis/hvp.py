"""Losses, evaluation and Hessian-vector products over fixed, padded batches.

The Hessian is that of the *exact* mean loss over every valid unit (the task's, fedjax_flat/tasks/base.py: examples
for classification, tokens or pixels for dense labels) of a fixed set of stacked batches (see `data.py`):

  L(w) = sum_b sum_u m_bu * ce(f(w, x_b)_u, y_bu) / sum_b sum_u m_bu,

m_bu the task's unit weight: the example mask (times the label's validity for dense labels).

H v is computed forward-over-reverse (`jax.jvp` of `jax.grad`, the JAX autodiff-cookbook HVP), one batch at
a time inside a `lax.scan`. Each batch contributes the HVP of its *summed* loss, which is the batch's mean-loss
HVP weighted by its valid count; the total is divided by the number of valid examples. Fully padded batches
therefore contribute exactly zero, and unequal batches are weighted correctly (unlike a mean of per-batch
HVPs, as in pytorch-hessian-eigenthings / google spectral-density with a mean loss).

Always float32: every function here takes `models.base.float32_model(model)`, so a run trained with
engine.compute_dtype='bfloat16' is analysed with its float32 model (the same float32 parameters; eigenvalues of
a bfloat16 forward pass would measure its rounding as curvature).

`make_hvp` and `make_eval_fn` return `jax.tree_util.Partial` objects: the data and parameters are pytree
leaves, so they are passed as device buffers to the jitted eigen / trace / landscape routines (no large
constants baked into XLA programs), and the compiled program is shared across parameter values and data
sets of the same shapes.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.tree_util import Partial

from fedjax_flat.models.base import float32_model
from fedjax_flat.tasks import base as tasks_lib
from fedjax_flat.tasks.base import cross_entropy  # noqa: F401  (re-exported)

Batch = Mapping[str, Any]


def _masked_sums(apply: Callable, task, params, batch: Batch):
  """(sum of the task's unit losses, number of correct valid predictions) over one [B, ...] batch."""
  logits = apply(params, batch['x'], train=False)
  sums = task.eval_sums(logits, batch['y'], batch['mask'])
  return sums['loss_sum'], jnp.asarray(sums['correct'], jnp.float32)   # integer counts (segmentation) too


def _count(task, batches: Batch):
  """The number of valid units of stacked batches (>= 1): the divisor of every mean here."""
  counts = jax.vmap(task.unit_count)(batches['y'], batches['mask'])
  return jnp.maximum(jnp.sum(counts), 1.0)


def _accumulate(fn: Callable, batches: Batch, init, unroll):
  """sum_b fn(batch_b) over the leading axis of the stacked batches, starting from `init` (a pytree).

  unroll='python' (from `unroll=True`): a Python loop, i.e. straight-line XLA code without a while loop.
  An int: `lax.scan(unroll=...)`. Note that `lax.scan(unroll=True)` still emits an XLA while loop, which
  keeps XLA:CPU's slow in-loop convolution weight gradients (jax#12868); only the Python loop avoids them.
  """
  add = lambda a, b: jax.tree_util.tree_map(jnp.add, a, b)  # noqa: E731
  if unroll == 'python':
    nb = jax.tree_util.tree_leaves(batches)[0].shape[0]
    acc = init
    for i in range(nb):
      acc = add(acc, fn(jax.tree_util.tree_map(lambda a: a[i], batches)))
    return acc
  acc, _ = lax.scan(lambda a, batch: (add(a, fn(batch)), None), init, batches, unroll=int(unroll))
  return acc


def _unroll_key(unroll):
  # True == 1 (same hash), so normalize before using it as an lru_cache key.
  return 'python' if unroll is True else int(unroll)


def make_loss_fn(model, *, task=None) -> Callable:
  """loss(params, batch) -> masked mean loss over one [B, ...] batch (0 if the batch is all padding)."""
  apply, task = float32_model(model).apply, tasks_lib.get_task(task)

  def loss(params, batch):
    s, _ = _masked_sums(apply, task, params, batch)
    return s / jnp.maximum(task.unit_count(batch['y'], batch['mask']), 1.0)
  return loss


@functools.lru_cache(maxsize=None)
def _full_loss_impl(apply: Callable, unroll, task) -> Callable:

  @jax.jit
  def full_loss(params, batches):
    total = _accumulate(lambda batch: _masked_sums(apply, task, params, batch)[0], batches,
                        jnp.zeros((), jnp.float32), unroll)
    return total / _count(task, batches)
  return full_loss


def make_full_loss_fn(model, *, unroll=1, task=None) -> Callable:
  """full_loss(params, batches) -> exact weighted mean loss over stacked [nb, B, ...] batches."""
  return _full_loss_impl(float32_model(model).apply, _unroll_key(unroll), tasks_lib.get_task(task))


@functools.lru_cache(maxsize=None)
def _eval_impl(apply: Callable, unroll, task) -> Callable:

  @jax.jit
  def evaluate(batches, params):
    zero = jnp.zeros((), jnp.float32)
    s, c = _accumulate(lambda batch: _masked_sums(apply, task, params, batch), batches, (zero, zero), unroll)
    n = _count(task, batches)
    return s / n, c / n
  return evaluate


def make_eval_fn(model, batches: Batch, *, unroll=1, task=None) -> Partial:
  """eval_fn(params) -> (loss, accuracy), exact example-weighted means over the fixed stacked batches.

  Jitted; the returned `Partial` can be called directly or passed to `landscape` functions, which trace it
  inside their own jitted grids.
  """
  batches = jax.tree_util.tree_map(jnp.asarray, dict(batches))
  return Partial(_eval_impl(float32_model(model).apply, _unroll_key(unroll), tasks_lib.get_task(task)), batches)


@functools.lru_cache(maxsize=None)
def _hvp_impl(apply: Callable, unroll, task) -> Callable:

  @jax.jit
  def hvp(params, batches, v_flat):
    flat, unravel = ravel_pytree(params)
    v = unravel(v_flat.astype(flat.dtype))

    def batch_sum_loss(p, batch):
      return _masked_sums(apply, task, p, batch)[0]
    grad_fn = jax.grad(batch_sum_loss)

    def batch_hvp(batch):
      _, hv = jax.jvp(lambda p: grad_fn(p, batch), (params,), (v,))
      return ravel_pytree(hv)[0]

    acc = _accumulate(batch_hvp, batches, jnp.zeros_like(flat), unroll)
    return acc / _count(task, batches)
  return hvp


def make_hvp(model, params, batches: Batch, *, unroll=1, task=None) -> Partial:
  """Returns hvp(v_flat) -> H v_flat for the exact weighted mean loss over `batches`.

  Args:
    model: a `fedjax_flat.models.Model`.
    params: the parameter pytree at which the Hessian is taken.
    batches: stacked {'x': [nb, B, ...], 'y': [nb, B], 'mask': [nb, B]} (see `data.make_fixed_batches`).
    unroll: how batches are accumulated. An int is the `lax.scan` unroll factor (1 keeps compile time
      independent of nb). `True` unrolls with a Python loop (no XLA while loop), which avoids XLA:CPU's slow
      convolution weight gradients inside loops for native (`conv_impl='lax'`) convolutions (jax#12868) at a
      compile-time cost growing with nb. This only helps a standalone HVP: the eigen / trace / density
      solvers call the HVP inside their own loops. On CPU, build the model with `conv_impl='im2col'`.

  The vector space is `jax.flatten_util.ravel_pytree(params)[0]` (dimension `num_params(params)`).
  The result is a jitted `jax.tree_util.Partial`; pass it to `eigen`, `trace` and `density` routines.
  """
  params = jax.tree_util.tree_map(jnp.asarray, params)
  batches = jax.tree_util.tree_map(jnp.asarray, dict(batches))
  return Partial(_hvp_impl(float32_model(model).apply, _unroll_key(unroll), tasks_lib.get_task(task)), params,
                 batches)


def flatten_params(params) -> tuple[jax.Array, Callable]:
  """(flat_vector, unravel) via `jax.flatten_util.ravel_pytree`."""
  return ravel_pytree(params)


def param_dim(params) -> int:
  return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))


@functools.lru_cache(maxsize=None)
def _dense_hessian_impl(apply: Callable, task) -> Callable:
  full_loss = _full_loss_impl(apply, 1, task)

  @jax.jit
  def dense(params, batches):
    flat, unravel = ravel_pytree(params)
    return jax.hessian(lambda w: full_loss(unravel(w), batches))(flat)
  return dense


def dense_hessian(model, params, batches: Batch, *, task=None) -> jax.Array:
  """The full [dim, dim] Hessian of the exact weighted mean loss (`jax.hessian`; small models only)."""
  batches = jax.tree_util.tree_map(jnp.asarray, dict(batches))
  return _dense_hessian_impl(float32_model(model).apply, tasks_lib.get_task(task))(params, batches)
