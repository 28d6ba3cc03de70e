"""CelebA in LEAF's layout (data/sources/celeba.py) on files written exactly as LEAF and the official release
write them: users = celebrities with >= 5 images, the 40 attributes kept, labels [smiling, oracle domain]."""
import json
import os

import numpy as np
import pytest

from fedjax_flat.data import registry
from fedjax_flat.data.sources import catalogue, celeba
from fedjax_flat.data.download import DownloadError
from fedjax_flat.errors import ConfigError, DataFormatError
from tests.fixtures.data_files import CELEBA_ATTRIBUTES, make_celeba_leaf


@pytest.fixture()
def root(tmp_path):
  r = tmp_path / 'celeba' / 'data'
  rows = make_celeba_leaf(str(r))
  return str(tmp_path), str(r), rows


def test_reads_users_attributes_and_domains(root):
  data_dir, r, rows = root
  ds = registry.get_dataset('celeba', data_dir=data_dir, image_size=16, train_fraction=0.6, seed=0, cache=False)
  assert ds.num_clients == 3                               # the celebrity with 3 images is not in LEAF's JSON
  assert ds.input_shape == (16, 16, 3) and ds.x.dtype == np.uint8
  assert ds.task == 'domain_labelled' and ds.y.shape[1] == 2
  assert ds.attribute_names == CELEBA_ATTRIBUTES and ds.attributes.shape == (len(ds.y), 40)
  n_train = [max(1, int(0.6 * n)) for n in (6, 5, 7)]
  assert ds.client_sizes().tolist() == n_train
  smiling = CELEBA_ATTRIBUTES.index('Smiling')
  cols = [CELEBA_ATTRIBUTES.index(a) for a in celeba.ORACLE_ATTRIBUTES]
  np.testing.assert_array_equal(ds.y[:, 0], ds.attributes[:, smiling])
  want = sum(ds.attributes[:, c].astype(int) << b for b, c in enumerate(cols))
  np.testing.assert_array_equal(ds.y[:, 1], want)
  assert ds.y[:, 1].max() < 32
  # attributes match the file's rows ({-1, 1} -> {0, 1}) for every training image, in client order
  from PIL import Image
  names = json.load(open(os.path.join(r, 'all_data', 'all_data.json')))['user_data']
  got_rows = {tuple(a) for a in ds.attributes.tolist()}
  assert got_rows <= {tuple(((v + 1) // 2).tolist()) for _, v in rows.values()}
  first = names[ds.client_names[0]]['x']
  imgs = [np.asarray(Image.open(os.path.join(r, 'raw', 'img_align_celeba', n)).convert('RGB')
                     .resize((16, 16), Image.BICUBIC)) for n in first]
  assert any(np.array_equal(ds.x[0], im) for im in imgs)


def test_domain_attributes_field(root):
  data_dir, _, _ = root
  ds = registry.get_dataset('celeba', data_dir=data_dir, image_size=8, domain_attributes='Male,Young',
                            cache=False)
  male, young = CELEBA_ATTRIBUTES.index('Male'), CELEBA_ATTRIBUTES.index('Young')
  np.testing.assert_array_equal(ds.y[:, 1], ds.attributes[:, male] + 2 * ds.attributes[:, young])
  with pytest.raises(DataFormatError, match='Smile'):
    registry.get_dataset('celeba', data_dir=data_dir, image_size=8, domain_attributes='Smile', cache=False)
  with pytest.raises(ConfigError, match='domain_attributes'):
    registry.get_dataset('celeba', data_dir=data_dir, domain_attributes='Male,Male', cache=False)


def test_untrusted_names_and_inconsistent_files(root):
  data_dir, r, _ = root
  path = os.path.join(r, 'all_data', 'all_data.json')
  d = json.load(open(path))
  u = d['users'][0]
  d['user_data'][u]['x'][0] = '../../secret.jpg'
  json.dump(d, open(path, 'w'))
  with pytest.raises(ValueError, match='plain image file names'):
    registry.get_dataset('celeba', data_dir=data_dir, cache=False)
  d['user_data'][u]['x'][0] = '000001.jpg'
  d['user_data'][u]['y'][0] = 1.0 - d['user_data'][u]['y'][0]
  json.dump(d, open(path, 'w'))
  with pytest.raises(DataFormatError, match='Smiling'):
    registry.get_dataset('celeba', data_dir=data_dir, cache=False)


def test_truncated_attribute_file(root):
  data_dir, r, _ = root
  path = os.path.join(r, 'raw', 'list_attr_celeba.txt')
  lines = open(path).read().split('\n')
  open(path, 'w').write('\n'.join(lines[:-3]) + '\n')
  with pytest.raises(DataFormatError, match='truncated'):
    registry.get_dataset('celeba', data_dir=data_dir, cache=False)


def test_missing_data_names_the_manual_steps(tmp_path):
  with pytest.raises(FileNotFoundError, match='list_attr_celeba.txt'):
    registry.get_dataset('celeba', data_dir=str(tmp_path), cache=False)
  with pytest.raises(DownloadError, match='CelebA'):
    catalogue.download('celeba', str(tmp_path))
