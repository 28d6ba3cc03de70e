"""Tiny-ImageNet reader (data/sources/tiny_imagenet.py) on small trees written in the official zip's layout."""
import io
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from fedjax_flat.data import registry
from fedjax_flat.data.sources import catalogue, tiny_imagenet as tin

WNIDS = ['n02124075', 'n01443537', 'n09246464']          # sorted: n01443537, n02124075, n09246464


def _jpeg(path, value, mode='RGB', size=64):
  arr = np.full((size, size, 3), value, np.uint8) if mode == 'RGB' else np.full((size, size), value, np.uint8)
  buf = io.BytesIO()
  Image.fromarray(arr).save(buf, format='JPEG', quality=100)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(buf.getvalue())


def make_tree(root, per_class=4, val_per_class=2, grey=True):
  """<root>/tiny-imagenet-200 with wnids.txt, train/<wnid>/images/*.JPEG (+ boxes file), val/ annotations."""
  base = os.path.join(root, 'tiny-imagenet-200')
  os.makedirs(base, exist_ok=True)
  with open(os.path.join(base, 'wnids.txt'), 'w') as f:
    f.write('\n'.join(WNIDS) + '\n')
  for c, w in enumerate(WNIDS):
    for i in range(per_class):
      _jpeg(os.path.join(base, 'train', w, 'images', f'{w}_{i}.JPEG'), 40 * c + i,
            mode='L' if (grey and i == 0) else 'RGB')
    with open(os.path.join(base, 'train', w, f'{w}_boxes.txt'), 'w') as f:
      f.write(''.join(f'{w}_{i}.JPEG\t0\t0\t63\t63\n' for i in range(per_class)))
  lines, n = [], 0
  for c, w in enumerate(WNIDS):
    for _ in range(val_per_class):
      _jpeg(os.path.join(base, 'val', 'images', f'val_{n}.JPEG'), 200 - 40 * c)
      lines.append(f'val_{n}.JPEG\t{w}\t1\t2\t60\t61\n')
      n += 1
  with open(os.path.join(base, 'val', 'val_annotations.txt'), 'w') as f:
    f.write(''.join(lines))
  return base


def test_reads_the_official_layout(tmp_path):
  make_tree(tmp_path)
  a = tin.load_arrays(str(tmp_path), check_official_sizes=False, threads=2)
  assert a['wnids'] == sorted(WNIDS) and a['num_classes'] == 3
  assert a['x_train'].shape == (12, 64, 64, 3) and a['x_train'].dtype == np.uint8
  assert a['x_test'].shape == (6, 64, 64, 3)
  # labels follow the sorted wnids: WNIDS[0] = n02124075 is class 1, WNIDS[1] = n01443537 class 0
  by_label = {int(y): [] for y in a['y_train']}
  for x, y in zip(a['x_train'], a['y_train']):
    by_label[int(y)].append(float(x.mean()))
  assert sorted(by_label) == [0, 1, 2] and all(len(v) == 4 for v in by_label.values())
  np.testing.assert_allclose(sorted(by_label[1]), [0, 1, 2, 3], atol=1.5)       # WNIDS[0]: values 0..3
  np.testing.assert_allclose(sorted(by_label[0]), [40, 41, 42, 43], atol=1.5)   # WNIDS[1]: values 40..43
  assert list(a['y_test']) == [1, 1, 0, 0, 2, 2]                                  # val files in order
  np.testing.assert_allclose(a['x_test'][:, 0, 0, 0].astype(float), [200, 200, 160, 160, 120, 120], atol=1.5)


def test_greyscale_images_become_rgb(tmp_path):
  make_tree(tmp_path)
  a = tin.load_arrays(str(tmp_path), check_official_sizes=False, threads=1)
  first = a['x_train'][a['y_train'] == 1][0]                  # n02124075_0.JPEG was written greyscale
  assert first.shape == (64, 64, 3) and np.array_equal(first[..., 0], first[..., 2])


def test_official_sizes_are_checked(tmp_path):
  make_tree(tmp_path)
  with pytest.raises(tin.TinyImageNetFormatError, match='official'):
    tin.load_arrays(str(tmp_path))


def test_missing_dataset_names_the_download_command(tmp_path):
  with pytest.raises(FileNotFoundError, match='--dataset=tiny_imagenet'):
    tin.load_arrays(str(tmp_path))


@pytest.mark.parametrize('damage,needle', [
    ('bad_wnid', "wnid 'n99999999' is not in wnids.txt"),
    ('path_name', 'is not a plain file name'),
    ('no_tab', 'expected tab-separated'),
    ('missing_image', 'listed but missing'),
    ('corrupt_jpeg', 'not a decodable image'),
    ('wrong_size', 'expected 64x64'),
    ('no_annotations', 'val_annotations.txt: missing'),
    ('missing_class_dir', 'missing (wnids.txt lists'),
])
def test_malformed_trees_raise_the_data_format_error(tmp_path, damage, needle):
  base = make_tree(tmp_path, grey=False)
  ann = os.path.join(base, 'val', 'val_annotations.txt')
  if damage == 'bad_wnid':
    with open(ann, 'a') as f:
      f.write('val_0.JPEG\tn99999999\t0\t0\t1\t1\n')
  elif damage == 'path_name':
    with open(ann, 'a') as f:
      f.write('../../wnids.txt\tn01443537\t0\t0\t1\t1\n')
  elif damage == 'no_tab':
    with open(ann, 'a') as f:
      f.write('val_0.JPEG n01443537\n')
  elif damage == 'missing_image':
    os.remove(os.path.join(base, 'val', 'images', 'val_3.JPEG'))
  elif damage == 'corrupt_jpeg':
    with open(os.path.join(base, 'val', 'images', 'val_2.JPEG'), 'r+b') as f:
      f.truncate(40)
  elif damage == 'wrong_size':
    _jpeg(os.path.join(base, 'train', WNIDS[2], 'images', f'{WNIDS[2]}_1.JPEG'), 9, size=32)
  elif damage == 'no_annotations':
    os.remove(ann)
  elif damage == 'missing_class_dir':
    shutil.rmtree(os.path.join(base, 'train', WNIDS[1]))
  with pytest.raises(tin.TinyImageNetFormatError, match=needle.replace('(', r'\(')):
    tin.load_arrays(str(tmp_path), check_official_sizes=False)


def test_registered_and_federated_with_a_saved_dirichlet_split(tmp_path):
  make_tree(tmp_path, per_class=6)
  kw = dict(data_dir=str(tmp_path), num_clients=3, alpha=0.5, examples_per_client=6, seed=0,
            check_official_sizes=False)
  ds = registry.get_dataset('tiny_imagenet', **kw)
  assert ds.num_clients == 3 and sorted(ds.client_sizes()) == [6, 6, 6] and ds.num_classes == 3
  saved = os.listdir(tmp_path / 'splits')
  assert len(saved) == 1 and saved[0].startswith('tiny_imagenet')
  again = registry.get_dataset('tiny_imagenet', **kw)
  assert np.array_equal(again.client_sizes(), ds.client_sizes())
  with pytest.raises(ValueError, match='partition'):
    registry.get_dataset('tiny_imagenet', **{**kw, 'partition': 'zipf'})


def test_catalogue_pins_the_official_zip():
  (res,) = catalogue.RESOURCES['tiny_imagenet']
  assert res.url == 'http://cs231n.stanford.edu/tiny-imagenet-200.zip'
  assert (res.size, res.md5) == (248100043, '90528d7ca1a48142e341f4ef8d21d0de')
  assert 'tiny_imagenet' in catalogue.DATASETS
