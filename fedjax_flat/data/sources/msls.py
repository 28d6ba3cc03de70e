"""`msls`: Mapillary Street-Level Sequences in its official layout, federated as in FedVPR (thesis 6.3).

Layout (the official loader, github.com/mapillary/mapillary_sls `mapillary_sls/datasets/msls.py`):
  <root>/train_val/<city>/{query,database}/
      images/<key>.jpg
      raw.csv            [index], key, lon, lat, ca, captured_at, pano
      seq_info.csv       [index], key, sequence_key, frame_number
      postprocessed.csv  [index], key, easting, northing, night, control_panel, view_direction, unique_cluster
(the CSVs are pandas exports: a leading unnamed index column, which is ignored). Panoramas (raw.csv pano True)
are excluded. Positions are the UTM easting / northing of postprocessed.csv; each city is moved by
`CITY_SPACING` metres in easting so that no two cities' coordinates meet (UTM zones restart per city).

Cities (the thesis, 6.3): validation Amsterdam and Manila (`VAL_CITIES`, left out of training), test San
Francisco and Copenhagen (`TEST_CITIES`, kept on the server: their queries and database form the test set,
y = (easting, northing, role)); every other city of train_val/ trains. Clients: Table 6.5's 'proximity' split
(`split_radius` 1000 / 2000 / 4000 m, >= 2 queries and >= 2 database sequences per client), 'clustering' (per
city k-means on a visual feature, the 4 x 4-grid mean colour of the image read at 16 x 16 (no model's
descriptors: `vpr_places.image_statistic`), k per city = its proximity clients at `split_radius`, so the total
matches the 2000 m split) or 'random' (data/vpr_places.py). `val_clients` random clients of the split (the
thesis: 12) leave training: data.val_x / val_y hold their queries and database frames (labelled as the test
set), data.val_groups their (query, sequence) ids. Training examples are each client's query tuples over one
image store: positives within 10 m and a pool of up to `neg_pool` negatives beyond 25 m from the client's own
database, `num_candidates` of them drawn afresh each round (data/vpr_places.tuple_dataset; tasks/retrieval.py
mines the hardest at every step).

Images are decoded with PIL (untrusted files: `errors.reading`) and resized to `image_size`; the whole
federated set is held in memory (each image once, in the store the tuples index), so `max_queries_per_city` /
`max_sequences_per_city` bound it (0 = all; the full MSLS, 1.6M images: `msls_stream`, data/sources/msls_stream.py,
the same split and batches with each client's images decoded when its batches are built).
MSLS needs a manual download with a licence: `experiments/download.py --dataset=msls` prints the steps.
"""
from __future__ import annotations

import csv
import os
from typing import Dict, List

import numpy as np

from fedjax_flat import errors
from fedjax_flat.errors import ConfigError
from fedjax_flat.data import vpr_places
from fedjax_flat.data.registry import register
from fedjax_flat.data.download import default_data_dir
from fedjax_flat.data.sources.segmentation import _pil

VAL_CITIES = ('amsterdam', 'manila')
TEST_CITIES = ('sf', 'cph')
CITY_SPACING = 10_000_000.0
# H-FL's continent clusters (algorithms/hfl.py, data.client_groups['continent']). [U] The thesis has 4 continent
# clusters (its FedAvg budget C = 20 = 4 x 5) but does not list them; the MSLS train_val cities span six
# continents, grouped here into four: Europe, the Americas, Asia-Pacific (with Oceania), Africa. A city not listed
# forms the last group, 'other'.
CONTINENTS = ('europe', 'americas', 'asia_pacific', 'africa', 'other')
CONTINENT_OF = {
    **dict.fromkeys(('trondheim', 'london', 'amsterdam', 'helsinki', 'moscow', 'zurich', 'paris', 'budapest',
                     'berlin', 'cph'), 'europe'),
    **dict.fromkeys(('boston', 'toronto', 'austin', 'ottawa', 'phoenix', 'sf', 'saopaulo'), 'americas'),
    **dict.fromkeys(('tokyo', 'bangkok', 'goa', 'amman', 'manila', 'melbourne'), 'asia_pacific'),
    'nairobi': 'africa',
}
SPLITS = ('proximity', 'random', 'clustering')
FEATURE_SIZE = 16      # clustering split: images read at 16 x 16 for their 4 x 4-grid colour statistic
URL = 'https://www.mapillary.com/dataset/places'
INSTRUCTIONS = (
    'MSLS needs a manual download with a licence: accept the terms and download the archives at '
    f'{URL}, then extract them so that <data_dir>/msls/train_val/<city>/{{query,database}}/ holds images/, '
    'raw.csv, seq_info.csv and postprocessed.csv.')


