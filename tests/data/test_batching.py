"""Local iterations of the epochs mode (data/batching.py): ceil(N_k / B) per epoch, or the FedVPR thesis' rule
min(floor(N_k / B), cap) (client.full_batches, client.max_local_steps), masked inside one fixed step count S
(no recompilation), on the host and the device paths alike; examples over an item store with a pool draw:
the same batches as copied items, a valid fresh draw every round, identical on the host and device paths."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.config import validate
from fedjax_flat.data import batching, sampling
from fedjax_flat.data.federated import FederatedDataset, lookup
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.errors import ConfigError
from fedjax_flat.training import trainers
from tests.fixtures.configs import small_config

SIZES = [7, 3, 12, 0, 5, 9, 1, 4, 10, 6]


@pytest.mark.parametrize('n,b,epochs,full,cap,want', [
    (10, 4, 1, False, 0, 3), (10, 4, 1, True, 0, 2), (10, 4, 2, True, 0, 4), (3, 4, 1, True, 0, 0),
    (3, 4, 1, False, 0, 1), (12, 4, 1, True, 0, 3), (10000, 4, 1, True, 2500, 2500), (9999, 4, 1, True, 2500, 2499),
    (0, 4, 1, True, 5, 0), (40, 4, 1, False, 3, 3)])
def test_steps_for_size_is_the_formula(n, b, epochs, full, cap, want):
  assert batching.steps_for_size(n, b, epochs, full_batches=full, max_steps=cap) == want


@pytest.mark.parametrize('full,cap', [(True, 0), (True, 2), (False, 2), (False, 0)])
def test_positions_mask_min_floor_cap_full_batches(full, cap):
  """Every client of the population: exactly min(floor|ceil(n/B), cap) steps hold examples, each of them a full
  batch under full_batches, no example twice within the epoch, in the run's single S."""
  b = 4
  s = batching.padded_num_steps(np.array(SIZES), b, full_batches=full, max_steps=cap)
  assert s == max(1, max(batching.steps_for_size(n, b, 1, full_batches=full, max_steps=cap) for n in SIZES))
  plan = batching.batch_plan(SIZES, batch_size=b, num_steps=s, full_batches=full, max_steps=cap)
  pos, mask = batching.host_round_positions(plan, 3, 0, np.arange(len(SIZES)), SIZES)
  assert pos.shape == (len(SIZES), s, b)
  for k, n in enumerate(SIZES):
    steps = batching.steps_for_size(n, b, 1, full_batches=full, max_steps=cap)
    per_step = mask[k].sum(1)
    assert np.count_nonzero(per_step) == steps and np.all(per_step[steps:] == 0)
    if full:
      assert np.all(per_step[:steps] == b)
    used = pos[k][mask[k] > 0]
    assert len(set(used.tolist())) == len(used) and np.all(used < max(n, 1))


def _trainer(**over):
  c = small_config(**{'data.num_clients': len(SIZES), 'client.batch_size': 4, 'rounds': 3, 'eval_every': 3,
                      **over})
  data = synthetic(len(SIZES), SIZES, input_shape=(3, 3, 1), num_classes=4, seed=0)
  return trainers.make_trainer(c, data=data)


