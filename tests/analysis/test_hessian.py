"""Tests for fedjax_flat.analysis: HVP, eigenpairs (power / Lanczos), Hutchinson trace, SLQ density, analyze.

Reference: the dense Hessian of a small MLP (8 inputs, 6 hidden, 3 classes: 75 parameters) computed with
`jax.hessian` on the concatenated valid examples, independently of the scan-over-batches code under test.
"""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat import analysis as A
from fedjax_flat.models.registry import get_model

SIZES = (10, 9, 4)  # three unequal batches, padded to 10 (make_fixed_batches(23, 10) has the same shape)


def _top_by_magnitude(ev, k):
  return np.sort(ev[np.argsort(-np.abs(ev))][:k])[::-1]


@pytest.fixture(scope='module')
def problem():
  model = get_model('mlp', 3, (8,), hidden=(6,))
  rng = np.random.RandomState(0)
  n = sum(SIZES)
  x = rng.randn(n, 8).astype(np.float32)
  y = rng.randint(0, 3, n).astype(np.int32)
  # Parameters of the right structure without compiling `init` (eval_shape only traces); biases != 0.
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), x[:1])
  prng = np.random.RandomState(1)
  params = jax.tree_util.tree_map(lambda s: (0.8 * prng.randn(*s.shape)).astype(np.float32), shapes)
  parts, s = [], 0
  for k in SIZES:
    parts.append({'x': x[s:s + k], 'y': y[s:s + k]})
    s += k
  batches = A.stack_batches(parts, batch_size=10)
  flat, unravel = A.flatten_params(params)
  loss1 = A.make_loss_fn(model)
  everything = {'x': x, 'y': y, 'mask': np.ones(n, np.float32)}
  hess = np.asarray(jax.jit(jax.hessian(lambda w: loss1(unravel(w), everything)))(flat), np.float64)
  hess = 0.5 * (hess + hess.T)
  ev = np.linalg.eigvalsh(hess)
  return dict(model=model, x=x, y=y, params=params, batches=batches, flat=flat, unravel=unravel,
              hess=hess, ev=ev, dim=flat.size, hvp=A.make_hvp(model, params, batches))


def test_make_fixed_batches_pads_last_batch():
  x = np.arange(23 * 2, dtype=np.float32).reshape(23, 2)
  y = np.arange(23, dtype=np.int32) % 5
  b = A.make_fixed_batches(x, y, 10)
  assert b['x'].shape == (3, 10, 2) and b['y'].shape == (3, 10) and b['mask'].shape == (3, 10)
  assert b['y'].dtype == np.int32 and b['mask'].dtype == np.float32
  np.testing.assert_array_equal(b['mask'].sum(1), [10, 10, 3])
  np.testing.assert_array_equal(b['x'].reshape(30, 2)[:23], x)
  np.testing.assert_array_equal(b['x'][2, 3:], 0)
  assert A.num_valid(b) == 23
  assert A.make_fixed_batches(x, y, 10, max_examples=20)['x'].shape == (2, 10, 2)


def test_stack_batches_unequal(problem):
  b = problem['batches']
  assert b['x'].shape == (3, 10, 8)
  np.testing.assert_array_equal(b['mask'].sum(1), SIZES)


def test_full_loss_is_exact_weighted_mean(problem):
  model, params, b = problem['model'], problem['params'], problem['batches']
  full = float(A.make_full_loss_fn(model)(params, b))
  loss1 = A.make_loss_fn(model)
  direct = float(loss1(params, {'x': problem['x'], 'y': problem['y'], 'mask': np.ones(len(problem['y']))}))
  np.testing.assert_allclose(full, direct, rtol=1e-6)
  per_batch = [float(loss1(params, {k: v[i] for k, v in b.items()})) for i in range(3)]
  np.testing.assert_allclose(full, np.dot(per_batch, SIZES) / sum(SIZES), rtol=1e-6)
  assert abs(full - np.mean(per_batch)) > 1e-4  # a mean of batch means would be wrong here


