"""Segmentation downloads: FedDrive's released split files (pinned sha256, local server), the manual steps of
Cityscapes (login: URLs + layout, then extraction of the official zips) and IDDA (on request)."""
import hashlib
import os
import zipfile

import pytest

from fedjax_flat.data.sources import cityscapes, feddrive_splits as fds, idda

from fedjax_flat.data import download as dl
from fedjax_flat.data.sources import catalogue
from tests.fixtures import seg_files as F
from tests.fixtures.http_server import loopback_opener as _opener


def test_feddrive_split_files_fetched_verified_and_read(server, tmp_path, monkeypatch):
  handler, base = server
  data_dir = str(tmp_path / 'data')
  files = F.make_cityscapes(os.path.join(data_dir, 'cityscapes'), {'ulm': 4}, {'lindau': 2})
  lab = lambda p: p.replace('_leftImg8bit.png', '_gtFine_labelIds.png')
  src_dir = tmp_path / 'release'
  train = sorted(p for p in files if p.startswith('train/'))
  val = sorted(p for p in files if p.startswith('val/'))
  F.write_leaf(str(src_dir / 'train.json'), {'ulm0': (train[:2], [lab(p) for p in train[:2]]),
                                             'ulm1': (train[2:], [lab(p) for p in train[2:]])})
  F.write_leaf(str(src_dir / 'test.json'), {'test_user': (val, [lab(p) for p in val])})
  table = []
  for rel, local in (('cityscapes/heterogeneous/train/all_data_0.json', 'train.json'),
                     ('cityscapes/heterogeneous/test/all_data_0.json', 'test.json')):
    body = (src_dir / local).read_bytes()
    handler.files[f'/{fds.RELEASE_COMMIT}/data/' + rel.replace('cityscapes/', 'cityscapes/data/', 1)] = body
    table.append((rel, len(body), hashlib.sha256(body).hexdigest()))
  monkeypatch.setattr(fds, 'RELEASED_FILES', tuple(table))
  monkeypatch.setattr(fds, 'RELEASE_URL', base + '/{commit}/data/{dataset}/data/{rest}')
  out = catalogue.download('feddrive_splits', data_dir, opener=_opener())
  assert out == [os.path.join(data_dir, 'feddrive_splits', 'cityscapes', 'heterogeneous')]
  src = cityscapes.load(data_dir, split_source='released', double=False)
  assert src.client_names == ['ulm0', 'ulm1'] and src.test_client_names == ['unseen']
  # A tampered file is refused by its checksum.
  monkeypatch.setattr(fds, 'RELEASED_FILES', ((table[0][0] + '.x', table[0][1], '0' * 64),))
  path = f'/{fds.RELEASE_COMMIT}/data/cityscapes/data/heterogeneous/train/all_data_0.json.x'
  handler.files[path] = b'x' * table[0][1]
  with pytest.raises(dl.ChecksumError, match='sha256'):
    catalogue.download('feddrive_splits', data_dir, opener=_opener())


def test_cityscapes_manual_step_then_zip_extraction(tmp_path):
  data_dir = str(tmp_path)
  with pytest.raises(dl.ManualDownloadRequired) as e:
    catalogue.download('cityscapes', data_dir)
  msg = str(e.value)
  assert all(url in msg for url in cityscapes.URLS.values())
  assert 'leftImg8bit/{train,val}/<city>' in msg and '_gtFine_labelIds.png' in msg
  # The official zips hold top-level leftImg8bit/ and gtFine/ folders.
  staging = tmp_path / 'staging'
  F.make_cityscapes(str(staging), {'jena': 2}, {'munster': 1})
  root = cityscapes.default_root(data_dir)
  os.makedirs(root)
  for name, top in (('gtFine_trainvaltest.zip', 'gtFine'), ('leftImg8bit_trainvaltest.zip', 'leftImg8bit')):
    with zipfile.ZipFile(os.path.join(root, name), 'w') as z:
      for dirpath, _, fnames in os.walk(staging / top):
        for f in fnames:
          full = os.path.join(dirpath, f)
          z.write(full, os.path.relpath(full, staging))
      z.writestr('README', 'license')
  assert catalogue.download('cityscapes', data_dir) == [root]
  src = cityscapes.load(data_dir, distribution='uniform', uniform_clients=2, double=False)
  assert src.client_sizes().sum() == 2 and src.test_client_sizes().tolist() == [1]


def test_idda_manual_step(tmp_path):
  with pytest.raises(dl.ManualDownloadRequired, match='idda-dataset.github.io'):
    catalogue.download('idda', str(tmp_path))
  root = idda.default_root(str(tmp_path))
  F.make_idda(root, ['T01_CN_A'], per_domain=1)
  assert catalogue.download('idda', str(tmp_path)) == [root]
  assert {'feddrive_splits', 'cityscapes', 'idda'} <= set(catalogue.DATASETS)


def test_offline_multi_file_sets_list_every_missing_file_at_once(server, tmp_path, monkeypatch):
  # 3 released files, 2 of them unreachable: the one that is there arrives, and one error lists both others with
  # their URLs and the paths to place them at (not one file per attempt)
  handler, base = server
  data_dir = str(tmp_path / 'data')
  bodies = {f'cityscapes/uniform/train/all_data_{i}.json': f'{{"users": [{i}]}}'.encode() for i in range(3)}
  table = tuple((rel, len(b), hashlib.sha256(b).hexdigest()) for rel, b in bodies.items())
  first = next(iter(bodies))
  handler.files[f'/{fds.RELEASE_COMMIT}/data/' + first.replace('cityscapes/', 'cityscapes/data/', 1)] = bodies[first]
  monkeypatch.setattr(fds, 'RELEASED_FILES', table)
  monkeypatch.setattr(fds, 'RELEASE_URL', base + '/{commit}/data/{dataset}/data/{rest}')
  with pytest.raises(dl.DownloadError) as e:
    catalogue.download('feddrive_splits', data_dir, opener=_opener())
  msg = str(e.value)
  assert msg.startswith('2 of 3 files could not be downloaded')
  for rel in list(bodies)[1:]:
    assert os.path.join(data_dir, 'feddrive_splits', *rel.split('/')) in msg
    assert fds.release_url(rel) in msg
  assert os.path.isfile(os.path.join(data_dir, 'feddrive_splits', *first.split('/')))
  # placed by hand (as the message says), the same command completes
  for rel, b in list(bodies.items())[1:]:
    path = os.path.join(data_dir, 'feddrive_splits', *rel.split('/'))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
      f.write(b)
  assert catalogue.download('feddrive_splits', data_dir, opener=_opener()) == [
      os.path.join(data_dir, 'feddrive_splits', 'cityscapes', 'uniform')]
