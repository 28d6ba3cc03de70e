"""Client-state stores: host (lazy dict) and device ([K, ...] arrays), checkpoint format, store selection, and
SCAFFOLD over a population of 100,000 clients whose state memory grows with the clients seen."""
import os

import jax
import numpy as np
import pytest

from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.core.client_state import (DeviceClientStateStore, DiskClientStateStore, HostClientStateStore,
                                           bytes_per_client, make_client_state_store, store_for)

TEMPLATE = {'a': np.zeros((2, 3), np.float32), 'b': {'c': np.zeros((), np.float32)}}


def _states(ids, offset=0.0):
  c = len(ids)
  return {'a': np.arange(c * 6, dtype=np.float32).reshape(c, 2, 3) + offset,
          'b': {'c': np.arange(c, dtype=np.float32) + 100 + offset}}


def _store(kind, k):
  return {'host': lambda: HostClientStateStore(TEMPLATE), 'device': lambda: DeviceClientStateStore(TEMPLATE, k),
          'disk': lambda: DiskClientStateStore(TEMPLATE, k)}[kind]()


@pytest.mark.parametrize('kind', ['host', 'device', 'disk'])
def test_gather_scatter_padding_and_lazy_template(kind):
  store = _store(kind, 10)
  ids = np.array([3, -1, 7])
  store.scatter(ids, _states(ids))
  assert len(store) == 2
  got = jax.device_get(store.gather(np.array([7, 5, -1, 3])))
  want = _states(ids)
  np.testing.assert_array_equal(got['a'][0], want['a'][2])
  np.testing.assert_array_equal(got['a'][1], 0)          # never seen: template
  np.testing.assert_array_equal(got['a'][2], 0)          # padding: template
  np.testing.assert_array_equal(got['a'][3], want['a'][0])
  np.testing.assert_array_equal(got['b']['c'], [102, 0, 0, 100])
  # overwrite one client
  store.scatter(np.array([7]), _states([7], offset=1000.0))
  np.testing.assert_array_equal(jax.device_get(store.gather(np.array([7])))['b']['c'], [1100])


def test_state_dict_is_interchangeable_between_stores():
  host = HostClientStateStore(TEMPLATE)
  ids = np.array([4, 1, 8])
  host.scatter(ids, _states(ids))
  d = host.state_dict()
  np.testing.assert_array_equal(d['ids'], [1, 4, 8])
  dev = DeviceClientStateStore(TEMPLATE, 9)
  dev.load_state_dict(d)
  assert len(dev) == 3
  d2 = dev.state_dict()
  np.testing.assert_array_equal(d2['ids'], d['ids'])
  jax.tree_util.tree_map(np.testing.assert_array_equal, d2['states'], d['states'])
  back = HostClientStateStore(TEMPLATE)
  back.load_state_dict(d2)
  jax.tree_util.tree_map(np.testing.assert_array_equal, back.gather([8, 1]), host.gather([8, 1]))
  disk = DiskClientStateStore(TEMPLATE, 9)
  disk.load_state_dict(d2)
  assert len(disk) == 3 and not disk.dirty             # restored rows are no news to the next checkpoint
  d3 = disk.state_dict()
  np.testing.assert_array_equal(d3['ids'], d['ids'])
  jax.tree_util.tree_map(np.testing.assert_array_equal, d3['states'], d['states'])
  empty = HostClientStateStore(TEMPLATE)
  assert empty.state_dict()['states'] is None
  dev.load_state_dict(empty.state_dict())
  assert len(dev) == 0


def test_auto_selection_and_nbytes():
  per = bytes_per_client(TEMPLATE)
  assert per == 7 * 4
  small = make_client_state_store(TEMPLATE, 100, 'auto', device_max_bytes=100 * per)
  big = make_client_state_store(TEMPLATE, 101, 'auto', device_max_bytes=100 * per)
  assert small.kind == 'device' and big.kind == 'host'
  huge = make_client_state_store(TEMPLATE, 1001, 'auto', device_max_bytes=100 * per, host_max_bytes=1000 * per)
  assert huge.kind == 'disk' and huge.nbytes() == 0     # beyond the host budget: memmaps, sparse until written
  huge.scatter(np.array([1000, -1]), _states([1000, -1]))
  assert huge.nbytes() == per and huge.dirty == {1000}
  assert small.nbytes() == 100 * per                    # device: the whole population up front
  big.scatter(np.array([5, 9, 50]), _states([5, 9, 50]))
  assert big.nbytes() == 3 * per                        # host: the clients seen
  with pytest.raises(ValueError, match='allowed'):
    make_client_state_store(TEMPLATE, 3, 'tape')


def _rows(k):
  return {'a': np.arange(k * 6, dtype=np.float32).reshape(k, 2, 3) - 50,
          'b': {'c': -np.arange(k, dtype=np.float32) - 1}}


