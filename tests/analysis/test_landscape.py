"""Tests for fedjax_flat.analysis.landscape / plots: interpolation, three-model plane, filter-normalized
directions, 2D surfaces, evaluation over padded batches, PNG writers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat import analysis as A
from fedjax_flat.analysis._util import tree_norm, tree_vdot
from fedjax_flat.models.registry import get_model


def _perturb(params, seed, scale):
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map(lambda w: np.asarray(w) + scale * rng.randn(*w.shape).astype(np.float32), params)


def _random_params(model, sample_x, seed):
  """Random parameters with the model's structure, without compiling `init` (eval_shape only traces)."""
  rng = np.random.RandomState(seed)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), sample_x)
  return jax.tree_util.tree_map(lambda s: (0.3 * rng.randn(*s.shape)).astype(np.float32), shapes)


@pytest.fixture(scope='module')
def setup():
  model = get_model('mlp', 3, (8,), hidden=(6,))
  rng = np.random.RandomState(0)
  x = rng.randn(23, 8).astype(np.float32)
  y = rng.randint(0, 3, 23).astype(np.int32)
  w1 = _random_params(model, x[:1], 0)
  w2 = _perturb(w1, 1, 0.5)
  w3 = _perturb(w1, 2, 0.5)
  batches = A.make_fixed_batches(x, y, 10)
  return dict(model=model, x=x, y=y, w1=w1, w2=w2, w3=w3, batches=batches,
              eval_fn=A.make_eval_fn(model, batches))


def _numpy_eval(model, params, x, y):
  logits = np.asarray(model.apply(params, x), np.float64)
  logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
  return np.mean(logz - logits[np.arange(len(y)), y]), np.mean(logits.argmax(1) == y)


def test_eval_fn_exact_and_padding_invariant(setup):
  loss, acc = setup['eval_fn'](setup['w1'])
  ref_loss, ref_acc = _numpy_eval(setup['model'], setup['w1'], setup['x'], setup['y'])
  np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
  np.testing.assert_allclose(float(acc), ref_acc, atol=1e-6)
  b = setup['batches']  # last batch has 3 valid + 7 padded examples; add a fully padded batch of garbage
  padded = {'x': np.concatenate([b['x'], np.full((1, 10, 8), 9.0, np.float32)]),
            'y': np.concatenate([b['y'], np.full((1, 10), 2, np.int32)]),
            'mask': np.concatenate([b['mask'], np.zeros((1, 10), np.float32)])}
  loss2, acc2 = A.make_eval_fn(setup['model'], padded)(setup['w1'])
  np.testing.assert_allclose([float(loss2), float(acc2)], [float(loss), float(acc)], rtol=1e-6)


def test_plane_through_three_basis_and_coordinates(setup):
  w1, w2, w3 = setup['w1'], setup['w2'], setup['w3']
  plane = A.plane_through_three(w1, w2, w3)
  u, v = plane.u_hat, plane.v_hat
  np.testing.assert_allclose([float(tree_norm(u)), float(tree_norm(v))], [1.0, 1.0], rtol=1e-5)
  assert abs(float(tree_vdot(u, v))) < 1e-5
  c = plane.coords
  assert c.shape == (3, 2)
  np.testing.assert_allclose(c[0], [0.0, 0.0])  # w1 at the origin
  du = jax.tree_util.tree_map(lambda a, b: a - b, w2, w1)
  np.testing.assert_allclose(c[1], [float(tree_norm(du)), 0.0], atol=1e-6)  # w2 on the x axis
  assert c[2, 1] > 0
  for (cx, cy), w in zip(c, (w1, w2, w3)):  # every model is reconstructed from its coordinates
    rec = jax.tree_util.tree_map(lambda o, a, b: o + cx * a + cy * b, plane.origin, u, v)
    for r, t in zip(jax.tree_util.tree_leaves(rec), jax.tree_util.tree_leaves(w)):
      np.testing.assert_allclose(np.asarray(r), np.asarray(t), atol=1e-5)
  xs, ys = A.plane_grid(plane, n=21, margin=0.2)
  assert len(xs) == len(ys) == 21
  assert xs[0] < c[:, 0].min() and xs[-1] > c[:, 0].max() and ys[0] < c[:, 1].min() and ys[-1] > c[:, 1].max()
  with pytest.raises(ValueError):
    A.plane_through_three(w1, w2, jax.tree_util.tree_map(lambda a, b: 2 * b - a, w1, w2))  # collinear


