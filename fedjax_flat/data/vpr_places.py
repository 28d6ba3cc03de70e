"""Place-recognition data (FedVPR, thesis 6.3): federated splits of geo-tagged sequences and the training tuples.

A city's images are queries and database frames with UTM positions (metres); database frames come in
sequences. What every place-recognition source (data/sources/vpr_synthetic.py, data/sources/msls.py) shares:

  proximity_split   Table 6.5's Proximity split, per city: pick a random unassigned query, group the unassigned
                    queries within `radius` of it and the unassigned database sequences whose centroid is within
                    `radius`; the group is a client when it holds >= 2 queries and >= 2 database sequences
                    (the validity rule), else its items are dropped. Repeat until no query is left.
  clustering_split  Table 6.5's Clustering split, per city: k-means (k-means++ init, Lloyd) with k clusters over
                    the visual features of the city's queries and database sequences (a sequence: the mean of
                    its frames' features); cluster c's queries and sequences are a client under the same
                    validity rule. k per city = that city's number of Proximity clients at 2000 m, so that the
                    total matches the 2000 m split (713 on MSLS) before the validity rule drops clusters.
                    Features: `image_statistic` (no model: the mean colour of every cell of a 4 x 4 grid), or
                    any [n, d] descriptors given (e.g. a model's).
  hold_out          `n` random clients of a split to the server's validation set (the thesis: 12).
  random_split      Table 6.5's Random split: queries of every city dealt at random to `num_clients`
                    clients, each with the database sequences holding its positives (duplicated where
                    clients share one) and a random share of the rest: a client's images span the cities,
                    so its negatives are mostly far away (few hard negatives).
  client_tuples     a client's training examples: per query, the positive candidates (its database frames
                    within `pos_radius` = 10 m, up to `num_positives`, nearest first) and its pool of negatives
                    (every frame of the client's database beyond `neg_radius` = 25 m, in random order; at most
                    `neg_pool` of them, a random subset when there are more: the reference's neg_samples_num
                    1000), all from the client's own database; queries without a positive are dropped (the MSLS
                    loader does the same). Indices are into the image array; -1 marks an empty slot.
  tuple_dataset     the FederatedDataset over an image store (data/federated.py): store [I, H, W, 3] uint8 holds
                    each image once, x [N, 1 + P + pool] int32 the tuples' image ids, y the same columns' slot
                    kinds (tasks/retrieval.py), draw = (1 + P, num_candidates): each time the round batches are
                    built, `num_candidates` negative candidates of every tuple are drawn afresh from its pool
                    (data/batching.draw_columns, keyed by seed, round, client, step and slot), so the batches
                    are x [B, 1 + P + num_candidates, H, W, 3] images and y [B, 1 + P + num_candidates] kinds;
                    test_x / test_y the server's query and database images with y = (easting, northing, role).

Mining and the reference's cache. The deep-visual-geo-localization benchmark's "partial" mining (datasets_ws.py)
refreshes a cache every `cache_refresh_rate` = 1000 queries: it samples 1000 queries and `neg_samples_num` = 1000
database images, computes their descriptors once with the model in eval mode, and gives each query the
`negs_num_per_query` hardest of the sampled images outside its 25 m soft positives, for the next 1000 queries'
training. Here each visit of a tuple draws `num_candidates` fresh negatives from its pool (the client's database
beyond 25 m, up to `neg_pool`), and tasks/retrieval.py computes their descriptors with the current model
(without gradient) at that very step before picking the hardest: the candidates are never stale (the
reference's are up to 1000 queries old, 1000 / B steps; a client round here is min(|D_k| / B, 2500) steps and
visits every tuple once, with a new draw), but each query sees `num_candidates` candidates per visit, not the
reference's ~1000, since every candidate costs a forward pass at every step.
Everything is a function of the arguments and the seed (numpy Generators).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from fedjax_flat.tasks import retrieval as ret_tasks
from fedjax_flat.data.federated import FederatedDataset

POS_RADIUS = 10.0      # metres: positives (the MSLS loader's posDistThr)
NEG_RADIUS = 25.0      # metres: negatives beyond it (nonNegDistThr)
MIN_QUERIES = 2        # Table 6.5's validity rule: a client needs >= 2 queries ...
MIN_SEQUENCES = 2      # ... and >= 2 database sequences


def distances(a, b):
  """Euclidean distances [len(a), len(b)] between positions a [n, 2] and b [m, 2]."""
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  return np.sqrt(np.maximum(np.sum(a * a, 1)[:, None] + np.sum(b * b, 1)[None, :] - 2 * a @ b.T, 0.0))


def within(query_pos, db_pos, radius: float):
  """For every query, the indices of the database positions within `radius` metres (a grid of radius-sized
  cells: each query looks at its 3 x 3 neighbouring cells, so memory follows the matches, not Nq x Nd)."""
  query_pos = np.asarray(query_pos, np.float64).reshape(-1, 2)
  db_pos = np.asarray(db_pos, np.float64).reshape(-1, 2)
  cells = {}
  for i, c in enumerate(map(tuple, np.floor(db_pos / radius).astype(np.int64))):
    cells.setdefault(c, []).append(i)
  out = []
  for q, (cx, cy) in zip(query_pos, np.floor(query_pos / radius).astype(np.int64)):
    cand = [i for dx in (-1, 0, 1) for dy in (-1, 0, 1) for i in cells.get((cx + dx, cy + dy), ())]
    cand = np.array(sorted(cand), np.int64)
    out.append(cand[np.linalg.norm(db_pos[cand] - q, axis=1) <= radius] if len(cand) else cand)
  return out


def proximity_split(query_pos, seq_centroids, radius: float, seed: int,
                    min_queries: int = MIN_QUERIES, min_sequences: int = MIN_SEQUENCES):
  """Clients of one city as (query indices, sequence indices) lists (module docstring)."""
  query_pos = np.asarray(query_pos, np.float64).reshape(-1, 2)
  seq_centroids = np.asarray(seq_centroids, np.float64).reshape(-1, 2)
  rng = np.random.default_rng(seed)
  q_free = np.ones(len(query_pos), bool)
  s_free = np.ones(len(seq_centroids), bool)
  clients = []
  while q_free.any():
    seed_q = rng.choice(np.flatnonzero(q_free))
    qs = np.flatnonzero(q_free & (distances(query_pos[seed_q:seed_q + 1], query_pos)[0] <= radius))
    ss = (np.flatnonzero(s_free & (distances(query_pos[seed_q:seed_q + 1], seq_centroids)[0] <= radius))
          if len(seq_centroids) else np.zeros((0,), np.int64))
    q_free[qs] = False
    s_free[ss] = False
    if len(qs) >= min_queries and len(ss) >= min_sequences:
      clients.append((qs, ss))
  return clients


def image_statistic(images, grid: int = 4) -> np.ndarray:
  """[n, 3 grid^2] float: the mean colour (in [0, 1]) of every cell of a grid x grid partition of each
  [n, H, W, 3] uint8 image: the clustering split's visual feature when no model's descriptors are given."""
  x = np.asarray(images, np.float64) / 255.0
  n, h, w = x.shape[:3]
  hs, ws = np.linspace(0, h, grid + 1).astype(int), np.linspace(0, w, grid + 1).astype(int)
  cells = [x[:, hs[i]:max(hs[i + 1], hs[i] + 1), ws[j]:max(ws[j + 1], ws[j] + 1)].mean((1, 2))
           for i in range(grid) for j in range(grid)]
  return np.concatenate(cells, axis=1).reshape(n, -1)


def kmeans_labels(x, k: int, seed: int, iters: int = 100) -> np.ndarray:
  """Cluster labels [n] of points x [n, d]: k-means++ initialisation, then Lloyd's iterations until no label
  changes (an emptied cluster takes the point farthest from its centre)."""
  x = np.asarray(x, np.float64)
  k = int(min(max(k, 1), len(x)))
  rng = np.random.default_rng(seed)
  centres = [x[rng.integers(len(x))]]
  for _ in range(1, k):
    d = np.min(distances_sq(x, np.stack(centres)), 1)
    centres.append(x[rng.choice(len(x), p=d / d.sum())] if d.sum() > 0 else x[rng.integers(len(x))])
  c = np.stack(centres)
  labels = np.full(len(x), -1)
  for _ in range(int(iters)):
    d = distances_sq(x, c)
    new = np.argmin(d, 1)
    for j in range(k):
      if not np.any(new == j):
        far = int(np.argmax(d[np.arange(len(x)), new]))
        new[far] = j
    if np.array_equal(new, labels):
      break
    labels = new
    c = np.stack([x[labels == j].mean(0) for j in range(k)])
  return labels


def distances_sq(a, b):
  return np.maximum(np.sum(a * a, 1)[:, None] + np.sum(b * b, 1)[None, :] - 2 * a @ b.T, 0.0)


def clustering_split(query_feats, seq_feats, k: int, seed: int, min_queries: int = MIN_QUERIES,
                     min_sequences: int = MIN_SEQUENCES):
  """Clients of one city as (query indices, sequence indices): k-means over the queries' and sequences'
  features together (module docstring); clusters failing the validity rule are dropped."""
  q = np.asarray(query_feats, np.float64).reshape(len(query_feats), -1)
  sq = np.asarray(seq_feats, np.float64).reshape(len(seq_feats), -1)
  if not len(q) or not len(sq) or k < 1:
    return []
  labels = kmeans_labels(np.concatenate([q, sq]), k, seed)
  lq, ls = labels[:len(q)], labels[len(q):]
  out = []
  for c in range(int(labels.max()) + 1):
    qs, ss = np.flatnonzero(lq == c), np.flatnonzero(ls == c)
    if len(qs) >= min_queries and len(ss) >= min_sequences:
      out.append((qs, ss))
  return out


def hold_out(groups, n: int, seed: int):
  """(training groups, validation groups): `n` clients drawn at random (all but one at most) to validation."""
  n = int(min(max(n, 0), max(len(groups) - 1, 0)))
  pick = set(np.random.default_rng([seed, 12]).choice(len(groups), n, replace=False).tolist()) if n else set()
  return ([g for i, g in enumerate(groups) if i not in pick], [g for i, g in enumerate(groups) if i in pick])


def random_split(query_sequences: Sequence[np.ndarray], num_sequences: int, num_clients: int, seed: int):
  """(query indices, sequence indices) of `num_clients` clients: queries dealt uniformly at random over every
  city; each client's database holds the sequences with its queries' positives (`query_sequences[i]`: the
  sequences with a frame within 10 m of query i; duplicated when queries of several clients share one) and a
  random share of the remaining sequences."""
  rng = np.random.default_rng(seed)
  qs = np.array_split(rng.permutation(len(query_sequences)), num_clients)
  empty = [np.zeros((0,), np.int64)]
  needed = [np.unique(np.concatenate([np.asarray(query_sequences[i], np.int64) for i in q] + empty)) for q in qs]
  used = np.zeros(num_sequences, bool)
  for n in needed:
    used[n] = True
  rest = np.array_split(rng.permutation(np.flatnonzero(~used)), num_clients)
  return [(q, np.union1d(n, r)) for q, n, r in zip(qs, needed, rest)]


NEG_POOL = 1000        # negatives kept per query: the reference's neg_samples_num


def client_tuples(query_ids, query_pos, db_ids, db_pos, *, num_positives: int, seed: int, neg_pool: int = NEG_POOL,
                  pos_radius: float = POS_RADIUS, neg_radius: float = NEG_RADIUS):
  """[n, 1 + num_positives + pool] image indices (-1 = empty) of one client's training tuples: the query, its
  nearest positives, then its pool of negatives in random order (module docstring); pool = the most any of
  its queries has, at most `neg_pool`."""
  query_ids = np.asarray(query_ids)
  db_ids = np.asarray(db_ids)
  rng = np.random.default_rng(seed)
  if not len(query_ids) or not len(db_ids):
    return np.zeros((0, 1 + num_positives), np.int64)
  d = distances(query_pos, db_pos)
  rows = []
  for i, q in enumerate(query_ids):
    pos = np.flatnonzero(d[i] <= pos_radius)
    if not len(pos):
      continue
    pos = pos[np.argsort(d[i, pos], kind='stable')][:num_positives]
    neg = np.flatnonzero(d[i] > neg_radius)
    neg = rng.permutation(neg)[:int(neg_pool)]
    row = np.full((1 + num_positives + len(neg),), -1, np.int64)
    row[0] = q
    row[1:1 + len(pos)] = db_ids[pos]
    row[1 + num_positives:] = db_ids[neg]
    rows.append(row)
  return pad_columns(rows, 1 + num_positives)


def pad_columns(rows, width: int = 0) -> np.ndarray:
  """Rows of different lengths as one int64 [n, max(len, width)] array, padded with -1."""
  k = max([width] + [len(r) for r in rows])
  out = np.full((len(rows), k), -1, np.int64)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def slot_kinds(num_positives: int, tuples):
  """[n, T] uint8 slot kinds of tuples (tasks/retrieval.py: QUERY, POSITIVE, NEGATIVE, EMPTY)."""
  kinds = np.zeros(tuples.shape, np.uint8)
  kinds[:, 0] = ret_tasks.QUERY
  kinds[:, 1:1 + num_positives] = ret_tasks.POSITIVE
  kinds[:, 1 + num_positives:] = ret_tasks.NEGATIVE
  kinds[tuples < 0] = ret_tasks.EMPTY
  return kinds


def test_labels(query_pos, db_pos):
  """y [Nq + Nd, 3] float32 = (easting, northing, role) of the test queries then the test database."""
  q = np.concatenate([np.asarray(query_pos, np.float32).reshape(-1, 2),
                      np.full((len(query_pos), 1), ret_tasks.QUERY_ROLE, np.float32)], 1)
  d = np.concatenate([np.asarray(db_pos, np.float32).reshape(-1, 2),
                      np.full((len(db_pos), 1), ret_tasks.DATABASE_ROLE, np.float32)], 1)
  return np.concatenate([q, d], 0)


def tuple_dataset(images, client_tuple_lists: Sequence[np.ndarray], num_positives: int, num_candidates: int,
                  test_x, test_y, name: str, client_names=None) -> FederatedDataset:
  """The FederatedDataset of training tuples over the image store `images` (module docstring): every client's
  pool padded to the widest (and to at least `num_candidates`) with empty slots, read as zero images."""
  fixed = 1 + int(num_positives)
  tuples = pad_columns([r for t in client_tuple_lists for r in t], fixed + int(num_candidates))
  x = tuples.astype(np.int32)
  y = slot_kinds(num_positives, tuples)
  offsets = np.cumsum([0] + [len(t) for t in client_tuple_lists])
  groups = [np.arange(offsets[k], offsets[k + 1]) for k in range(len(client_tuple_lists))]
  return FederatedDataset.from_client_indices(x, y, groups, test_x, test_y, num_classes=1, name=name,
                                              client_names=client_names, task='retrieval',
                                              store=np.asarray(images), draw=(fixed, int(num_candidates)))


def split_statistics(clients: Sequence[Tuple[np.ndarray, np.ndarray]], seq_sizes) -> dict:
  """Table 6.5's columns: sequences per client, images per client (mean, std), number of clients."""
  seq_sizes = np.asarray(seq_sizes)
  seqs = np.array([len(s) for _, s in clients], np.float64)
  imgs = np.array([len(q) + int(np.sum(seq_sizes[s])) for q, s in clients], np.float64)
  f = lambda a: (float(np.mean(a)) if len(a) else 0.0, float(np.std(a)) if len(a) else 0.0)  # noqa: E731
  return {'clients': len(clients), 'sequences_per_client': f(seqs), 'images_per_client': f(imgs)}