def test_hvp_matches_dense_hessian(problem):
  for seed in range(3):
    v = jax.random.normal(jax.random.PRNGKey(seed), (problem['dim'],), jnp.float32)
    np.testing.assert_allclose(np.asarray(problem['hvp'](v)), problem['hess'] @ np.asarray(v, np.float64),
                               atol=1e-5, rtol=1e-5)
  dense = np.asarray(A.dense_hessian(problem['model'], problem['params'], problem['batches']))
  np.testing.assert_allclose(dense, problem['hess'], atol=1e-5)


def test_hvp_padding_and_batching_invariance(problem):
  model, params, b = problem['model'], problem['params'], problem['batches']
  v = jax.random.normal(jax.random.PRNGKey(7), (problem['dim'],), jnp.float32)
  ref = np.asarray(problem['hvp'](v))
  rng = np.random.RandomState(1)
  padded = {  # one extra, fully padded batch holding garbage inputs
      'x': np.concatenate([b['x'], 5 * rng.randn(1, 10, 8).astype(np.float32)]),
      'y': np.concatenate([b['y'], rng.randint(0, 3, (1, 10)).astype(np.int32)]),
      'mask': np.concatenate([b['mask'], np.zeros((1, 10), np.float32)])}
  np.testing.assert_allclose(np.asarray(A.make_hvp(model, params, padded)(v)), ref, atol=1e-6)
  for bs in (4, 30):
    rebatched = A.make_fixed_batches(problem['x'], problem['y'], bs)
    np.testing.assert_allclose(np.asarray(A.make_hvp(model, params, rebatched)(v)), ref, atol=1e-6)
  # Python-unrolled accumulation (no XLA while loop) gives the same result.
  np.testing.assert_allclose(np.asarray(A.make_hvp(model, params, b, unroll=True)(v)), ref, atol=1e-6)


def test_power_iteration_top5_largest_magnitude(problem):
  ev, hess = problem['ev'], problem['hess']
  lams, vecs, iters = A.top_eigenpairs_power(problem['hvp'], problem['dim'], k=5, num_iters=1000, tol=1e-7,
                                             rng=jax.random.PRNGKey(0), return_num_iters=True)
  lams, vecs = np.asarray(lams, np.float64), np.asarray(vecs, np.float64)
  expected = _top_by_magnitude(ev, 5)
  np.testing.assert_allclose(lams, expected, rtol=1e-3)
  assert np.all(np.diff(lams) <= 0)  # sorted by descending value
  # Deflation finds distinct eigenpairs: distinct values, orthonormal vectors, small residuals.
  assert np.min(np.abs(np.diff(lams))) > 1e-3
  np.testing.assert_allclose(vecs @ vecs.T, np.eye(5), atol=2e-2)
  for lam, u in zip(lams, vecs):
    assert np.linalg.norm(hess @ u - lam * u) < 2e-2 * abs(lams[0])
  assert np.all(np.asarray(iters) >= 1) and np.all(np.asarray(iters) <= 1000)


def test_power_iteration_thesis_settings_lambda_max(problem):
  # 20 steps, tol 1e-4 (the thesis/FedGloSS recipe): lambda_1 is already accurate for this gap.
  lams, _, iters = A.top_eigenpairs_power(problem['hvp'], problem['dim'], k=1, num_iters=20, tol=1e-4,
                                          init='uniform', return_num_iters=True)
  np.testing.assert_allclose(float(lams[0]), problem['ev'][-1], rtol=1e-2)
  assert int(iters[0]) <= 20


