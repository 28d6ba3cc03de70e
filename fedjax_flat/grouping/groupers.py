"""Groupers phi: clients -> superclients (thesis 5.2.2, "Grouping Clients"; ICPR reference code).

Goal: the largest number N_S of superclients S with (i) |D_S| >= min_examples and (ii) K_S <= max_clients,
every client in exactly one superclient. Bin-packing-like and NP-hard, hence greedy heuristics:

  random   shuffle, then fill superclients in turn.
  kmeans   k-means (Euclidean, `num_clusters`, "reasonably" N_C) on the representations; each superclient
           takes one client from each cluster in turn (the cycle continues across superclients).
  greedy   each superclient starts from the client farthest (tau) from the uniform vector 1/d (the reference's
           representer of an empty cluster), then repeatedly adds argmax_j tau(r_S, r_j) where r_S is the
           data-size-weighted mean of its members' representations.
  icg      Inter-Cluster Grouping (FedGSP): shuffle; n_c = floor(K / N_S) equal-size clusters of N_S clients
           from n_c * N_S of them (k-means whose assignment step is an assignment problem with every
           cluster holding exactly N_S clients, squared Euclidean costs, <= `iterations` rounds or until the
           assignment repeats); superclient g takes one random client of every cluster; the clients left
           over go round-robin.

Filling (random, kmeans, greedy): a superclient takes clients while |D_S| < min_examples and
K_S < max_clients (0 = no cap), then the next one opens. A last superclient below min_examples is
redistributed, its clients popped from the end, round-robin over the other superclients under max_clients
taken in increasing |D_S| order; when they have too little room (the constraints conflict) it stays a
superclient of its own, with a warning. So K_S <= max_clients always holds, and |D_S| >= min_examples holds
except where max_clients closed a superclient first or the data cannot satisfy both (reported by `stats`).

ICG ignores data sizes (as the reference): without `num_superclients`, N_S = K // ceil(min_examples /
(|D| // K)) (the reference's `_K`, exact for equal-size clients; with it K_S <= ceil(K / N_S) <= max_clients
whenever the two constraints can both hold).

num_superclients = N given (FedSeq2Par's growth function): exactly min(N, K) superclients of K // N or
K // N + 1 clients, and the constraints are not applied (the caller decides the parallelism, as in the
reference's FedSeq2Par). random deals the shuffled clients round-robin; kmeans deals them cluster after
cluster (clusters and members shuffled), so each superclient gets clients of many clusters; greedy lets the
superclients pick in turn, each the remaining client farthest from its own representer; icg as above.

All functions are deterministic given `rng` (numpy Generator) and return a list of int64 arrays of client
ids (chain order = the order they were added). Cost: greedy computes K distances per pick, O(K^2 d) in all;
ICG solves an assignment per iteration (dense M x M for M <= ICG_DENSE_MAX clustered clients, else an LP).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

from absl import logging
import numpy as np

from fedjax_flat.grouping import distances

METHODS = ('random', 'kmeans', 'greedy', 'icg')
# Up to this many clustered clients ICG's assignment is scipy's linear_sum_assignment on the M x M matrix
# (measured on 2 loaded cores: 0.13 s at M = 1,000, 3 s at 3,500, 25 s at 8,000 with 512 MB); above it, the
# transportation LP (M x n_c variables; about 50x slower than the dense solver at M = 1,000, but memory
# O(M n_c)). StackOverflow-size populations (K = 40,000) are out of reach of both: use kmeans or random.
ICG_DENSE_MAX = 8000


def _cap(max_clients: int) -> float:
  return float('inf') if not max_clients else max_clients


def redistribute(groups: List[List[int]], leftover: List[int], sizes, *, min_examples: int,
                 max_clients: int) -> List[List[int]]:
  """Adds the last, incomplete superclient to `groups`: as it is when it meets min_examples (or is alone),
  else its clients round-robin over the other superclients with room, smallest |D_S| first."""
  sizes = np.asarray(sizes)
  if not leftover:
    return groups
  if not groups or sizes[leftover].sum() >= min_examples:
    return groups + [list(leftover)]
  cap = _cap(max_clients)
  room = sum(cap - len(g) for g in groups)
  if room < len(leftover):
    logging.warning('grouping: %d leftover clients (%d examples < min_examples=%d) cannot be redistributed: '
                    'the other superclients have room for %d under max_clients=%d; they stay a superclient',
                    len(leftover), int(sizes[leftover].sum()), min_examples, int(room), max_clients)
    return groups + [list(leftover)]
  leftover = list(leftover)
  order = sorted((i for i, g in enumerate(groups) if len(g) < cap), key=lambda i: sizes[groups[i]].sum())
  while leftover:
    for i in order:
      if not leftover:
        break
      if len(groups[i]) < cap:
        groups[i].append(leftover.pop())
  return groups


def _fill(num_clients: int, sizes, pick, *, min_examples: int, max_clients: int) -> List[List[int]]:
  """Opens superclients in turn; `pick(current)` returns the next client for the current one."""
  if min_examples < 1 and not max_clients:
    raise ValueError('min_examples must be >= 1 when max_clients is 0 (no cap): nothing would close a '
                     'superclient')
  sizes = np.asarray(sizes)
  cap = _cap(max_clients)
  groups, cur, cur_n, left = [], [], 0, num_clients
  while left:
    if cur_n < min_examples and len(cur) < cap:
      k = pick(cur)
      cur.append(int(k))
      cur_n += int(sizes[k])
      left -= 1
    else:
      groups.append(cur)
      cur, cur_n = [], 0
  return redistribute(groups, cur, sizes, min_examples=min_examples, max_clients=max_clients)


def _deal(order: Sequence[int], n: int) -> List[List[int]]:
  groups = [[] for _ in range(n)]
  for i, k in enumerate(order):
    groups[i % n].append(int(k))
  return groups


def _as_arrays(groups) -> List[np.ndarray]:
  return [np.asarray(g, np.int64) for g in groups if len(g)]


def _clamp(num_superclients: Optional[int], k: int) -> Optional[int]:
  if num_superclients is None:
    return None
  if num_superclients < 1:
    raise ValueError(f'num_superclients={num_superclients} must be >= 1')
  return min(int(num_superclients), k)


# Random.
def random_grouping(sizes, *, min_examples: int, max_clients: int, rng: np.random.Generator,
                    num_superclients: Optional[int] = None) -> List[np.ndarray]:
  k = len(sizes)
  perm = rng.permutation(k)
  n = _clamp(num_superclients, k)
  if n is not None:
    return _as_arrays(_deal(perm, n))
  it = iter(perm)
  return _as_arrays(_fill(k, sizes, lambda cur: next(it), min_examples=min_examples, max_clients=max_clients))


# K-means + round-robin.
def kmeans_labels(reps, num_clusters: int, rng: np.random.Generator) -> np.ndarray:
  """Euclidean k-means (scikit-learn, k-means++ init, 10 restarts) cluster ids [K]."""
  from sklearn.cluster import KMeans
  reps = np.asarray(reps, np.float64)
  k = max(1, min(int(num_clusters), len(reps)))
  km = KMeans(n_clusters=k, n_init=10, random_state=int(rng.integers(2**31 - 1)))
  return km.fit_predict(reps).astype(np.int64)


def kmeans_grouping(reps, sizes, *, num_clusters: int, min_examples: int, max_clients: int,
                    rng: np.random.Generator, num_superclients: Optional[int] = None) -> List[np.ndarray]:
  labels = kmeans_labels(reps, num_clusters, rng)
  clusters = [list(rng.permutation(np.flatnonzero(labels == c))) for c in np.unique(labels)]
  k = len(sizes)
  n = _clamp(num_superclients, k)
  if n is not None:
    order = [c for i in rng.permutation(len(clusters)) for c in clusters[i]]
    return _as_arrays(_deal(order, n))
  state = {'next': 0}

  def pick(cur):
    del cur
    while not clusters[state['next'] % len(clusters)]:
      state['next'] += 1
    c = clusters[state['next'] % len(clusters)]
    state['next'] += 1
    return c.pop()
  return _as_arrays(_fill(k, sizes, pick, min_examples=min_examples, max_clients=max_clients))


# Greedy farthest-from-mean.
def representer(reps, sizes, members) -> np.ndarray:
  """Data-size-weighted mean of the members' representations; the uniform vector 1/d when empty."""
  reps = np.asarray(reps, np.float64)
  if len(members) == 0:
    return np.full(reps.shape[1], 1.0 / reps.shape[1])
  w = np.asarray(sizes, np.float64)[list(members)]
  if w.sum() <= 0:
    w = np.ones_like(w)
  return w @ reps[list(members)] / w.sum()