def default_root(data_dir: str = '') -> str:
  return os.path.join(data_dir or default_data_dir(), 'msls')


def _read_csv(path: str, columns) -> List[Dict[str, str]]:
  """The rows of one official CSV as dicts (the unnamed pandas index column dropped); every column needed."""
  if not os.path.isfile(path):
    raise errors.DataFormatError(f'{path} is missing. {INSTRUCTIONS}')
  with errors.reading(path, 'an MSLS CSV file'), open(path, newline='', encoding='utf-8') as f:
    reader = csv.DictReader(f)
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
      raise errors.DataFormatError(f'{path}: columns {missing} are missing (found {reader.fieldnames})')
    return [{c: row[c] for c in columns} for row in reader]


def _float(path, key, column, text):
  try:
    v = float(text)
  except ValueError:
    raise errors.DataFormatError(f'{path}: {column}={text!r} of key {key!r} is not a number') from None
  if not np.isfinite(v):
    raise errors.DataFormatError(f'{path}: {column}={text!r} of key {key!r} is not finite')
  return v


def _is_pano(text: str) -> bool:
  return text.strip().lower() in ('true', '1')


def read_subset(folder: str):
  """One city's query/ or database/ folder -> (keys, positions [n, 2], sequence keys, frame numbers), panoramas
  excluded, ordered by (sequence, frame)."""
  raw = _read_csv(os.path.join(folder, 'raw.csv'), ('key', 'pano'))
  seq = _read_csv(os.path.join(folder, 'seq_info.csv'), ('key', 'sequence_key', 'frame_number'))
  post_path = os.path.join(folder, 'postprocessed.csv')
  post = _read_csv(post_path, ('key', 'easting', 'northing'))
  pano = {r['key'] for r in raw if _is_pano(r['pano'])}
  where = {r['key']: (_float(post_path, r['key'], 'easting', r['easting']),
                      _float(post_path, r['key'], 'northing', r['northing'])) for r in post}
  rows = []
  for r in seq:
    k = r['key']
    if k in pano:
      continue
    if k not in where:
      raise errors.DataFormatError(f'{post_path}: key {k!r} of seq_info.csv has no position')
    rows.append((r['sequence_key'], int(_float(os.path.join(folder, 'seq_info.csv'), k, 'frame_number',
                                                r['frame_number'])), k))
  rows.sort()
  keys = [k for _, _, k in rows]
  pos = np.array([where[k] for k in keys], np.float64).reshape(-1, 2)
  return keys, pos, [s for s, _, _ in rows], np.array([f for _, f, _ in rows], np.int64)


def load_image(folder: str, key: str, size: int) -> np.ndarray:
  Image = _pil()
  path = os.path.join(folder, 'images', f'{key}.jpg')
  if os.path.basename(key) != key or key in ('', '.', '..'):
    raise errors.DataFormatError(f'{folder}: key {key!r} is not a plain file name')
  with errors.reading(path, 'a JPEG image', images=True), Image.open(path) as im:
    return np.asarray(im.convert('RGB').resize((size, size), Image.BILINEAR), np.uint8)


def _city(root, city, index, max_queries, max_sequences, seed):
  """(query keys, query positions, database keys, database positions, sequence id per database frame)."""
  base = os.path.join(root, 'train_val', city)
  qk, qp, _, _ = read_subset(os.path.join(base, 'query'))
  dk, dp, ds, _ = read_subset(os.path.join(base, 'database'))
  rng = np.random.default_rng([seed, index])
  seq_names = sorted(set(ds))
  if max_sequences and len(seq_names) > max_sequences:
    seq_names = sorted(rng.choice(seq_names, max_sequences, replace=False).tolist())
  seq_id = {s: i for i, s in enumerate(seq_names)}
  keep = np.array([s in seq_id for s in ds], bool)
  dk = [k for k, m in zip(dk, keep) if m]
  dp, ds = dp[keep], np.array([seq_id[s] for s, m in zip(ds, keep) if m], np.int64)
  if max_queries and len(qk) > max_queries:
    sel = np.sort(rng.choice(len(qk), max_queries, replace=False))
    qk, qp = [qk[i] for i in sel], qp[sel]
  off = np.array([index * CITY_SPACING, 0.0])
  return qk, qp + off, dk, dp + off, ds