def test_lanczos_top5_and_tridiagonalization(problem):
  ev, hess, dim = problem['ev'], problem['hess'], problem['dim']
  lams, vecs = A.top_eigenpairs_lanczos(problem['hvp'], dim, k=5, num_steps=40, rng=jax.random.PRNGKey(1))
  np.testing.assert_allclose(np.asarray(lams), ev[::-1][:5], rtol=1e-3)
  for lam, u in zip(np.asarray(lams, np.float64), np.asarray(vecs, np.float64)):
    assert np.linalg.norm(hess @ u - lam * u) < 1e-2 * abs(ev[-1])
  res = A.lanczos(problem['hvp'], dim, 40, jax.random.PRNGKey(2))
  q = np.asarray(res.basis, np.float64)
  assert q.shape == (40, dim) and res.alphas.shape == (40,) and res.betas.shape == (39,)
  np.testing.assert_allclose(q @ q.T, np.eye(40), atol=1e-5)
  np.testing.assert_allclose(q @ hess @ q.T, np.asarray(A.tridiagonal(res.alphas, res.betas)), atol=1e-4)


def _quadratic_hvp(d, v):
  # HVP of f(w) = 0.5 sum_i d_i w_i^2 (H = diag(d)) by forward-over-reverse autodiff.
  f = lambda w: 0.5 * jnp.sum(d * w ** 2)  # noqa: E731
  return jax.jvp(jax.grad(f), (jnp.zeros_like(v),), (v,))[1]


def quadratic(d):
  """A Partial operator: quadratics of the same dimension share compiled programs across tests."""
  return jax.tree_util.Partial(_quadratic_hvp, jnp.asarray(d, jnp.float32))


def test_quadratic_known_diagonal_hessian():
  # Repeated values make the Krylov space 4-dimensional, so Lanczos breaks down and restarts; with
  # num_steps = dim every Ritz value is exact.
  d = np.array([7.0, 3.0, 3.0, -1.0, 0.5, 0.5, 0.5, 3.0, -1.0, 0.5, 0.5, 0.5])
  hvp, dim = quadratic(d), d.size
  lams, vecs = A.top_eigenpairs_lanczos(hvp, dim, k=dim, num_steps=dim)
  np.testing.assert_allclose(np.asarray(lams), np.sort(d)[::-1], atol=1e-5)
  np.testing.assert_allclose(np.abs(np.asarray(vecs[0])), np.eye(dim)[0], atol=1e-4)
  lams_p, vecs_p = A.top_eigenpairs_power(hvp, dim, k=1, num_iters=200, tol=0.0)
  np.testing.assert_allclose(float(lams_p[0]), 7.0, rtol=1e-6)
  np.testing.assert_allclose(np.abs(np.asarray(vecs_p[0])), np.eye(dim)[0], atol=1e-4)
  est, se = A.hutchinson_trace(hvp, dim, num_probes=3)
  np.testing.assert_allclose(float(est), d.sum(), rtol=1e-6)  # exact for a diagonal H
  np.testing.assert_allclose(float(se), 0.0, atol=1e-6)


def test_power_is_largest_magnitude_lanczos_largest_algebraic():
  d = np.array([-9.0, 5.0, 4.0, 2.0, 1.0, 0.5, 0.25, 0.1, 0.05, 0.02, 0.01, 0.0])
  lams_p, _ = A.top_eigenpairs_power(quadratic(d), d.size, k=3, num_iters=300, tol=1e-7)
  np.testing.assert_allclose(np.asarray(lams_p), [5.0, 4.0, -9.0], rtol=1e-4)
  lams_l, _ = A.top_eigenpairs_lanczos(quadratic(d), d.size, k=3, num_steps=d.size)
  np.testing.assert_allclose(np.asarray(lams_l), [5.0, 4.0, 2.0], rtol=1e-4)


def test_power_early_stopping():
  d = np.array([10.0, 1.0, 0.5, 0.1] + [0.0] * 8)
  _, _, iters = A.top_eigenpairs_power(quadratic(d), d.size, k=1, num_iters=50, tol=1e-4,
                                       return_num_iters=True)
  assert 1 < int(iters[0]) < 50
  _, _, iters = A.top_eigenpairs_power(quadratic(d), d.size, k=1, num_iters=50, tol=0.0, return_num_iters=True)
  assert int(iters[0]) == 50


