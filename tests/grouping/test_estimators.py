"""Estimators psi (fedjax_flat/grouping/estimators.py) against their formulas on tiny problems."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.grouping import estimators
from fedjax_flat.models.base import from_flax


class Tiny(nn.Module):
  """h = tanh(x W1) (+ a GroupNorm-free 'scale'-less feature extractor), logits = h W2."""

  @nn.compact
  def __call__(self, x, train=False):
    h = jnp.tanh(nn.Dense(3, use_bias=False, name='feat')(x))
    return nn.Dense(4, use_bias=True, name='classifier')(h)


def _tiny():
  model = from_flax(Tiny(), 'tiny', 4, (5,))
  params = model.init(jax.random.key(0), jnp.zeros((1, 5)))
  return model, params


def _softmax(z):
  e = np.exp(z - z.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def test_pca_keeps_at_least_the_variance_and_no_more_components_than_needed():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(60, 12)) * np.geomspace(10, 0.1, 12)     # a decaying spectrum
  for v in (0.5, 0.9, 0.99):
    z, info = estimators.pca_reduce(x, v, standardize=False)
    centered = x - x.mean(axis=0)
    s = np.linalg.svd(centered, compute_uv=False) ** 2
    ratio = np.cumsum(s) / s.sum()
    k = info['components']
    assert z.shape == (60, k)
    assert ratio[k - 1] >= v and (k == 1 or ratio[k - 2] < v)     # the fewest components reaching v
    assert info['explained'] == pytest.approx(ratio[k - 1])
    # The projection keeps the pairwise geometry of the kept subspace: variance of z = kept variance.
    assert np.sum(z.var(axis=0) * 60) == pytest.approx(s[:k].sum(), rel=1e-9)
  z, info = estimators.pca_reduce(x, 0.9, standardize=True)
  xs = (x - x.mean(0)) / x.std(0)
  s = np.linalg.svd(xs, compute_uv=False) ** 2
  assert info['explained'] >= 0.9 and info['explained'] == pytest.approx(np.cumsum(s)[info['components'] - 1] / s.sum())
  z, info = estimators.pca_reduce(x, 1.0, standardize=False)       # 1 (or 0): no reduction
  assert info['components'] == 12 and np.allclose(z, x)


def test_confidence_vector_is_eq_5_1_on_a_tiny_model():
  model, params = _tiny()
  rng = np.random.default_rng(1)
  x = rng.normal(size=(12, 5)).astype(np.float32)
  y = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 1, 2])               # J = 4 of classes 0-2, class 3 absent
  logits = np.asarray(model.apply(params, jnp.asarray(x)))
  probs = _softmax(logits.astype(np.float64))
  p = np.array([probs[y == c, c].mean() if np.any(y == c) else 0.0 for c in range(4)])
  expected = _softmax(p)
  got = estimators.confidence_vector(model.apply(params, jnp.asarray(x)), jnp.asarray(y), 4)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)
  assert np.asarray(got).sum() == pytest.approx(1.0, abs=1e-6)


def test_public_set_takes_j_per_class_from_the_test_split():
  ty = np.array([0] * 15 + [1] * 3 + [2] * 12)
  idx = estimators.public_set(ty, 3, 10, seed=4)
  assert np.bincount(ty[idx]).tolist() == [10, 3, 10]               # fewer when the split has fewer
  np.testing.assert_array_equal(idx, estimators.public_set(ty, 3, 10, seed=4))
  assert not np.array_equal(idx, estimators.public_set(ty, 3, 10, seed=5))


def test_classifier_vector_is_the_classifier_kernel():
  _, params = _tiny()
  v = estimators.classifier_vector(params, 'classifier')
  np.testing.assert_array_equal(np.asarray(v), np.asarray(params['classifier']['kernel']).ravel())
  feat, clf = estimators.split_paths(params, 'classifier')
  assert feat == ('feat/kernel',) and clf == ('classifier/bias', 'classifier/kernel')
  with pytest.raises(ValueError, match='matches no parameter'):
    estimators.split_paths(params, 'head')


def _hand_fisher_terms(params, x):
  """Per-example d log p(c|x) / d W1 for every class c, by the chain rule: [N, C, 5, 3]."""
  w1 = np.asarray(params['feat']['kernel'], np.float64)
  w2 = np.asarray(params['classifier']['kernel'], np.float64)
  b2 = np.asarray(params['classifier']['bias'], np.float64)
  h = np.tanh(x @ w1)
  p = _softmax(h @ w2 + b2)
  grads = []
  for c in range(4):
    dz = np.eye(4)[c] - p                           # d log p_c / d logits
    dh = dz @ w2.T * (1 - h ** 2)                   # [N, 3]
    grads.append(x[:, :, None] * dh[:, None, :])    # [N, 5, 3]
  return np.stack(grads, axis=1), p


def test_task2vec_fisher_equals_the_hand_computed_diagonal_fisher():
  model, params = _tiny()
  rng = np.random.default_rng(2)
  x = rng.normal(size=(8, 5)).astype(np.float32)
  mask = np.array([1, 1, 1, 1, 1, 1, 0, 0], np.float32)            # two padding examples
  batch = {'x': jnp.asarray(x), 'y': jnp.zeros(8, jnp.int32), 'mask': jnp.asarray(mask)}
  apply_fn = lambda p, xx: model.apply(p, xx)
  g, p = _hand_fisher_terms(params, x.astype(np.float64))
  valid = mask > 0
  # exact: sum_c p_c g_c^2, averaged over the valid examples.
  exact = np.einsum('nc,ncij->nij', p, g ** 2)[valid].mean(axis=0)
  sums, count = estimators.fisher_sums(apply_fn, params, batch, jax.random.key(3), feature_paths=('feat/kernel',),
                                       mode='exact', examples_per_pass=4)
  assert float(count) == 6
  np.testing.assert_allclose(np.asarray(sums['feat/kernel']) / 6, exact, rtol=1e-4, atol=1e-7)
  # montecarlo: the sampled class of example e is categorical(fold_in(rng, e), log p).
  rng_key = jax.random.key(3)
  ys = [int(jax.random.categorical(jax.random.fold_in(rng_key, e), jnp.log(jnp.asarray(p[e], jnp.float32))))
        for e in range(8)]
  mc = np.stack([g[e, ys[e]] ** 2 for e in range(8)])[valid].mean(axis=0)
  sums, _ = estimators.fisher_sums(apply_fn, params, batch, rng_key, feature_paths=('feat/kernel',),
                                   mode='montecarlo', examples_per_pass=3)       # 8 -> passes of 2
  np.testing.assert_allclose(np.asarray(sums['feat/kernel']) / 6, mc, rtol=1e-4, atol=1e-7)
  # The embedding: per filter (output unit) mean over the input axis.
  vec = estimators.task2vec_vector({'feat/kernel': jnp.asarray(exact), 'feat/bias': jnp.ones(3)})
  np.testing.assert_allclose(np.asarray(vec), exact.mean(axis=0), rtol=1e-6)


def test_task2vec_vector_orders_leaves_and_keeps_scales():
  f = {'b/kernel': jnp.arange(6.0).reshape(2, 3), 'a/scale': jnp.array([7.0, 8.0]), 'a/bias': jnp.ones(2)}
  np.testing.assert_allclose(np.asarray(estimators.task2vec_vector(f)), [7, 8, 1.5, 2.5, 3.5])
  with pytest.raises(ValueError, match='no kernel'):
    estimators.task2vec_vector({'a/bias': jnp.ones(2)})
