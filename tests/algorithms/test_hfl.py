"""H-FL (algorithms/hfl.py): one cluster with T_c = 1 is FedAvg round for round (server SGD and Adam), two
clusters average their own clients only and meet at the top server every T_c rounds, messages counted at both
tiers, stratified sampling takes clients_per_cluster members of every cluster."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_flat.algorithms import hfl
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.config.default_config import default_config
from fedjax_flat.core import engine
from fedjax_flat.data import sampling
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.errors import ConfigError
from fedjax_flat.models import base
from fedjax_flat.training import trainers
from tests.fixtures.configs import small_config

SIZES = np.array([6.0, 3.0, 5.0, 2.0], np.float32)


class Tiny(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    return nn.Dense(3)(nn.relu(nn.Dense(5)(x.reshape(x.shape[0], -1))))


MODEL = base.from_flax(Tiny(), 'tiny', 3, (4,))
LOSS = local_lib.make_loss(MODEL)


def _cfg():
  c = default_config().client
  c.lr, c.momentum, c.weight_decay = 0.1, 0.0, 0.0
  return c


def _batches(seed=7):
  x = jax.random.normal(jax.random.PRNGKey(seed), (4, 3, 2, 4))
  y = jax.random.randint(jax.random.PRNGKey(seed + 1), (4, 3, 2), 0, 3)
  mask = np.zeros((4, 3, 2), np.float32)
  for k, n in enumerate(SIZES.astype(int)):
    mask[k].reshape(-1)[:n] = 1.0
  return {'x': x, 'y': y, 'mask': jnp.asarray(mask)}


def _run(alg, states, rounds):
  fn = engine.make_round_fn(alg, chunk=1, donate=False)
  s = alg.server_init(MODEL.init(jax.random.PRNGKey(0), jnp.zeros((1, 4))), None)
  rngs = jnp.stack([jax.random.PRNGKey(3)] * 4)
  for r in range(rounds):
    s, _, _ = fn(s, _batches(r), states, rngs, jnp.asarray(SIZES), jnp.ones(4, bool), r)
  return s


@pytest.mark.parametrize('server_tx', [optax.sgd(1.0), optax.adam(0.05)], ids=['sgd', 'adam'])
def test_one_cluster_and_sync_every_round_equals_fedavg(server_tx):
  h = hfl.hfl(MODEL, LOSS, *client_parts(_cfg()), server_tx, num_clusters=1, cluster_sizes=[1.0], sync_every=1)
  f = fedavg(MODEL, LOSS, *client_parts(_cfg()), server_tx)
  sh = _run(h, hfl.initial_client_states(np.zeros(4)), 3)
  sf = _run(f, None, 3)
  got = h.eval_models(sh)['global'][0]
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(sf['params'])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  assert float(sh['messages_bottom']) == 3 * 2 * 4 and float(sh['messages_top']) == 3 * 2


def test_clusters_average_their_own_clients_and_meet_every_t_c_rounds():
  cluster = np.array([0, 1, 0, 1])
  sizes = [SIZES[cluster == 0].sum(), SIZES[cluster == 1].sum()]
  h = hfl.hfl(MODEL, LOSS, *client_parts(_cfg()), optax.sgd(1.0), num_clusters=2, cluster_sizes=sizes, sync_every=2)
  states = hfl.initial_client_states(cluster)
  s1 = _run(h, states, 1)
  # After round 0 (no sync): cluster g's model is the N_k-weighted mean of its own clients' models.
  w0 = MODEL.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
  b = _batches(0)
  trained = []
  for k in range(4):
    one = fedavg(MODEL, LOSS, *client_parts(_cfg()), optax.sgd(1.0))
    st = one.server_init(w0, None)
    bk = {key: v[k:k + 1] for key, v in b.items()}
    sizes_k = jnp.asarray(SIZES[k:k + 1])
    out, _, _ = engine.make_round_fn(one, chunk=1, donate=False)(st, bk, None, jnp.stack([jax.random.PRNGKey(3)]),
                                                              sizes_k, jnp.ones(1, bool), 0)
    trained.append(out['params'])
  for g in (0, 1):
    ids = np.flatnonzero(cluster == g)
    want = jax.tree_util.tree_map(lambda *ps: sum(SIZES[k] * ps[i] for i, k in enumerate(ids)) / SIZES[ids].sum(),
                                  *[trained[k] for k in ids])
    got = jax.tree_util.tree_map(lambda x: x[g], s1['params'])
    for a, c in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-6)
  assert float(s1['messages_top']) == 0
  leaves = jax.tree_util.tree_leaves(s1['params'])
  assert any(not np.allclose(l[0], l[1]) for l in leaves)
  # After round 1 (sync): every cluster holds the top server's size-weighted average.
  s2 = _run(h, states, 2)
  for l in jax.tree_util.tree_leaves(s2['params']):
    np.testing.assert_array_equal(np.asarray(l[0]), np.asarray(l[1]))
  assert float(s2['messages_top']) == 2 * 2 and float(s2['messages_bottom']) == 2 * 2 * 4


def test_cluster_without_sampled_client_keeps_its_model():
  h = hfl.hfl(MODEL, LOSS, *client_parts(_cfg()), optax.sgd(1.0), num_clusters=3, cluster_sizes=[1, 1, 1], sync_every=5)
  s = _run(h, hfl.initial_client_states(np.array([0, 1, 0, 1])), 1)
  w0 = MODEL.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
  for a, b in zip(jax.tree_util.tree_leaves(s['params']), jax.tree_util.tree_leaves(w0)):
    np.testing.assert_array_equal(np.asarray(a[2]), np.asarray(b))


def test_stratified_sampling_takes_clients_of_every_cluster():
  cluster = np.repeat(np.arange(4), [7, 3, 10, 6])
  for r in range(5):
    ids = hfl.stratified_sample(cluster, 5, seed=0, round_idx=r)
    counts = np.bincount(cluster[ids], minlength=4)
    assert counts.tolist() == [5, 3, 5, 5] and len(set(ids.tolist())) == len(ids)
  a = hfl.stratified_sample(cluster, 5, seed=0, round_idx=0)
  assert not np.array_equal(a, hfl.stratified_sample(cluster, 5, seed=0, round_idx=1))
  np.testing.assert_array_equal(a, hfl.stratified_sample(cluster, 5, seed=0, round_idx=0))


def test_bad_arguments():
  with pytest.raises(ValueError, match='cluster_sizes'):
    hfl.hfl(MODEL, LOSS, *client_parts(_cfg()), optax.sgd(1.0), num_clusters=2, cluster_sizes=[1.0], sync_every=1)
  with pytest.raises(ValueError, match='sync_every'):
    hfl.hfl(MODEL, LOSS, *client_parts(_cfg()), optax.sgd(1.0), num_clusters=2, cluster_sizes=[1, 1], sync_every=0)


# --------------------------------------------------------------------------------- registered: train.py's path

GROUP_SIZES = [7, 3, 12, 2, 5, 9, 4, 10]


def _groups_data(city):
  data = synthetic(len(GROUP_SIZES), GROUP_SIZES, input_shape=(3, 3, 1), num_classes=4, seed=0)
  data.client_groups = {'city': np.asarray(city, np.int64), 'continent': np.zeros(len(city), np.int64)}
  return data


def _hfl_trainer(data, over=None, **engine):
  c = small_config(**(over or {}))
  c.rounds, c.eval_every = 3, 3
  c.data.num_clients = len(GROUP_SIZES)
  for k, v in engine.items():
    c.engine[k] = v
  if c.algorithm == 'hfl':
    c.algo.update({**alg_registry.default_hparams('hfl'), **c.algo.to_dict()})
  return trainers.make_trainer(c, data=data)


def test_registered_one_cluster_sync_every_round_is_fedavg_through_the_trainer():
  """train.py's path: with every client in one cluster and T_c = 1 the stratified sampler draws the uniform
  sampler's clients, and H-FL's evaluated model equals FedAvg's after 3 rounds (server SGD)."""
  data = _groups_data(np.zeros(len(GROUP_SIZES)))
  h = _hfl_trainer(data, {'algorithm': 'hfl', 'algo.clients_per_group': 3, 'algo.sync_every': 1},
                   device_data=False)
  f = _hfl_trainer(data, device_data=False)
  for r in range(3):
    np.testing.assert_array_equal(h.plan.sample_round(r), f.plan.sample_round(r))
  summary = h.train()
  assert 'messages' not in f.train()
  got = h.algorithm.eval_models(h.server_state)['global'][0]
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(f.server_state['params'])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  assert float(h.server_state['messages_bottom']) == 3 * 2 * 3 and float(h.server_state['messages_top']) == 3 * 2
  assert summary['messages'] == {'messages_bottom': 18.0, 'messages_top': 6.0}     # both tiers in summary.json