def test_hutchinson_trace(problem):
  exact = float(np.trace(problem['hess']))
  est, se = A.hutchinson_trace(problem['hvp'], problem['dim'], num_probes=50, rng=jax.random.PRNGKey(3))
  assert float(se) > 0
  assert abs(float(est) - exact) < 3 * float(se)
  est, se = A.hutchinson_trace(problem['hvp'], problem['dim'], num_probes=500, rng=jax.random.PRNGKey(4))
  assert abs(float(est) - exact) < 3 * float(se)
  assert abs(float(est) - exact) < 0.1 * np.sum(np.abs(problem['ev']))


def test_slq_density_clusters():
  # Eigenvalues -1 (x2), 2 (x4), 5 (x6). With Rademacher probes the quadrature weight of each cluster is
  # exactly its multiplicity / dim; the Krylov space is 3-dimensional (Lanczos restarts after breakdown).
  d = np.array([-1.0] * 2 + [2.0] * 4 + [5.0] * 6)
  dens = A.spectral_density(quadratic(d), d.size, num_probes=3, num_steps=d.size, sigma=0.05, grid_size=2000)
  np.testing.assert_allclose(np.trapezoid(dens.density, dens.grid), 1.0, atol=1e-6)
  np.testing.assert_allclose(dens.weights.sum(1), 1.0, atol=1e-5)
  for center, frac in ((-1.0, 2 / 12), (2.0, 4 / 12), (5.0, 6 / 12)):
    sel = np.abs(dens.grid - center) < 0.25
    np.testing.assert_allclose(np.trapezoid(dens.density[sel], dens.grid[sel]), frac, atol=5e-3)
  assert dens.density[np.argmin(np.abs(dens.grid - 3.5))] < 1e-6


def test_slq_density_mlp(problem):
  ev, dim = problem['ev'], problem['dim']
  dens = A.spectral_density(problem['hvp'], dim, num_probes=4, num_steps=dim, rng=jax.random.PRNGKey(5))
  np.testing.assert_allclose(np.trapezoid(dens.density, dens.grid), 1.0, atol=1e-6)
  # With a full Krylov space the nodes carrying weight are the true eigenvalues ...
  heavy = dens.nodes[dens.weights > 1e-4]
  assert np.max(np.min(np.abs(heavy[:, None] - ev[None, :]), axis=1)) < 1e-3 * np.abs(ev).max()
  # ... so the mass sits within 3 sigma of the spectrum,
  near = np.min(np.abs(dens.grid[:, None] - ev[None, :]), axis=1) < 3 * dens.sigma
  assert np.trapezoid(np.where(near, dens.density, 0.0), dens.grid) > 0.99
  # ... and its mean is the 4-probe Hutchinson estimate of tr(H) / dim: sum_j tau_j theta_j = z^T H z / dim.
  mean = np.trapezoid(dens.grid * dens.density, dens.grid)
  np.testing.assert_allclose(mean, np.mean(np.sum(dens.weights * dens.nodes, 1)), atol=1e-3)
  hess = problem['hess']
  se = np.sqrt(2 * (np.sum(hess ** 2) - np.sum(np.diag(hess) ** 2))) / dim / np.sqrt(4)
  assert abs(mean - ev.mean()) < 4 * se


def test_client_lambda_max(problem):
  model, params, b = problem['model'], problem['params'], problem['batches']
  # The client's data is the first batch; its other batches are fully padded (same shapes as the global
  # batches, so the compiled power iteration is shared).
  client = dict(b, mask=b['mask'] * np.array([[1.0], [0.0], [0.0]], np.float32))
  out = A.client_lambda_max(model, params, client, b, num_iters=500, tol=1e-7, init='uniform')
  h_local = np.asarray(A.dense_hessian(model, params, client), np.float64)
  np.testing.assert_allclose(out['lambda_local'], _top_by_magnitude(np.linalg.eigvalsh(h_local), 1)[0],
                             rtol=1e-3)
  np.testing.assert_allclose(out['lambda_global'], _top_by_magnitude(problem['ev'], 1)[0], rtol=1e-3)
  assert abs(out['lambda_local'] - out['lambda_global']) > 1e-3


