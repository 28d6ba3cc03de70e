"""fedjax_flat/aggregators.py (`ff.aggregators`): every aggregator, jitted, against a NumPy reference written from
the papers' definitions on the valid clients only; masked (padding) rows hold NaN and huge values that must never
leak into a result; weights count where the method defines them (mean, geometric median)."""
import jax
import numpy as np
import pytest

import fedjax_flat as ff
from fedjax_flat import aggregators as agg

tmap = jax.tree_util.tree_map


# ---- NumPy references over a list of valid uploads (flat float64 vectors) ------------------------------------


def np_mean(xs, w):
  w = np.asarray(w, np.float64)
  return np.tensordot(w / w.sum(), np.stack(xs), axes=1)


def np_median(xs, w):
  return np.median(np.stack(xs), axis=0)


def np_trimmed_mean(xs, w, beta):
  a = np.sort(np.stack(xs), axis=0)
  n = len(xs)
  k = min(int(np.floor(beta * n)), (n - 1) // 2)
  return a[k:n - k].mean(axis=0)


def np_krum_scores(xs, f):
  n = len(xs)
  near = max(n - f - 2, 1)
  scores = []
  for i in range(n):
    d = sorted(float(np.sum((xs[i] - xs[j]) ** 2)) for j in range(n) if j != i)
    scores.append(sum(d[:near]))
  return np.asarray(scores)


def np_krum(xs, w, f):
  return xs[int(np.argmin(np_krum_scores(xs, f)))]


def np_multi_krum(xs, w, f, m):
  m = m or len(xs) - f
  best = np.argsort(np_krum_scores(xs, f), kind='stable')[:m]
  return np.mean([xs[i] for i in best], axis=0)


def np_geometric_median(xs, w, iters, eps):
  a = np.asarray(w, np.float64) / np.sum(w)
  x = np.stack(xs)
  z = a @ x
  for _ in range(iters):
    b = a / np.maximum(eps, np.linalg.norm(x - z, axis=1))
    z = b @ x / b.sum()
  return z


def np_bulyan(xs, w, f):
  """El Mhamdi et al. 2018, Alg. 1: theta = n - 2f picks by Krum on the remaining set, then per coordinate the mean
  of the beta = theta - 2f picked values closest to their median."""
  n = len(xs)
  theta, rest, picked = max(n - 2 * f, 1), list(range(n)), []
  for _ in range(theta):
    scores = np_krum_scores([xs[i] for i in rest], f)
    picked.append(rest.pop(int(np.argmin(scores))))
  s = np.stack([xs[i] for i in sorted(picked)])     # ties (theta even: two values equally near) -> lower index
  beta = max(len(picked) - 2 * f, 1)
  med = np.median(s, axis=0)
  out = np.empty(s.shape[1])
  for j in range(s.shape[1]):
    near = np.argsort(np.abs(s[:, j] - med[j]), kind='stable')[:beta]
    out[j] = s[near, j].mean()
  return out


def np_centered_clipping(xs, w, center, tau, iters):
  """Karimireddy et al. 2021, Alg. 2: v <- v + (1/n) sum_i (x_i - v) min(1, tau / ||x_i - v||)."""
  v = np.asarray(center, np.float64)
  for _ in range(iters):
    v = v + np.mean([(x - v) * min(1.0, tau / np.linalg.norm(x - v)) for x in xs], axis=0)
  return v


def np_norm_bounding(xs, w, bound):
  """Sun et al. 2019: each update clipped to norm <= M, then the weighted mean."""
  return np_mean([x / max(1.0, np.linalg.norm(x) / bound) for x in xs], w)


def _objective(x, w, z):
  return float(np.sum(np.asarray(w) * np.linalg.norm(np.stack(x) - z, axis=1)))


# ---- fixtures -------------------------------------------------------------------------------------------------


def _problem(seed, c=7, masked=(2, 5)):
  rng = np.random.default_rng(seed)
  uploads = {'w': rng.normal(size=(c, 3, 2)).astype(np.float32), 'b': rng.normal(size=(c, 4)).astype(np.float32)}
  mask = np.ones(c, bool)
  mask[list(masked)] = False
  for k in uploads:          # padding rows: garbage that would dominate any result that counted them
    uploads[k][~mask] = np.nan
    uploads[k][masked[0]] = 1e30
  weights = rng.uniform(1, 9, size=c).astype(np.float32)
  weights[~mask] = 0.0
  return uploads, weights, mask


def _flat_rows(uploads, mask):
  c = mask.shape[0]
  flat = np.concatenate([np.asarray(uploads[k], np.float64).reshape(c, -1) for k in sorted(uploads)], axis=1)
  return [flat[i] for i in range(c) if mask[i]], flat


def _flat_one(tree):
  return np.concatenate([np.asarray(tree[k], np.float64).ravel() for k in sorted(tree)])


CASES = {
    'mean': (agg.mean, np_mean),
    'median': (agg.median, np_median),
    'trimmed_mean': (lambda u, w, m: agg.trimmed_mean(u, w, m, 0.2), lambda x, w: np_trimmed_mean(x, w, 0.2)),
    'krum': (lambda u, w, m: agg.krum(u, w, m, 1), lambda x, w: np_krum(x, w, 1)),
    'multi_krum': (lambda u, w, m: agg.multi_krum(u, w, m, 1), lambda x, w: np_multi_krum(x, w, 1, 0)),
    'multi_krum_m2': (lambda u, w, m: agg.multi_krum(u, w, m, 1, 2), lambda x, w: np_multi_krum(x, w, 1, 2)),
    'geometric_median': (lambda u, w, m: agg.geometric_median(u, w, m, 20, 1e-8),
                         lambda x, w: np_geometric_median(x, w, 20, 1e-8)),
    # f = 0 here (every n of these cohorts); f > 0: test_bulyan_matches_numpy (theta = 2 would tie exactly)
    'bulyan': (lambda u, w, m: agg.bulyan(u, w, m, 0), lambda x, w: np_bulyan(x, w, 0)),
    # tau below the uploads' distances from 0, so the clipping binds (norms ~ 3.5)
    'centered_clipping': (lambda u, w, m: agg.centered_clipping(u, w, m, None, 0.7, 3),
                          lambda x, w: np_centered_clipping(x, w, np.zeros_like(x[0]), 0.7, 3)),
    'norm_bounding': (lambda u, w, m: agg.norm_bounding(u, w, m, 2.0), lambda x, w: np_norm_bounding(x, w, 2.0)),
}


@pytest.mark.parametrize('name', sorted(CASES))
@pytest.mark.parametrize('seed,masked', [(0, (2, 5)), (1, (0,)), (2, (6, 3, 1))])
def test_aggregator_matches_numpy_on_valid_clients(name, seed, masked):
  fn, ref = CASES[name]
  uploads, weights, mask = _problem(seed, masked=masked)
  got = jax.jit(fn)(uploads, weights, mask)
  assert tmap(np.shape, got) == {'w': (3, 2), 'b': (4,)}
  xs, _ = _flat_rows(uploads, mask)
  want = ref(xs, weights[mask])
  np.testing.assert_allclose(_flat_one(got), want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_every_named_aggregator_is_tested_and_on_the_front_door():
  # a model merge takes a reference model too: tests/test_merging.py holds rebasin to its NumPy reference (NaN rows
  # masked included)
  assert set(agg.AGGREGATORS) - set(agg.MODEL_MERGES) <= set(CASES)
  assert ff.aggregators.rebasin is agg.rebasin
  assert 'aggregators' in ff.__all__ and ff.aggregators.median is agg.median


def test_even_and_odd_medians_and_one_client():
  x = {'a': np.array([[1.0], [5.0], [3.0], [100.0]], np.float32)}
  w = np.ones(4, np.float32)
  assert float(agg.median(x, w, np.array([1, 1, 1, 0], bool))['a'][0]) == 3.0      # odd n: the middle
  assert float(agg.median(x, w, np.array([1, 1, 1, 1], bool))['a'][0]) == 4.0      # even n: the two middles' mean
  assert float(agg.median(x, w, np.array([0, 1, 0, 0], bool))['a'][0]) == 5.0      # one client: itself
  assert float(agg.trimmed_mean(x, w, np.array([0, 1, 0, 0], bool), 0.4)['a'][0]) == 5.0


def test_mean_equals_the_weighted_mean_and_ignores_masked_weights():
  uploads, weights, mask = _problem(3)
  weights = weights.copy()
  weights[~mask] = 1e6          # a masked client's weight never counts either
  xs, _ = _flat_rows(uploads, mask)
  np.testing.assert_allclose(_flat_one(agg.mean(uploads, weights, mask)), np_mean(xs, weights[mask]), rtol=1e-6)


def test_robust_aggregators_resist_one_outlier_the_mean_does_not():
  rng = np.random.default_rng(4)
  honest = rng.normal(size=(8, 5)).astype(np.float32) * 0.1 + 1.0
  x = {'d': np.concatenate([honest, np.full((1, 5), 1e4, np.float32)])}
  w, m = np.ones(9, np.float32), np.ones(9, bool)
  assert np.all(np.asarray(agg.mean(x, w, m)['d']) > 100)
  for fn in (agg.median, lambda *a: agg.trimmed_mean(*a, 0.2), lambda *a: agg.krum(*a, 1),
             lambda *a: agg.multi_krum(*a, 1), agg.geometric_median):
    out = np.asarray(jax.jit(fn)(x, w, m)['d'])
    assert np.all(np.abs(out - 1.0) < 0.5), out


def test_geometric_median_decreases_the_weighted_objective_and_weights_count():
  rng = np.random.default_rng(5)
  x = rng.normal(size=(6, 4)).astype(np.float32)
  w = np.array([1, 1, 1, 1, 1, 20], np.float32)
  m = np.ones(6, bool)
  z = np.asarray(agg.geometric_median({'x': x}, w, m, 50, 1e-8)['x'], np.float64)
  z0 = np_mean(list(x.astype(np.float64)), w)
  assert _objective(x, w, z) < _objective(x, w, z0)
  assert np.linalg.norm(z - x[5]) < np.linalg.norm(z0 - x[5])     # the heavy client pulls the median to itself


def test_krum_ties_go_to_the_lowest_client_index():
  x = {'a': np.array([[0.0], [0.0], [0.0], [0.0], [1.0]], np.float32)}
  out = agg.krum(x, np.ones(5, np.float32), np.ones(5, bool), 1)
  assert float(out['a'][0]) == 0.0
  scores = np.asarray(agg.krum_scores(x, np.array([1, 1, 0, 1, 1], bool), 1))
  assert np.isinf(scores[2]) and np.all(np.isfinite(scores[[0, 1, 3, 4]]))


@pytest.mark.parametrize('seed,c,masked,f', [(0, 7, (2, 5), 1), (1, 7, (0,), 1), (6, 14, (4, 9), 2)])
def test_bulyan_matches_numpy(seed, c, masked, f):
  """n = 5 and 6 with f = 1 (theta, beta clamped: below 4 f + 3), and n = 12 with f = 2 (the paper's regime:
  theta = 8 picks, beta = 4 values per coordinate) with two outliers the recursive Krum must leave out."""
  uploads, weights, mask = _problem(seed, c=c, masked=masked)
  if c == 14:
    uploads['w'][0] += 50.0
    uploads['b'][7] -= 80.0
  got = jax.jit(lambda u, w, m: agg.bulyan(u, w, m, f))(uploads, weights, mask)
  xs, _ = _flat_rows(uploads, mask)
  np.testing.assert_allclose(_flat_one(got), np_bulyan(xs, None, f), rtol=1e-5, atol=1e-5)
  if c != 14:
    return
  chosen = np.asarray(agg.bulyan_selection(uploads, mask, 2))
  assert chosen.sum() == 8 and not chosen[[0, 7, 4, 9]].any()


def test_centered_clipping_starts_from_the_center_and_each_client_moves_it_at_most_tau_over_n():
  uploads, weights, mask = _problem(7)
  xs, _ = _flat_rows(uploads, mask)
  center = {'w': np.full((3, 2), 0.3, np.float32), 'b': np.full((4,), -0.2, np.float32)}
  got = jax.jit(lambda u, w, m, c: agg.centered_clipping(u, w, m, c, 0.5, 2))(uploads, weights, mask, center)
  np.testing.assert_allclose(_flat_one(got), np_centered_clipping(xs, None, _flat_one(center), 0.5, 2),
                             rtol=1e-5, atol=1e-5)
  one = agg.centered_clipping(uploads, weights, mask, center, 0.5, 1)
  assert np.linalg.norm(_flat_one(one) - _flat_one(center)) <= 0.5 + 1e-6     # a convex mix of steps <= tau
  # a huge tau: no clipping, one iteration = the plain mean of the valid uploads (weights are not read)
  np.testing.assert_allclose(_flat_one(agg.centered_clipping(uploads, weights, mask, center, 1e9, 1)),
                             np.mean(xs, axis=0), rtol=1e-5, atol=1e-6)


def test_norm_bounding_clips_only_the_long_uploads():
  x = {'a': np.array([[3.0, 4.0], [0.3, 0.4], [np.nan, np.nan]], np.float32)}
  w, m = np.array([1.0, 3.0, 0.0], np.float32), np.array([True, True, False])
  out = np.asarray(agg.norm_bounding(x, w, m, 1.0)['a'])
  np.testing.assert_allclose(out, (np.array([0.6, 0.8]) * 1 + np.array([0.3, 0.4]) * 3) / 4, rtol=1e-6)


def test_new_robust_aggregators_resist_one_outlier():
  rng = np.random.default_rng(8)
  honest = rng.normal(size=(10, 5)).astype(np.float32) * 0.1 + 1.0
  x = {'d': np.concatenate([honest, np.full((1, 5), 1e4, np.float32)])}
  w, m = np.ones(11, np.float32), np.ones(11, bool)
  out = np.asarray(jax.jit(lambda *a: agg.bulyan(*a, 2))(x, w, m)['d'])
  assert np.all(np.abs(out - 1.0) < 0.5), out
  # bounded influence: the outlier moves the clipped mean by at most bound / n
  center = {'d': np.ones(5, np.float32)}
  out = np.asarray(agg.centered_clipping(x, w, m, center, 0.5, 1)['d'])
  assert np.linalg.norm(out - 1.0) < 0.5 * 11 / 11 + 0.1
  out = np.asarray(agg.norm_bounding(x, w, m, 3.0)['d'])
  assert np.all(np.abs(out - 1.0) < 0.5), out
