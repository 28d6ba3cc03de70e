"""LADD / FFREEDA readers (data/sources/ladd_data.py) on small files written in the official layouts: GTA5 split
lines and label ids, CrossCity (unlabelled training users, 13 classes), Mapillary v1.2 ids -> 19 classes, the
LEAF-style split JSONs (untrusted: malformed files are errors), the pinned released files, config checks."""
import hashlib
import inspect
import json
import os

import numpy as np
import pytest
from PIL import Image

from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config, segmentation_data
from fedjax_flat.data import registry
from fedjax_flat.data.sources import cityscapes
from fedjax_flat.data.sources import ladd_data as L
from fedjax_flat.errors import DataFormatError


def _blocks(rng, h, w, values):
  bh, bw = max(1, h // 4), max(1, w // 4)
  b = rng.choice(values, size=(-(-h // bh), -(-w // bw)))
  return np.kron(b, np.ones((bh, bw), np.int64))[:h, :w].astype(np.uint8)


def _write(path, arr, mode=None):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.fromarray(arr, mode=mode).save(path)


def _leaf(path, users):
  """users: {name: (x, y or None)}; y None = no 'y' key (CrossCity's training users)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  d = {'users': list(users), 'num_samples': [len(x) for x, _ in users.values()],
       'user_data': {u: ({'x': x} if y is None else {'x': x, 'y': y}) for u, (x, y) in users.items()}}
  with open(path, 'w') as f:
    json.dump(d, f)


# ------------------------------------------------------------------------------------------------ GTA5

def _make_gta5(root, n=5, size=(12, 16), seed=0):
  rng = np.random.default_rng(seed)
  labels = {}
  lines = []
  for i in range(1, n + 1):
    name = f'{i:05d}.png'
    _write(os.path.join(root, 'images', name), rng.integers(0, 256, size + (3,), dtype=np.uint8))
    lab = _blocks(rng, *size, np.arange(34))
    _write(os.path.join(root, 'labels', name), lab, 'L')
    labels[name] = lab
    lines.append(f'/images/{name} /labels/{name}')
  os.makedirs(os.path.join(root, 'splits'), exist_ok=True)
  with open(os.path.join(root, 'splits', 'train.txt'), 'w') as f:
    f.write('\n'.join(lines[:4]) + '\n')
  with open(os.path.join(root, 'splits', 'test.txt'), 'w') as f:
    f.write(lines[4] + '\n')
  return labels


@pytest.mark.parametrize('target,table', [('cityscapes', cityscapes.LABEL_TO_TRAIN),
                                          ('crosscity', L.CROSSCITY_LABEL_TO_TRAIN),
                                          ('mapillary', cityscapes.LABEL_TO_TRAIN)])
def test_gta5_labels_and_chunks(tmp_path, target, table):
  root = str(tmp_path / 'gta5')
  labels = _make_gta5(root)
  src = L.gta5_source(str(tmp_path), root=root, target=target, images_per_client=3)
  assert src.num_clients == 2 and list(src.client_sizes()) == [3, 1]
  assert src.num_classes == (13 if target == 'crosscity' else 19)
  x, y = src.client_examples(0)
  assert x.shape == (3, 12, 16, 3) and y.dtype == np.uint8
  for i, name in enumerate(['00001.png', '00002.png', '00003.png']):
    raw = labels[name]
    want = np.full(raw.shape, 255, np.uint8)
    for k, v in table.items():
      want[raw == k] = v
    np.testing.assert_array_equal(y[i], want)
  test = L.gta5_source(str(tmp_path), root=root, split='test', target=target)
  assert test.num_clients == 1 and list(test.client_sizes()) == [1]


def test_gta5_split_lines_are_checked(tmp_path):
  bad = tmp_path / 'bad.txt'
  for text, msg in (('/images/1.png\n', 'expected'), ('/labels/1.png /images/1.png\n', 'expected'), ('\n', 'no split')):
    bad.write_text(text)
    with pytest.raises(DataFormatError, match=msg):
      L.read_gta5_split(str(bad))
  with pytest.raises(FileNotFoundError, match='ladd_splits'):
    L.gta5_source(str(tmp_path), root=str(tmp_path / 'nowhere'))
  # A file at the released place must be the released one (size + sha256).
  rel = tmp_path / 'ladd_splits' / 'gta5' / 'splits' / 'train.txt'
  rel.parent.mkdir(parents=True)
  rel.write_text('/images/00001.png /labels/00001.png\n')
  with pytest.raises(DataFormatError, match='sha256'):
    L.gta5_source(str(tmp_path), root=str(tmp_path / 'gta5'))


# ------------------------------------------------------------------------------------------------ targets

def _make_crosscity(tmp_path, size=(8, 12)):
  rng = np.random.default_rng(1)
  cities = tmp_path / 'crosscity' / 'cities'
  train = {}
  for city in ('Rio', 'Rome'):
    xs = []
    for i in range(3):
      rel = f'{city}/Images/Train/pano_{i:05d}_0_0.jpg'
      _write(str(cities / rel), rng.integers(0, 256, size + (3,), dtype=np.uint8))
      xs.append(rel)
    train[f'{city}1'] = (xs[:2], None)
    train[f'{city}2'] = (xs[2:], None)
  tx, ty, raw = [], [], []
  for i in range(2):
    x = f'Tokyo/Images/Test/pano_{i:05d}_1_180.png'
    y = f'Tokyo/Labels/Test/pano_{i:05d}_1_180_eval.png'
    _write(str(cities / x), rng.integers(0, 256, size + (3,), dtype=np.uint8))
    lab = _blocks(rng, *size, np.arange(34))
    _write(str(cities / y), lab, 'L')
    tx.append(x)
    ty.append(y)
    raw.append(lab)
  split = tmp_path / 'split'
  _leaf(str(split / 'train' / 'Rio.json'), {k: v for k, v in train.items() if k.startswith('Rio')})
  _leaf(str(split / 'train' / 'Rome.json'), {k: v for k, v in train.items() if k.startswith('Rome')})
  _leaf(str(split / 'test' / 'test_user.json'), {'test_user': (tx, ty)})
  return str(split), raw


def test_crosscity_unlabelled_training_users(tmp_path):
  split, raw = _make_crosscity(tmp_path)
  src = L.target_source('crosscity', str(tmp_path), split_dir=split)
  assert src.client_names == ['Rio1', 'Rio2', 'Rome1', 'Rome2'] and list(src.client_sizes()) == [2, 1, 2, 1]
  x, y = src.client_examples(0)
  assert x.shape == (2, 8, 12, 3) and np.all(y == 255)         # no label file exists or is opened
  assert src.test_client_names == ['target'] and src.num_classes == 13
  _, ty = src.test_client_examples(0)
  for i in range(2):
    want = np.full(raw[i].shape, 255, np.uint8)
    for k, v in L.CROSSCITY_LABEL_TO_TRAIN.items():
      want[raw[i] == k] = v
    np.testing.assert_array_equal(ty[i], want)
  with pytest.raises(ValueError, match='no labels'):
    L.target_source('crosscity', str(tmp_path), split_dir=split, labelled_train=True)


def test_mapillary_v12_ids_to_cityscapes_classes(tmp_path):
  rng = np.random.default_rng(2)
  root = tmp_path / 'mapillary'
  users, raws = {}, {}
  for u, keys in (('EU1', ['a1', 'a2']), ('AS1', ['b1'])):
    xs, ys = [], []
    for k in keys:
      _write(str(root / 'training' / 'images' / f'{k}.jpg'), rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
      lab = _blocks(rng, 8, 8, np.arange(66))
      _write(str(root / 'training' / 'v1.2' / 'labels' / f'{k}.png'), lab, 'L')
      raws[k] = lab
      xs.append(f'training/images/{k}.jpg')
      ys.append(f'training/v1.2/labels/{k}.png')
    users[u] = (xs, ys)
  _write(str(root / 'validation' / 'images' / 'v1.jpg'), rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
  _write(str(root / 'validation' / 'v1.2' / 'labels' / 'v1.png'), _blocks(rng, 8, 8, np.arange(66)), 'L')
  split = tmp_path / 'split'
  _leaf(str(split / 'train' / 'EU.json'), {'EU1': users['EU1']})
  _leaf(str(split / 'train' / 'AS.json'), {'AS1': users['AS1']})
  (split / 'test').mkdir(parents=True)
  with open(split / 'test' / 'test_user.json', 'w') as f:
    json.dump({'users': ['test_user'], 'num_samples': 1, 'user_data': {'test_user': {
        'x': ['validation/images/v1.jpg'], 'y': ['validation/v1.2/labels/v1.png']}}}, f)
  ffreeda = L.target_source('mapillary', str(tmp_path), split_dir=str(split))
  assert np.all(ffreeda.client_examples(0)[1] == 255)
  oracle = L.target_source('mapillary', str(tmp_path), split_dir=str(split), labelled_train=True)
  assert oracle.client_names == ['AS1', 'EU1']               # files in natural order: AS.json before EU.json
  _, y = oracle.client_examples(1)
  want = np.full((8, 8), 255, np.uint8)
  for k, v in L.MAPILLARY_LABEL_TO_TRAIN.items():
    want[raws['a1'] == k] = v
  np.testing.assert_array_equal(y[0], want)
  table = L.MAPILLARY_LABEL_TO_TRAIN
  assert table[13] == 0 and table[55] == 13 and 1 not in table
  assert sorted(set(L.MAPILLARY_LABEL_TO_TRAIN.values())) == list(range(19))


# ------------------------------------------------------------------------------------------------ split files

@pytest.mark.parametrize('doc,msg', [
    ('{"users": ["a"]', 'not valid JSON'),
    ('{"users": "a", "user_data": {}}', 'not a LEAF'),
    ('{"users": ["a"], "num_samples": [1], "user_data": {}}', 'has no x'),
    ('{"users": ["a"], "num_samples": [2], "user_data": {"a": {"x": ["i.png"]}}}', 'num_samples'),
    ('{"users": ["a", "b"], "num_samples": 1, "user_data": {"a": {"x": ["i"]}, "b": {"x": ["j"]}}}', 'one integer'),
    ('{"users": ["a"], "num_samples": [2], "user_data": {"a": {"x": ["i", "j"], "y": ["k"]}}}', 'as many label'),
    ('{"users": ["a", "a"], "num_samples": [1, 1], "user_data": {"a": {"x": ["i"]}}}', 'twice'),
])
def test_malformed_split_files(tmp_path, doc, msg):
  p = tmp_path / 's.json'
  p.write_text(doc)
  with pytest.raises(DataFormatError, match=msg):
    L.read_split_json(str(p))


def test_released_files_are_pinned(tmp_path):
  counts = {}
  for path, size, sha in L.RELEASED_FILES:
    assert size > 0 and len(sha) == 64
    counts[path.split('/')[0]] = counts.get(path.split('/')[0], 0) + 1
  assert counts == {'cityscapes': 25, 'crosscity': 5, 'gta5': 2, 'mapillary': 7}
  assert L.release_url('gta5/splits/train.txt') == (
      f'https://raw.githubusercontent.com/Erosinho13/LADD/{L.RELEASE_COMMIT}/data/gta5/splits/train.txt')
  with pytest.raises(FileNotFoundError, match='ladd_splits'):
    L.released_split(str(tmp_path), 'cityscapes')
  # A released folder whose file is not the released one is refused before it is parsed.
  base = tmp_path / 'ladd_splits' / 'cityscapes' / 'splits' / 'heterogeneous'
  _leaf(str(base / 'train' / 'all_data_0.json'), {'jena0': (['train/jena/x.png'], ['train/jena/y.png'])})
  _leaf(str(base / 'test' / 'all_data_0.json'), {'test_user': (['val/a/x.png'], ['val/a/y.png'])})
  with pytest.raises(DataFormatError, match='sha256'):
    L.released_split(str(tmp_path), 'cityscapes')
  # verify_released itself: the exact bytes pass.
  rel, size, sha = L.RELEASED_FILES[0]
  fake = tmp_path / 'f.json'
  fake.write_bytes(b'x' * 3)
  with pytest.raises(DataFormatError):
    L.verify_released(str(fake), rel)
  assert hashlib.sha256(b'x' * 3).hexdigest() != sha


# ------------------------------------------------------------------------------------------------ config

def _cfg(dataset, **data):
  c = default_config()
  c.dataset = dataset
  c.data = segmentation_data(dataset, **data)
  c.augment = 'segmentation'
  c.normalize = 'feddrive'
  return c


def test_registered_datasets_and_their_checks():
  for name in ('gta5', 'cityscapes_ladd', 'crosscity_ladd', 'mapillary_ladd'):
    assert name in registry.names()
    validate.validate_config(_cfg(name))
  for dataset, field, value in (('gta5', 'target', 'idda'), ('gta5', 'split', 'val'), ('gta5', 'images_per_client', 0),
                                ('crosscity_ladd', 'labelled_train', True), ('mapillary_ladd', 'image_size', (4, 4)),
                                ('cityscapes_ladd', 'num_workers', 0)):
    with pytest.raises(validate.ConfigError, match=rf'config\.data\.{field}='):
      validate.validate_config(_cfg(dataset, **{field: value}))


def test_builder_defaults_equal_declared_defaults():
  fns = {'gta5': L._gta5, 'crosscity_ladd': L._target_builder('crosscity')}
  for name, fn in fns.items():
    declared = registry.declared_fields(name)
    for p in inspect.signature(fn).parameters.values():
      if p.kind is p.VAR_KEYWORD:
        continue
      assert p.name in declared, (name, p.name)
      assert declared[p.name] == p.default or tuple(declared[p.name]) == tuple(p.default), (name, p.name)