def test_analyze_report(problem):
  model, params, ev = problem['model'], problem['params'], problem['ev']
  # batch_size=10 gives the fixture's batch shapes: the compiled programs of the other tests are reused.
  rep = A.analyze(model, params, problem['x'], problem['y'], batch_size=10, top_k=5, method='power',
                  num_iters=1000, tol=1e-7, trace_probes=500, density_probes=4, density_steps=problem['dim'],
                  rng=jax.random.PRNGKey(0))
  json.dumps(rep)  # JSON-able
  assert rep['num_params'] == problem['dim'] and rep['num_examples'] == len(problem['y'])
  np.testing.assert_allclose(rep['eigenvalues'], _top_by_magnitude(ev, 5), rtol=1e-3)
  assert rep['lambda_max'] == rep['eigenvalues'][0]
  np.testing.assert_allclose(rep['lambda_max_over_lambda_5'], rep['eigenvalues'][0] / rep['eigenvalues'][4])
  assert abs(rep['trace'] - ev.sum()) < 4 * rep['trace_stderr']
  np.testing.assert_allclose(np.trapezoid(rep['density']['density'], rep['density']['grid']), 1.0, atol=1e-5)
  assert {'hvp_s', 'eigen_s', 'trace_s', 'density_s', 'total_s'} <= set(rep['timings'])
  rep = A.analyze(model, params, problem['x'], problem['y'], batch_size=10, top_k=5, method='lanczos',
                  num_iters=40)
  np.testing.assert_allclose(rep['eigenvalues'], ev[::-1][:5], rtol=1e-3)
  assert rep['trace'] is None and 'density' not in rep


def _clustered(dim=300, seed=0):
  """Symmetric H with the CIFAR-CNN-like clustered top spectrum of issue 13 (5.50/5.34/5.22/5.18/5.14,
  lambda_min -5.19 larger in magnitude than the 5th), its float64 eigenvalues, and an f32 HVP."""
  rng = np.random.RandomState(seed)
  ev = np.concatenate([[5.50, 5.34, 5.22, 5.18, 5.14, -5.19], np.clip(rng.randn(dim - 6), -4.0, 4.0)])
  q, _ = np.linalg.qr(rng.randn(dim, dim))
  h = (q * ev) @ q.T
  h = 0.5 * (h + h.T)
  h32 = jnp.asarray(h, jnp.float32)
  return h, np.linalg.eigvalsh(h)[::-1], lambda v: h32 @ v


def test_default_eigensolver_on_a_clustered_spectrum_matches_float64_eigh():
  h, ev, hvp = _clustered()
  pairs = A.top_eigenpairs(hvp, h.shape[0], k=5, rng=jax.random.PRNGKey(0))
  np.testing.assert_allclose(pairs.eigenvalues, ev[:5], atol=1e-4)
  np.testing.assert_allclose(pairs.rayleigh_quotients, ev[:5], atol=1e-4)
  assert pairs.converged.all() and (pairs.residuals <= 1e-3 * 5.5).all()
  # the residuals are the true ||Hu - lambda u|| (float64 recomputation)
  u = np.asarray(pairs.eigenvectors, np.float64)
  u /= np.linalg.norm(u, axis=1, keepdims=True)
  true_res = np.linalg.norm(u @ h - pairs.eigenvalues[:, None] * u, axis=1)
  np.testing.assert_allclose(pairs.residuals, true_res, atol=2e-5)


