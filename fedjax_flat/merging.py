"""Model merging by permutation alignment: Git Re-Basin weight matching (Ainsworth et al. 2023, Alg. 1).

Hidden units of a feed-forward network can be permuted without changing its function: permute the output units
of layer l (its kernel's last axis and its bias) and the matching input axis of layer l + 1. Two models trained
from different starts (or drifting apart in local training) can sit in different permutations of the same basin,
and their plain average then lands on a loss barrier. Weight matching aligns model B to a reference A: with one
permutation P_l per hidden layer, it maximises sum_l <W_l^A, P_l W_l^B P_{l-1}^T> (+ the biases' <b_l^A, P_l
b_l^B>) by coordinate descent: for each layer l in turn, with the other permutations fixed, P_l is the linear
assignment maximising

  C_l[i, j] = <W_l^A[:, i], (W_l^B P_{l-1}^T)[:, j]> + b_l^A[i] b_l^B[j] + <W_{l+1}^A[i, :], (P_{l+1} W_{l+1}^B)[j, :]>

(the kernel flattened over every axis but the unit axis: a Dense kernel [in, out], a Conv kernel
[kh, kw, cin, cout]; a Dense that reads a flattened NHWC feature map views its rows as [H W, C]). Each assignment is
solved exactly by scipy.optimize.linear_sum_assignment (the Hungarian method) on the host through
`jax.pure_callback`, so the alignment runs inside the compiled round; the layers are visited in forward order
(Ainsworth et al. visit them in a random order; a fixed one keeps a run a function of its seed alone) for
`iters` sweeps, all starting from identity permutations.

  permutation_spec(params)                     the layers in forward order, or a ValueError naming why the params
                                               are not a chain of Conv / Dense layers this can permute
  weight_matching(ref, other, iters)           the permutations [P_0, ..., P_{L-2}] aligning `other` to `ref`
  permute(params, perms)                       `params` with the hidden units permuted (same function)
  rebasin_merge(models, weights, mask, ref, iters)
                                               each valid model [C, ...] aligned to `ref`, then their
                                               weights-weighted mean (config.server.aggregator='rebasin':
                                               algorithms/wrappers/robust.py hands it the client models,
                                               global - delta, and the global model as the reference)

PERMUTABLE_MODELS names the registered models whose params are such a chain (no normalisation layer, no
residual path); the config check refuses the others in one line before compiling.
"""
from __future__ import annotations

import re
from typing import List

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ['permutation_spec', 'weight_matching', 'permute', 'rebasin_merge', 'PERMUTABLE_MODELS']

# Registered models (models/cnn.py) built of Conv / Dense layers only: ReLU, max pooling and dropout commute with
# a permutation of the channels. digits_cnn qualifies only with model_kwargs.gn_groups=0 (its default).
PERMUTABLE_MODELS = ('mlp', 'digits_cnn', 'cifar_cnn', 'femnist_cnn', 'mcmahan_cnn', 'pfl_cnn')

_NAME = re.compile(r'^(Conv|Dense)_(\d+)$')


def permutation_spec(params) -> List[str]:
  """The layer names of `params` in forward order: every Conv_i, then every Dense_i, by index (Flax's automatic
  names in a sequential model), each holding exactly a 'kernel' and a 'bias'. Raises ValueError otherwise."""
  if not isinstance(params, dict) or not params:
    raise ValueError('the params are not a dict of layers')
  names = []
  for k, v in params.items():
    m = _NAME.match(str(k))
    if m is None or not isinstance(v, dict) or set(v) != {'kernel', 'bias'}:
      raise ValueError(f'layer {k!r} is not a Conv_i / Dense_i with a kernel and a bias')
    names.append((0 if m.group(1) == 'Conv' else 1, int(m.group(2)), str(k)))
  order = [n for _, _, n in sorted(names)]
  for a, b in zip(order[:-1], order[1:]):
    ka, kb = params[a]['kernel'], params[b]['kernel']
    n = ka.shape[-1]
    rows = kb.shape[2] if kb.ndim == 4 else kb.shape[0]
    if rows % n:
      raise ValueError(f'layer {b!r} reads {rows} inputs, not a multiple of the {n} units of {a!r}')
  return order


