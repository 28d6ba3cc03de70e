"""DP mechanisms (privacy/mechanism.py) against their formulas on tiny problems."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.privacy import mechanism as mech


def tree(scale=1.0):
  rng = np.random.default_rng(0)
  return {'a': jnp.asarray(scale * rng.normal(size=(3, 4)), jnp.float32),
          'b': jnp.asarray(scale * rng.normal(size=(5,)), jnp.float32)}


def np_norm(t):
  return math.sqrt(sum(float(np.sum(np.square(np.asarray(x, np.float64)))) for x in jax.tree_util.tree_leaves(t)))


@pytest.mark.parametrize('c', [0.5, 100.0])
def test_flat_clip_scales_to_min_norm_c_and_keeps_the_direction(c):
  t = tree()
  n = np_norm(t)
  clipped, norm = mech.clip(t, c)
  np.testing.assert_allclose(float(norm), n, rtol=1e-6)
  np.testing.assert_allclose(np_norm(clipped), min(n, c), rtol=1e-5)
  s = min(1.0, c / n)
  for x, y in zip(jax.tree_util.tree_leaves(clipped), jax.tree_util.tree_leaves(t)):
    np.testing.assert_allclose(x, s * np.asarray(y), rtol=1e-5)


def test_per_layer_clip_bounds_each_leaf_by_c_over_sqrt_l_and_the_whole_by_c():
  t = {'a': jnp.full((4,), 3.0), 'b': jnp.full((2,), 0.01)}   # norms 6 and 0.0141
  clipped, _ = mech.clip(t, 1.0, per_layer=True)
  np.testing.assert_allclose(np_norm({'a': clipped['a']}), 1 / math.sqrt(2), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(clipped['b']), np.asarray(t['b']), rtol=1e-6)   # already within C/sqrt(L)
  assert np_norm(clipped) <= 1.0 + 1e-6


def test_per_tensor_clip_bounds_each_leaf_by_c_and_keeps_small_leaves():
  tree = {'a': jnp.array([3.0, 4.0]), 'b': jnp.array([0.1, 0.2, 0.2]), 'c': jnp.full((4,), 10.0)}
  out, norm = mech.clip(tree, 1.0, per_tensor=True)
  np.testing.assert_allclose(np.asarray(out['a']), [0.6, 0.8], rtol=1e-6)         # norm 5 -> 1
  np.testing.assert_array_equal(np.asarray(out['b']), np.asarray(tree['b']))      # norm 0.3: kept
  np.testing.assert_allclose(np.linalg.norm(np.asarray(out['c'])), 1.0, rtol=1e-6)
  total = math.sqrt(sum(float(jnp.sum(x ** 2)) for x in out.values()))
  assert total <= 1.0 * math.sqrt(3) + 1e-6                                       # the accountant's bound C sqrt(L)
  np.testing.assert_allclose(float(norm), math.sqrt(25 + 0.09 + 400), rtol=1e-6)


def test_gaussian_noise_has_mean_zero_and_the_std_over_many_keys():
  std = 0.7
  keys = jax.random.split(jax.random.PRNGKey(3), 4000)
  draws = jax.vmap(lambda k: mech.gaussian(k, tree(), std))(keys)
  for x in jax.tree_util.tree_leaves(draws):
    x = np.asarray(x).reshape(4000, -1)
    # 4000 x (12 or 5) draws: the mean's std is std / sqrt(n) <= 0.7 / 141 = 0.005; 5 sigma
    assert abs(x.mean()) < 5 * std / math.sqrt(x.size)
    np.testing.assert_allclose(x.std(), std, rtol=0.03)
    assert abs(np.corrcoef(x[:, 0], x[:, 1])[0, 1]) < 0.06   # coordinates independent


def test_noisy_mean_without_noise_is_the_exact_sum_over_the_expected_cohort():
  t = tree()
  got = mech.noisy_mean(jax.random.PRNGKey(0), t, 0.0, 4)
  for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(t)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y) / np.float32(4))


def test_noisy_mean_noise_std_is_std_sum_over_m():
  keys = jax.random.split(jax.random.PRNGKey(1), 2000)
  zero = {'w': jnp.zeros((10,))}
  draws = np.asarray(jax.vmap(lambda k: mech.noisy_mean(k, zero, 2.0, 8)['w'])(keys))
  np.testing.assert_allclose(draws.std(), 2.0 / 8, rtol=0.03)


def test_adaptive_clip_geometric_update_formula():
  c, b_bar = mech.adaptive_clip(jnp.float32(0.1), 7.0, jax.random.PRNGKey(0), 0.0, 10, 0.5, 0.2)
  np.testing.assert_allclose(float(b_bar), 0.7, rtol=1e-6)
  np.testing.assert_allclose(float(c), 0.1 * math.exp(-0.2 * (0.7 - 0.5)), rtol=1e-6)


@pytest.mark.parametrize('quantile', [0.5, 0.8])
def test_adaptive_clip_converges_to_the_target_quantile_of_synthetic_norms(quantile):
  """Log-normal update norms, 100 clients a round, the paper's count noise (m / 20): from TFF's initial clip 0.1
  the clip reaches the target quantile of the norm distribution within a few percent."""
  rng = np.random.default_rng(0)
  m = 100

  def step(c, key):
    k_norm, k_noise = jax.random.split(key)
    norms = jnp.exp(0.5 * jax.random.normal(k_norm, (m,)))    # median 1
    below = jnp.sum((norms <= c).astype(jnp.float32))
    c, _ = mech.adaptive_clip(c, below, k_noise, m / 20, m, quantile, 0.2)
    return c, c

  _, cs = jax.lax.scan(step, jnp.float32(0.1), jax.random.split(jax.random.PRNGKey(int(rng.integers(99))), 400))
  want = math.exp(0.5 * float(jax.scipy.stats.norm.ppf(quantile)))   # the quantile of exp(N(0, 0.25))
  got = float(np.mean(np.asarray(cs)[-200:]))
  np.testing.assert_allclose(got, want, rtol=0.05)
  assert float(cs[0]) < 0.2 * want      # it did start far below


def test_value_multiplier_shares_z_between_the_two_queries():
  z, sb = 1.0, 2.0
  zv = mech.value_multiplier(z, sb, True)
  np.testing.assert_allclose((zv ** -2 + (2 * sb) ** -2) ** -0.5, z, rtol=1e-12)   # Andrew et al., Theorem 1
  assert mech.value_multiplier(z, sb, False) == z
  assert mech.value_multiplier(0.0, sb, True) == 0.0     # no noise stays no noise


@pytest.mark.parametrize('m,big_m', [(5, 5), (5, 100), (16, 40)])
def test_noise_shares_per_mode(m, big_m):
  # Central: nothing at the client, std z C m / M on the sum. Distributed: m client shares whose variances add up
  # to the central sum's. Local: std z C per client, so sqrt(m) z C on the sum of m independent draws.
  assert mech.client_noise_share('central', m, big_m) == 0.0
  assert mech.sum_noise_share('central', m, big_m) == m / big_m
  share = mech.client_noise_share('distributed', m, big_m)
  np.testing.assert_allclose(m * share ** 2, mech.sum_noise_share('distributed', m, big_m) ** 2, rtol=1e-12)
  assert mech.client_noise_share('local', m, big_m) == 1.0
  np.testing.assert_allclose(mech.sum_noise_share('local', m, big_m), math.sqrt(m * 1.0 ** 2), rtol=1e-12)
  # Measured: the sum of m distributed draws has the central std.
  draws = [mech.gaussian(jax.random.key(k), jnp.zeros((20_000,)), share) for k in range(m)]
  np.testing.assert_allclose(float(jnp.std(sum(draws))), mech.sum_noise_share('central', m, big_m), rtol=0.03)