def test_thesis_power_iteration_is_flagged_where_it_has_not_converged(caplog):
  """20 deflated power steps (the thesis protocol) on the clustered spectrum: pairs that are not eigenpairs
  are marked and warned about; every pair marked converged is within its residual of a true eigenvalue."""
  h, ev, hvp = _clustered()
  lams, vecs = A.top_eigenpairs_power(hvp, h.shape[0], k=5, num_iters=20, rng=jax.random.PRNGKey(0))
  pairs = A.check_pairs(hvp, lams, vecs)
  assert not pairs.converged.all()
  for lam, r in zip(pairs.eigenvalues, pairs.residuals):
    assert np.min(np.abs(ev - lam)) <= r + 1e-5        # Bauer-Fike: some eigenvalue within the residual
  with caplog.at_level('WARNING'):
    assert A.eigen.warn_unconverged(pairs, 'power', more='num_iters')
  assert 'did not converge' in caplog.text and 'more steps: num_iters' in caplog.text


def test_analyze_reports_rayleigh_quotient_residual_and_convergence(problem, caplog):
  model, params, ev = problem['model'], problem['params'], problem['ev']
  rep = A.analyze(model, params, problem['x'], problem['y'], batch_size=10, top_k=5)
  assert rep['method'] == 'lanczos' and rep['all_converged'] and all(rep['converged'])
  np.testing.assert_allclose(rep['eigenvalues'], ev[::-1][:5], rtol=1e-3)
  np.testing.assert_allclose(rep['rayleigh_quotients'], rep['eigenvalues'], rtol=1e-4, atol=1e-6)
  assert len(rep['residuals']) == 5 and max(rep['residuals']) <= 1e-3 * rep['residual_scale']
  with caplog.at_level('WARNING'):
    rep = A.analyze(model, params, problem['x'], problem['y'], batch_size=10, top_k=5, method='power',
                    num_iters=2, tol=0.0)
  json.dumps(rep)
  assert not rep['all_converged'] and rep['converged'].count(False) >= 1 and 'did not converge' in caplog.text
  assert '--num_iters' in caplog.text and '--lanczos_steps' not in caplog.text    # power's steps: num_iters
  caplog.clear()
  with caplog.at_level('WARNING'):      # warn=False: the caller says it (experiments/hessian.py), once
    A.analyze(model, params, problem['x'], problem['y'], batch_size=10, top_k=5, method='power', num_iters=2,
              tol=0.0, warn=False)
  assert 'did not converge' not in caplog.text


@dataclasses.dataclass(frozen=True)
class _SquaredLoss:
  """0.5 (f(x) - y)^2 per example: a linear model's batch Hessian is X^T X / n in closed form."""

  def eval_sums(self, pred, y, mask):
    return {'loss_sum': jnp.sum(mask * 0.5 * (pred - y) ** 2), 'correct': jnp.zeros(())}

  def unit_count(self, y, mask):
    return jnp.sum(mask)


class _Linear:
  @staticmethod
  def apply(params, x, train=False):
    return x @ params['w']


def test_client_lambda_max_estimates_batch_median_vs_full_data_on_a_quadratic():
  # Batches of 2 examples; batch Hessians X_b^T X_b / 2: diag(2, 0.5), diag(0.5, 4.5), diag(1, 0) -> lambda_max
  # 2, 4.5, 1 (median 2); the fourth batch is padding (skipped). Whole set: diag(7, 10) / 6 -> lambda_max 10/6.
  x = np.array([[[2, 0], [0, 1]], [[0, 3], [1, 0]], [[1, 0], [1, 0]], [[5, 5], [5, 5]]], np.float32)
  batches = {'x': x, 'y': np.ones((4, 2), np.float32),
             'mask': np.array([[1, 1], [1, 1], [1, 1], [0, 0]], np.float32)}
  params = {'w': np.array([0.3, -0.2], np.float32)}
  out = A.client_lambda_max_estimates(_Linear, params, batches, num_iters=200, tol=1e-7, task=_SquaredLoss())
  np.testing.assert_allclose(sorted(out['lambda_batches']), [1.0, 2.0, 4.5], rtol=1e-4)
  np.testing.assert_allclose(out['lambda_batch_median'], 2.0, rtol=1e-4)
  np.testing.assert_allclose(out['lambda_full_data'], 10 / 6, rtol=1e-4)
