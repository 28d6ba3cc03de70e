"""The MSLS reader (data/sources/msls.py) on small trees written here in the official layout (pandas-style CSVs
with their index column, JPEG images): panoramas excluded, validation cities left out, San Francisco and
Copenhagen on the server, tuples valid by UTM distance, the proximity split's validity rule, malformed files."""
import csv
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from fedjax_flat.data import registry
from fedjax_flat.data.download import ManualDownloadRequired
from fedjax_flat.data.sources import catalogue
from fedjax_flat.data.sources import msls
from fedjax_flat.errors import DataFormatError
from fedjax_flat.tasks import retrieval as ret
from tests.fixtures.paths import REPO


def _write_subset(folder, rows, rng):
  """rows: (key, easting, northing, sequence_key, frame, pano)."""
  os.makedirs(os.path.join(folder, 'images'), exist_ok=True)
  with open(os.path.join(folder, 'raw.csv'), 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['', 'key', 'lon', 'lat', 'ca', 'captured_at', 'pano'])
    for i, (k, _, _, _, _, pano) in enumerate(rows):
      w.writerow([i, k, 12.5, 55.6, 90.0, 1500000000000, 'True' if pano else 'False'])
  with open(os.path.join(folder, 'seq_info.csv'), 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['', 'key', 'sequence_key', 'frame_number'])
    for i, (k, _, _, s, fr, _) in enumerate(rows):
      w.writerow([i, k, s, fr])
  with open(os.path.join(folder, 'postprocessed.csv'), 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['', 'key', 'utm', 'easting', 'northing', 'night', 'control_panel', 'view_direction',
                'unique_cluster'])
    for i, (k, e, n, _, _, _) in enumerate(rows):
      w.writerow([i, k, '', e, n, False, False, 'Forward', 0])
  for k, *_ in rows:
    Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(os.path.join(folder, 'images', f'{k}.jpg'))


def write_city(root, city, rng, *, n_seq=6, seq_len=4, n_q=10, size=600.0, panos=1):
  """Database sequences along random straight lines, queries within 5 m of a database frame."""
  base = os.path.join(root, 'train_val', city)
  db, q = [], []
  for s in range(n_seq):
    start, step = rng.uniform(0, size, 2), rng.normal(0, 4, 2)
    for fr in range(seq_len):
      e, n = 500000 + start + fr * step
      db.append((f'{city}_d{s}_{fr}', e, n, f'{city}_seq{s}', fr, False))
  for j in range(n_q):
    _, e, n, *_ = db[rng.integers(len(db))]
    q.append((f'{city}_q{j}', e + rng.normal(0, 2), n + rng.normal(0, 2), f'{city}_qseq{j}', 0, j < panos))
  _write_subset(os.path.join(base, 'database'), db, rng)
  _write_subset(os.path.join(base, 'query'), q, rng)
  return db, q


@pytest.fixture
def tree(tmp_path):
  rng = np.random.default_rng(0)
  info = {c: write_city(str(tmp_path / 'msls'), c, rng) for c in ('boston', 'tokyo', 'amsterdam', 'sf', 'cph')}
  return str(tmp_path), info


def test_reads_the_official_layout(tree):
  data_dir, info = tree
  d = registry.get_dataset('msls', data_dir=data_dir, split_radius=400.0, image_size=8, num_candidates=4)
  assert d.task == 'retrieval'
  assert d.train_cities == ('boston', 'tokyo') and d.test_cities == ('sf', 'cph')   # amsterdam: validation
  n_q = sum(len([r for r in info[c][1] if not r[5]]) for c in ('sf', 'cph'))       # panoramas excluded
  n_db = sum(len(info[c][0]) for c in ('sf', 'cph'))
  assert d.test_x.shape == (n_q + n_db, 8, 8, 3)
  assert int(np.sum(d.test_y[:, 2] == ret.QUERY_ROLE)) == n_q
  assert d.input_shape == (7, 8, 8, 3) and d.store.shape[1:] == (8, 8, 3) and d.num_clients >= 2
  # test cities far apart in the shifted UTM frame: no false match across cities
  qpos = d.test_y[d.test_y[:, 2] == 1, :2]
  assert np.ptp(qpos[:, 0]) > 1e6


