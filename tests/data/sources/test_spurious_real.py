"""Waterbirds and CelebA blond (data/sources/spurious_real.py) on files written exactly as the releases write
them: metadata.csv / list_attr_celeba.txt + list_eval_partition.txt, tiny JPEGs; groups = 2 * target + attribute."""
import os

import numpy as np
import pytest

from fedjax_flat.data import registry
from fedjax_flat.data.sources import spurious_real
from fedjax_flat.errors import DataFormatError
from fedjax_flat.tasks.groups import GroupLabelled
from tests.fixtures.data_files import (CELEBA_ATTRIBUTES, make_celeba_leaf, make_waterbirds,
                                       write_celeba_partition)


def test_waterbirds_splits_groups_and_images(tmp_path):
  rows = make_waterbirds(str(tmp_path))
  ds = registry.get_dataset('waterbirds', data_dir=str(tmp_path), num_clients=2, image_size=12, seed=1)
  train = [r for r in rows if r[3] == 0]
  test = [r for r in rows if r[3] == 2]
  assert len(ds.y) == len(train) and len(ds.test_y) == len(test)      # the val split (1) is left out
  assert ds.x.shape == (len(train), 12, 12, 3) and ds.x.dtype == np.uint8
  assert isinstance(ds.task, GroupLabelled) and ds.task.num_groups == 4
  assert ds.group_names == spurious_real.WATERBIRDS_GROUPS
  want = sorted((r[2], 2 * r[2] + r[4]) for r in test)
  assert sorted(map(tuple, ds.test_y.tolist())) == want
  np.testing.assert_array_equal(ds.y[:, 1] // 2, ds.y[:, 0])
  assert sorted(np.concatenate([ds.client_indices(k) for k in range(2)]).tolist()) == list(range(len(train)))
  # the decoded image is the file's, resized as the loader says
  from PIL import Image
  first = os.path.join(str(tmp_path), spurious_real.WATERBIRDS_DIR, train[0][1])
  with Image.open(first) as im:
    ref = np.asarray(im.convert('RGB').resize((12, 12), Image.BICUBIC))
  assert any(np.array_equal(ref, x) for x in ds.x)


def test_waterbirds_group_skew_and_subset(tmp_path):
  make_waterbirds(str(tmp_path), per_split=(16, 0, 4))
  ds = registry.get_dataset('waterbirds', data_dir=str(tmp_path), num_clients=2, group_alpha=0.1,
                            max_samples=12, image_size=8)
  assert len(ds.y) == 12 and len(ds.test_y) == 4
  # Dirichlet(0.1) over the groups: each client is dominated by few groups
  for k in range(2):
    counts = np.bincount(ds.client_labels(k)[:, 1], minlength=4)
    assert counts.max() >= 0.5 * counts.sum()


def test_waterbirds_bad_files(tmp_path):
  make_waterbirds(str(tmp_path))
  meta = os.path.join(str(tmp_path), spurious_real.WATERBIRDS_DIR, 'metadata.csv')
  lines = open(meta).read().splitlines()
  with open(meta, 'w') as f:
    f.write('\n'.join([lines[0], '99,../../etc/passwd,0,0,0,x.jpg'] + lines[1:]) + '\n')
  with pytest.raises(DataFormatError, match='leaves'):
    registry.get_dataset('waterbirds', data_dir=str(tmp_path), num_clients=2, image_size=8)
  with open(meta, 'w') as f:
    f.write('\n'.join([lines[0], '99,a.jpg,2,0,0,x.jpg']) + '\n')
  with pytest.raises(DataFormatError, match='y and place must be 0 or 1'):
    registry.get_dataset('waterbirds', data_dir=str(tmp_path), num_clients=2, image_size=8)
  with open(meta, 'w') as f:
    f.write('id,file,y\n')
  with pytest.raises(DataFormatError, match='header must be'):
    registry.get_dataset('waterbirds', data_dir=str(tmp_path), num_clients=2, image_size=8)
  with pytest.raises(FileNotFoundError, match='metadata.csv'):
    registry.get_dataset('waterbirds', data_dir=str(tmp_path / 'nothing'), num_clients=2)


def test_celeba_blond_reads_the_official_files(tmp_path):
  root = tmp_path / 'celeba'
  rows = make_celeba_leaf(str(root), celebs=(6, 6), seed=2, image_size=(20, 24))
  names = sorted(rows)
  splits = [0, 2, 1] * (len(names) // 3)
  write_celeba_partition(str(root), names, splits)
  ds = registry.get_dataset('celeba_blond', data_dir=str(tmp_path), num_clients=2, image_size=8)
  blond, male = CELEBA_ATTRIBUTES.index('Blond_Hair'), CELEBA_ATTRIBUTES.index('Male')

  def want(split):
    return sorted(((int(rows[n][1][blond]) + 1) // 2, (int(rows[n][1][blond]) + 1) + (int(rows[n][1][male]) + 1) // 2)
                  for n, s in zip(names, splits) if s == split)
  assert sorted(map(tuple, ds.y.tolist())) == want(0)
  assert sorted(map(tuple, ds.test_y.tolist())) == want(2)
  assert ds.x.shape == (splits.count(0), 8, 8, 3) and ds.task.num_groups == 4
  assert ds.group_names == spurious_real.CELEBA_GROUPS
  with open(root / 'raw' / 'list_eval_partition.txt', 'a') as f:
    f.write('999999.jpg 3\n')
  with pytest.raises(DataFormatError, match='list_eval_partition'):
    registry.get_dataset('celeba_blond', data_dir=str(tmp_path), num_clients=2, image_size=8)