def greedy_grouping(reps, sizes, *, distance: str, min_examples: int, max_clients: int,
                    rng: Optional[np.random.Generator] = None,
                    num_superclients: Optional[int] = None) -> List[np.ndarray]:
  """Ties go to the lowest client id; `rng` is unused (the first pick is the farthest from uniform)."""
  del rng
  reps = np.asarray(reps, np.float64)
  tau = distances.get(distance)
  k = len(reps)
  free = np.ones(k, bool)

  def pick(cur):
    d = np.where(free, tau(representer(reps, sizes, cur), reps), -np.inf)
    j = int(np.argmax(d))
    free[j] = False
    return j

  n = _clamp(num_superclients, k)
  if n is not None:
    groups = [[] for _ in range(n)]
    for t in range(k):
      groups[t % n].append(pick(groups[t % n]))
    return _as_arrays(groups)
  return _as_arrays(_fill(k, sizes, pick, min_examples=min_examples, max_clients=max_clients))


# ICG.
def num_superclients_from_constraints(sizes, *, min_examples: int, max_clients: int) -> int:
  """The reference's N_S: K // ceil(min_examples / (|D| // K)), at least 1 (warns if max_clients conflicts)."""
  sizes = np.asarray(sizes)
  k = len(sizes)
  per_client = max(int(sizes.sum()) // max(k, 1), 1)
  need = max(1, math.ceil(min_examples / per_client))
  if max_clients and need > max_clients:
    logging.warning('grouping: min_examples=%d needs %d clients of %d examples on average, more than '
                    'max_clients=%d: the constraints conflict', min_examples, need, per_client, max_clients)
  return max(1, k // need)


def balanced_assignment(cost, cluster_size: int) -> np.ndarray:
  """argmin sum_i cost[i, label_i] with every cluster holding exactly `cluster_size` rows.

  cost [M, n_c] with M = n_c * cluster_size. Small problems: scipy's linear_sum_assignment on the cost
  matrix with every cluster repeated cluster_size times (M x M); large ones: the same problem as a
  transportation LP (HiGHS dual simplex; its vertex solutions are integral). Returns labels [M].
  """
  cost = np.asarray(cost, np.float64)
  m, n_c = cost.shape
  if m != n_c * cluster_size:
    raise ValueError(f'{m} rows for {n_c} clusters of {cluster_size}')
  if m <= ICG_DENSE_MAX:
    from scipy.optimize import linear_sum_assignment
    rows, cols = linear_sum_assignment(np.repeat(cost, cluster_size, axis=1))
    labels = np.empty(m, np.int64)
    labels[rows] = cols // cluster_size
    return labels
  from scipy import sparse
  from scipy.optimize import linprog
  logging.info('grouping: ICG assignment of %d clients to %d clusters as a transportation LP (slow)', m, n_c)
  var = np.arange(m * n_c).reshape(m, n_c)
  rows = np.concatenate([np.repeat(np.arange(m), n_c), m + np.tile(np.arange(n_c), m)])
  a_eq = sparse.csr_matrix((np.ones(2 * m * n_c), (rows, np.concatenate([var.ravel(), var.ravel()]))),
                           shape=(m + n_c, m * n_c))
  b_eq = np.concatenate([np.ones(m), np.full(n_c, cluster_size)])
  res = linprog(cost.ravel(), A_eq=a_eq, b_eq=b_eq, bounds=(0, 1), method='highs-ds')
  if res.status != 0:
    raise RuntimeError(f'ICG assignment LP failed: {res.message}')
  labels = np.argmax(res.x.reshape(m, n_c), axis=1)
  if np.any(np.bincount(labels, minlength=n_c) != cluster_size):
    raise RuntimeError('ICG assignment LP returned a fractional solution')
  return labels.astype(np.int64)


def equal_size_kmeans(reps, n_clusters: int, cluster_size: int, rng: np.random.Generator,
                      iterations: int = 10) -> np.ndarray:
  """k-means with every cluster exactly `cluster_size` rows (reps has n_clusters * cluster_size rows).

  Random equal-size start; each iteration: centroids = member means, then the balanced assignment on
  squared Euclidean costs; stops after `iterations` assignments or when one repeats the previous.
  """
  reps = np.asarray(reps, np.float64)
  labels = np.repeat(np.arange(n_clusters), cluster_size)[rng.permutation(len(reps))]
  for _ in range(max(1, int(iterations))):
    centroids = np.stack([reps[labels == c].mean(axis=0) for c in range(n_clusters)])
    # ||x - c||^2 without the [M, n_c, d] difference tensor (M can be tens of thousands).
    cost = (np.sum(reps ** 2, axis=1)[:, None] - 2 * reps @ centroids.T + np.sum(centroids ** 2, axis=1)[None, :])
    new = balanced_assignment(cost, cluster_size)
    if np.array_equal(new, labels):
      break
    labels = new
  return labels


def icg_grouping(reps, sizes, *, min_examples: int, max_clients: int, rng: np.random.Generator,
                 num_superclients: Optional[int] = None, iterations: int = 10) -> List[np.ndarray]:
  reps = np.asarray(reps, np.float64)
  k = len(reps)
  n = _clamp(num_superclients, k)
  if n is None:
    n = num_superclients_from_constraints(sizes, min_examples=min_examples, max_clients=max_clients)
  n_c = k // n
  order = rng.permutation(k)
  picked, rest = order[:n_c * n], order[n_c * n:]
  labels = equal_size_kmeans(reps[picked], n_c, n, rng, iterations)
  members = [rng.permutation(picked[labels == c]) for c in range(n_c)]
  groups = [[int(members[c][g]) for c in range(n_c)] for g in range(n)]
  for i, kk in enumerate(rest):
    groups[i % n].append(int(kk))
  return _as_arrays(groups)


def make_groups(method: str, sizes, reps=None, *, distance: str = 'euclidean', num_clusters: int = 10,
                min_examples: int = 1, max_clients: int = 0, seed: int = 0,
                num_superclients: Optional[int] = None, icg_iterations: int = 10) -> List[np.ndarray]:
  """Dispatch by method name; `reps` [K, d] is needed by every method but 'random'."""
  rng = np.random.default_rng([int(seed), 0x6A0F])
  kw = dict(min_examples=int(min_examples), max_clients=int(max_clients), num_superclients=num_superclients)
  if method == 'random':
    return random_grouping(sizes, rng=rng, **kw)
  if reps is None:
    raise ValueError(f'grouping method {method!r} needs client representations')
  if len(reps) != len(sizes):
    raise ValueError(f'{len(reps)} representations for {len(sizes)} clients')
  if method == 'kmeans':
    return kmeans_grouping(reps, sizes, num_clusters=num_clusters, rng=rng, **kw)
  if method == 'greedy':
    return greedy_grouping(reps, sizes, distance=distance, rng=rng, **kw)
  if method == 'icg':
    return icg_grouping(reps, sizes, rng=rng, iterations=icg_iterations, **kw)
  raise ValueError(f'grouping method={method!r} is unknown; allowed: {METHODS}')