def test_tuples_are_valid_by_utm_distance_and_clients_follow_the_rule(tree):
  data_dir, _ = tree
  d = registry.get_dataset('msls', data_dir=data_dir, split_radius=400.0, image_size=8, num_candidates=4)
  assert d.split_stats['clients'] == d.num_clients
  assert d.split_stats['sequences_per_client'][0] >= 2
  for n in range(len(d.y)):
    row, kinds = d.tuple_index[n], d.y[n]
    qp = d.image_pos[row[0]]
    for j in range(1, len(row)):
      if kinds[j] == ret.EMPTY:
        continue
      dist = np.linalg.norm(d.image_pos[row[j]] - qp)
      assert dist <= 10.0 if kinds[j] == ret.POSITIVE else dist > 25.0
  r = registry.get_dataset('msls', data_dir=data_dir, split='random', num_clients=3, image_size=8, num_candidates=4)
  assert r.num_clients == 3


def test_missing_tree_and_malformed_files(tree, tmp_path):
  data_dir, _ = tree
  with pytest.raises(DataFormatError, match='manual download with a licence'):
    registry.get_dataset('msls', data_dir=str(tmp_path / 'nowhere'))
  post = os.path.join(data_dir, 'msls', 'train_val', 'tokyo', 'database', 'postprocessed.csv')
  text = open(post).read().splitlines()
  bad = text[:2] + [text[2].replace(text[2].split(',')[3], 'nan')] + text[3:]
  open(post, 'w').write('\n'.join(bad) + '\n')
  with pytest.raises(DataFormatError, match='easting.*not finite|not finite'):
    registry.get_dataset('msls', data_dir=data_dir, image_size=8)
  open(post, 'w').write('key,northing\nx,1\n')
  with pytest.raises(DataFormatError, match=r"columns \['easting'\] are missing"):
    registry.get_dataset('msls', data_dir=data_dir, image_size=8)


def test_unsafe_key_is_refused(tmp_path):
  with pytest.raises(DataFormatError, match='plain file name'):
    msls.load_image(str(tmp_path), '../etc/passwd', 8)


def test_catalogue_names_the_manual_download(tmp_path, tree):
  assert 'msls' in catalogue.DATASETS
  with pytest.raises(ManualDownloadRequired, match='manual download with a licence'):
    catalogue.download('msls', str(tmp_path / 'empty'))
  data_dir, _ = tree
  assert catalogue.download('msls', data_dir) == [os.path.join(data_dir, 'msls')]


def test_split_table_has_table_6_5_columns(tree):
  data_dir, _ = tree
  rows = msls.split_table(data_dir, radii=(200.0, 400.0))
  assert [r['split'] for r in rows] == ['proximity', 'proximity', 'random', 'clustering']
  assert rows[0]['clients'] >= rows[1]['clients'] >= 1
  assert all(len(r['images_per_client']) == 2 for r in rows)
  assert rows[2]['clients'] == len(msls.index(data_dir, 'proximity', 2000.0)['groups'])


def test_prepare_prints_the_split_statistics(tree):
  data_dir, _ = tree
  out = subprocess.run([sys.executable, os.path.join(REPO, 'experiments', 'prepare.py'), '--dataset=msls',
                        f'--data_dir={data_dir}'], capture_output=True, text=True, timeout=120,
                       env={**os.environ, 'PYTHONPATH': REPO})
  assert out.returncode == 0, out.stderr[-2000:]
  lines = [l for l in out.stdout.splitlines() if l.startswith('| proximity') or l.startswith('| random')]
  assert len(lines) == 4 and lines[1].startswith('| proximity | 2000 |')


