"""vpr_synthetic (data/sources/vpr_synthetic.py): shapes and determinism, every tuple slot valid by distance and
held by its own client, each pool the client's far frames, the round's candidates drawn from it afresh (host =
device), the proximity split's rule, the random split spanning cities, test labels, bad input."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.data import batching, registry, sampling
from fedjax_flat.data.sources import vpr_synthetic
from fedjax_flat.errors import ConfigError
from fedjax_flat.tasks import retrieval as ret

SMALL = dict(num_cities=2, city_size=150.0, sequences_per_city=10, seq_len=5, queries_per_city=24,
             image_size=16, view_m=16.0, test_sequences=6, test_queries=10, split_radius=60.0,
             num_positives=2, num_candidates=5)


def test_shapes_task_and_determinism():
  a = registry.get_dataset('vpr_synthetic', **SMALL)
  b = registry.get_dataset('vpr_synthetic', **SMALL)
  assert a.task == 'retrieval'
  # Index tuples over one image store: query, 2 positives, the negative pool; 5 candidates drawn per batch.
  assert a.x.dtype == np.int32 and a.y.shape == a.x.shape and a.x.shape[1] >= 8
  assert a.store.shape[1:] == (16, 16, 3) and a.store.dtype == np.uint8 and a.draw == (3, 5)
  assert a.input_shape == (8, 16, 16, 3) and a.label_shape == (8,)
  assert a.test_x.shape == (10 + 30, 16, 16, 3) and a.test_y.shape == (40, 3)
  assert np.sum(a.test_y[:, 2] == ret.QUERY_ROLE) == 10
  np.testing.assert_array_equal(a.x, b.x)
  np.testing.assert_array_equal(a.client_index, b.client_index)


@pytest.mark.parametrize('split', ['proximity', 'random'])
def test_every_slot_is_valid_by_distance_and_from_the_clients_own_database(split):
  d = registry.get_dataset('vpr_synthetic', **SMALL, split=split)
  assert d.num_clients >= 2
  for k in range(d.num_clients):
    for n in d.client_indices(k):
      row, kinds = d.tuple_index[n], d.y[n]
      qp = d.image_pos[row[0]]
      assert kinds[0] == ret.QUERY
      for j in range(1, len(row)):
        if kinds[j] == ret.EMPTY:
          assert row[j] < 0
          continue
        dist = np.linalg.norm(d.image_pos[row[j]] - qp)
        assert dist <= 10.0 if kinds[j] == ret.POSITIVE else dist > 25.0
        assert d.image_client[row[j]] in (k, -2)                 # the client's own (or a duplicated) frame
      assert (kinds == ret.POSITIVE).any()
    # The pool is every negative of the client's own database (fewer than neg_pool here).
    frames = SMALL['num_cities'] * SMALL['sequences_per_city'] * SMALL['seq_len']    # database images first
    only, maybe = (np.flatnonzero(np.isin(d.image_client[:frames], c)) for c in ((k,), (k, -2)))
    for n in d.client_indices(k):
      row, kinds = d.tuple_index[n], d.y[n]
      far = lambda ids: set(ids[np.linalg.norm(d.image_pos[ids] - d.image_pos[row[0]], axis=1) > 25.0].tolist())  # noqa: E731
      assert far(only) <= set(row[kinds == ret.NEGATIVE].tolist()) <= far(maybe)
  if split == 'proximity':
    assert d.split_stats['sequences_per_client'][0] >= 2


def test_random_split_clients_span_the_cities():
  d = registry.get_dataset('vpr_synthetic', **SMALL, split='random')
  cities = [set((d.image_pos[d.tuple_index[d.client_indices(k), 0], 0] // vpr_synthetic.CITY_SPACING).tolist())
            for k in range(d.num_clients)]
  assert sum(len(c) > 1 for c in cities) >= d.num_clients // 2


def test_bad_input_is_one_config_error():
  with pytest.raises(ConfigError, match='data.split'):
    registry.get_dataset('vpr_synthetic', **{**SMALL, 'split': 'clusters'})
  with pytest.raises(ConfigError, match='split_radius'):
    registry.get_dataset('vpr_synthetic', **{**SMALL, 'split_radius': 0.5})
  with pytest.raises(ConfigError, match='city_size'):
    registry.get_dataset('vpr_synthetic', **{**SMALL, 'city_size': float('nan')})


def test_neg_pool_bounds_each_pool_to_a_random_subset():
  small = registry.get_dataset('vpr_synthetic', **SMALL, neg_pool=7)
  full = registry.get_dataset('vpr_synthetic', **SMALL)
  assert small.x.shape[1] == 1 + 2 + 7
  for n in range(len(small.y)):
    pool, whole = small.x[n, 3:], full.x[n, 3:]
    assert np.sum(pool >= 0) == min(7, np.sum(whole >= 0))
    assert set(pool[pool >= 0].tolist()) <= set(whole[whole >= 0].tolist())
  with pytest.raises(ConfigError, match='neg_pool'):
    registry.get_dataset('vpr_synthetic', **SMALL, neg_pool=0)


def test_single_split_is_one_client_with_every_query():
  one = registry.get_dataset('vpr_synthetic', **SMALL, split='single')
  prox = registry.get_dataset('vpr_synthetic', **SMALL)
  assert one.num_clients == 1 and len(one.y) >= len(prox.y)


def test_client_groups_are_the_city_of_the_clients_queries():
  """H-FL's clusters: a proximity client's 'city' is the city of all its queries; 'continent' pairs the cities."""
  d = registry.get_dataset('vpr_synthetic', **SMALL)
  g = d.client_groups
  for k in range(d.num_clients):
    q = d.image_pos[d.tuple_index[d.client_indices(k), 0]]
    assert set((q[:, 0] // vpr_synthetic.CITY_SPACING).astype(int).tolist()) == {int(g['city'][k])}
  np.testing.assert_array_equal(g['continent'], g['city'] // 2)


def test_round_candidates_are_the_clients_far_frames_fresh_each_round_same_on_host_and_device():
  """The negative candidates of a round's batches: drawn from the client's own database beyond 25 m, different
  in the next round, identical for the same (seed, round, client) on the host and in the compiled gather. Items
  read as their ids (a store of numbers) to see which images were drawn."""
  d = registry.get_dataset('vpr_synthetic', **SMALL)
  ids = dataclasses.replace(d, store=np.arange(1, len(d.store) + 1, dtype=np.int32)[:, None])
  clients = np.arange(d.num_clients, dtype=np.int32)
  s = batching.padded_num_steps(d.client_sizes(), 4)
  plan = batching.batch_plan(d.client_sizes(), batch_size=4, num_steps=s, draw=d.draw)
  frames = SMALL['num_cities'] * SMALL['sequences_per_city'] * SMALL['seq_len']
  drawn = []
  for r in range(2):
    rb = batching.make_round_batches(ids, clients, round_idx=r, seed=0, batch_size=4, num_steps=s, plan=plan)
    dev, _ = jax.device_get(jax.jit(batching.gather_round_device, static_argnums=0)(
        plan, batching.device_data(ids), sampling.seed_key(0), jnp.int32(r), jnp.asarray(clients)))
    np.testing.assert_array_equal(dev['x'], rb.x)
    np.testing.assert_array_equal(dev['y'], rb.y)
    got = rb.x[..., 0].astype(np.int64) - 1                  # [C, S, B, T] image ids, -1 empty
    for k in clients:
      for t, kinds in zip(got[k][rb.mask[k] > 0], rb.y[k][rb.mask[k] > 0]):
        neg = t[kinds == ret.NEGATIVE]
        assert len(neg) == min(5, np.sum(d.x[d.x[:, 0] == t[0]][0, 3:] >= 0)) and len(set(neg)) == len(neg)
        assert np.all(neg < frames) and np.all(np.isin(d.image_client[neg], (k, -2)))
        assert np.all(np.linalg.norm(d.image_pos[neg] - d.image_pos[t[0]], axis=1) > 25.0)
    drawn.append(got)
  assert not np.array_equal(drawn[0][..., 3:], drawn[1][..., 3:])
