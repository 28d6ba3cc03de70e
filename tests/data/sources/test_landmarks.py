import json
import os

import numpy as np
import pytest

from fedjax_flat.data.sources import landmarks

from fedjax_flat.data import registry
from tests.fixtures.data_files import make_landmarks


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  root = tmp_path_factory.mktemp('gld')
  info = make_landmarks(str(root), 'gld23k', num_users=4, per_user=(3, 5, 2, 4), num_test=5)
  out = landmarks.prepare('gld23k', str(root), short_side=48, num_workers=2)
  return root, info, out


def test_split_info_counts_csv(prepared):
  root, info, _ = prepared
  s = landmarks.split_info('gld23k', str(root))
  assert (s['num_clients'], s['num_train'], s['num_test']) == (4, 14, 5)
  assert s['client_size_min'] == 2 and s['client_size_max'] == 5


def test_prepare_writes_resized_shards(prepared):
  root, info, out = prepared
  idx = json.load(open(os.path.join(out, 'index.json')))
  assert idx['format'] == landmarks.FORMAT and idx['num_train'] == 14 and idx['num_test'] == 5
  # clients sorted by (numeric) user id, shards are per client
  assert idx['client_ids'] == ['11', '48', '85', '122']
  assert sorted(os.listdir(os.path.join(out, 'train')))[:2] == ['00000.bin', '00000.json']
  src = landmarks.LandmarksSource(out, image_size=32)
  from PIL import Image
  import io
  for b in src.read_client_blobs(1):
    w, h = Image.open(io.BytesIO(b)).size
    assert min(w, h) == 48  # shorter side resized at prepare time (originals are 96x64 / 64x96)


def test_source_protocol(prepared):
  root, info, out = prepared
  src = registry.get_dataset('gld23k', data_dir=str(root), short_side=48, image_size=32, seed=1)
  assert isinstance(src, landmarks.LandmarksSource)
  assert src.num_clients == 4 and src.input_shape == (32, 32, 3) and src.num_classes == 7
  assert list(src.client_sizes()) == [3, 5, 2, 4]
  rows = info['rows']
  x, y = src.client_examples(1)
  assert x.shape == (5, 32, 32, 3) and x.dtype == np.uint8
  np.testing.assert_array_equal(y, [c for u, _, c in rows if u == '48'])
  # fresh random crops on each call, reproducible across sources with the same seed
  x2, _ = src.client_examples(1)
  assert not np.array_equal(x, x2)
  other = landmarks.LandmarksSource(out, image_size=32, seed=1)
  np.testing.assert_array_equal(other.client_examples(1)[0], x)
  tx, ty = src.test_examples()
  assert tx.shape == (5, 32, 32, 3)
  np.testing.assert_array_equal(ty, [c for _, c in info['test_rows']])
  src.close()
  other.close()


def test_prefetch_matches_direct_decoding(prepared):
  _, _, out = prepared
  src = landmarks.LandmarksSource(out, image_size=24, train_augment=False, num_workers=2)
  ids = [3, 0, 2, 1, 0]
  got = list(src.prefetch_clients(ids, max_in_flight=2))
  assert [k for k, _ in got] == ids
  for k, (x, y) in got:
    ex, ey = src.client_examples(k)
    np.testing.assert_array_equal(x, ex)
    np.testing.assert_array_equal(y, ey)
  src.close()


def test_prepare_resumes_and_flat_layout(tmp_path):
  make_landmarks(str(tmp_path), 'gld160k', num_users=3, per_user=(2,), num_test=2, nested=False)
  out = landmarks.prepare('gld160k', str(tmp_path), short_side=40, num_workers=1)
  shard = os.path.join(out, 'train', '00001.bin')
  mtime = os.path.getmtime(shard)
  os.remove(os.path.join(out, 'index.json'))
  landmarks.prepare('gld160k', str(tmp_path), short_side=40, num_workers=1)  # resumes
  assert os.path.getmtime(shard) == mtime
  src = registry.get_dataset('gld160k', data_dir=str(tmp_path), short_side=40, image_size=16)
  assert src.num_clients == 3 and list(src.client_sizes()) == [2, 2, 2]


def test_missing_and_truncated(tmp_path):
  with pytest.raises(FileNotFoundError, match='--dataset=gld23k'):
    landmarks.split_info('gld23k', str(tmp_path))
  with pytest.raises(FileNotFoundError, match='experiments/prepare.py --dataset=gld23k'):
    registry.get_dataset('gld23k', data_dir=str(tmp_path))
  info = make_landmarks(str(tmp_path), 'gld23k', num_users=2, per_user=(3,), num_test=1)
  victim = info['rows'][1][1]
  os.remove(os.path.join(info['images_dir'], victim[0], victim[1], victim[2], f'{victim}.jpg'))
  with pytest.raises(FileNotFoundError, match='1 GLDv2 images missing'):
    landmarks.prepare('gld23k', str(tmp_path), short_side=32, num_workers=1)
  out = landmarks.prepare('gld23k', str(tmp_path), short_side=32, num_workers=1, allow_missing=True)
  idx = json.load(open(os.path.join(out, 'index.json')))
  assert idx['missing_train'] == 1 and idx['num_train'] == 5
  src = landmarks.LandmarksSource(out, image_size=16)
  assert list(src.client_sizes()) == [2, 3]
  shard = os.path.join(out, 'train', '00001.bin')
  with open(shard, 'r+b') as f:
    f.truncate(os.path.getsize(shard) - 10)
  with pytest.raises(ValueError, match='truncated'):
    src.client_examples(1)


def test_bad_csv_header(tmp_path):
  p = tmp_path / 'f.csv'
  p.write_text('user,image,label\n1,a,2\n')
  with pytest.raises(ValueError, match='user_id'):
    landmarks.read_split_csv(str(p), True)


def test_random_resized_crop_box():
  rng = np.random.default_rng(0)
  for _ in range(200):
    x0, y0, x1, y1 = landmarks.random_resized_crop_box(341, 256, rng)
    assert 0 <= x0 < x1 <= 341 and 0 <= y0 < y1 <= 256
    area = (x1 - x0) * (y1 - y0) / (341 * 256)
    assert 0.07 <= area <= 1.0
  # too-thin image: falls back to the center crop
  box = landmarks.random_resized_crop_box(1000, 2, rng)
  assert box == landmarks.center_crop_box(1000, 2)


@pytest.mark.parametrize('text', [b'user_id,image_id,class\n1,a,\xff\xfe\n', b'user_id,image_id,class\n1,"a\n'])
def test_malformed_csv_is_a_data_format_error(tmp_path, text):
  """Bytes that are not UTF-8, an unterminated quote: the project's DataFormatError naming the file."""
  from fedjax_flat.errors import DataFormatError
  p = tmp_path / 'f.csv'
  p.write_bytes(text)
  with pytest.raises(DataFormatError, match='f.csv'):
    landmarks.read_split_csv(str(p), True)