def test_client_groups_are_the_clients_city_and_continent(tree):
  """H-FL's clusters (algorithms/hfl.py): a proximity client's 'city' is the training city of all its queries
  (read from the positions, which are shifted by CITY_SPACING per city), its 'continent' that city's."""
  data_dir, _ = tree
  d = registry.get_dataset('msls', data_dir=data_dir, split_radius=400.0, image_size=8, num_candidates=4)
  g = d.client_groups
  assert g['city'].shape == g['continent'].shape == (d.num_clients,)
  for k in range(d.num_clients):
    q = d.image_pos[d.tuple_index[d.client_indices(k), 0]]
    assert set((q[:, 0] // msls.CITY_SPACING).astype(int).tolist()) == {int(g['city'][k])}
  assert sorted(set(g['city'].tolist())) == [0, 1]                       # boston, tokyo both have clients
  want = {0: msls.CONTINENTS.index('americas'), 1: msls.CONTINENTS.index('asia_pacific')}
  assert [want[c] for c in g['city'].tolist()] == g['continent'].tolist()


def test_clustering_split_follows_k_per_city_and_the_validity_rule(tree):
  """The Clustering split: k-means per city on the images' grid colours with k = the city's proximity clients
  (at the same radius): at most that many clients, every one >= 2 queries and >= 2 sequences of ONE city, the
  same groups on a second read (seeded), and the dataset built from them."""
  data_dir, _ = tree
  prox = msls.index(data_dir, 'proximity', 400.0)
  clus = msls.index(data_dir, 'clustering', 400.0)
  assert 1 <= len(clus['groups']) <= len(prox['groups'])
  city_of = lambda ids: set((clus['pos'][ids, 0] // msls.CITY_SPACING).astype(int).tolist())  # noqa: E731
  for qs, ss in clus['groups']:
    assert len(qs) >= 2 and len(ss) >= 2
    frames = np.concatenate([clus['seq_frames'][s] for s in ss])
    assert len(city_of(qs) | city_of(frames)) == 1
  again = msls.index(data_dir, 'clustering', 400.0)
  assert [(q.tolist(), s.tolist()) for q, s in again['groups']] == [(q.tolist(), s.tolist()) for q, s in clus['groups']]
  d = registry.get_dataset('msls', data_dir=data_dir, split='clustering', split_radius=400.0, image_size=8,
                           num_candidates=4)
  assert d.num_clients == len(clus['groups']) and d.split_stats['clients'] == d.num_clients


def test_kmeans_and_image_statistic_on_known_answers():
  from fedjax_flat.data import vpr_places
  img = np.zeros((2, 8, 8, 3), np.uint8)
  img[0, :4, :4] = 255          # top-left cell block white in image 0
  f = vpr_places.image_statistic(img, grid=2)
  np.testing.assert_allclose(f[0], [1, 1, 1] + [0] * 9)
  np.testing.assert_allclose(f[1], np.zeros(12))
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.normal(0, 0.1, (20, 2)), rng.normal(5, 0.1, (15, 2)), rng.normal([0, 9], 0.1, (10, 2))])
  labels = vpr_places.kmeans_labels(x, 3, seed=1)
  assert sorted(np.bincount(labels).tolist()) == [10, 15, 20]
  assert len(set(labels[:20])) == len(set(labels[20:35])) == len(set(labels[35:])) == 1


def test_validation_clients_leave_training(tree):
  data_dir, _ = tree
  full = registry.get_dataset('msls', data_dir=data_dir, split_radius=400.0, image_size=8, num_candidates=4)
  held = registry.get_dataset('msls', data_dir=data_dir, split_radius=400.0, image_size=8, num_candidates=4,
                              val_clients=1)
  assert held.num_clients == full.num_clients - 1 and len(held.val_groups) == 1
  qs, ss = held.val_groups[0]
  n_db = sum(len(msls.index(data_dir, 'proximity', 400.0)['seq_frames'][s]) for s in ss)
  assert held.val_x.shape == (len(qs) + n_db, 8, 8, 3) and held.val_y.shape == (len(qs) + n_db, 3)
  assert int(np.sum(held.val_y[:, 2] == ret.QUERY_ROLE)) == len(qs)
  train_q = {tuple(p) for p in held.image_pos[held.tuple_index[:, 0]].tolist()}
  val_q = {tuple(p) for p in held.val_y[held.val_y[:, 2] == ret.QUERY_ROLE, :2].astype(np.float64).tolist()}
  assert not train_q & val_q
  with pytest.raises(Exception, match='data.val_clients'):
    registry.get_dataset('msls', data_dir=data_dir, split_radius=400.0, image_size=8, val_clients=-1)
