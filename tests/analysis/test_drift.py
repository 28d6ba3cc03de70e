"""Client drift and update sparsity (analysis/drift.py) against NumPy on random updates."""
import numpy as np
import pytest

from fedjax_flat.analysis import drift as drift_lib


def _np_cos(a, b):
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_flat_updates_are_the_raveled_differences():
  start = {'a': np.zeros((2, 2), np.float32), 'b': np.ones((3,), np.float32)}
  c1 = {'a': np.arange(4, dtype=np.float32).reshape(2, 2), 'b': np.full((3,), 3.0, np.float32)}
  d = np.asarray(drift_lib.flat_updates(start, [c1, start]))
  np.testing.assert_array_equal(d, [[0, 1, 2, 3, 2, 2, 2], [0] * 7])


def test_drift_matches_numpy_with_weights_and_a_zero_update():
  rng = np.random.default_rng(0)
  d = rng.normal(size=(4, 30)).astype(np.float32)
  d[3] = 0                                        # a client that did not move: no direction, cosine 0
  n = np.array([1.0, 2.0, 3.0, 4.0])
  out = drift_lib.update_drift(d, n)
  agg = (n / n.sum()) @ d.astype(np.float64)
  norms = np.linalg.norm(d, axis=1)
  cos = np.array([_np_cos(r, agg) for r in d[:3]] + [0.0])
  np.testing.assert_allclose(out['aggregate'], agg, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(out['norms'], norms, rtol=1e-6)
  np.testing.assert_allclose(out['cosines'], cos, rtol=1e-5, atol=1e-7)
  assert float(out['norm_mean']) == pytest.approx(norms.mean(), rel=1e-6)
  assert float(out['norm_max']) == pytest.approx(norms.max(), rel=1e-6)
  assert float(out['cos_mean']) == pytest.approx(cos.mean(), rel=1e-5)
  assert float(out['cos_min']) == pytest.approx(cos.min(), abs=1e-7)
  assert float(out['aggregate_norm']) == pytest.approx(np.linalg.norm(agg), rel=1e-5)
  uniform = drift_lib.update_drift(d)                    # no weights: the plain mean
  np.testing.assert_allclose(uniform['aggregate'], d.mean(0), rtol=1e-5, atol=1e-7)


def test_sparsity_is_relative_to_each_updates_largest_entry():
  d = np.array([[1.0, 0.01, -0.001, 0.0005, -2.0],      # max 2: <= 0.002 are 0.001 and 0.0005 -> 2/5
                [0.0] * 5,                               # nothing moved: fully sparse
                [1.0, -1.0, 1.0, 1.0, 1.0]], np.float32)  # dense
  got = np.asarray(drift_lib.update_sparsity(d, 1e-3))
  a = np.abs(d)
  want = np.mean(a <= 1e-3 * a.max(1, keepdims=True), axis=1)
  np.testing.assert_allclose(got, want)
  np.testing.assert_allclose(got, [0.4, 1.0, 0.0])