def test_evaluate_plane_hits_the_three_models(setup):
  eval_fn, w1, w2, w3 = setup['eval_fn'], setup['w1'], setup['w2'], setup['w3']
  plane = A.plane_through_three(w1, w2, w3)
  c = plane.coords
  xs = np.array([0.0, c[1, 0], c[2, 0]])
  ys = np.array([0.0, c[2, 1]])
  res = A.evaluate_plane(eval_fn, plane.origin, plane.u_hat, plane.v_hat, xs, ys)
  assert res['loss'].shape == (2, 3) and res['accuracy'].shape == (2, 3)  # [len(ys), len(xs)]
  for (j, i), w in (((0, 0), w1), ((0, 1), w2), ((1, 2), w3)):
    loss, acc = eval_fn(w)
    np.testing.assert_allclose(res['loss'][j, i], float(loss), rtol=1e-4)
    np.testing.assert_allclose(res['error'][j, i], 1.0 - float(acc), atol=1e-6)
  chunked = A.evaluate_plane(eval_fn, plane.origin, plane.u_hat, plane.v_hat, xs, ys, chunk_size=3)
  np.testing.assert_allclose(chunked['loss'], res['loss'], rtol=1e-5)
  full = A.evaluate_three_model_plane(eval_fn, w1, w2, w3, n=5)
  assert full['loss'].shape == (5, 5) and np.all(np.isfinite(full['loss']))
  np.testing.assert_allclose(full['coords'], c)


def test_interpolate_1d_endpoints(setup):
  eval_fn, w1, w2 = setup['eval_fn'], setup['w1'], setup['w2']
  res = A.interpolate_1d(eval_fn, w1, w2, [0.0, 0.5, 1.0])
  mid = jax.tree_util.tree_map(lambda a, b: 0.5 * (a + b), w1, w2)
  for i, w in enumerate((w1, mid, w2)):
    loss, acc = eval_fn(w)
    np.testing.assert_allclose(res['loss'][i], float(loss), rtol=1e-5)
    np.testing.assert_allclose(res['accuracy'][i], float(acc), atol=1e-6)
  scalar = A.interpolate_1d(lambda p: eval_fn(p)[0], w1, w2, [0.0, 1.0])  # a scalar loss function
  assert set(scalar) == {'alphas', 'loss'}
  np.testing.assert_allclose(scalar['loss'], res['loss'][[0, 2]], rtol=1e-5)