def test_trainer_batches_follow_the_thesis_rule_host_and_device_gather():
  """Fast (no round runs): the trainer's S and each sampled client's host batches follow min(floor(N_k/4), 2),
  and the device gather of the compiled block gives the same batches."""
  t = _trainer(**{'client.full_batches': True, 'client.max_local_steps': 2, 'engine.device_data': False})
  assert t.plan.num_steps == 2 and t.plan.batch_plan.full_batches and t.plan.batch_plan.max_steps == 2
  arrays = batching.device_data(t.data)
  for r in range(3):
    rb = t.driver.prepare_round(r)
    ids = sampling.sample_clients(len(SIZES), 3, seed=t.config.seed, round_idx=r)
    for i, k in enumerate(ids):
      assert rb.mask[i].sum() == 4 * min(SIZES[k] // 4, 2)
    padded = np.full(rb.mask.shape[0], -1, np.int32)
    padded[:len(ids)] = ids
    dev, _ = jax.device_get(batching.gather_round_device(t.plan.batch_plan, arrays, sampling.seed_key(t.config.seed),
                                                         jnp.int32(r), jnp.asarray(padded)))
    for key in ('x', 'y', 'mask'):
      np.testing.assert_array_equal(dev[key], getattr(rb, key), err_msg=key)


@pytest.mark.slow   # two trainers, ~30 s on the shared CPU: the fast test above checks the same batches unrun
def test_trainer_runs_the_thesis_rule_in_one_program_host_equals_device():
  """client.full_batches + client.max_local_steps through the trainer: S = min(floor(12 / 4), 2) = 2, each
  sampled client's round batches hold min(floor(N_k / 4), 2) full batches, and the compiled multi-round block
  (one program) equals the host rounds."""
  over = {'client.full_batches': True, 'client.max_local_steps': 2}
  host = _trainer(**over, **{'engine.device_data': False})
  assert host.plan.num_steps == 2
  for r in range(3):
    rb = host.driver.prepare_round(r)
    ids = sampling.sample_clients(len(SIZES), 3, seed=host.config.seed, round_idx=r)
    for i, k in enumerate(ids):
      assert rb.mask[i].sum() == 4 * min(SIZES[k] // 4, 2)
  dev = _trainer(**over, **{'engine.rounds_per_call': 3})
  assert dev.plan.device_rounds and not host.plan.device_rounds
  host.train()
  dev.train()
  assert dev.driver.block_fn._cache_size() == 1
  for a, b in zip(jax.tree_util.tree_leaves(host.server_state), jax.tree_util.tree_leaves(dev.server_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_local_iteration_settings_are_config_errors():
  with pytest.raises(ConfigError, match='client.local_steps'):
    validate.validate_config(small_config(**{'client.local_steps': 5, 'client.max_local_steps': 10}))
  with pytest.raises(ConfigError, match='client.max_local_steps'):
    validate.validate_config(small_config(**{'client.max_local_steps': -1}))


# -- Examples over an item store, with a pool draw (data/federated.py `store`, `draw`). ------------------------

STORE_SIZES = [5, 2, 7, 3]


def _store_data(draw=(2, 3), ids=False, seed=0):
  """Index rows [N, 6]: 2 fixed columns, a pool of 4 (some empty: -1) into 30 items; labels = column kind (1
  fixed, 2 pool, 0 empty). ids=True: item i is the number i + 1 (0: empty), to read which items were drawn."""
  rng = np.random.default_rng(seed)
  n = sum(STORE_SIZES)
  x = np.stack([rng.permutation(30)[:6] for _ in range(n)]).astype(np.int32)   # distinct items per row
  x[rng.random((n, 6)) < 0.25] = -1
  x[:, 0] = rng.integers(0, 30, n)
  x[3, 2:] = [-1, 7, -1, -1]                              # a pool smaller than the draw
  y = np.where(x < 0, 0, np.where(np.arange(6) < 2, 1, 2)).astype(np.uint8)
  store = (np.arange(1, 31, dtype=np.int32)[:, None] if ids
           else rng.integers(0, 255, (30, 2, 2, 3)).astype(np.uint8))
  groups = np.split(np.arange(n), np.cumsum(STORE_SIZES)[:-1])
  return FederatedDataset.from_client_indices(x, y, groups, store[:1], np.zeros(1), num_classes=1, store=store,
                                              draw=draw)


_gather_jit = jax.jit(batching.gather_round_device, static_argnums=0)


def _host_and_device(data, r, ids, seed=0, s=3, b=3):
  plan = batching.batch_plan(data.client_sizes(), batch_size=b, num_steps=s, draw=data.draw)
  rb = batching.make_round_batches(data, ids, round_idx=r, seed=seed, batch_size=b, num_steps=s, plan=plan)
  dev, _ = jax.device_get(_gather_jit(plan, batching.device_data(data), sampling.seed_key(seed),
                                                       jnp.int32(r), jnp.asarray(np.asarray(ids, np.int32))))
  return rb, dev


def test_store_gather_equals_the_copied_items():
  """Without a draw, the batches of index rows over a store equal those of the same data with the items copied
  into every row, on the host and in the compiled gather."""
  d = _store_data(draw=None)
  copied = FederatedDataset.from_client_indices(lookup(d.store, d.x), d.y, [d.client_indices(k) for k in range(4)],
                                                d.test_x, d.test_y, num_classes=1)
  assert d.input_shape == copied.input_shape == (6, 2, 2, 3)
  np.testing.assert_array_equal(d.take(np.arange(4))[0], copied.x[:4])
  assert d.nbytes < copied.nbytes
  for r in range(2):
    rb, dev = _host_and_device(d, r, [0, 2, 3])
    want, want_dev = _host_and_device(copied, r, [0, 2, 3])
    for key in ('x', 'y', 'mask'):
      np.testing.assert_array_equal(getattr(rb, key), getattr(want, key), err_msg=key)
      np.testing.assert_array_equal(dev[key], want_dev[key], err_msg=key)
    assert rb.x.dtype == np.uint8 and not rb.x[rb.mask == 0].any()


def test_pool_draw_is_valid_fresh_each_round_and_the_same_on_host_and_device():
  d = _store_data(ids=True)
  assert d.input_shape == (5, 1) and d.label_shape == (5,)
  seen = []
  for r in range(3):
    rb, dev = _host_and_device(d, r, [0, 1, 2, 3])
    for key in ('x', 'y', 'mask'):
      np.testing.assert_array_equal(dev[key], getattr(rb, key), err_msg=key)
    plan = batching.batch_plan(d.client_sizes(), batch_size=3, num_steps=3, draw=d.draw)
    pos, mask = batching.host_round_positions(plan, 0, r, [0, 1, 2, 3], d.client_sizes())
    for k in range(4):
      for s, j in zip(*np.nonzero(mask[k])):
        row = d.x[d.client_indices(k)[pos[k, s, j]]]
        got = rb.x[k, s, j, :, 0] - 1                           # item ids (-1: empty)
        np.testing.assert_array_equal(got[:2], row[:2])         # the fixed columns, in place
        pool = set(row[2:][row[2:] >= 0].tolist())
        drawn = got[2:][got[2:] >= 0].tolist()
        assert len(set(drawn)) == len(drawn) == min(3, len(pool)) and set(drawn) <= pool
        np.testing.assert_array_equal(rb.y[k, s, j], np.where(got < 0, 0, np.where(np.arange(5) < 2, 1, 2)))
    assert not rb.x[rb.mask == 0].any()
    seen.append(rb.x)
  assert not np.array_equal(seen[0], seen[1]) and not np.array_equal(seen[1], seen[2])
  # Keyed by (seed, round, client): the same batches again, whichever other clients share the round.
  again = batching.make_round_batches(d, [2, 3], round_idx=1, seed=0, batch_size=3, num_steps=3)
  np.testing.assert_array_equal(again.x, seen[1][2:])
  # A plan built without the data's draw (a caller outside the rounds) reads the first pool columns, as `take`.
  plain_plan = batching.batch_plan(d.client_sizes(), batch_size=3, num_steps=3)
  plain = batching.make_round_batches(d, [2], round_idx=0, seed=0, batch_size=3, num_steps=3, plan=plain_plan)
  pos, mask = batching.host_round_positions(plain_plan, 0, 0, [2], d.client_sizes()[[2]])
  want = d.take(d.client_indices(2)[pos[0][mask[0] > 0]])
  np.testing.assert_array_equal(plain.x[0][plain.mask[0] > 0], want[0])
  np.testing.assert_array_equal(plain.y[0][plain.mask[0] > 0], want[1])


def test_store_and_draw_bad_input():
  d = _store_data()
  with pytest.raises(ValueError, match='outside the store'):
    FederatedDataset.from_client_indices(d.x + 30, d.y, [np.arange(len(d.y))], d.test_x, d.test_y, 1,
                                         store=d.store)
  with pytest.raises(ValueError, match='draw'):
    FederatedDataset.from_client_indices(d.x, d.y, [np.arange(len(d.y))], d.test_x, d.test_y, 1, store=d.store,
                                         draw=(2, 5))
