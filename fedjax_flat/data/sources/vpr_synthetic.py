"""`vpr_synthetic`: a synthetic place-recognition set (FedVPR's stand-in for MSLS on this machine).

Each city is a textured 2-D world map at 1 pixel per metre (smooth colour fields, "buildings" as random
rectangles and discs of random colours); cities lie 100 km apart in easting. An image taken at a "GPS"
position (metres) is the map seen through a `view_m` x `view_m` window centred near it, resampled to
`image_size`:
  viewpoint      the window's centre shifted by U(-view_jitter, view_jitter) metres on each axis and its
                 scale by U(1 - zoom, 1 + zoom) (the camera is never exactly where the tag says)
  illumination   x' = clip(x^gamma * gain + offset + noise, 0, 1) per image; database images are "day"
                 (gamma in [0.8, 1.25], gain 0.85-1.15), queries any time (gamma in [0.5, 2], gain 0.6-1.4,
                 offset +-0.1): the model has to learn invariance to both, as between MSLS's query and
                 database sets.
Database frames come in sequences (`seq_len` frames `frame_step` metres apart along a random walk); each
query is taken within a few metres (N(0, query_offset)) of a random database frame, so most queries have a
positive (<= 10 m) and hard negatives (25 m to a few hundred metres) share parts of the view.

Training cities are split into clients (data/vpr_places.py): 'proximity' (Table 6.5, `split_radius` metres,
>= 2 queries and >= 2 sequences per client) or 'random' (queries of all cities dealt to `num_clients` clients
with the sequences of their positives, the other sequences dealt at random; 0 = as many clients as the
proximity split gives), or 'single' (one client with everything: the centralized reference, mining over
the whole database). Each client's training examples are
its query tuples over one image store (data/vpr_places.tuple_dataset: positives and a pool of up to `neg_pool`
negatives from its own database, `num_candidates` of them drawn afresh whenever the round's batches are built;
tasks/retrieval.py mines the hardest). The test set is a separate city on the server: its queries and database,
y = (easting, northing, role).

Extra attributes: split_stats (Table 6.5's columns), tuple_index [N, K] (= x: the image ids of each tuple's
query, positives and negative pool), image_pos [images, 2], image_client (the client holding each image; -2
when several hold it).

Default size: 4 training cities of 300 m x 300 m, 30 sequences x 8 frames and 80 queries each, 32 x 32
images; generated in a few seconds (3.6 s measured under load).
"""
from __future__ import annotations

import numpy as np

from fedjax_flat.errors import ConfigError
from fedjax_flat.data import vpr_places
from fedjax_flat.data.registry import register

SPLITS = ('proximity', 'random', 'single')
CITY_SPACING = 100_000.0      # metres between the cities' origins (easting)


def world_map(size: int, seed: int) -> np.ndarray:
  """[size, size, 3] float32 in [0, 1]: a smooth colour field with random rectangles and discs on it."""
  rng = np.random.default_rng([seed, 0])
  yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
  img = np.full((size, size, 3), 0.5, np.float32)
  for _ in range(4):                       # low-frequency colour field
    theta, freq, phase = rng.uniform(0, np.pi), rng.uniform(0.005, 0.04), rng.uniform(0, 2 * np.pi)
    wave = np.sin(freq * (np.cos(theta) * xx + np.sin(theta) * yy) + phase)
    img += 0.12 * wave[..., None] * rng.uniform(-1, 1, 3).astype(np.float32)
  n = int(size * size / 120)
  for _ in range(n):                       # "buildings" and "trees"
    cy, cx = rng.uniform(0, size, 2)
    colour = rng.uniform(0.05, 0.95, 3).astype(np.float32)
    r = rng.uniform(1.5, 7.0)
    y0, y1 = int(max(cy - 2 * r, 0)), int(min(cy + 2 * r + 1, size))
    x0, x1 = int(max(cx - 2 * r, 0)), int(min(cx + 2 * r + 1, size))
    wy, wx = yy[y0:y1, x0:x1] - cy, xx[y0:y1, x0:x1] - cx
    if rng.uniform() < 0.5:
      th = rng.uniform(0, np.pi)
      u, v = np.cos(th) * wx + np.sin(th) * wy, -np.sin(th) * wx + np.cos(th) * wy
      inside = (np.abs(u) <= r) & (np.abs(v) <= r * rng.uniform(0.3, 1.0))
    else:
      inside = wx * wx + wy * wy <= r * r
    img[y0:y1, x0:x1][inside] = colour
  return np.clip(img, 0.0, 1.0)


