"""Place-recognition splits and tuples (data/vpr_places.py): the proximity split's validity rule and radius on a
generated city, the random split keeping each query's positive sequences, and the mined candidates of a
client's tuples (positives within 10 m, negatives beyond 25 m, all from the client's own database)."""
import numpy as np

from fedjax_flat.data import vpr_places
from fedjax_flat.tasks import retrieval as ret


def _city(seed=0, n_q=120, n_s=40, size=1500.0):
  rng = np.random.default_rng(seed)
  return rng.uniform(0, size, (n_q, 2)), rng.uniform(0, size, (n_s, 2))


def test_proximity_split_honours_the_validity_rule_and_the_radius():
  q, s = _city()
  for radius in (150.0, 300.0, 600.0):
    clients = vpr_places.proximity_split(q, s, radius, seed=1)
    assert clients
    seen_q, seen_s = set(), set()
    for qs, ss in clients:
      assert len(qs) >= 2 and len(ss) >= 2                           # >= 2 queries, >= 2 database sequences
      assert not seen_q & set(qs.tolist()) and not seen_s & set(ss.tolist())   # disjoint clients
      seen_q |= set(qs.tolist())
      seen_s |= set(ss.tolist())
      # every member lies within the radius of the group's seed query, so within 2 radii of each other
      assert vpr_places.distances(q[qs], q[qs]).max() <= 2 * radius + 1e-9
      assert vpr_places.distances(q[qs], s[ss]).max() <= 2 * radius + 1e-9
  # A larger radius makes fewer, bigger clients (Table 6.5: 1303 / 713 / 316 clients at 1 / 2 / 4 km).
  counts = [len(vpr_places.proximity_split(q, s, r, seed=1)) for r in (150.0, 600.0)]
  assert counts[0] > counts[1]


def test_proximity_split_drops_groups_that_break_the_rule():
  q = np.array([[0, 0], [5, 0], [1000, 0], [5000, 0], [5003, 0]], np.float64)
  s = np.array([[0, 3], [2, 3], [1000, 2], [1001, 2], [5000, 9]], np.float64)
  clients = vpr_places.proximity_split(q, s, 50.0, seed=0)
  # Only the group at the origin is valid: 1000 m has one query, 5000 m one sequence.
  assert len(clients) == 1
  assert sorted(clients[0][0].tolist()) == [0, 1] and sorted(clients[0][1].tolist()) == [0, 1]


def test_random_split_keeps_each_querys_positive_sequences():
  rng = np.random.default_rng(0)
  qseq = [rng.choice(20, rng.integers(1, 3), replace=False) for _ in range(30)]
  clients = vpr_places.random_split(qseq, 20, 4, seed=0)
  assert sorted(np.concatenate([c[0] for c in clients]).tolist()) == list(range(30))
  for qs, ss in clients:
    for i in qs:
      assert set(qseq[i].tolist()) <= set(ss.tolist())
  assert set(np.concatenate([c[1] for c in clients]).tolist()) == set(range(20))   # every sequence used


def test_client_tuples_mine_only_valid_positives_and_negatives_by_distance():
  rng = np.random.default_rng(2)
  db_pos = rng.uniform(0, 200, (80, 2))
  db_ids = np.arange(100, 180)                    # image ids of the client's own database
  q_pos = db_pos[:12] + rng.normal(0, 3, (12, 2))
  q_ids = np.arange(500, 512)
  t = vpr_places.client_tuples(q_ids, q_pos, db_ids, db_pos, num_positives=2, seed=0)
  assert len(t) >= 10
  pos_of = dict(zip(db_ids.tolist(), db_pos))
  kinds = vpr_places.slot_kinds(2, t)
  for row, kind in zip(t, kinds):
    qp = q_pos[q_ids.tolist().index(row[0])]
    assert kind[0] == ret.QUERY
    for j, img in enumerate(row[1:], start=1):
      if img < 0:
        assert kind[j] == ret.EMPTY
        continue
      assert img in pos_of                          # restricted to the client's database
      d = np.linalg.norm(pos_of[img] - qp)
      assert (d <= 10.0) if kind[j] == ret.POSITIVE else (d > 25.0)
    assert np.sum(kind == ret.POSITIVE) >= 1
    # The pool: every database frame beyond 25 m (no neg_pool bound reached), each once.
    dq = np.linalg.norm(db_pos - qp, axis=1)
    assert sorted(row[3:][row[3:] >= 0].tolist()) == db_ids[dq > 25.0].tolist()
  assert t.shape[1] == 3 + max(int(np.sum(np.linalg.norm(db_pos - q_pos[q_ids.tolist().index(r[0])], axis=1) > 25))
                               for r in t)
  bounded = vpr_places.client_tuples(q_ids, q_pos, db_ids, db_pos, num_positives=2, seed=0, neg_pool=6)
  assert bounded.shape[1] == 9 and np.all(bounded[:, 3:] >= 0)
  # Queries without a database frame within 10 m give no tuple.
  far = vpr_places.client_tuples([7], np.array([[1e4, 1e4]]), db_ids, db_pos, num_positives=2, seed=0)
  assert far.shape == (0, 3)


def test_split_statistics_columns():
  clients = [(np.arange(3), np.array([0, 1])), (np.arange(2), np.array([2, 3, 4]))]
  st = vpr_places.split_statistics(clients, [4, 4, 5, 5, 5])
  assert st['clients'] == 2
  assert st['sequences_per_client'] == (2.5, 0.5)
  assert st['images_per_client'] == (((3 + 8) + (2 + 15)) / 2, 3.0)


def test_within_equals_the_dense_distance_test():
  rng = np.random.default_rng(5)
  q, d = rng.uniform(0, 80, (40, 2)), rng.uniform(0, 80, (300, 2))
  got = vpr_places.within(q, d, 10.0)
  dense = vpr_places.distances(q, d) <= 10.0
  for g, row in zip(got, dense):
    assert g.tolist() == np.flatnonzero(row).tolist()
  assert sum(len(g) for g in got) > 0