def index(data_dir='', split='proximity', split_radius=2000.0, num_clients=0, max_queries_per_city=0,
          max_sequences_per_city=0, seed=0, val_clients=0):
  """The federated split from the CSVs alone (no image decoded): a dict with the training cities, the test
  cities, `groups` [(query ids, sequence ids)], `seq_frames` (image ids per sequence), `pos` [images, 2] and
  `files` [(folder, key)] of the training image store (each city's queries, then its database frames)."""
  root = default_root(data_dir)
  tv = os.path.join(root, 'train_val')
  if not os.path.isdir(tv):
    raise errors.DataFormatError(f'{tv} is missing. {INSTRUCTIONS}')
  cities = sorted(d for d in os.listdir(tv) if os.path.isdir(os.path.join(tv, d)))
  train = [c for c in cities if c not in VAL_CITIES + TEST_CITIES]
  test = [c for c in TEST_CITIES if c in cities]
  if not train or not test:
    raise errors.DataFormatError(f'{tv}: needs training cities and the test cities {TEST_CITIES}; found {cities}')
  pos, clients_q = [], []      # positions of the image store (queries, then database, city by city)
  seq_frames_all, groups_all, offset, seq_count = [], [], 0, 0
  folder_of = []
  for i, city in enumerate(train):
    qk, qp, dk, dp, ds = _city(root, city, i, int(max_queries_per_city), int(max_sequences_per_city), int(seed))
    base = os.path.join(tv, city)
    q_ids = offset + np.arange(len(qk))
    d_ids = offset + len(qk) + np.arange(len(dk))
    folder_of += [(os.path.join(base, 'query'), k) for k in qk] + [(os.path.join(base, 'database'), k) for k in dk]
    pos.append(np.concatenate([qp.reshape(-1, 2), dp.reshape(-1, 2)]))
    offset += len(qk) + len(dk)
    n_seq = int(ds.max()) + 1 if len(ds) else 0
    frames = [d_ids[ds == s] for s in range(n_seq)]
    seq_frames_all += frames
    centroids = np.array([dp[ds == s].mean(0) for s in range(n_seq)]).reshape(-1, 2)
    city_groups = vpr_places.proximity_split(qp, centroids, float(split_radius), seed=int(seed) * 7919 + i)
    if split == 'clustering':     # k-means on visual features, k = the city's proximity clients (module doc)
      qf = vpr_places.image_statistic(np.stack([load_image(os.path.join(base, 'query'), k, FEATURE_SIZE)
                                                for k in qk]).reshape(len(qk), FEATURE_SIZE, FEATURE_SIZE, 3))
      df = vpr_places.image_statistic(np.stack([load_image(os.path.join(base, 'database'), k, FEATURE_SIZE)
                                                for k in dk]).reshape(len(dk), FEATURE_SIZE, FEATURE_SIZE, 3))
      sf = np.array([df[ds == s_].mean(0) for s_ in range(n_seq)]).reshape(n_seq, -1)
      city_groups = vpr_places.clustering_split(qf, sf, len(city_groups), seed=int(seed) * 7919 + i)
    for gq, gs in city_groups:
      groups_all.append((q_ids[gq], seq_count + gs))
    clients_q.append((q_ids, qp))
    seq_count += n_seq
  all_pos = np.concatenate(pos) if pos else np.zeros((0, 2))
  if split == 'proximity' and int(num_clients):
    raise ConfigError('data.num_clients', num_clients, "0 with split='proximity' (the radius sets the clients)")
  if split == 'random':
    q_all = np.concatenate([q for q, _ in clients_q])
    db_ids = np.concatenate(seq_frames_all) if seq_frames_all else np.zeros((0,), np.int64)
    seq_of = np.zeros(offset, np.int64)
    for s, f in enumerate(seq_frames_all):
      seq_of[f] = s
    near = vpr_places.within(all_pos[q_all], all_pos[db_ids], vpr_places.POS_RADIUS)
    qseq = [np.unique(seq_of[db_ids[row]]) for row in near]
    k = int(num_clients) or max(1, len(groups_all))     # default: as many clients as the proximity split
    groups_all = [(q_all[gq], gs) for gq, gs in vpr_places.random_split(qseq, seq_count, k, seed=int(seed))]
  if not groups_all:
    raise ConfigError('data.split_radius', split_radius, 'a larger radius: no group holds >= 2 queries and >= 2 '
                      'database sequences')
  # The thesis' validation set: `val_clients` random clients (12) leave training for the server.
  groups_all, val_groups = vpr_places.hold_out(groups_all, int(val_clients), int(seed))
  return {'train': train, 'test': test, 'groups': groups_all, 'seq_frames': seq_frames_all, 'pos': all_pos,
          'files': folder_of, 'root': root, 'val_groups': val_groups}