def render(world, pos, rng, *, image_size: int, view_m: float, view_jitter: float, zoom: float,
           query: bool) -> np.ndarray:
  """One uint8 image [image_size, image_size, 3] of `world` seen from pos = (x, y) metres in map coordinates."""
  size = world.shape[0]
  centre = np.asarray(pos, np.float64) + rng.uniform(-view_jitter, view_jitter, 2)
  scale = view_m * rng.uniform(1 - zoom, 1 + zoom) / image_size
  g = (np.arange(image_size) - (image_size - 1) / 2) * scale
  ys = np.clip(np.round(centre[1] + g), 0, size - 1).astype(np.int64)
  xs = np.clip(np.round(centre[0] + g), 0, size - 1).astype(np.int64)
  img = world[ys[:, None], xs[None, :]]
  if query:
    gamma = np.exp(rng.uniform(np.log(0.5), np.log(2.0)))
    gain, off = rng.uniform(0.6, 1.4, 3), rng.uniform(-0.1, 0.1, 3)
  else:
    gamma, gain, off = np.exp(rng.uniform(np.log(0.8), np.log(1.25))), rng.uniform(0.85, 1.15, 3), np.zeros(3)
  img = np.power(img, gamma) * gain + off + rng.normal(0, 0.02, img.shape)
  return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


def city(seed: int, city_id: int, *, city_size: float, sequences: int, seq_len: int, frame_step: float,
         queries: int, query_offset: float, image_size: int, view_m: float, view_jitter: float, zoom: float):
  """(database images, positions [Nd, 2], sequence id per frame, query images, positions [Nq, 2]) of one city;
  positions in metres with the city's easting offset."""
  margin = int(np.ceil(view_m))
  size = int(np.ceil(city_size)) + 2 * margin
  world = world_map(size, seed * 1000 + city_id)
  rng = np.random.default_rng([seed, city_id, 1])
  pos, seq = [], []
  for s in range(sequences):
    p = rng.uniform(0, city_size, 2)
    heading = rng.uniform(0, 2 * np.pi)
    for _ in range(seq_len):
      pos.append(p.copy())
      seq.append(s)
      heading += rng.normal(0, 0.2)
      p = np.clip(p + frame_step * np.array([np.cos(heading), np.sin(heading)]), 0, city_size)
  db_pos = np.array(pos)
  q_pos = np.clip(db_pos[rng.integers(0, len(db_pos), queries)] + rng.normal(0, query_offset, (queries, 2)),
                  0, city_size)
  kw = dict(image_size=image_size, view_m=view_m, view_jitter=view_jitter, zoom=zoom)
  db_img = np.stack([render(world, p + margin, rng, query=False, **kw) for p in db_pos])
  q_img = np.stack([render(world, p + margin, rng, query=True, **kw) for p in q_pos])
  off = np.array([city_id * CITY_SPACING, 0.0])
  return db_img, db_pos + off, np.array(seq, np.int64), q_img, q_pos + off


FIELDS = dict(num_cities=4, city_size=300.0, sequences_per_city=30, seq_len=8, frame_step=4.0,
              queries_per_city=80, query_offset=4.0, image_size=32, view_m=32.0, view_jitter=3.0, zoom=0.1,
              split='proximity', split_radius=100.0, num_clients=0, num_positives=2, num_candidates=10,
              neg_pool=vpr_places.NEG_POOL, test_sequences=30, test_queries=80, seed=0)


def _check(d):
  if d.get('split', 'proximity') not in SPLITS:
    raise ConfigError('data.split', d.get('split'), f'one of {SPLITS}')
  for k in ('num_cities', 'sequences_per_city', 'seq_len', 'queries_per_city', 'image_size', 'num_positives',
            'num_candidates', 'neg_pool', 'test_sequences', 'test_queries'):
    if k in d and int(d[k]) < 1:
      raise ConfigError(f'data.{k}', d[k], 'an integer >= 1')
  for k in ('city_size', 'frame_step', 'view_m', 'split_radius'):
    if k in d and not (np.isfinite(float(d[k])) and float(d[k]) > 0):
      raise ConfigError(f'data.{k}', d[k], 'a finite number > 0 (metres)')


