"""vpr_synthetic (data/sources/vpr_synthetic.py): shapes and determinism, every tuple slot valid by distance and
held by its own client, the proximity split's rule, the random split spanning cities, test labels, bad input."""
import numpy as np
import pytest

from fedjax_flat.data import registry
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
  assert a.x.shape[1:] == (8, 16, 16, 3) and a.x.dtype == np.uint8 and a.y.shape[1:] == (8,)
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
          assert row[j] < 0 and not d.x[n, j].any()
          continue
        dist = np.linalg.norm(d.image_pos[row[j]] - qp)
        assert dist <= 10.0 if kinds[j] == ret.POSITIVE else dist > 25.0
        assert d.image_client[row[j]] in (k, -2)                 # the client's own (or a duplicated) frame
      assert (kinds == ret.POSITIVE).any()
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


@pytest.mark.parametrize('split', ['proximity', 'random', 'single'])
def test_validation_clients_are_held_out_of_every_split(split):
  """val_clients proximity clients leave training before the split: none of their queries or database frames is
  in a training tuple, every split shares them, val_x / val_y / val_client hold each one's queries then its
  database frames (positions as the test labels), and val_clients=0 leaves the split as it was."""
  base = registry.get_dataset('vpr_synthetic', **SMALL, split=split)
  d = registry.get_dataset('vpr_synthetic', **SMALL, split=split, val_clients=2)
  prox = registry.get_dataset('vpr_synthetic', **SMALL, val_clients=2)
  assert len(d.val_groups) == 2
  assert [(q.tolist(), s.tolist()) for q, s in d.val_groups] == [(q.tolist(), s.tolist()) for q, s in prox.val_groups]
  assert base.val_x.shape[0] == 0 and base.val_client.shape == (0,)
  n_q = sum(len(q) for q, _ in d.val_groups)
  assert len(d.val_x) == len(d.val_y) == len(d.val_client) and int(np.sum(d.val_y[:, 2] == ret.QUERY_ROLE)) == n_q
  for g, (qs, ss) in enumerate(d.val_groups):
    mine = d.val_client == g
    assert int(np.sum(mine & (d.val_y[:, 2] == ret.QUERY_ROLE))) == len(qs)
    assert int(np.sum(mine & (d.val_y[:, 2] == ret.DATABASE_ROLE))) == len(ss) * SMALL['seq_len']
  # The held-out images: never a training slot (positions identify the images: no two share one here).
  val_pos = {tuple(p) for p in d.val_y[:, :2].tolist()}
  used = d.tuple_index[d.tuple_index >= 0]
  train_pos = {tuple(p) for p in d.image_pos[used].astype(np.float32).tolist()}
  assert not val_pos & train_pos
  np.testing.assert_array_equal(d.val_x, prox.val_x)                   # one validation set for every split
  np.testing.assert_array_equal(d.val_y, prox.val_y)
  assert d.val_x.shape[1:] == (16, 16, 3) and d.val_x.dtype == np.uint8 and d.val_x.any()
  if split == 'proximity':
    assert d.num_clients == base.num_clients - 2
  else:
    assert len(d.y) < len(base.y)
  with pytest.raises(ConfigError, match='data.val_clients'):
    registry.get_dataset('vpr_synthetic', **SMALL, val_clients=-1)