def training_tuples(ix, num_positives, neg_pool, seed):
  """Every client's training tuples [n_k, 1 + P + pool] over the global image ids of `index` (vpr_places)."""
  out = []
  for k, (qs, ss) in enumerate(ix['groups']):
    frames = np.concatenate([ix['seq_frames'][s] for s in ss]) if len(ss) else np.zeros((0,), np.int64)
    out.append(vpr_places.client_tuples(qs, ix['pos'][qs], frames, ix['pos'][frames], num_positives=int(num_positives),
                                        neg_pool=int(neg_pool), seed=int(seed) * 104729 + k))
  return out


def test_set(ix, size, seed):
  """(test_x, test_y): the test cities' queries then database images, y = (easting, northing, role)."""
  tq, tqp, tdb, tdp = [], [], [], []
  for j, city in enumerate(ix['test']):
    qk, qp, dk, dp, _ = _city(ix['root'], city, len(ix['train']) + j, 0, 0, int(seed))
    base = os.path.join(ix['root'], 'train_val', city)
    tq += [load_image(os.path.join(base, 'query'), k, size) for k in qk]
    tdb += [load_image(os.path.join(base, 'database'), k, size) for k in dk]
    tqp.append(qp.reshape(-1, 2))
    tdp.append(dp.reshape(-1, 2))
  return np.stack(tq + tdb), vpr_places.test_labels(np.concatenate(tqp), np.concatenate(tdp))


