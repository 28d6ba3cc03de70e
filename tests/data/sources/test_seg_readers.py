"""Cityscapes and IDDA readers on small files written in the official layouts; FedDrive split files."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from fedjax_flat.data.sources import cityscapes, feddrive_splits as fds, idda, ladd_data

from fedjax_flat.data import registry
from fedjax_flat.data.sources.segmentation import IGNORE, lookup_table, map_labels, safe_join
from tests.fixtures import seg_files as F

TRAIN = {'aachen': 9, 'bochum': 8, 'erfurt': 10}
VAL = {'frankfurt': 3, 'lindau': 2}


def _cs_expected(lab):
  out = np.full(lab.shape, 255, np.uint8)
  for raw, tid in cityscapes.LABEL_TO_TRAIN.items():
    out[lab == raw] = tid
  return out


@pytest.fixture(scope='module')
def cs_root(tmp_path_factory):
  d = tmp_path_factory.mktemp('cs')
  files = F.make_cityscapes(str(d / 'cityscapes'), TRAIN, VAL)
  return str(d), files


def test_label_table_is_the_official_one():
  # 19 train ids, each once, from the labelIds of the evaluated classes; everything else ignored.
  assert sorted(cityscapes.LABEL_TO_TRAIN.values()) == list(range(19)) and len(cityscapes.CLASS_NAMES) == 19
  assert (cityscapes.LABEL_TO_TRAIN[7] == 0 and cityscapes.LABEL_TO_TRAIN[26] == 13
          and cityscapes.LABEL_TO_TRAIN[33] == 18)
  assert sum(cityscapes.TRAIN_CITIES.values()) == 2975 and sum(cityscapes.VAL_CITIES.values()) == 500
  raw = np.array([[0, 7, 9, 33, 34, 255]])
  np.testing.assert_array_equal(map_labels(raw, lookup_table(cityscapes.LABEL_TO_TRAIN)),
                                [[255, 0, 255, 18, 255, 255]])


def test_cityscapes_heterogeneous_reads_exact_pixels(cs_root):
  data_dir, files = cs_root
  src = cityscapes.load(data_dir, distribution='heterogeneous', clients_per_city=2, double=False)
  assert src.num_clients == 6 and src.input_shape == (16, 32, 3) and src.label_shape == (16, 32)
  # floor(n_city / 2) images per client, remainder dropped (as the release's 8 per city).
  assert sorted(src.client_sizes().tolist()) == [4, 4, 4, 4, 5, 5]
  assert src.client_domains == ['aachen', 'aachen', 'bochum', 'bochum', 'erfurt', 'erfurt']
  for k in range(src.num_clients):
    x, y = src.client_examples(k)
    assert x.dtype == np.uint8 and y.dtype == np.uint8 and x.shape[1:] == (16, 32, 3) and y.shape[1:] == (16, 32)
    for i, rel in enumerate(src.clients[k].images):
      img, lab = files[rel]
      np.testing.assert_array_equal(x[i], img)
      np.testing.assert_array_equal(y[i], _cs_expected(lab))
      assert set(np.unique(y[i])) <= set(range(19)) | {IGNORE}
  # Test client: the val cities, never a training city.
  assert src.test_client_names == ['unseen']
  tx, ty = src.test_examples()
  assert len(tx) == 5 and ty.shape == (5, 16, 32)
  assert set(src.test_example_domains(0)) == {'frankfurt', 'lindau'}
  assert not set(src.test_example_domains(0)) & set(src.client_domains)
  batches = list(src.test_batches(2))
  assert [len(b[0]) for b in batches] == [2, 2, 1]
  np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), ty)


def test_cityscapes_uniform_double_resize_prefetch(cs_root):
  data_dir, files = cs_root
  src = cityscapes.load(data_dir, distribution='uniform', uniform_clients=4, double=True, image_size=(8, 16))
  assert src.num_clients == 4 and src.client_sizes().sum() == 2 * 27
  x, y = src.client_examples(1)
  n = len(src.clients[1].images)
  assert x.shape == (2 * n, 8, 16, 3) and y.shape == (2 * n, 8, 16)
  np.testing.assert_array_equal(x[n:], x[:n, :, ::-1])            # the release's double_dataset: flipped copies
  np.testing.assert_array_equal(y[n:], y[:n, :, ::-1])
  img, lab = files[src.clients[1].images[0]]
  np.testing.assert_array_equal(y[0], _cs_expected(np.asarray(Image.fromarray(lab).resize((16, 8), Image.NEAREST))))
  got = list(src.prefetch_clients([3, 0, 2], max_in_flight=2))
  assert [k for k, _ in got] == [3, 0, 2]
  for k, (gx, gy) in got:
    ex, ey = src.client_examples(k)
    np.testing.assert_array_equal(gx, ex)
    np.testing.assert_array_equal(gy, ey)
  src.close()


def test_cityscapes_split_saved_and_reused(cs_root, tmp_path):
  data_dir, _ = cs_root
  a = cityscapes.load(data_dir, distribution='uniform', uniform_clients=5, seed=3, double=False)
  path = fds.split_dir(data_dir, 'cityscapes', 'uniform_k5', 3)
  with open(os.path.join(path, 'meta.json')) as f:
    meta = json.load(f)
  assert meta['procedure'] == fds.PROCEDURE and meta['seed'] == 3
  with open(os.path.join(path, 'train', 'all_data_0.json')) as f:
    leaf = json.load(f)
  assert leaf['users'] == a.client_names and leaf['num_samples'] == a.client_sizes().tolist()
  b = cityscapes.load(data_dir, distribution='uniform', uniform_clients=5, seed=3)   # read back from the JSON
  assert [c.images for c in a.clients] == [c.images for c in b.clients]
  c = cityscapes.load(data_dir, distribution='uniform', uniform_clients=5, seed=4)
  assert [x.images for x in c.clients] != [x.images for x in a.clients]
  # A saved split made for other files is refused, not silently used.
  meta['files_fingerprint'] = 'other'
  with open(os.path.join(path, 'meta.json'), 'w') as f:
    json.dump(meta, f)
  with pytest.raises(ValueError, match='another set of files'):
    cityscapes.load(data_dir, distribution='uniform', uniform_clients=5, seed=3)


def test_cityscapes_released_split_files(cs_root):
  data_dir, files = cs_root
  rel = fds.released_dir(data_dir, 'cityscapes', 'heterogeneous')
  train = sorted(p for p in files if p.startswith('train/'))
  lab = lambda p: p.replace('_leftImg8bit.png', '_gtFine_labelIds.png')
  F.write_leaf(os.path.join(rel, 'train', 'all_data_0.json'),
               {'aachen0': (train[:3], [lab(p) for p in train[:3]]),
                'aachen1': (train[3:5], [lab(p) for p in train[3:5]])})
  F.write_leaf(os.path.join(rel, 'train', 'all_data_1.json'), {'bochum0': (train[9:11], [lab(p) for p in train[9:11]])})
  val = sorted(p for p in files if p.startswith('val/'))
  F.write_leaf(os.path.join(rel, 'test', 'all_data_0.json'), {'test_user': (val, [lab(p) for p in val])})
  src = registry.get_dataset('cityscapes', data_dir=data_dir, split_source='released', double=False,
                             crop=(8, 8), style='none')     # augmentation fields are ignored by the builder
  assert src.client_names == ['aachen0', 'aachen1', 'bochum0'] and src.client_sizes().tolist() == [3, 2, 2]
  assert src.test_client_names == ['unseen'] and src.test_client_sizes().tolist() == [5]
  x, y = src.client_examples(2)
  np.testing.assert_array_equal(y[0], _cs_expected(files[train[9]][1]))


def test_released_files_are_untrusted(tmp_path):
  with pytest.raises(ValueError, match='relative'):
    safe_join(str(tmp_path), '../etc/passwd')
  with pytest.raises(ValueError, match='relative'):
    safe_join(str(tmp_path), '/etc/passwd')
  d = tmp_path / 'train'
  d.mkdir()
  (d / 'a.json').write_text('{"users": ["u"], "user_data": {"u": {"x": ["a.png"], "y": []}}}')
  with pytest.raises(ValueError, match='equal length'):
    fds.read_leaf_dir(str(d))
  (d / 'a.json').write_text('{"users": ["u"], "user_data": {"u": {"x": ["a.png"], "y": ["a.png"]}}')
  with pytest.raises(ValueError, match='not valid JSON'):
    fds.read_leaf_dir(str(d))
  split = fds.Split([fds.Client('a', ['x'], ['y']), fds.Client('b', ['x'], ['y'])], [], {})
  with pytest.raises(ValueError, match='more than one client'):
    fds.check_split(split)
  split = fds.Split([fds.Client('a', ['x'], ['y'])], [fds.Client('unseen', ['x'], ['y'])], {})
  with pytest.raises(ValueError, match='both training and test'):
    fds.check_split(split)


def test_missing_files_name_the_download_command(tmp_path, cs_root):
  with pytest.raises(FileNotFoundError, match='experiments/download.py --dataset=cityscapes'):
    cityscapes.load(str(tmp_path))
  with pytest.raises(FileNotFoundError, match='experiments/download.py --dataset=idda'):
    idda.load(str(tmp_path))
  with pytest.raises(FileNotFoundError, match='--dataset=feddrive_splits'):
    cityscapes.load(str(tmp_path), split_source='released')
  # A split listing a file that is gone: the count, examples and the command.
  data_dir, files = cs_root
  rel = os.path.join(str(tmp_path), 'rel')
  F.write_leaf(os.path.join(rel, 'train', 'a.json'),
               {'u': (['train/aachen/gone_leftImg8bit.png'], ['train/aachen/gone.png'])})
  F.write_leaf(os.path.join(rel, 'test', 'a.json'), {'test_user': ([], [])})
  with pytest.raises(FileNotFoundError, match=r'2 of 2 files .*download.py --dataset=cityscapes'):
    cityscapes.load(data_dir, split_source='released', split_dir=rel)


def test_unseen_cities_are_enforced():
  with pytest.raises(ValueError, match='unseen cities'):
    fds.cityscapes_split([('train/a/1.png', 'l', 'a')], [('val/a/2.png', 'l', 'a')], 'uniform', 0, num_clients=1)


def test_image_label_size_mismatch_and_size_check(tmp_path):
  root = str(tmp_path / 'cityscapes')
  F.make_cityscapes(root, {'aachen': 2}, {'lindau': 1}, size=(8, 16))
  Image.fromarray(np.zeros((9, 16), np.uint8), mode='L').save(
      os.path.join(root, 'gtFine', 'train', 'aachen', 'aachen_000000_000019_gtFine_labelIds.png'))
  src = cityscapes.load(str(tmp_path), distribution='uniform', uniform_clients=2)
  with pytest.raises(ValueError, match='label map'):
    [src.client_examples(k) for k in range(2)]


@pytest.fixture(scope='module')
def idda_root(tmp_path_factory):
  d = tmp_path_factory.mktemp('idda')
  domains = F.idda_domains()
  files = F.make_idda(str(d / 'idda' / 'IDDAsmall'), domains, per_domain=5)
  return str(d), files, domains


def _idda_expected(lab):
  return np.array([[idda.RAW_TO_TRAIN.get(int(v), 255) for v in row] for row in lab], np.uint8)


@pytest.mark.parametrize('setting,unseen', [('country', lambda d: d.startswith('T07')),
                                            ('rainy', lambda d: '_HRN_' in d),
                                            ('bus', lambda d: d.endswith('_B'))])
def test_idda_heterogeneous_domains(idda_root, setting, unseen):
  data_dir, files, domains = idda_root
  src = idda.load(data_dir, setting=setting, distribution='heterogeneous', image_size=())
  train_domains = [d for d in domains if not unseen(d)]
  assert src.client_names == sorted(train_domains) and src.client_domains == sorted(train_domains)
  assert src.client_sizes().tolist() == [4] * len(train_domains)      # 80 % of 5 images per domain
  assert src.test_client_names == ['seen', 'unseen']
  seen_doms, unseen_doms = set(src.test_example_domains(0)), set(src.test_example_domains(1))
  assert seen_doms == set(train_domains) and unseen_doms == {d for d in domains if unseen(d)}
  assert src.test_client_sizes().tolist() == [len(train_domains), 5 * len(unseen_doms)]
  x, y = src.client_examples(0)
  for i, rel in enumerate(src.clients[0].images):
    img, lab = files[rel]
    np.testing.assert_array_equal(x[i], img)
    np.testing.assert_array_equal(y[i], _idda_expected(lab))
  assert set(np.unique(y)) <= set(range(16)) | {255}


def test_idda_uniform_resize_and_rgb_labels(tmp_path):
  domains = F.idda_domains(towns=('T01', 'T02', 'T07'), weathers=('CN',), viewpoints=('A', 'B', 'J'))
  files = F.make_idda(str(tmp_path / 'idda' / 'IDDAsmall'), domains, per_domain=5, rgb_labels=True)
  src = idda.load(str(tmp_path), setting='country', distribution='uniform', image_size=(6, 10))
  assert src.num_clients == 6 and src.input_shape == (6, 10, 3)
  for c in src.clients:            # 4 images from 4 distinct domains (Latin-square deal)
    doms = [p.split('/')[0] for p in c.images]
    assert len(doms) == 4 and len(set(doms)) == 4 and c.domain is None
  x, y = src.client_examples(0)
  _, lab = files[src.clients[0].images[0]]
  ref = np.asarray(Image.fromarray(lab).resize((10, 6), Image.NEAREST))
  np.testing.assert_array_equal(y[0], _idda_expected(ref))       # class from the red channel of RGB labels


def test_idda_released_layout(idda_root):
  data_dir, files, domains = idda_root
  rel = fds.released_dir(data_dir, 'idda', 'heterogeneous', 'country')
  imgs = sorted(files)
  lab = lambda p: p.replace('/RGB/', '/Semantic/').replace('.jpg', '.png')
  t01 = [p for p in imgs if p.startswith('T01')]
  t07 = [p for p in imgs if p.startswith('T07')]
  F.write_leaf(os.path.join(rel, 'train', 'idda_by_city_country_train_clients.json'),
               {'T01_CN_A': (t01[:3], [lab(p) for p in t01[:3]])})
  F.write_leaf(os.path.join(rel, 'test', 'idda_by_city_country_test_clients.json'),
               {'test_user_diff_domain': (t07[:2], [lab(p) for p in t07[:2]]),
                'test_user_same_domain': (t01[3:4], [lab(p) for p in t01[3:4]])})
  src = registry.get_dataset('idda', data_dir=data_dir, setting='country', split_source='released', image_size=())
  assert src.client_names == ['T01_CN_A'] and src.test_client_names == ['seen', 'unseen']
  assert src.test_client_sizes().tolist() == [1, 2]


def test_idda_images_without_label_are_left_out_and_said(tmp_path, caplog):
  root = str(tmp_path / 'IDDAsmall')
  files = F.make_idda(root, ['T01_CN_A', 'T07_CN_A'], per_domain=3)
  gone = sorted(files)[0]
  os.remove(os.path.join(root, gone.replace('/RGB/', '/Semantic/').replace('.jpg', '.png')))
  with caplog.at_level('WARNING'):
    items = idda.find_images(root)
  assert len(items) == 5 and gone not in {t[0] for t in items}
  assert 'have no Semantic/ label map' in caplog.text


@pytest.mark.parametrize('case', ['truncated PNG', 'not an image'])
def test_malformed_image_is_a_data_format_error(tmp_path, case):
  """A damaged image or label map: the project's DataFormatError naming both files, not PIL's error."""
  from fedjax_flat.data.sources.segmentation import decode_pair
  from fedjax_flat.errors import DataFormatError
  img, lab = tmp_path / 'a.png', tmp_path / 'a_label.png'
  Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(img)
  Image.fromarray(np.zeros((8, 8), np.uint8), mode='L').save(lab)
  raw = img.read_bytes()
  img.write_bytes(raw[:len(raw) // 2] if case == 'truncated PNG' else b'GIF89a not really')
  with pytest.raises(DataFormatError, match='a.png / .*a_label.png'):
    decode_pair(str(img), str(lab), lookup_table({0: 0}))


def test_one_split_folder_walk_for_feddrive_and_ladd(tmp_path):
  """feddrive_splits.split_json_files: natural order (u2 before u10), JSON files only, missing / empty folders;
  both readers (FedDrive's read_leaf_dir, LADD's read_split_dir) read users in that file order."""
  d = tmp_path / 'train'
  with pytest.raises(FileNotFoundError, match='not found'):
    fds.split_json_files(str(d))
  d.mkdir()
  (d / 'notes.txt').write_text('not a split')
  with pytest.raises(FileNotFoundError, match='no \\*.json'):
    fds.split_json_files(str(d))
  for name in ('u10', 'u2', 'u1'):
    (d / f'{name}.json').write_text(json.dumps({'users': [name], 'num_samples': [1],
                                                'user_data': {name: {'x': [f'{name}.png'], 'y': [f'{name}_l.png']}}}))
  assert fds.split_json_files(str(d)) == ['u1.json', 'u2.json', 'u10.json']
  assert [c.name for c in fds.read_leaf_dir(str(d))] == ['u1', 'u2', 'u10']
  assert [c.name for c in ladd_data.read_split_dir(str(d))] == ['u1', 'u2', 'u10']