def load(num_cities=4, city_size=300.0, sequences_per_city=30, seq_len=8, frame_step=4.0, queries_per_city=80,
         query_offset=4.0, image_size=32, view_m=32.0, view_jitter=3.0, zoom=0.1, split='proximity',
         split_radius=100.0, num_clients=0, num_positives=2, num_candidates=10, test_sequences=30,
         test_queries=80, seed=0, neg_pool=vpr_places.NEG_POOL):
  """The federated stand-in (module docstring)."""
  _check(dict(split=split, num_cities=num_cities, sequences_per_city=sequences_per_city, seq_len=seq_len,
              queries_per_city=queries_per_city, image_size=image_size, num_positives=num_positives,
              num_candidates=num_candidates, neg_pool=neg_pool, test_sequences=test_sequences,
              test_queries=test_queries, city_size=city_size, frame_step=frame_step, view_m=view_m,
              split_radius=split_radius))
  kw = dict(city_size=float(city_size), seq_len=int(seq_len), frame_step=float(frame_step),
            query_offset=float(query_offset), image_size=int(image_size), view_m=float(view_m),
            view_jitter=float(view_jitter), zoom=float(zoom))
  cities = [city(int(seed), c, sequences=int(sequences_per_city), queries=int(queries_per_city), **kw)
            for c in range(int(num_cities))]
  tdb, tdb_pos, _, tq, tq_pos = city(int(seed), int(num_cities), sequences=int(test_sequences),
                                     queries=int(test_queries), **kw)
  # One image array: every city's database frames, then every city's queries.
  db_img = np.concatenate([c[0] for c in cities])
  db_pos = np.concatenate([c[1] for c in cities])
  seq_off = np.cumsum([0] + [int(sequences_per_city)] * int(num_cities))
  db_seq = np.concatenate([c[2] + seq_off[i] for i, c in enumerate(cities)])
  q_img = np.concatenate([c[3] for c in cities])
  q_pos = np.concatenate([c[4] for c in cities])
  images = np.concatenate([db_img, q_img])
  q_base = len(db_img)
  seq_frames = [np.flatnonzero(db_seq == s) for s in range(seq_off[-1])]
  centroids = np.stack([db_pos[f].mean(0) for f in seq_frames])
  nq = int(queries_per_city)
  groups = []
  for c in range(int(num_cities)):
    qs = np.arange(c * nq, (c + 1) * nq)
    ss = np.arange(seq_off[c], seq_off[c + 1])
    for gq, gs in vpr_places.proximity_split(q_pos[qs], centroids[ss], float(split_radius), seed=int(seed) * 7919 + c):
      groups.append((qs[gq], ss[gs]))
  if split == 'random':
    k = int(num_clients) or max(1, len(groups))
    near = vpr_places.within(q_pos, db_pos, vpr_places.POS_RADIUS)
    groups = vpr_places.random_split([np.unique(db_seq[row]) for row in near], len(seq_frames), k, seed=int(seed))
  elif split == 'single':          # the centralized reference: one client holding every query and sequence
    groups = [(np.arange(len(q_pos)), np.arange(len(seq_frames)))]
  elif int(num_clients):
    raise ConfigError('data.num_clients', num_clients, "0 with split='proximity' (the radius sets the clients)")
  if not groups:
    raise ConfigError('data.split_radius', split_radius, 'a larger radius: no group holds >= 2 queries and >= 2 '
                      'database sequences')
  tuples = []
  for k, (qs, ss) in enumerate(groups):
    frames = np.concatenate([seq_frames[s] for s in ss]) if len(ss) else np.zeros((0,), np.int64)
    tuples.append(vpr_places.client_tuples(q_base + qs, q_pos[qs], frames, db_pos[frames],
                                           num_positives=int(num_positives), neg_pool=int(neg_pool),
                                           seed=int(seed) * 104729 + k))
  test_x = np.concatenate([tq, tdb])
  test_y = vpr_places.test_labels(tq_pos, tdb_pos)
  data = vpr_places.tuple_dataset(images, tuples, int(num_positives), int(num_candidates), test_x, test_y,
                                  name=f'vpr_synthetic_{split}')
  data.split_stats = vpr_places.split_statistics(groups, [len(f) for f in seq_frames])
  data.tuple_index = data.x                                   # [N, K] image ids of the slots (-1 empty)
  data.image_pos = np.concatenate([db_pos, q_pos])            # [images, 2] metres
  data.image_client = np.full(len(images), -1, np.int64)      # the client holding an image (-1: none or several)
  for k, (qs, ss) in enumerate(groups):
    for ids in [q_base + qs] + [seq_frames[s] for s in ss]:
      data.image_client[ids] = np.where(data.image_client[ids] == -1, k, -2)
  # Per-client metadata (H-FL's clusters, algorithms/hfl.py): the city of most of the client's queries; the
  # stand-in has no continents, its 'continent' pairs the cities (0-1, 2-3, ...).
  city_of = np.array([np.bincount((q_pos[qs, 0] // CITY_SPACING).astype(np.int64)).argmax() if len(qs) else 0
                   for qs, _ in groups], np.int64)
  data.client_groups = {'city': city_of, 'continent': city_of // 2}
  return data


@register('vpr_synthetic', task='retrieval', fields=FIELDS, check=_check)
def _vpr_synthetic(num_cities=4, city_size=300.0, sequences_per_city=30, seq_len=8, frame_step=4.0,
                   queries_per_city=80, query_offset=4.0, image_size=32, view_m=32.0, view_jitter=3.0, zoom=0.1,
                   split='proximity', split_radius=100.0, num_clients=0, num_positives=2, num_candidates=10,
                   test_sequences=30, test_queries=80, seed=0, neg_pool=vpr_places.NEG_POOL, **unused):
  del unused
  return load(num_cities=num_cities, city_size=city_size, sequences_per_city=sequences_per_city, seq_len=seq_len,
              frame_step=frame_step, queries_per_city=queries_per_city, query_offset=query_offset,
              image_size=image_size, view_m=view_m, view_jitter=view_jitter, zoom=zoom, split=split,
              split_radius=split_radius, num_clients=num_clients, num_positives=num_positives,
              num_candidates=num_candidates, test_sequences=test_sequences, test_queries=test_queries, seed=seed,
              neg_pool=neg_pool)