@pytest.mark.parametrize('kind', ['host', 'device', 'disk'])
def test_per_client_initial_rows(kind):
  """A never-written client reads ITS row (not the template); padding reads the template; a scatter overrides the
  row; restoring a checkpoint starts again from the rows."""
  rows = _rows(6)
  store = make_client_state_store(TEMPLATE, 6, kind, initial=rows)
  assert store.kind == kind
  got = jax.device_get(store.gather(np.array([4, -1, 0])))
  np.testing.assert_array_equal(got['a'][0], rows['a'][4])
  np.testing.assert_array_equal(got['a'][1], 0)
  np.testing.assert_array_equal(got['a'][2], rows['a'][0])
  np.testing.assert_array_equal(got['b']['c'], [-5, 0, -1])
  store.scatter(np.array([4]), _states([4]))
  np.testing.assert_array_equal(jax.device_get(store.gather(np.array([4, 3])))['b']['c'], [100, -4])
  assert len(store) == 1
  d = store.state_dict()
  np.testing.assert_array_equal(d['ids'], [4])
  other = make_client_state_store(TEMPLATE, 6, 'device' if kind == 'host' else 'host', initial=rows)
  other.load_state_dict(d)
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(other.gather(np.arange(6))),
                         jax.device_get(store.gather(np.arange(6))))
  store.load_state_dict(None)     # back to the rows
  np.testing.assert_array_equal(jax.device_get(store.gather(np.array([4])))['b']['c'], [-5])


def test_initial_rows_are_checked():
  with pytest.raises(ValueError, match='structure'):
    make_client_state_store(TEMPLATE, 3, 'host', initial={'a': np.zeros((3, 2, 3))})
  with pytest.raises(ValueError, match='do not match the template'):
    make_client_state_store(TEMPLATE, 3, 'device', initial={'a': np.zeros((3, 3, 2)), 'b': {'c': np.zeros(3)}})
  for kind in ('host', 'device', 'disk'):
    with pytest.raises(ValueError, match='population of 4'):
      make_client_state_store(TEMPLATE, 4, kind, initial=_rows(3))
  host = make_client_state_store(TEMPLATE, 3, 'host', initial=_rows(3))
  with pytest.raises(IndexError, match='population 3'):
    host.gather([3])


def test_store_for_an_algorithm():
  """core/client_state.store_for: stateless -> None; the template alone; the template + the declared rows."""
  f = lambda *a, **k: None  # noqa: E731
  base = FederatedAlgorithm('x', f, f, f, f, f, f, f)
  assert store_for(base, None, 3) is None
  plain = store_for(base.replace(client_state_init=lambda p: TEMPLATE), None, 3, 'host')
  np.testing.assert_array_equal(plain.gather([2])['b']['c'], [0])
  rows = store_for(base.replace(client_state_init=lambda p: TEMPLATE, initial_client_states=lambda p: _rows(3)),
                   None, 3, 'host')
  np.testing.assert_array_equal(rows.gather([2])['b']['c'], [-3])


# ---- in training -----------------------------------------------------------------------------------------
from fedjax_flat.data.sources.builtin import synthetic                      # noqa: E402
from fedjax_flat.data.federated import FederatedDataset            # noqa: E402
from fedjax_flat.training import driver as driver_lib  # noqa: E402
from fedjax_flat.training import trainers  # noqa: E402
from fedjax_flat.training import checkpoint as ckpt_lib  # noqa: E402
from fedjax_flat.config.default_config import default_config    # noqa: E402
from tests.fixtures.configs import set_fields  # noqa: E402


def _config(algorithm='scaffold', **over):
  c = default_config()
  c.dataset, c.model, c.algorithm = 'synthetic', 'mlp', algorithm
  c.model_kwargs.hidden = ()
  c.rounds, c.clients_per_round, c.eval_every = 3, 10, 100
  c.client.batch_size, c.client.lr = 2, 0.1
  c.progress_every_s = 1e9
  return set_fields(c, over)


def test_device_host_and_disk_stores_train_identically(tmp_path):
  data = synthetic(40, 3, input_shape=(4, 4, 1), num_classes=4, seed=0)
  out = {}
  for kind in ('host', 'device', 'disk'):
    t = trainers.make_trainer(_config(client_state_store=kind, **{'data.num_clients': 40}), data=data)
    host = driver_lib.HostDriver(t.plan)        # the same host-built rounds over either store
    for r in range(3):
      t.server_state, _ = host.run_round(t.server_state, t.store, r, host.prepare_round(r))
    assert t.store.kind == kind and len(t.store) > 10
    out[kind] = (t.server_state['params'], t.store.state_dict())
  for kind in ('device', 'disk'):
    jax.tree_util.tree_map(np.testing.assert_array_equal, out['host'][0], out[kind][0])
    np.testing.assert_array_equal(out['host'][1]['ids'], out[kind][1]['ids'])
    jax.tree_util.tree_map(np.testing.assert_array_equal, out['host'][1]['states'], out[kind][1]['states'])


