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
  ids = sampling.sample_clients(100_000, 25, seed=7, round_idx=4, sampler='sort')
  ref = _full_sort(sampling.seed_key(7), 4, 100_000, 25, 100_000)
  np.testing.assert_array_equal(ids, np.asarray(ref))
  assert len(np.unique(ids)) == 25


# ---- sampler='floyd': O(cohort) draws ---------------------------------------------------------------------

@pytest.mark.parametrize('n,c', [(5, 5), (30, 7), (1_000_000, 50)])
def test_floyd_draws_distinct_ids_in_range_same_on_host_and_traced(n, c):
  key = sampling.seed_key(1)
  traced = jax.jit(lambda r: sampling.floyd_ids(key, r, n, c))
  for r in range(6):
    ids = sampling.sample_clients(n, c, seed=1, round_idx=r, sampler='floyd')
    assert len(np.unique(ids)) == c and ids.min() >= 0 and ids.max() < n and (np.diff(ids) > 0).all()
    np.testing.assert_array_equal(ids, np.asarray(traced(r)))
  assert sampling.procedure('floyd') != sampling.procedure('sort') == sampling.PROCEDURE


def test_floyd_is_uniform_over_subsets():
  # K=5, C=2: 10 subsets, each 1/10; 4,000 rounds -> every count within 5 standard deviations of 400.
  draws = jax.jit(jax.vmap(lambda r: sampling.floyd_ids(sampling.seed_key(0), r, 5, 2)))(jnp.arange(4000))
  pairs = np.asarray(draws)
  _, counts = np.unique(pairs[:, 0] * 5 + pairs[:, 1], return_counts=True)
  assert len(counts) == 10 and np.abs(counts - 400).max() < 5 * np.sqrt(4000 * 0.1 * 0.9)


def test_floyd_run_device_path_equals_host_path_and_default_unchanged():
  """sampler='floyd' through the one-program device block and the host driver trains the same bits; the default
  sampler is the sort's procedure (what summary.json records)."""
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.training import driver as driver_lib
  from fedjax_flat.training import trainers
  from tests.fixtures.configs import small_config
  data = synthetic(300, 2, input_shape=(4,), num_classes=3, seed=0)
  cfg = small_config(**{'data.num_clients': 300, 'model': 'mlp', 'clients_per_round': 10, 'rounds': 3,
                        'sampler': 'floyd'})
  dev = trainers.make_trainer(cfg, data=data)
  assert isinstance(dev.driver, driver_lib.DeviceDriver)
  dev.train()
  host = trainers.make_trainer(cfg, data=data)
  hd = driver_lib.HostDriver(host.plan)
  for r in range(3):
    host.server_state, _ = hd.run_round(host.server_state, host.store, r, hd.prepare_round(r))
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(dev.server_state['params']),
                         jax.device_get(host.server_state['params']))
  assert dev.plan.sample_round(1).tolist() == sampling.sample_clients(300, 10, seed=cfg.seed, round_idx=1,
                                                                      sampler='floyd').tolist()


def test_floyd_refused_where_unused():
  from fedjax_flat.config.validate import validate_config
  from fedjax_flat.errors import ConfigError
  from fedjax_flat.training import packing
  from tests.fixtures.configs import small_config
  cfg = small_config(sampler='floyd')
  assert 'sampler' in packing.batch_blocker(cfg)
  cfg.algorithm = 'hfl'
  with pytest.raises(ConfigError, match='sampler'):
    validate_config(cfg)


def test_auto_is_sort_up_to_the_threshold_and_floyd_above(monkeypatch):
  """The default sampler='auto': 'sort' (every earlier run's clients) up to AUTO_FLOYD_ABOVE clients, 'floyd' above;
  the host draw, the compiled block's draw, the recorded procedure and the runs-program blocker all follow it."""
  from fedjax_flat.config.default_config import default_config
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.training import packing
  from fedjax_flat.training import trainers
  from tests.fixtures.configs import small_config
  assert default_config().sampler == 'auto'
  t = sampling.AUTO_FLOYD_ABOVE
  assert sampling.resolve('auto', t) == 'sort' and sampling.resolve('auto', t + 1) == 'floyd'
  assert sampling.resolve('sort', 10**6) == 'sort' and sampling.resolve('floyd', 10) == 'floyd'
  with pytest.raises(ValueError, match='sampler'):
    sampling.resolve('shuffle', 10)
  for n in (t, t + 1):
    want = 'sort' if n == t else 'floyd'
    assert sampling.sample_clients(n, 7, seed=3, round_idx=2).tolist() == sampling.sample_clients(
        n, 7, seed=3, round_idx=2, sampler=want).tolist()
    assert sampling.procedure('auto', n) == sampling.procedure(want)
  with pytest.raises(ValueError, match='num_clients'):
    sampling.procedure('auto')
  data = synthetic(300, 2, input_shape=(4,), num_classes=3, seed=0)
  cfg = small_config(**{'data.num_clients': 300, 'model': 'mlp', 'clients_per_round': 10, 'rounds': 2})
  small = trainers.make_trainer(cfg, data=data)
  assert small.plan.sampler.sampler == 'sort' and small.plan.device_sampler() is None
  assert packing.batch_blocker(cfg) is None and packing.trainer_blocker(small) is None
  monkeypatch.setattr(sampling, 'AUTO_FLOYD_ABOVE', 100)     # 300 clients are now a large population
  big = trainers.make_trainer(cfg, data=data)
  assert big.plan.sampler.sampler == 'floyd' and big.plan.sampler.procedure == sampling.FLOYD_PROCEDURE
  assert big.plan.sample_round(1).tolist() == sampling.sample_clients(300, 10, seed=cfg.seed, round_idx=1,
                                                                      sampler='floyd').tolist()
  dev = jax.jit(big.plan.device_sampler())
  assert np.asarray(dev(sampling.seed_key(cfg.seed), jnp.int32(1))).tolist() == big.plan.sample_round(1).tolist()
  assert 'floyd' in packing.trainer_blocker(big)
