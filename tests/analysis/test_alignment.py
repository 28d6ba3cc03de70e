"""Update alignment with the Hessian's top eigenvectors (analysis/alignment.py) against NumPy projections."""
import numpy as np
import pytest

from fedjax_flat.analysis import alignment


def test_subspace_fraction_matches_a_numpy_projection():
  rng = np.random.default_rng(1)
  basis = np.linalg.qr(rng.normal(size=(20, 3)))[0].T          # 3 orthonormal rows in R^20
  v = rng.normal(size=(4, 20)).astype(np.float32)
  v[2] = 0
  proj = v.astype(np.float64) @ basis.T @ basis
  want = [np.sum(p * p) / np.sum(r * r) if np.any(r) else 0.0 for p, r in zip(proj, v.astype(np.float64))]
  np.testing.assert_allclose(alignment.subspace_fraction(v, basis), want, rtol=1e-5, atol=1e-7)
  assert float(alignment.subspace_fraction(basis[1], basis)) == pytest.approx(1.0, rel=1e-5)   # in the span
  assert float(alignment.subspace_fraction(v[0], basis)) == pytest.approx(want[0], rel=1e-5)   # one vector


def test_top_subspace_of_a_known_operator_gives_its_top_eigenvectors():
  rng = np.random.default_rng(2)
  q = np.linalg.qr(rng.normal(size=(12, 12)))[0]
  lams = np.array([9.0, 7.0, 5.0] + [1.0] * 9)
  h = (q * lams) @ q.T
  pairs = alignment.top_subspace(lambda x: h.astype(np.float32) @ x, 12, 2, num_steps=12)
  np.testing.assert_allclose(pairs.eigenvalues, [9.0, 7.0], rtol=1e-4)
  v = rng.normal(size=(12,))
  want = np.sum((q[:, :2].T @ v) ** 2) / np.sum(v * v)     # the part of v along eigenvectors 1 and 2
  assert float(alignment.subspace_fraction(v, pairs.eigenvectors)) == pytest.approx(want, rel=1e-4)
