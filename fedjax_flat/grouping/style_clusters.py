"""Style clustering for LADD (thesis Algorithm 7): k-means on the clients' FDA styles, k by the silhouette.

  for k in ks (release: 4..19, capped at K - 1):
      n_init k-means runs (k-means++ seeding, Lloyd iterations); keep the run with the least inertia
      sigma(k) = mean silhouette of the clients
  k* = argmax_k sigma(k)   (`force_k` overrides the selection)

Silhouette of client i in cluster A (Rousseeuw 1987; scikit-learn's `silhouette_score`, Euclidean):
  a_i = mean distance to the other members of A,  b_i = min over clusters B != A of the mean distance to B,
  s_i = (b_i - a_i) / max(a_i, b_i),  and s_i = 0 when |A| = 1.
The release runs scikit-learn's `KMeans(k, n_init=10)`, which keeps the run of least inertia (the thesis'
Algorithm 7 writes "least sum of a_k"; the two agree on separated clusters); we do the same in numpy, keyed
by the seed. Centroids are the member means (mu_c); a test image is routed to the nearest centroid in L2
(`route`, as the release's `KMeans.predict`).

Pure numpy: no model. The inputs are the flattened styles (data/transforms/fda.py); `cluster_clients` computes
them from a dataset's clients first (what the trainer does for an algorithm that needs 'style_clusters').
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence

import numpy as np

from fedjax_flat.data.transforms import fda

RELEASE_KS = tuple(range(4, 20))     # the release's candidate numbers of clusters


@dataclasses.dataclass(frozen=True)
class StyleClustering:
  k: int
  labels: np.ndarray          # [K] cluster of every client
  centroids: np.ndarray       # [k, D]
  scores: Dict[int, float]    # silhouette of every candidate k tried (empty when forced)
  inertia: float

  def sizes(self) -> np.ndarray:
    return np.bincount(self.labels, minlength=self.k)


def _sq_dists(x, c):
  return np.maximum(np.sum(x * x, 1)[:, None] - 2 * x @ c.T + np.sum(c * c, 1)[None, :], 0.0)


def _kmeanspp(x, k: int, rng: np.random.Generator) -> np.ndarray:
  """k-means++ seeding (Arthur & Vassilvitskii 2007): first centre uniform, then D^2-weighted draws."""
  n = len(x)
  centres = [x[rng.integers(n)]]
  d2 = _sq_dists(x, np.asarray(centres))[:, 0]
  for _ in range(1, k):
    total = d2.sum()
    i = rng.integers(n) if total <= 0 else rng.choice(n, p=d2 / total)
    centres.append(x[i])
    d2 = np.minimum(d2, _sq_dists(x, x[i:i + 1])[:, 0])
  return np.asarray(centres)


def kmeans(x, k: int, *, n_init: int = 10, max_iter: int = 300, tol: float = 1e-10,
           rng: Optional[np.random.Generator] = None):
  """(labels [N], centroids [k, D], inertia) of the best of `n_init` k-means runs (least inertia)."""
  x = np.asarray(x, np.float64)
  if not 1 <= k <= len(x):
    raise ValueError(f'k={k} clusters for {len(x)} points')
  rng = np.random.default_rng(0) if rng is None else rng
  best = None
  for _ in range(int(n_init)):
    c = _kmeanspp(x, k, rng)
    labels = None
    for _ in range(max_iter):
      new = np.argmin(_sq_dists(x, c), axis=1)
      moved = c.copy()
      for j in range(k):
        members = x[new == j]
        if len(members):
          moved[j] = members.mean(0)
        else:               # an emptied cluster takes the point farthest from its centre
          far = int(np.argmax(np.min(_sq_dists(x, moved), axis=1)))
          moved[j] = x[far]
      shift = np.sum((moved - c) ** 2)
      c = moved
      if labels is not None and np.array_equal(new, labels) and shift <= tol:
        break
      labels = new
    labels = np.argmin(_sq_dists(x, c), axis=1)
    inertia = float(np.sum(np.min(_sq_dists(x, c), axis=1)))
    if best is None or inertia < best[2]:
      best = (labels, c, inertia)
  return best


def silhouette_samples(x, labels) -> np.ndarray:
  """Per-point silhouette s_i (Euclidean; 0 for points alone in their cluster)."""
  x = np.asarray(x, np.float64)
  labels = np.asarray(labels)
  d = np.sqrt(np.maximum(_sq_dists(x, x), 0.0))
  np.fill_diagonal(d, 0.0)
  ids = np.unique(labels)
  if len(ids) < 2:
    raise ValueError('the silhouette needs at least 2 clusters')
  s = np.zeros(len(x))
  for i in range(len(x)):
    own = labels == labels[i]
    n_own = own.sum()
    if n_own == 1:
      continue
    a = d[i, own].sum() / (n_own - 1)
    b = min(d[i, labels == j].mean() for j in ids if j != labels[i])
    m = max(a, b)
    s[i] = 0.0 if m == 0 else (b - a) / m
  return s


def silhouette_score(x, labels) -> float:
  return float(np.mean(silhouette_samples(x, labels)))


def cluster_styles(styles, ks: Sequence[int] = RELEASE_KS, *, force_k: int = 0, n_init: int = 10,
                   seed: int = 0) -> StyleClustering:
  """Algorithm 7 on styles [K, ...] (flattened per client). ks is capped at K - 1 (the silhouette needs
  2 <= k <= K - 1); `force_k` > 0 skips the selection."""
  x = np.asarray(styles, np.float64).reshape(len(styles), -1)
  n = len(x)
  rng = np.random.default_rng([seed, 7])
  if force_k:
    if not 1 <= force_k <= n:
      raise ValueError(f'force_k={force_k} for {n} clients: allowed 1..{n}')
    labels, c, inertia = kmeans(x, int(force_k), n_init=n_init, rng=rng)
    return StyleClustering(int(force_k), labels.astype(np.int32), c, {}, inertia)
  cand = sorted({int(k) for k in ks if 2 <= int(k) <= n - 1})
  if not cand:
    raise ValueError(f'no candidate k in {list(ks)} fits {n} clients (2 <= k <= {n - 1}); set force_k')
  best, scores = None, {}
  for k in cand:
    labels, c, inertia = kmeans(x, k, n_init=n_init, rng=rng)
    if len(np.unique(labels)) < 2:
      continue
    scores[k] = silhouette_score(x, labels)
    if best is None or scores[k] > scores[best[0]]:
      best = (k, labels, c, inertia)
  k, labels, c, inertia = best
  return StyleClustering(k, labels.astype(np.int32), c, scores, inertia)


def cluster_clients(data, *, ks: Sequence[int] = RELEASE_KS, force_k: int = 0, seed: int = 0,
                    b: int = fda.FDA_B) -> StyleClustering:
  """Every training client's FDA style (data/transforms/fda.client_styles: the mean over its images), then
  Algorithm 7 (`cluster_styles`)."""
  return cluster_styles(fda.client_styles(data, b), ks, force_k=force_k, seed=seed)


def route(styles, centroids) -> np.ndarray:
  """The nearest centroid (L2) of each style [N, ...]: int32 [N] (test-time routing)."""
  x = np.asarray(styles, np.float64).reshape(len(styles), -1)
  return np.argmin(_sq_dists(x, np.asarray(centroids, np.float64)), axis=1).astype(np.int32)


def agreement(found, planted) -> float:
  """Fraction of client pairs on which two clusterings agree (same / different cluster): the Rand index."""
  f, p = np.asarray(found), np.asarray(planted)
  same_f, same_p = f[:, None] == f[None, :], p[:, None] == p[None, :]
  iu = np.triu_indices(len(f), 1)
  return float(np.mean(same_f[iu] == same_p[iu])) if len(iu[0]) else 1.0
