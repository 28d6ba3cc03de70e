"""Groupers and distances (fedjax_flat/grouping/): formulas, constraints, ICG, greedy, determinism."""
import itertools
import logging as pylogging

import numpy as np
import pytest

from fedjax_flat.grouping import distances, groupers

METHODS = ('random', 'kmeans', 'greedy', 'icg')


# Distances equal their formulas.
def test_distances_equal_formulas():
  a = np.array([0.5, 0.3, 0.2])
  b = np.array([0.1, 0.1, 0.8])
  assert distances.euclidean(a, b) == pytest.approx(np.sqrt(0.16 + 0.04 + 0.36))
  cos = (0.05 + 0.03 + 0.16) / (np.sqrt(0.25 + 0.09 + 0.04) * np.sqrt(0.01 + 0.01 + 0.64))
  assert distances.cosine(a, b) == pytest.approx(1 - cos)
  u, v = a / (a + b + 1e-8), b / (a + b + 1e-8)
  assert distances.normalized_cosine(a, b) == pytest.approx(1 - u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))
  m = (a + b) / 2                                  # [0.3, 0.2, 0.5]
  assert distances.kl(a, b) == pytest.approx(1 - sum(p * np.log(p / (1 / 3)) for p in m))
  assert distances.gini(a, b) == pytest.approx(1 - (0.09 + 0.04 + 0.25))
  # Rows of b at once, and the edge cases: zero vector (cosine 1), 0 log 0 = 0.
  rows = np.stack([b, a, np.zeros(3)])
  np.testing.assert_allclose(distances.cosine(a, rows), [1 - cos, 0.0, 1.0], atol=1e-12)
  assert distances.kl(np.array([1.0, 0, 0]), np.array([1.0, 0, 0])) == pytest.approx(1 - np.log(3))
  for name, fn in distances.DISTANCES.items():
    np.testing.assert_allclose(fn(a, np.stack([b, a])), [fn(a, b), fn(a, a)], err_msg=name)


def test_kl_and_gini_favour_diverse_mixtures():
  uniform, onehot = np.full(4, 0.25), np.eye(4)
  # The mixture of two different one-hots is more diverse than of two equal ones.
  for fn in (distances.kl, distances.gini):
    assert fn(onehot[0], onehot[1]) > fn(onehot[0], onehot[0])
    assert fn(uniform, uniform) > fn(onehot[0], onehot[1])


# Constraints.
def _check_partition(groups, k):
  ids = np.concatenate(groups)
  assert sorted(ids.tolist()) == list(range(k)), 'every client exactly once'


def _check_constraints(groups, sizes, min_examples, max_clients):
  _check_partition(groups, len(sizes))
  for g in groups:
    assert len(g) <= max_clients
  short = [g for g in groups if sizes[g].sum() < min_examples]
  for g in short:   # only where impossible: closed by max_clients, or the one leftover nobody had room for
    full = len(g) == max_clients
    no_room = sum(max_clients - len(h) for h in groups if h is not g) < len(g)
    assert full or no_room, (g, sizes[g].sum())


def _reps(k, d=6, seed=0):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(k, d))