def test_filter_normalized_direction_cnn():
  model = get_model('digits_cnn', 10, (8, 8, 1))
  params = _random_params(model, np.zeros((1, 8, 8, 1), np.float32), 0)
  d = A.filter_normalized_direction(jax.random.PRNGKey(1), params)
  flat_p = jax.tree_util.tree_leaves_with_path(params)
  flat_d = jax.tree_util.tree_leaves(d)
  kinds = set()
  for (path, w), dw in zip(flat_p, flat_d):
    assert dw.shape == w.shape
    if w.ndim == 1:  # biases zeroed
      np.testing.assert_array_equal(np.asarray(dw), 0.0)
      continue
    kinds.add(w.ndim)
    axes = tuple(range(w.ndim - 1))  # conv [kh,kw,cin,cout] / dense [in,out]: one filter per output
    np.testing.assert_allclose(np.linalg.norm(np.asarray(dw), axis=axes) if w.ndim == 2 else
                               np.sqrt((np.asarray(dw) ** 2).sum(axes)),
                               np.sqrt((np.asarray(w) ** 2).sum(axes)), rtol=1e-5, err_msg=str(path))
    assert not np.allclose(np.asarray(dw), np.asarray(w))  # random, not the weights
  assert kinds == {2, 4}
  norms_d, norms_p = A.filter_norms(d), A.filter_norms(params)
  assert jax.tree_util.tree_structure(norms_d) == jax.tree_util.tree_structure(norms_p)
  kept = A.filter_normalized_direction(jax.random.PRNGKey(1), params, keep_biases=True)
  for w, dk, dd in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(kept), flat_d):
    np.testing.assert_array_equal(np.asarray(dk), np.asarray(w) if w.ndim == 1 else np.asarray(dd))
  d2 = A.filter_normalized_direction(jax.random.PRNGKey(2), params)
  assert abs(float(tree_vdot(d, d2))) < 0.5 * float(tree_norm(d) * tree_norm(d2))



def test_surface_2d_mlp(setup):
  eval_fn, w1 = setup['eval_fn'], setup['w1']
  d1 = A.filter_normalized_direction(jax.random.PRNGKey(3), w1)
  d2 = A.filter_normalized_direction(jax.random.PRNGKey(4), w1)
  surf = A.surface_2d(eval_fn, w1, d1, d2, (np.linspace(-1, 1, 5), np.linspace(-1, 1, 3)))
  assert surf['loss'].shape == (3, 5)
  np.testing.assert_allclose(surf['loss'][1, 2], float(eval_fn(w1)[0]), rtol=1e-5)
  p = jax.tree_util.tree_map(lambda w, a, b: w + 1.0 * a - 1.0 * b, w1, d1, d2)  # (x=1, y=-1)
  np.testing.assert_allclose(surf['loss'][0, 4], float(eval_fn(p)[0]), rtol=1e-4)
  zero = jax.tree_util.tree_map(jnp.zeros_like, w1)
  flat = A.surface_2d(eval_fn, w1, zero, zero, np.linspace(-1, 1, 3))
  np.testing.assert_allclose(flat['loss'], float(eval_fn(w1)[0]), rtol=1e-5)


def test_plots_write_pngs(setup, tmp_path):
  from fedjax_flat.analysis import plots
  xs = ys = np.linspace(-1, 1, 7)
  gx, gy = np.meshgrid(xs, ys)
  z = gx ** 2 + 0.5 * gy ** 2 + 0.1
  grid = np.linspace(-1, 5, 200)
  kw = dict(dpi=60)  # small images: fast
  paths = [
      plots.plot_eigenvalues([5.0, 3.0, 2.0, 1.0, 0.5], str(tmp_path / 'eig.png'), **kw),
      plots.plot_eigenvalues([[5.0, 3.0, 1.0], [4.0, 2.0, 0.5]], str(tmp_path / 'eig2.png'),
                             labels=['a', 'b'], log=True, **kw),
      plots.plot_density(grid, np.exp(-grid ** 2), str(tmp_path / 'density.png'), eigenvalues=[0.0, 1.0], **kw),
      plots.plot_interpolation(np.linspace(-0.5, 1.5, 9), np.linspace(1, 2, 9), str(tmp_path / 'interp.png'),
                               **kw),
      plots.plot_plane(xs, ys, z, str(tmp_path / 'sub' / 'plane.png'),
                       coords=np.array([[0, 0], [0.8, 0], [0.3, 0.7]]), log_levels=True, **kw),
      plots.plot_surface_3d(xs, ys, z, str(tmp_path / 'surf.png'), **kw),
      plots.plot_surface_3d(xs, ys, z, str(tmp_path / 'net.png'), style='net', **kw),
  ]
  for p in paths:
    with open(p, 'rb') as f:
      data = f.read()
    assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 2000, p
