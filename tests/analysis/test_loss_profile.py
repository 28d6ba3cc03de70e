"""The loss-vs-gradient-weight profile (analysis/loss_profile.py): per-example losses and gradient norms of a linear
softmax model against their closed form, the correlations and bins against NumPy."""
import jax
import numpy as np
import pytest

from fedjax_flat.analysis import loss_profile
from fedjax_flat.analysis.data import make_fixed_batches
from fedjax_flat.models.registry import get_model


def test_per_example_loss_and_gradient_norm_of_a_linear_softmax_model():
  # logits = W^T x + b: the gradient of example i is (p_i - e_y) x_i^T for W and p_i - e_y for b, so its norm is
  # ||p_i - e_y|| * sqrt(||x_i||^2 + 1).
  rng = np.random.default_rng(0)
  x = rng.normal(size=(7, 3, 1, 1)).astype(np.float32)
  y = rng.integers(0, 4, size=7).astype(np.int32)
  model = get_model('mlp', 4, (3, 1, 1), hidden=())
  params = model.init(jax.random.key(1), x[:1])
  d = params['Dense_0']
  w, b = np.asarray(d['kernel'], np.float64), np.asarray(d['bias'], np.float64)
  z = x.reshape(7, 3).astype(np.float64) @ w + b
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  want_loss = -np.log(p[np.arange(7), y])
  r = p - np.eye(4)[y]
  want_norm = np.linalg.norm(r, axis=1) * np.sqrt(np.sum(x.reshape(7, 3).astype(np.float64) ** 2, 1) + 1)
  losses, norms = loss_profile.per_example_loss_gradnorm(model, params, make_fixed_batches(x, y, 3))  # padded
  np.testing.assert_allclose(losses, want_loss, rtol=1e-5)
  np.testing.assert_allclose(norms, want_norm, rtol=1e-5)


def test_profile_correlations_and_bins_match_numpy():
  rng = np.random.default_rng(3)
  losses = rng.exponential(size=23)
  norms = 2 * losses + rng.normal(size=23)
  out = loss_profile.loss_gradnorm_profile(losses, norms, bins=4)
  assert out['pearson'] == pytest.approx(np.corrcoef(losses, norms)[0, 1], rel=1e-10)
  rank = lambda a: np.argsort(np.argsort(a)).astype(float)      # noqa: E731  (no ties in continuous draws)
  assert out['spearman'] == pytest.approx(np.corrcoef(rank(losses), rank(norms))[0, 1], rel=1e-10)
  order = np.argsort(losses)
  assert [b['count'] for b in out['bins']] == [6, 6, 6, 5]
  start = 0
  for b in out['bins']:
    idx = order[start:start + b['count']]
    start += b['count']
    assert b['loss_mean'] == pytest.approx(losses[idx].mean())
    assert b['gradnorm_mean'] == pytest.approx(norms[idx].mean())
    assert (b['loss_lo'], b['loss_hi']) == (losses[idx].min(), losses[idx].max())


def test_spearman_gives_ties_their_average_rank_and_a_constant_side_no_correlation():
  out = loss_profile.loss_gradnorm_profile([1.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0], bins=2)
  ra, rb = np.array([1.5, 1.5, 3, 4]), np.array([1.0, 2, 3, 4])
  assert out['spearman'] == pytest.approx(np.corrcoef(ra, rb)[0, 1], rel=1e-12)
  assert loss_profile.loss_gradnorm_profile([1.0, 1.0], [0.5, 2.0])['pearson'] == 0.0
  with pytest.raises(ValueError, match='same non-empty'):
    loss_profile.loss_gradnorm_profile([1.0], [1.0, 2.0])
