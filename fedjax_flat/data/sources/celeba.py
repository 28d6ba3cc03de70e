"""CelebA in LEAF's format (Caldas et al. 2018), with the 40 attributes kept for FedCG's oracle domains (thesis 5.4).

LEAF's layout (leaf/data/celeba, built by its preprocess.sh from the official CelebA files):
  <root>/all_data/*.json            {"users": [celebrity id, ...], "num_samples": [...], "user_data": {u: {"x":
                                    [image file names], "y": [0/1 "Smiling" (LEAF writes (a + 1) / 2: 0.0 / 1.0)]}}}
                                    one user per celebrity with >= 5 images (9,343 users, about 21 images each)
  <root>/raw/img_align_celeba/      the aligned 178x218 JPEGs (img_align_celeba.zip)
  <root>/raw/list_attr_celeba.txt   line 1: the image count; line 2: the 40 attribute names; then one line per
                                    image: "<file> a_1 ... a_40" with a_i in {-1, 1}
  (or LEAF's own train/test files under <root>/train, <root>/test: data.source='leaf_split')
Sampling, min_samples and the train/test split are LEAF's, shared with FEMNIST (data/sources/leaf.py).

Images: decoded with PIL, converted to RGB and resized to `image_size` x `image_size` (84, LEAF's model; bicubic,
named explicitly since PIL's default changed across versions), stored uint8 [N, S, S, 3] (the batch transforms
scale to [0, 1]). File names come from the JSON, an untrusted file: only plain names (letters, digits, '_', '-',
'.', ending .jpg/.png) are opened, inside raw/img_align_celeba.

Labels y [N, 2] = [smiling, domain] under the `domain_labelled` task (tasks/domains.py). The target is LEAF's y,
checked against the attribute file's "Smiling" column. The domain of an image is sum_b attr_b 2^b over
`domain_attributes` (default the thesis' five: Attractive, Heavy_Makeup, High_Cheekbones, Mouth_Slightly_Open,
Wavy_Hair -> N = 32 oracle domains; bit b = the b-th attribute listed, 1 = present). All 40 attributes stay on the
dataset (`attributes` / `test_attributes` [N, 40] in {0, 1}, `attribute_names`).

CelebA cannot be fetched by a program (Google Drive / a form on the CelebA page): `celeba_instructions`.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Sequence, Tuple

import numpy as np

from fedjax_flat.data.registry import check_arg, register
from fedjax_flat.schema import DataValue
from fedjax_flat.data.sources import leaf
from fedjax_flat.data.download import default_data_dir
from fedjax_flat.errors import DataFormatError

NUM_ATTRIBUTES = 40
TARGET = 'Smiling'
ORACLE_ATTRIBUTES = ('Attractive', 'Heavy_Makeup', 'High_Cheekbones', 'Mouth_Slightly_Open', 'Wavy_Hair')
IMAGE_DIR = os.path.join('raw', 'img_align_celeba')
ATTR_FILE = os.path.join('raw', 'list_attr_celeba.txt')
_SAFE_NAME = re.compile(r'^[A-Za-z0-9_\-.]+\.(jpg|jpeg|png)$')


def celeba_instructions(data_dir: str) -> str:
  return ('CelebA is published on Google Drive behind the CelebA page (mmlab.ie.cuhk.edu.hk/projects/CelebA.html): '
          'download img_align_celeba.zip, list_attr_celeba.txt and identity_CelebA.txt into leaf/data/celeba/data/raw '
          '(unzip the images there), run  cd leaf/data/celeba && ./preprocess.sh  (writes data/all_data/*.json), '
          f'then copy leaf/data/celeba/data to {os.path.join(data_dir, "celeba")} or pass '
          '--config.data.data_dir=<...>/leaf/data/celeba/data')


def encode_celeba(xs: list, ys: list, where: str) -> Tuple[np.ndarray, np.ndarray]:
  """A user's LEAF lists -> (file names [n] str, targets [n] int32)."""
  for name in xs:
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or name.startswith('.'):
      raise leaf.LeafFormatError(f'{where}: CelebA x must be plain image file names, got {name!r}')
  try:
    y = np.asarray(ys, np.float64).reshape(-1)
  except (TypeError, ValueError) as e:
    raise leaf.LeafFormatError(f'{where}: CelebA y must be 0/1 numbers ({e})') from e
  if len(y) and not np.all((y == 0) | (y == 1)):
    raise leaf.LeafFormatError(f'{where}: CelebA y must be 0 or 1 (LEAF writes (attribute + 1) / 2)')
  return np.asarray(xs, dtype=str), y.astype(np.int32)


