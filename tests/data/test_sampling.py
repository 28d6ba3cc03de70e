"""data/sampling.py: the threshold shortcut of large populations draws exactly the full sort's clients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.data import sampling


def _full_sort(key, r, n, c, size):
  """The procedure's definition: the first c of a stable sort of the population's keys, sorted by id."""
  k = jax.random.fold_in(jax.random.fold_in(key, sampling.SAMPLE_STREAM), r)
  return jnp.sort(sampling.random_permutation(k, n, size)[:c])


@pytest.mark.parametrize('n,c', [(1000, 20), (20_000, 50), (300_000, 10)])
def test_shortcut_equals_full_sort(n, c):
  assert sampling._candidates(c) * 4 <= n          # these populations take the shortcut
  key = sampling.seed_key(3)
  fast = jax.jit(lambda r: sampling.sample_ids(key, r, n, c))
  ref = jax.jit(lambda r: _full_sort(key, r, n, c, n))
  for r in range(12):
    np.testing.assert_array_equal(np.asarray(fast(r)), np.asarray(ref(r)))


def test_shortcut_with_traced_population_in_padded_size():
  key = sampling.seed_key(0)
  fast = jax.jit(lambda r, n: sampling.sample_ids(key, r, n, 20, size=8000))
  ref = jax.jit(lambda r, n: _full_sort(key, r, n, 20, 8000))
  for n in (20, 150, 2500, 8000):
    for r in range(5):
      ids = np.asarray(fast(r, n))
      np.testing.assert_array_equal(ids, np.asarray(ref(r, n)))
      assert ids.max() < n and len(set(ids.tolist())) == 20


@pytest.mark.parametrize('every', [5000, 20])
def test_fallback_is_exact(every):
  # every 5000th key small: 10 < c below the threshold; every 20th: 2500, more than the candidate room. Either
  # way the full sort runs and answers the same (ties among the equal keys: lower ids first).
  key = jax.random.key(0)
  c, size = 30, 50_000
  bits = jnp.full((size,), 0xFFFFFFF0, jnp.uint32).at[jnp.arange(0, size, every)].set(jnp.uint32(5))

  def smallest(bits_):
    order = jnp.argsort(bits_, stable=True)
    return jnp.sort(order[:c].astype(jnp.int32))
  orig = jax.random.bits
  try:
    jax.random.bits = lambda k, shape, dtype: bits
    got = sampling._smallest_keys(key, size, size, c)
  finally:
    jax.random.bits = orig
  np.testing.assert_array_equal(np.asarray(got), np.asarray(smallest(bits)))


def test_host_sampler_matches_device_and_draws_distinct_ids():
  ids = sampling.sample_clients(100_000, 25, seed=7, round_idx=4)
  ref = _full_sort(sampling.seed_key(7), 4, 100_000, 25, 100_000)
  np.testing.assert_array_equal(ids, np.asarray(ref))
  assert len(np.unique(ids)) == 25