def _in_view(kernel, n):
  """The kernel of the layer after a hidden layer of n units, as [..., n, out_rest] with the units on axis -2:
  Conv [kh, kw, n, cout] as is; Dense [n, out] as is; Dense [H W n, out] (a flattened NHWC map, channels
  fastest) as [H W, n, out]."""
  if kernel.ndim == 4:
    return kernel
  if kernel.shape[0] == n:
    return kernel
  return kernel.reshape(kernel.shape[0] // n, n, kernel.shape[1])


def _unit_axis_in(view):
  return view.ndim - 2


def _take_in(kernel, perm, n):
  view = _in_view(kernel, n)
  return jnp.take(view, perm, axis=_unit_axis_in(view)).reshape(kernel.shape)


def permute(params, perms):
  """`params` with hidden layer l's units reordered by perms[l] (unit i of the result = unit `perms[l][i]`)."""
  order = permutation_spec(params)
  out = {k: dict(v) for k, v in params.items()}
  for l, p in enumerate(perms):
    a, b = order[l], order[l + 1]
    n = params[a]['kernel'].shape[-1]
    out[a]['kernel'] = jnp.take(out[a]['kernel'], p, axis=-1)
    out[a]['bias'] = jnp.take(out[a]['bias'], p, axis=0)
    out[b]['kernel'] = _take_in(out[b]['kernel'], p, n)
  return out


def _lap(cost):
  """The assignment maximising sum_i cost[i, perm[i]] (host: scipy's Hungarian solver), int32."""
  from scipy.optimize import linear_sum_assignment   # scipy loads only when a run aligns models

  def host(c):
    c = np.asarray(c, np.float64)
    _, cols = linear_sum_assignment(c, maximize=True)
    return cols.astype(np.int32)
  out = jax.ShapeDtypeStruct((cost.shape[0],), jnp.int32)
  return jax.pure_callback(host, out, cost, vmap_method='sequential')


def _units_first(x, axis):
  return jnp.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)


def weight_matching(ref, other, iters: int = 3):
  """[P_0, ..., P_{L-2}] (int32 index arrays): the permutations of `other`'s hidden units that align it to `ref`
  by `iters` coordinate-descent sweeps of weight matching (the module docstring)."""
  order = permutation_spec(ref)
  sizes = [ref[k]['kernel'].shape[-1] for k in order[:-1]]
  perms = [jnp.arange(n, dtype=jnp.int32) for n in sizes]
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  for _ in range(int(iters)):
    for l, n in enumerate(sizes):
      a, b = order[l], order[l + 1]
      wa, wb = f32(ref[a]['kernel']), f32(other[a]['kernel'])
      if l > 0:       # the layer's inputs: other's previous hidden layer, already aligned by P_{l-1}
        wb = _take_in(wb, perms[l - 1], sizes[l - 1])
      cost = _units_first(wa, -1) @ _units_first(wb, -1).T
      cost = cost + jnp.outer(f32(ref[a]['bias']), f32(other[a]['bias']))
      na, nb = f32(ref[b]['kernel']), f32(other[b]['kernel'])
      if l + 1 < len(sizes):   # the next layer's outputs, aligned by P_{l+1}
        nb = jnp.take(nb, perms[l + 1], axis=-1)
      va, vb = _in_view(na, n), _in_view(nb, n)
      cost = cost + _units_first(va, _unit_axis_in(va)) @ _units_first(vb, _unit_axis_in(vb)).T
      perms[l] = _lap(cost)
  return perms


def rebasin_merge(models, weights, mask, ref, iters: int = 3):
  """The weights-weighted mean of the valid models [C, ...], each first aligned to `ref` by weight matching
  (masked models never enter: their rows are replaced by `ref` before alignment and weigh 0)."""
  coef = jnp.where(mask, weights.astype(jnp.float32), 0.0)
  total = jnp.maximum(jnp.sum(coef), jnp.finfo(jnp.float32).tiny)
  safe = jax.tree_util.tree_map(
      lambda x, r: jnp.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)), x, r[None].astype(x.dtype)), models, ref)

  def align(model):
    return permute(model, weight_matching(ref, model, iters))
  aligned = jax.lax.map(align, safe)
  return jax.tree_util.tree_map(
      lambda x: (jnp.tensordot(coef, x.astype(jnp.float32), axes=1) / total).astype(x.dtype), aligned)