@pytest.mark.parametrize('method', ('random', 'kmeans', 'greedy'))
@pytest.mark.parametrize('seed', (0, 1))
@pytest.mark.parametrize('sizes_kind', ('equal', 'skewed'))
def test_fill_groupers_honour_constraints(method, seed, sizes_kind):
  rng = np.random.default_rng(seed)
  k = 53
  sizes = np.full(k, 20) if sizes_kind == 'equal' else rng.integers(1, 80, size=k)
  reps = np.abs(_reps(k, seed=seed)) if method == 'greedy' else _reps(k, seed=seed)
  for min_examples, max_clients in ((100, 8), (150, 5), (60, 0)):
    groups = groupers.make_groups(method, sizes, reps, distance='cosine', num_clusters=4,
                                  min_examples=min_examples, max_clients=max_clients, seed=seed)
    _check_constraints(groups, sizes, min_examples, max_clients or 10**9)
    need = -(-min_examples // 20)
    if sizes_kind == 'equal' and need <= (max_clients or k):
      # Equal clients, feasible constraints: every superclient reaches min_examples and N_S is the maximum.
      assert all(sizes[g].sum() >= min_examples for g in groups)
      assert len(groups) == k // need


def test_redistribution_to_smallest_and_conflict():
  sizes = np.array([5, 5, 5, 5, 6, 6, 5])
  groups = groupers.redistribute([[0, 1], [2, 3], [4, 5]], [6], sizes, min_examples=10, max_clients=3)
  assert groups == [[0, 1, 6], [2, 3], [4, 5]]          # the smallest |D_S| first (10 < 12)
  sizes8 = np.append(sizes, 5)
  groups = groupers.redistribute([[0, 1], [2, 3], [4, 5]], [6, 7], sizes8, min_examples=20, max_clients=3)
  assert groups == [[0, 1, 7], [2, 3, 6], [4, 5]]       # popped from the end, round-robin, smallest first
  # No room under max_clients: the leftover stays a superclient of its own.
  groups = groupers.redistribute([[0, 1], [2, 3], [4, 5]], [6], sizes, min_examples=10, max_clients=2)
  assert groups == [[0, 1], [2, 3], [4, 5], [6]]
  # A leftover that meets min_examples is a superclient.
  assert groupers.redistribute([[0, 1]], [2, 3], sizes, min_examples=10, max_clients=2) == [[0, 1], [2, 3]]


def test_random_grouping_fills_in_shuffled_order():
  sizes = np.full(10, 10)
  groups = groupers.random_grouping(sizes, min_examples=30, max_clients=5, rng=np.random.default_rng(3))
  perm = np.random.default_rng(3).permutation(10)
  # [3, 3, 3] then a leftover of 1 client redistributed to the first (all equal |D_S|) superclient.
  assert [g.tolist() for g in groups] == [list(perm[:3]) + [perm[9]], list(perm[3:6]), list(perm[6:9])]


# Greedy.
def test_greedy_picks_the_farthest_from_the_weighted_mean():
  a, b = [1.0, 0.0], [0.0, 1.0]
  d, c = [0.8, 0.6], [0.6, 0.8]
  reps = np.array([a, b, d, c])
  sizes = np.array([3, 1, 1, 1])
  groups = groupers.greedy_grouping(reps, sizes, distance='cosine', min_examples=100, max_clients=4)
  # Uniform start: a and b tie (lowest id wins); then b (opposite of a); then the representer is the
  # data-size-weighted mean (3a + b)/4 = [0.75, 0.25], farther from c (id 3) than from d (id 2); an unweighted
  # mean [0.5, 0.5] would be equidistant.
  assert [g.tolist() for g in groups] == [[0, 1, 3, 2]]
  np.testing.assert_allclose(groupers.representer(reps, sizes, [0, 1]), [0.75, 0.25])
  np.testing.assert_allclose(groupers.representer(reps, sizes, []), [0.5, 0.5])


def test_greedy_with_confidence_vectors_mixes_classes():
  # One-hot-like confidence vectors of 4 classes x 3 clients: every superclient of 4 gets 4 classes.
  conf = np.repeat(np.eye(4) * 0.9 + 0.025, 3, axis=0)
  sizes = np.full(12, 10)
  for dist in ('kl', 'gini', 'cosine', 'euclidean'):
    groups = groupers.greedy_grouping(conf, sizes, distance=dist, min_examples=40, max_clients=4)
    labels = np.repeat(np.arange(4), 3)
    assert [len(set(labels[g])) for g in groups] == [4, 4, 4], dist


# K-means + round-robin.
def test_kmeans_round_robin_takes_one_client_per_cluster():
  rng = np.random.default_rng(0)
  centers = np.eye(3) * 10
  labels = np.repeat(np.arange(3), 4)
  reps = centers[labels] + 0.01 * rng.normal(size=(12, 3))
  groups = groupers.kmeans_grouping(reps, np.full(12, 10), num_clusters=3, min_examples=30, max_clients=3,
                                    rng=np.random.default_rng(1))
  assert len(groups) == 4
  for g in groups:
    assert sorted(labels[g]) == [0, 1, 2]


# ICG.
def _brute_force_balanced(cost, size):
  m, n_c = cost.shape
  best = np.inf
  for perm in itertools.permutations(range(m)):
    labels = np.empty(m, int)
    labels[list(perm)] = np.repeat(np.arange(n_c), size)
    best = min(best, cost[np.arange(m), labels].sum())
  return best


def test_balanced_assignment_is_optimal_and_equal_size(monkeypatch):
  rng = np.random.default_rng(0)
  cost = rng.random((6, 2))
  labels = groupers.balanced_assignment(cost, 3)
  assert np.bincount(labels).tolist() == [3, 3]
  assert cost[np.arange(6), labels].sum() == pytest.approx(_brute_force_balanced(cost, 3))
  # The transportation-LP path (large problems) finds the same optimum.
  cost = rng.random((60, 4))
  dense = groupers.balanced_assignment(cost, 15)
  monkeypatch.setattr(groupers, 'ICG_DENSE_MAX', 0)
  lp = groupers.balanced_assignment(cost, 15)
  assert np.bincount(lp).tolist() == [15] * 4
  assert cost[np.arange(60), lp].sum() == pytest.approx(cost[np.arange(60), dense].sum())


def test_equal_size_kmeans_gives_equal_clusters_and_finds_separated_ones():
  rng = np.random.default_rng(0)
  true = np.repeat(np.arange(4), 5)[rng.permutation(20)]
  reps = np.eye(4)[true] * 10 + 0.1 * rng.normal(size=(20, 4))
  labels = groupers.equal_size_kmeans(reps, 4, 5, np.random.default_rng(1), iterations=10)
  assert np.bincount(labels).tolist() == [5] * 4
  # Unequal natural clusters are still split into equal ones.
  skew = np.concatenate([np.zeros(14), np.ones(6)])[:, None] + 0.01 * rng.normal(size=(20, 1))
  assert np.bincount(groupers.equal_size_kmeans(skew, 4, 5, np.random.default_rng(2))).tolist() == [5] * 4
  # With separated clusters of exactly the right size, each found cluster is one true cluster.
  for c in range(4):
    assert len(set(true[labels == c])) == 1


def test_icg_one_client_per_cluster_per_group_then_round_robin():
  rng = np.random.default_rng(0)
  n_s, n_c = 5, 4
  true = np.repeat(np.arange(n_c), n_s)[rng.permutation(20)]
  reps = np.eye(n_c)[true] * 10 + 0.1 * rng.normal(size=(20, n_c))
  groups = groupers.icg_grouping(reps, np.full(20, 10), min_examples=1, max_clients=0,
                                 rng=np.random.default_rng(1), num_superclients=n_s)
  _check_partition(groups, 20)
  for g in groups:                                 # one client of every (equal-size) cluster
    assert sorted(true[g]) == list(range(n_c))
  # 3 more clients: still 23 // 5 = 4 clusters of 5; the 3 left over go round-robin.
  more = np.concatenate([reps, rng.normal(size=(3, n_c))])
  groups = groupers.icg_grouping(more, np.full(23, 10), min_examples=1, max_clients=0,
                                 rng=np.random.default_rng(1), num_superclients=n_s)
  _check_partition(groups, 23)
  assert [len(g) for g in groups] == [5, 5, 5, 4, 4]


def test_icg_n_from_constraints_and_max_clients():
  sizes = np.full(100, 100)
  assert groupers.num_superclients_from_constraints(sizes, min_examples=1000, max_clients=11) == 10
  assert groupers.num_superclients_from_constraints(sizes, min_examples=250, max_clients=11) == 33
  groups = groupers.icg_grouping(_reps(100), sizes, min_examples=250, max_clients=4, rng=np.random.default_rng(0))
  assert len(groups) == 33 and max(map(len, groups)) == 4 and min(sizes[g].sum() for g in groups) >= 250


# num_superclients overrides the constraints.
@pytest.mark.parametrize('method', METHODS)
def test_num_superclients_gives_exactly_n_balanced_groups(method):
  k = 23
  sizes = np.arange(1, k + 1)
  for n in (1, 4, 7, 23, 40):
    groups = groupers.make_groups(method, sizes, np.abs(_reps(k)), distance='euclidean', num_clusters=3,
                                  min_examples=10**6, max_clients=2, seed=0, num_superclients=n)
    _check_partition(groups, k)
    assert len(groups) == min(n, k)
    assert {len(g) for g in groups} <= {k // min(n, k), k // min(n, k) + 1}


# Determinism.
@pytest.mark.parametrize('method', METHODS)
def test_groupings_are_deterministic_from_the_seed(method):
  k = 40
  sizes = np.random.default_rng(0).integers(5, 30, size=k)
  reps = np.abs(_reps(k))
  kw = dict(distance='cosine', num_clusters=4, min_examples=60, max_clients=6)
  a = groupers.make_groups(method, sizes, reps, seed=5, **kw)
  b = groupers.make_groups(method, sizes, reps, seed=5, **kw)
  assert [g.tolist() for g in a] == [g.tolist() for g in b]
  if method in ('random', 'icg'):
    c = groupers.make_groups(method, sizes, reps, seed=6, **kw)
    assert [g.tolist() for g in a] != [g.tolist() for g in c]


def test_conflicting_constraints_warn(caplog):
  with caplog.at_level(pylogging.WARNING):
    groupers.num_superclients_from_constraints(np.full(10, 10), min_examples=100, max_clients=5)
  assert 'conflict' in caplog.text
  with pytest.raises(ValueError, match='min_examples'):
    groupers.random_grouping(np.full(3, 1), min_examples=0, max_clients=0, rng=np.random.default_rng(0))