def read_attributes(path: str) -> Tuple[List[str], Dict[str, np.ndarray]]:
  """list_attr_celeba.txt -> (40 names, {file name: [40] int8 in {0, 1}})."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'celeba: {path} not found (the official list_attr_celeba.txt, in raw/)')
  with open(path) as f:
    lines = f.read().split('\n')
  if len(lines) < 2:
    raise DataFormatError(f'{path}: expected a count line and a line of attribute names')
  names = lines[1].split()
  if len(names) != NUM_ATTRIBUTES:
    raise DataFormatError(f'{path}: line 2 names {len(names)} attributes, expected {NUM_ATTRIBUTES}')
  table = {}
  for i, line in enumerate(lines[2:], start=3):
    parts = line.split()
    if not parts:
      continue
    if len(parts) != NUM_ATTRIBUTES + 1 or any(p not in ('1', '-1') for p in parts[1:]):
      raise DataFormatError(f'{path}: line {i} is not "<file> <40 values in {{-1, 1}}>"')
    table[parts[0]] = ((np.array([int(p) for p in parts[1:]], np.int8) + 1) // 2).astype(np.int8)
  try:
    count = int(lines[0].split()[0])
  except (IndexError, ValueError) as e:
    raise DataFormatError(f'{path}: line 1 must be the number of images') from e
  if count != len(table):
    raise DataFormatError(f'{path}: line 1 says {count} images, the file lists {len(table)} (truncated?)')
  return names, table


def decode_paths(paths: Sequence[str], image_size: int, what: str, hint: str = '') -> np.ndarray:
  """Image files -> uint8 [N, image_size, image_size, 3] (RGB, bicubic resize); a missing or unreadable file is
  one line naming it (`what`: the dataset; `hint`: how to get the files)."""
  from PIL import Image   # only the image readers (and segmentation) need PIL
  out = np.zeros((len(paths), image_size, image_size, 3), np.uint8)
  for i, path in enumerate(paths):
    if not os.path.isfile(path):
      raise FileNotFoundError(f'{what}: image {path} not found{hint}')
    try:
      with Image.open(path) as im:
        out[i] = np.asarray(im.convert('RGB').resize((image_size, image_size), Image.BICUBIC), np.uint8)
    except OSError as e:
      raise DataFormatError(f'{what}: {path} is not a readable image ({e})') from e
  return out


def decode_images(root: str, names: Sequence[str], image_size: int) -> np.ndarray:
  base = os.path.join(root, IMAGE_DIR)
  return decode_paths([os.path.join(base, n) for n in names], image_size, 'celeba',
                      ' (img_align_celeba.zip unzipped into raw/?)')


def domain_ids(attrs: np.ndarray, attribute_names: Sequence[str], chosen: Sequence[str]) -> np.ndarray:
  """sum_b attr[chosen_b] 2^b: [N, 40] {0, 1} -> [N] domain ids in [0, 2^len(chosen))."""
  cols = [list(attribute_names).index(a) for a in chosen]
  return np.sum(attrs[:, cols].astype(np.int64) << np.arange(len(cols))[None, :], axis=1).astype(np.int32)


def load_celeba(data_dir=None, *, image_size: int = 84, domain_attributes: Sequence[str] = ORACLE_ATTRIBUTES,
                **leaf_args):
  try:
    root = leaf.find_root(data_dir or default_data_dir(), 'celeba')
  except FileNotFoundError as e:
    raise FileNotFoundError(f'celeba: no LEAF CelebA data under {data_dir or default_data_dir()}. '
                            + celeba_instructions(data_dir or default_data_dir())) from e
  train, test, pop, desc = leaf.load('celeba', data_dir or default_data_dir(), encode_celeba, **leaf_args)
  attribute_names, table = read_attributes(os.path.join(root, ATTR_FILE))
  for a in list(domain_attributes) + [TARGET]:
    if a not in attribute_names:
      raise DataFormatError(f'celeba: attribute {a!r} is not in {ATTR_FILE}')
  target_col = attribute_names.index(TARGET)

  def convert(users):
    out, attrs = [], []
    for u, names, y, h in users:
      missing = [n for n in names if n not in table]
      if missing:
        raise DataFormatError(f'celeba: user {u!r}: image {missing[0]!r} has no line in {ATTR_FILE}')
      a = np.stack([table[n] for n in names]) if len(names) else np.zeros((0, NUM_ATTRIBUTES), np.int8)
      if np.any(a[:, target_col] != y):
        raise DataFormatError(f'celeba: user {u!r}: the JSON target differs from the attribute file\'s {TARGET!r}')
      labels = np.stack([y.astype(np.int32), domain_ids(a, attribute_names, domain_attributes)], axis=1)
      out.append((u, decode_images(root, names, image_size), labels, h))
      attrs.append(a)
    return out, (np.concatenate(attrs) if attrs else np.zeros((0, NUM_ATTRIBUTES), np.int8))

  train, train_attrs = convert(train)
  test, test_attrs = convert(test)
  ds = leaf.to_dataset(train, test, pop, num_classes=2, name=desc, task='domain_labelled')
  ds.attributes, ds.test_attributes, ds.attribute_names = train_attrs, test_attrs, attribute_names
  ds.domain_attributes = tuple(domain_attributes)
  return ds


def _attribute_list(v) -> Tuple[str, ...]:
  if isinstance(v, str):
    return tuple(a for a in v.replace(',', ' ').split() if a)
  return tuple(v or ())


@register('celeba', task='domain_labelled',
          rules={'num_clients': DataValue(None, 'int', lo=0, what='users drawn at random; 0 = every user')})
def _celeba(data_dir=None, source='auto', split='', fraction=1.0, iid_user_fraction=1.0, iid_sizes='leaf',
            min_samples=0, train_split='sample', train_fraction=0.9, seed=0, cache=True, num_clients=0,
            max_samples=0, image_size=84, domain_attributes=','.join(ORACLE_ATTRIBUTES), **unused):
  del unused
  attrs = _attribute_list(domain_attributes)
  check_arg('domain_attributes', domain_attributes, 1 <= len(attrs) <= 10 and len(set(attrs)) == len(attrs),
            'a comma-separated list of 1 to 10 distinct CelebA attribute names (2^n oracle domains)')
  check_arg('image_size', image_size, isinstance(image_size, int) and image_size >= 8, 'an integer >= 8')
  return load_celeba(data_dir, image_size=image_size, domain_attributes=attrs, source=source, split=split,
                     fraction=fraction, iid_user_fraction=iid_user_fraction, iid_sizes=iid_sizes,
                     min_samples=min_samples, train_split=train_split, train_fraction=train_fraction, seed=seed,
                     cache=cache, num_clients=num_clients, max_samples=max_samples)