def test_registered_trainer_puts_each_city_in_its_client_state_and_samples_per_city():
  """Fast (no round runs): the trainer's store holds every client's city, and each round's clients (host
  sampler and the compiled block's sampler alike) are clients_per_group of every city."""
  city = np.array([1, 0, 1, 1, 0, 0, 1, 0])
  t = _hfl_trainer(_groups_data(city), {'algorithm': 'hfl', 'algo.clients_per_group': 2, 'clients_per_round': 4},
                   device_data=False)
  np.testing.assert_array_equal(np.asarray(t.store.gather(np.arange(len(city)))['cluster']), city)
  dev = jax.jit(t.plan.device_sampler())
  for r in range(5):
    ids = t.plan.sample_round(r)
    assert np.bincount(city[ids], minlength=2).tolist() == [2, 2]
    np.testing.assert_array_equal(np.asarray(dev(t.plan.key, r)), ids)


@pytest.mark.slow   # two trainers, ~30 s on the shared CPU: the fast test above checks the same wiring unrun
def test_registered_clusters_in_client_states_stratified_rounds_host_equals_device():
  """Two cities: every client's city is its initial client state, every round samples clients_per_group of
  each city, and the compiled multi-round block (on-device stratified sampling) equals the host rounds."""
  city = np.array([1, 0, 1, 1, 0, 0, 1, 0])
  over = {'algorithm': 'hfl', 'algo.clients_per_group': 2, 'algo.sync_every': 2, 'clients_per_round': 4}
  runs = {}
  for name, eng in {'host': dict(device_data=False), 'device': dict(rounds_per_call=3)}.items():
    t = _hfl_trainer(_groups_data(city), over, **eng)
    assert t.plan.device_rounds == (name == 'device')
    np.testing.assert_array_equal(np.asarray(t.store.gather(np.arange(len(city)))['cluster']), city)
    for r in range(3):
      ids = t.plan.sample_round(r)
      assert np.bincount(city[ids], minlength=2).tolist() == [2, 2]
    t.train()
    runs[name] = t
  for a, b in zip(jax.tree_util.tree_leaves(jax.device_get(runs['host'].server_state)),
                  jax.tree_util.tree_leaves(jax.device_get(runs['device'].server_state))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  s = runs['host'].server_state
  assert float(s['messages_bottom']) == 3 * 2 * 4 and float(s['messages_top']) == 1 * 2 * 2   # sync after round 1
  assert any(not np.allclose(np.asarray(l)[0], np.asarray(l)[1]) for l in jax.tree_util.tree_leaves(s['params']))


def test_registered_checks_name_the_fix():
  data = _groups_data(np.array([1, 0, 1, 1, 0, 0, 1, 0]))
  with pytest.raises(ConfigError, match='must be 4'):
    _hfl_trainer(data, {'algorithm': 'hfl', 'algo.clients_per_group': 2, 'clients_per_round': 3})
  plain = synthetic(len(GROUP_SIZES), GROUP_SIZES, input_shape=(3, 3, 1), num_classes=4, seed=0)
  with pytest.raises(ConfigError, match='algo.group_by'):
    _hfl_trainer(plain, {'algorithm': 'hfl', 'algo.clients_per_group': 1, 'clients_per_round': 1})
  cfg = small_config(algorithm='hfl')
  with pytest.raises(ConfigError, match='geographic clusters'):
    alg_registry.build_algorithm(cfg, MODEL, population=4)


def test_stratified_ids_traceable_equals_host_and_counts():
  groups = np.array([2, 0, 0, 1, 2, 2, 0, 1, 1, 1, 0])
  per = 2
  total = sampling.stratified_total(groups, per)
  assert total == 6
  fn = jax.jit(lambda r: sampling.stratified_ids(sampling.seed_key(4), r, groups, per, total))
  seen = np.zeros(len(groups))
  for r in range(300):
    ids = sampling.sample_clients_stratified(groups, per, seed=4, round_idx=r)
    np.testing.assert_array_equal(np.asarray(fn(r)), ids)
    assert list(ids) == sorted(set(ids.tolist())) and np.bincount(groups[ids], minlength=3).tolist() == [2, 2, 2]
    seen[ids] += 1
  # uniform within each group: a member of a group of n is drawn with probability per / n
  want = np.array([per / np.sum(groups == g) for g in groups]) * 300
  assert np.all(np.abs(seen / want - 1) < 0.2), (seen, want)