def client_groups(ix):
  """Per-client metadata (H-FL's clusters): the training city of most of the client's queries (every query of a
  proximity client), and that city's continent (CONTINENT_OF)."""
  city_of = np.array([np.bincount((ix['pos'][qs, 0] // CITY_SPACING).astype(np.int64)).argmax() if len(qs) else 0
                      for qs, _ in ix['groups']], np.int64)
  cont = np.array([CONTINENTS.index(CONTINENT_OF.get(c, 'other')) for c in ix['train']], np.int64)
  return {'city': city_of, 'continent': cont[city_of]}


def val_set(ix, size):
  """(val_x, val_y): the held-out validation clients' queries and database frames, labelled as the test set."""
  vq = [int(i) for qs, _ in ix['val_groups'] for i in qs]
  vd = [int(i) for _, ss in ix['val_groups'] for s_ in ss for i in ix['seq_frames'][s_]]
  x = (np.stack([load_image(*ix['files'][i], size) for i in vq + vd]) if vq else
       np.zeros((0, size, size, 3), np.uint8))
  return x, vpr_places.test_labels(ix['pos'][vq].reshape(-1, 2), ix['pos'][vd].reshape(-1, 2))


def load(data_dir='', split='proximity', split_radius=2000.0, num_clients=0, image_size=64, num_positives=2,
         num_candidates=10, max_queries_per_city=0, max_sequences_per_city=0, seed=0, val_clients=0,
         neg_pool=vpr_places.NEG_POOL):
  ix = index(data_dir, split, split_radius, num_clients, max_queries_per_city, max_sequences_per_city, seed,
             val_clients)
  train, test, groups_all, seq_frames_all = ix['train'], ix['test'], ix['groups'], ix['seq_frames']
  all_pos, folder_of = ix['pos'], ix['files']
  size = int(image_size)
  offset = len(all_pos)
  tuples = training_tuples(ix, num_positives, neg_pool, seed)
  # Decode only the images some tuple uses; the store is re-indexed densely.
  used = np.unique(np.concatenate([t[t >= 0] for t in tuples] + [np.zeros((0,), np.int64)]))
  remap = np.full(max(offset, 1), -1, np.int64)
  remap[used] = np.arange(len(used))
  images = np.stack([load_image(*folder_of[i], size) for i in used]) if len(used) else np.zeros((0, size, size, 3),
                                                                                              np.uint8)
  tuples = [np.where(t >= 0, remap[np.maximum(t, 0)], -1) for t in tuples]
  test_x, test_y = test_set(ix, size, seed)
  data = vpr_places.tuple_dataset(images, tuples, int(num_positives), int(num_candidates), test_x, test_y,
                                  name=f'msls_{split}')
  data.split_stats = vpr_places.split_statistics(groups_all, [len(f) for f in seq_frames_all])
  data.train_cities, data.test_cities = tuple(train), tuple(test)
  data.client_groups = client_groups(ix)
  # The held-out validation clients (val_clients): their queries and database frames, labelled as the test set.
  data.val_x, data.val_y = val_set(ix, size)
  data.val_groups = ix['val_groups']
  data.tuple_index = data.x
  data.image_pos = all_pos[used]
  return data


def split_table(data_dir='', radii=(1000.0, 2000.0, 4000.0), seed=0, max_queries_per_city=0,
                max_sequences_per_city=0):
  """Table 6.5's statistics of the MSLS splits (CSV only): rows {split, radius, clients, sequences_per_client,
  images_per_client} for the proximity radii, the random split (as many clients as the 2000 m split) and the
  clustering split (k per city from the 2000 m split; reads the images at 16 x 16 for their features)."""
  rows = []
  for r in radii:
    ix = index(data_dir, 'proximity', r, 0, max_queries_per_city, max_sequences_per_city, seed)
    rows.append({'split': 'proximity', 'radius': r,
                 **vpr_places.split_statistics(ix['groups'], [len(f) for f in ix['seq_frames']])})
  ix = index(data_dir, 'random', 2000.0, 0, max_queries_per_city, max_sequences_per_city, seed)
  rows.append({'split': 'random', 'radius': None,
               **vpr_places.split_statistics(ix['groups'], [len(f) for f in ix['seq_frames']])})
  ix = index(data_dir, 'clustering', 2000.0, 0, max_queries_per_city, max_sequences_per_city, seed)
  rows.append({'split': 'clustering', 'radius': None,
               **vpr_places.split_statistics(ix['groups'], [len(f) for f in ix['seq_frames']])})
  return rows


FIELDS = dict(data_dir='', split='proximity', split_radius=2000.0, num_clients=0, image_size=64, num_positives=2,
              num_candidates=10, max_queries_per_city=0, max_sequences_per_city=0, seed=0, val_clients=0,
              neg_pool=vpr_places.NEG_POOL)


def _check(d):
  if d.get('split', 'proximity') not in SPLITS:
    raise ConfigError('data.split', d.get('split'), f'one of {SPLITS}')
  for k in ('image_size', 'num_positives', 'num_candidates', 'neg_pool'):
    if k in d and int(d[k]) < 1:
      raise ConfigError(f'data.{k}', d[k], 'an integer >= 1')
  if 'split_radius' in d and not (np.isfinite(float(d['split_radius'])) and float(d['split_radius']) > 0):
    raise ConfigError('data.split_radius', d['split_radius'], 'a finite number > 0 (metres: 1000, 2000, 4000)')


@register('msls', task='retrieval', fields=FIELDS, check=_check)
def _msls(data_dir='', split='proximity', split_radius=2000.0, num_clients=0, image_size=64, num_positives=2,
          num_candidates=10, max_queries_per_city=0, max_sequences_per_city=0, seed=0, val_clients=0,
          neg_pool=vpr_places.NEG_POOL, **unused):
  del unused
  if int(val_clients) < 0:
    raise ConfigError('data.val_clients', val_clients, 'an integer >= 0 (the thesis holds out 12 clients)')
  _check(dict(split=split, split_radius=split_radius, image_size=image_size, num_positives=num_positives,
              num_candidates=num_candidates, neg_pool=neg_pool))
  return load(data_dir=data_dir, split=split, split_radius=split_radius, num_clients=num_clients,
              image_size=image_size, num_positives=num_positives, num_candidates=num_candidates,
              max_queries_per_city=max_queries_per_city, max_sequences_per_city=max_sequences_per_city, seed=seed,
              val_clients=val_clients, neg_pool=neg_pool)
