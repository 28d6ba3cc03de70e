"""Camelyon17 in the WILDS layout (data/sources/camelyon17.py) on generated files: metadata.csv + PNG patches
whose pixels encode (patient, tumor, node), so the split can be checked image by image."""
import csv
import io
import os
import tarfile

import numpy as np
import pytest
from PIL import Image

from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config
from fedjax_flat.data.registry import get_dataset
from fedjax_flat.data import download as dl
from fedjax_flat.data.sources import camelyon17, catalogue
from fedjax_flat.errors import ConfigError, DataFormatError
from tests.fixtures.http_server import loopback_opener


def write_wilds_camelyon17(data_dir, *, patients_per_center=4, patches=6, size=96):
  """WILDS camelyon17_v1.0: metadata.csv (its columns, a leading index) + patches/patient_PPP_node_N/*.png.
  Patient p of center c: id 10 c + p; its node is (p + c) % 5 (so node != center); half its patches tumour."""
  root = os.path.join(data_dir, camelyon17.DIRNAME)
  rows = []
  for c in range(5):
    for p in range(patients_per_center):
      pid, node = 10 * c + p, (p + c) % 5
      d = os.path.join(root, 'patches', f'patient_{pid:03d}_node_{node}')
      os.makedirs(d, exist_ok=True)
      for j in range(patches):
        tumor, x, y = j % 2, 100 * j, 7 * j + 1
        img = np.zeros((size, size, 3), np.uint8)
        img[..., 0], img[..., 1], img[..., 2] = pid, 200 * tumor, 10 * node
        Image.fromarray(img).save(os.path.join(d, f'patch_patient_{pid:03d}_node_{node}_x_{x}_y_{y}.png'))
        rows.append([len(rows), f'{pid:03d}', node, x, y, tumor, 5 * c + node, c, 0])
  with open(os.path.join(root, 'metadata.csv'), 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['', 'patient', 'node', 'x_coord', 'y_coord', 'tumor', 'slide', 'center', 'split'])
    w.writerows(rows)
  return root


@pytest.fixture(scope='module')
def files(tmp_path_factory):
  d = str(tmp_path_factory.mktemp('c17'))
  write_wilds_camelyon17(d)
  return d


def _decode(x):
  return x[:, 0, 0, 0].astype(int), (x[:, 0, 0, 1] > 100).astype(int), (x[:, 0, 0, 2] // 10).astype(int)


def test_hospitals_patient_level_split_and_the_balanced_subset(files):
  data = get_dataset('camelyon17', data_dir=files, train_per_class=2, test_per_class=5, seed=3)
  assert data.num_clients == 5 and data.num_classes == 2 and data.x.shape[1:] == (96, 96, 3)
  assert data.x.dtype == np.uint8
  for k in range(5):
    x, y = data.client_examples(k)
    tx, ty = data.client_test_examples(k)
    p, t, _ = _decode(x)
    tp, tt, _ = _decode(tx)
    np.testing.assert_array_equal(t, y)                      # labels are the metadata's tumor column
    np.testing.assert_array_equal(tt, ty)
    assert set(p // 10) == {k} and set(tp // 10) == {k}      # client k = hospital (center) k
    assert not set(p) & set(tp)                              # patient-level: no patient on both sides
    assert np.bincount(y, minlength=2).tolist() == [2, 2]    # the class-balanced subset
  gx, gy = data.test_examples()                              # global test: the same count from every hospital
  assert np.bincount(_decode(gx)[0] // 10, minlength=5).tolist() == [2] * 5
  # deterministic in the seed
  again = get_dataset('camelyon17', data_dir=files, train_per_class=2, test_per_class=5, seed=3)
  np.testing.assert_array_equal(again.x, data.x)


def test_release_grouping_by_node_and_leave_one_out(files):
  data = get_dataset('camelyon17', data_dir=files, client_by='node', train_per_class=0, test_per_class=0,
                     leave_out=2)
  assert data.num_clients == 4 and data.source_of_client == [0, 1, 3, 4]
  for k, node in enumerate(data.source_of_client):
    assert set(_decode(data.client_examples(k)[0])[2]) == {node}
  ux, uy = data.unseen_examples()
  assert set(_decode(ux)[2]) == {2} and len(uy) == 4 * 6            # all of node 2's patches (train + test)


def test_bad_files_and_fields_are_one_line_errors(files, tmp_path):
  with pytest.raises(FileNotFoundError, match='download.py --dataset=camelyon17'):
    get_dataset('camelyon17', data_dir=str(tmp_path))
  root = write_wilds_camelyon17(str(tmp_path), patients_per_center=2, patches=2)
  meta = os.path.join(root, 'metadata.csv')
  text = open(meta).read().splitlines()
  text[1] = text[1].replace(',0,0,0', ',x,0,0', 1) if ',0,0,0' in text[1] else text[1][:-1] + 'zz'
  open(meta, 'w').write('\n'.join(text) + '\n')
  with pytest.raises(DataFormatError, match='metadata.csv'):
    get_dataset('camelyon17', data_dir=str(tmp_path))
  bad = tmp_path / 'b'
  root = write_wilds_camelyon17(str(bad), patients_per_center=2, patches=2)
  png = os.path.join(root, 'patches', 'patient_000_node_0', 'patch_patient_000_node_0_x_0_y_1.png')
  open(png, 'wb').write(b'not a png')
  with pytest.raises(DataFormatError, match='patch_patient_000_node_0_x_0_y_1.png'):
    get_dataset('camelyon17', data_dir=str(bad), train_per_class=0, test_per_class=0)
  cfg = default_config()
  cfg.dataset = 'camelyon17'
  cfg.data.client_by = 'hospital'
  with pytest.raises(ConfigError, match='client_by'):
    validate.validate_config(cfg)


def test_download_extracts_the_wilds_archive_where_the_reader_looks(server, tmp_path, monkeypatch):
  handler, base = server
  src = tmp_path / 'src'
  root = write_wilds_camelyon17(str(src), patients_per_center=2, patches=2, size=8)
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:      # WILDS' archive: metadata.csv + patches/ at its top
    for name in sorted(os.listdir(root)):
      tar.add(os.path.join(root, name), arcname=name)
  handler.files['/blob/'] = buf.getvalue()
  monkeypatch.setitem(catalogue.RESOURCES, 'camelyon17',
                      [dl.Resource('camelyon17_v1.0.tar.gz', base + '/blob/', note='no published checksum')])
  out = catalogue.download('camelyon17', str(tmp_path / 'data'), opener=loopback_opener())
  assert out == [str(tmp_path / 'data' / camelyon17.DIRNAME)]
  data = get_dataset('camelyon17', data_dir=str(tmp_path / 'data'), train_per_class=0, test_per_class=0,
                     image_size=8)
  assert data.num_clients == 5