def test_scaffold_runs_bit_identical_with_each_store_and_disk_files_in_the_workdir(tmp_path):
  """Whole runs as users start them: the device store takes the one-program device path, host and disk the host
  path; the params agree bit for bit, and the disk store's memmaps live in WORKDIR/client_states."""
  data = synthetic(60, 3, input_shape=(4, 4, 1), num_classes=4, seed=1)
  params = {}
  for kind in ('device', 'host', 'disk'):
    cfg = _config(client_state_store=kind, rounds=4, **{'data.num_clients': 60})
    t = trainers.make_trainer(cfg, str(tmp_path / kind), data=data)
    assert t.store.kind == kind
    t.train()
    params[kind] = jax.device_get(t.server_state['params'])
  assert sorted(os.listdir(tmp_path / 'disk' / 'client_states')) == ['leaf_0.npy', 'leaf_1.npy']
  for kind in ('host', 'disk'):
    jax.tree_util.tree_map(np.testing.assert_array_equal, params['device'], params[kind])


def test_disk_store_resume_is_bit_identical(tmp_path):
  """A run on the disk store interrupted after round 3 (checkpoint) and resumed in a fresh trainer ends with the
  uninterrupted run's params and client states."""
  data = synthetic(50, 3, input_shape=(4, 4, 1), num_classes=4, seed=2)
  cfg = _config(client_state_store='disk', rounds=6, **{'data.num_clients': 50})
  whole = trainers.make_trainer(cfg, str(tmp_path / 'whole'), data=data)
  whole.train()
  first = trainers.make_trainer(cfg, str(tmp_path / 'cut'), data=data)
  first.train(num_rounds=3)
  ck = ckpt_lib.Checkpointer(str(tmp_path / 'cut' / 'checkpoints'), keep=2)
  ck.save(first)
  ck.wait()
  again = trainers.make_trainer(cfg, str(tmp_path / 'again'), data=data)
  assert ckpt_lib.Checkpointer(str(tmp_path / 'cut' / 'checkpoints')).restore_latest(again) == 3
  assert again.store.kind == 'disk' and len(again.store) == len(first.store)
  ck.close()
  again.train()
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(whole.server_state['params']),
                         jax.device_get(again.server_state['params']))
  a, b = whole.store.state_dict(), again.store.state_dict()
  np.testing.assert_array_equal(a['ids'], b['ids'])
  jax.tree_util.tree_map(np.testing.assert_array_equal, a['states'], b['states'])


def test_scaffold_with_100k_clients_memory_grows_with_clients_seen():
  k = 100_000
  sizes = 1 + (np.arange(k) % 2)                                   # 1 or 2 examples per client
  n = int(sizes.sum())
  rng = np.random.default_rng(0)
  y = rng.integers(0, 10, n).astype(np.int32)
  x = (rng.normal(size=(n, 8, 8, 1)) + y[:, None, None, None] / 5.0).astype(np.float32)
  data = FederatedDataset(x=x, y=y, client_index=np.arange(n, dtype=np.int64),
                          client_offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                          test_x=x[:200], test_y=y[:200], num_classes=10, name='100k')
  cfg = _config(**{'data.num_clients': k, 'client_state_device_max_mb': 64})
  t = trainers.make_trainer(cfg, data=data)
  per_client = (8 * 8 * 10 + 10) * 4                               # one c_k: 2,600 bytes
  assert t.store.kind == 'host'                                    # auto: 100k * 2.6 KB = 260 MB > 64 MiB
  seen, messages = set(), {'down_params': 0.0, 'up_params': 0.0}
  for r in range(cfg.rounds):
    rb = t.driver.prepare_round(r)
    t.server_state, res = t.driver.run_round(t.server_state, t.store, r, rb)
    t.round = r + 1
    messages = {k: v + res['messages'][k] for k, v in messages.items()}
    seen |= set(int(c) for c in rb.client_ids if c >= 0)
    assert len(t.store) == len(seen)
    assert t.store.nbytes() == len(seen) * per_client              # grows with clients seen, not population
  assert len(seen) == 30
  # c_k of a client that trained is non-zero; an unseen client reads the zero template
  some = sorted(seen)[0]
  unseen = next(i for i in range(k) if i not in seen)
  got = t.store.gather([some, unseen])
  leaves = jax.tree_util.tree_leaves(got)
  assert any(np.abs(a[0]).sum() > 0 for a in leaves) and all(np.abs(a[1]).sum() == 0 for a in leaves)
  # communication: SCAFFOLD sends 2 models each way per client per round
  num_params = 8 * 8 * 10 + 10
  assert messages == {'down_params': 2.0 * 30 * num_params, 'up_params': 2.0 * 30 * num_params}
