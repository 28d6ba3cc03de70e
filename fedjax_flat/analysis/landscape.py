"""Loss-landscape geometry: 1D interpolation, the plane through three models, random-direction surfaces.

Parameters can be any pytree (e.g. a model's params) or flat vectors; directions have the same structure as
the parameters. `eval_fn(params) -> (loss, accuracy)` is typically `hvp.make_eval_fn(model, batches)`; it
is traced inside one jitted grid evaluation (`lax.map` over points, optionally in vmapped chunks).

  * `interpolate_1d`: w(a) = (1 - a) w1 + a w2 (thesis Eq. 2.39 with gamma = 1 - a).
  * `plane_through_three`: Garipov et al. 2018 (thesis section 2.5; digest 5.3): u = w2 - w1,
    v = (w3 - w1) - <w3 - w1, u>/||u||^2 u, u_hat = u/||u||, v_hat = v/||v||; P(x, y) = w1 + x u_hat + y v_hat.
  * `filter_normalized_direction` and `surface_2d`: Li et al. 2018 ("Visualizing the loss landscape").
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_flat.analysis._util import as_partial, tree_norm, tree_scale, tree_sub, tree_vdot

PyTree = Any


def _to_jnp(tree):
  return jax.tree_util.tree_map(jnp.asarray, tree)


def _split_eval(out) -> dict:
  if isinstance(out, (tuple, list)) and len(out) == 2:
    loss, acc = np.asarray(out[0]), np.asarray(out[1])
    return {'loss': loss, 'accuracy': acc, 'error': 1.0 - acc}
  return {'loss': np.asarray(out)}


@functools.partial(jax.jit, static_argnames=('chunk_size',))
def _interp_impl(eval_fn, w1, w2, alphas, *, chunk_size):
  def f(a):
    p = jax.tree_util.tree_map(lambda x, y: ((1.0 - a) * x + a * y).astype(x.dtype), w1, w2)
    return eval_fn(p)
  return lax.map(f, alphas, batch_size=chunk_size if chunk_size > 1 else None)


def interpolate_1d(loss_eval: Callable, w1: PyTree, w2: PyTree, alphas: Sequence[float] = None, *,
                   chunk_size: int = 1) -> dict:
  """Evaluates `loss_eval((1 - a) w1 + a w2)` for each a in `alphas` (default linspace(-0.5, 1.5, 41)).

  a = 0 is w1 and a = 1 is w2. Returns {'alphas', 'loss', 'accuracy', 'error'} as numpy arrays when
  `loss_eval` returns (loss, accuracy), {'alphas', 'loss'} when it returns a scalar.
  """
  if alphas is None:
    alphas = np.linspace(-0.5, 1.5, 41)
  alphas = jnp.asarray(alphas, jnp.float32)
  out = _interp_impl(as_partial(loss_eval), _to_jnp(w1), _to_jnp(w2), alphas, chunk_size=int(chunk_size))
  return {'alphas': np.asarray(alphas), **_split_eval(out)}


class Plane(NamedTuple):
  origin: PyTree        # w1
  u_hat: PyTree         # unit vector along w2 - w1
  v_hat: PyTree         # unit vector in the plane, orthogonal to u_hat, towards w3
  coords: np.ndarray    # [3, 2]: (x, y) coordinates of w1, w2, w3 in the (u_hat, v_hat) basis
  u_norm: float         # ||w2 - w1||
  v_norm: float         # ||v|| before normalization (distance of w3 from the w1-w2 line)


@jax.jit
def _plane_impl(w1, w2, w3):
  u = tree_sub(w2, w1)
  d3 = tree_sub(w3, w1)
  uu = tree_vdot(u, u)
  v = jax.tree_util.tree_map(lambda a, b: a - (tree_vdot(d3, u) / uu) * b, d3, u)
  u_norm = jnp.sqrt(uu)
  v_norm = tree_norm(v)
  u_hat = tree_scale(1.0 / u_norm, u)
  v_hat = tree_scale(1.0 / v_norm, v)
  coords = jnp.array([[0.0, 0.0], [u_norm, 0.0], [tree_vdot(d3, u_hat), tree_vdot(d3, v_hat)]])
  return u_hat, v_hat, coords, u_norm, v_norm, tree_norm(d3)


def plane_through_three(w1: PyTree, w2: PyTree, w3: PyTree) -> Plane:
  """The plane through three models, with w1 at the origin and w2 on the positive x axis (Garipov et al.)."""
  w1, w2, w3 = _to_jnp(w1), _to_jnp(w2), _to_jnp(w3)
  u_hat, v_hat, coords, u_norm, v_norm, d3_norm = _plane_impl(w1, w2, w3)
  if not float(u_norm) > 0.0:
    raise ValueError('w1 and w2 coincide; the plane is undefined')
  if not float(v_norm) > 1e-5 * float(d3_norm):  # float32 round-off of the projection is ~1e-7
    raise ValueError('w1, w2, w3 are (nearly) collinear; the plane is undefined')
  return Plane(w1, u_hat, v_hat, np.asarray(coords, np.float64), float(u_norm), float(v_norm))


def plane_grid(plane: Plane, n: int = 21, margin: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
  """Default grid: `n` points per axis covering the three models with `margin` of the span on each side.

  With w3 above the middle of w1-w2 this is Garipov's linspace(-0.2, 1.2, n) * ||u|| (and * ||v||).
  """
  c = plane.coords
  (x0, y0), (x1, y1) = c.min(0), c.max(0)
  dx, dy = x1 - x0, max(y1 - y0, 1e-12)
  return (np.linspace(x0 - margin * dx, x1 + margin * dx, n),
          np.linspace(y0 - margin * dy, y1 + margin * dy, n))


@functools.partial(jax.jit, static_argnames=('chunk_size',))
def _grid_impl(eval_fn, origin, d1, d2, xs, ys, *, chunk_size):
  gx, gy = jnp.meshgrid(xs, ys)  # [ny, nx], 'xy' indexing (matplotlib contour convention)
  pts = jnp.stack([gx.reshape(-1), gy.reshape(-1)], axis=-1)

  def f(pt):
    p = jax.tree_util.tree_map(lambda w, a, b: (w + pt[0] * a + pt[1] * b).astype(w.dtype), origin, d1, d2)
    return eval_fn(p)
  out = lax.map(f, pts, batch_size=chunk_size if chunk_size > 1 else None)
  return jax.tree_util.tree_map(lambda o: o.reshape(gx.shape), out)


def evaluate_plane(eval_fn: Callable, w1: PyTree, u: PyTree, v: PyTree, xs=None, ys=None, *, n: int = 21,
                   chunk_size: int = 1) -> dict:
  """Evaluates eval_fn(w1 + x u + y v) on the grid xs x ys (default: linspace(-0.2, 1.2, n) each).

  Args:
    eval_fn: params -> (loss, accuracy) (or a scalar loss).
    w1: the origin (e.g. `Plane.origin`).
    u: the first direction (e.g. `Plane.u_hat`), the pytree structure of w1.
    v: the second direction (e.g. `Plane.v_hat`), the same structure.
    xs: 1-D coordinates along u.
    ys: 1-D coordinates along v.
    chunk_size: grid points evaluated together with vmap (1 = strictly sequential `lax.map`, least memory).

  Returns:
    {'xs', 'ys', 'loss', 'accuracy', 'error'}: numpy arrays, the grids with shape [len(ys), len(xs)]
    (row j is y = ys[j]), ready for `plt.contour(xs, ys, loss)`.
  """
  xs = np.linspace(-0.2, 1.2, n) if xs is None else np.asarray(xs)
  ys = np.linspace(-0.2, 1.2, n) if ys is None else np.asarray(ys)
  out = _grid_impl(as_partial(eval_fn), _to_jnp(w1), _to_jnp(u), _to_jnp(v),
                   jnp.asarray(xs, jnp.float32), jnp.asarray(ys, jnp.float32), chunk_size=int(chunk_size))
  return {'xs': xs, 'ys': ys, **_split_eval(out)}


def evaluate_three_model_plane(eval_fn: Callable, w1: PyTree, w2: PyTree, w3: PyTree, *, n: int = 21,
                               margin: float = 0.2, chunk_size: int = 1) -> dict:
  """`plane_through_three` + `plane_grid` + `evaluate_plane`; adds 'coords' [3, 2] of the three models."""
  plane = plane_through_three(w1, w2, w3)
  xs, ys = plane_grid(plane, n, margin)
  res = evaluate_plane(eval_fn, plane.origin, plane.u_hat, plane.v_hat, xs, ys, chunk_size=chunk_size)
  res['coords'] = plane.coords
  return res


def _filter_axes(ndim: int) -> tuple:
  # A filter is one output channel / unit: the last axis of Flax kernels (conv [kh,kw,cin,cout], dense
  # [in,out]); the norm is taken over every other axis.
  return tuple(range(ndim - 1))


@functools.partial(jax.jit, static_argnames=('keep_biases',))
def filter_normalized_direction(rng, params: PyTree, *, keep_biases: bool = False) -> PyTree:
  """A Gaussian direction with each filter rescaled to the norm of the matching filter of `params`.

  Li et al. 2018, `net_plotter.normalize_directions_for_weights(norm='filter', ignore='biasbn')`:
    * parameters with ndim >= 2: d[..., o] <- d[..., o] * ||w[..., o]|| / ||d[..., o]|| for each output
      channel / unit o (conv kernel [kh, kw, cin, cout]: one [kh, kw, cin] slice; dense kernel [in, out]: one
      column);
    * 1-D parameters (biases, norm scales/offsets) and scalars: zero by default; with `keep_biases=True`
      they are set to the weights themselves, as Li et al. do when biases/BN are not ignored.
  """
  leaves, treedef = jax.tree_util.tree_flatten(params)
  # One Gaussian draw for the whole model (one threefry call compiles much faster than one per leaf).
  sizes = [int(np.size(w)) for w in leaves]
  noise = jax.random.normal(rng, (max(sum(sizes), 1),), jnp.float32)
  offsets = np.cumsum([0] + sizes)
  out = []
  for i, w in enumerate(leaves):
    w = jnp.asarray(w)
    if w.ndim <= 1:
      out.append(w if keep_biases else jnp.zeros_like(w))
      continue
    d = noise[offsets[i]:offsets[i + 1]].reshape(w.shape)
    axes = _filter_axes(w.ndim)
    wn = jnp.sqrt(jnp.sum(jnp.square(w.astype(jnp.float32)), axis=axes, keepdims=True))
    dn = jnp.sqrt(jnp.sum(jnp.square(d), axis=axes, keepdims=True))
    out.append((d * wn / (dn + 1e-10)).astype(w.dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


@jax.jit
def filter_norms(tree: PyTree) -> PyTree:
  """Per-filter norms (over all axes but the last) of every >= 2-D leaf; 1-D leaves map to abs values."""
  def norms(x):
    x = jnp.asarray(x, jnp.float32)
    if x.ndim <= 1:
      return jnp.abs(x)
    return jnp.sqrt(jnp.sum(jnp.square(x), axis=_filter_axes(x.ndim)))
  return jax.tree_util.tree_map(norms, tree)


def surface_2d(eval_fn: Callable, params: PyTree, d1: PyTree, d2: PyTree, coords=None, *,
               chunk_size: int = 1) -> dict:
  """Loss surface f(a, b) = eval_fn(params + a d1 + b d2) for the 3D / contour plots of Li et al.

  Args:
    coords: 1-D coefficients used on both axes (default linspace(-1, 1, 21), the thesis's [-1, 1] range),
      or a pair (alphas, betas). Use the *same* d1, d2 for every compared model.

  Returns:
    {'xs', 'ys', 'loss', 'accuracy', 'error'} like `evaluate_plane` ([len(ys), len(xs)] grids).
  """
  if coords is None:
    coords = np.linspace(-1.0, 1.0, 21)
  if isinstance(coords, (tuple, list)) and len(coords) == 2 and np.ndim(coords[0]) == 1:
    xs, ys = coords
  else:
    xs = ys = coords
  return evaluate_plane(eval_fn, params, d1, d2, xs, ys, chunk_size=chunk_size)
