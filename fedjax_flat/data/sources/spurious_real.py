"""The real spurious-correlation sets (thesis §7.2.3) read from their official files: Waterbirds (Sagawa et al.
2020) and CelebA blond hair (the same paper's CelebA task), federated by the project's partitioners.

Waterbirds (`waterbirds`): the release folder `waterbird_complete95_forest2water2` (under data_dir, or data_dir
itself) holding `metadata.csv` with the header img_id,img_filename,y,split,place,place_filename (y: 0 landbird,
1 waterbird; place: 0 land, 1 water background; split: 0 train, 1 val, 2 test) and the images at
<folder>/<img_filename>. Groups = 2 * y + place: 0 landbird/land, 1 landbird/water, 2 waterbird/land,
3 waterbird/water.

CelebA blond (`celeba_blond`): the official files beside the LEAF CelebA layout (data/sources/celeba.py, whose
attribute reader and image decoder this reuses): <root>/raw/list_attr_celeba.txt, <root>/raw/list_eval_partition.txt
("<file> <0 | 1 | 2>" per line: train / val / test) and <root>/raw/img_align_celeba/, root = data_dir/celeba or
data_dir. Target Blond_Hair, spurious attribute Male: groups = 2 * blond + male.

Both: the train split is dealt to `num_clients` clients IID (group_alpha = 0) or with per-client group skew
(Dirichlet over the groups, alpha = group_alpha: data/sources/spurious.group_partition); the test split is the
global test set (the val split is not used: no model selection here). `max_samples` > 0 keeps a random subset
of that many examples of each split (seeded). Images are decoded with PIL to uint8 [N, S, S, 3]
(`image_size`, bicubic); file names from the metadata are untrusted: a name that leaves its folder is refused.
Labels y = [class, group] under the group_labelled task (tasks/groups.py).
"""
from __future__ import annotations

import csv
import os
from typing import Tuple

import numpy as np

from fedjax_flat.data.download import default_data_dir
from fedjax_flat.data.registry import register
from fedjax_flat.data.sources import celeba
from fedjax_flat.data.sources.spurious import group_dataset, group_partition
from fedjax_flat.errors import DataFormatError
from fedjax_flat.schema import DataValue

WATERBIRDS_DIR = 'waterbird_complete95_forest2water2'
WATERBIRDS_COLUMNS = ('img_id', 'img_filename', 'y', 'split', 'place', 'place_filename')
WATERBIRDS_GROUPS = ('landbird/land', 'landbird/water', 'waterbird/land', 'waterbird/water')
CELEBA_PARTITION = os.path.join('raw', 'list_eval_partition.txt')
CELEBA_GROUPS = ('not_blond/female', 'not_blond/male', 'blond/female', 'blond/male')
TRAIN, VAL, TEST = 0, 1, 2


def _inside(root: str, name: str, where: str) -> str:
  """root/name, refused when the name is absolute or leaves root (the metadata is an untrusted file)."""
  path = os.path.normpath(os.path.join(root, name))
  if os.path.isabs(name) or not path.startswith(os.path.normpath(root) + os.sep):
    raise DataFormatError(f'{where}: image name {name!r} leaves {root}')
  return path


def _subset(n: int, max_samples: int, rng) -> np.ndarray:
  return np.arange(n) if not max_samples or n <= max_samples else np.sort(rng.permutation(n)[:max_samples])


def read_waterbirds_metadata(path: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """metadata.csv -> (file names [N] str, y [N], split [N], place [N])."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'waterbirds: {path} not found (the {WATERBIRDS_DIR} release folder, with metadata.csv)')
  with open(path, newline='') as f:
    rows = list(csv.reader(f))
  if not rows or tuple(c.strip() for c in rows[0]) != WATERBIRDS_COLUMNS:
    raise DataFormatError(f'{path}: header must be {",".join(WATERBIRDS_COLUMNS)}, got {rows[0] if rows else []}')
  names, ints = [], []
  for i, row in enumerate(rows[1:], start=2):
    if not row:
      continue
    if len(row) != len(WATERBIRDS_COLUMNS):
      raise DataFormatError(f'{path}: line {i} has {len(row)} columns, expected {len(WATERBIRDS_COLUMNS)}')
    try:
      y, split, place = int(row[2]), int(row[3]), int(row[4])
    except ValueError as e:
      raise DataFormatError(f'{path}: line {i}: y, split and place must be integers ({e})') from e
    if y not in (0, 1) or place not in (0, 1) or split not in (TRAIN, VAL, TEST):
      raise DataFormatError(f'{path}: line {i}: y and place must be 0 or 1, split 0, 1 or 2; got y={y}, '
                            f'split={split}, place={place}')
    names.append(row[1])
    ints.append((y, split, place))
  a = np.asarray(ints, np.int64).reshape(-1, 3)
  return np.asarray(names, dtype=str), a[:, 0], a[:, 1], a[:, 2]


def _assemble(x_of, y, group, split, *, num_clients, group_alpha, max_samples, seed, group_names, name):
  """Train / test of the split column -> the federated, group-labelled dataset (x_of(indices) decodes)."""
  rng = np.random.default_rng([int(seed), 0x3A7])
  tr = np.flatnonzero(split == TRAIN)
  te = np.flatnonzero(split == TEST)
  tr, te = tr[_subset(len(tr), max_samples, rng)], te[_subset(len(te), max_samples, rng)]
  if len(tr) < num_clients or not len(te):
    raise DataFormatError(f'{name}: {len(tr)} training and {len(te)} test examples cannot make {num_clients} '
                          'clients and a test set')
  splits = group_partition(group[tr], num_clients, group_alpha, seed)
  return group_dataset(x_of(tr), y[tr], group[tr], splits, x_of(te), y[te], group[te], num_classes=2,
                       num_groups=len(group_names), group_names=group_names, name=name)


def _root(data_dir, marker: str, subdir: str, what: str) -> str:
  base = data_dir or default_data_dir()
  for root in (os.path.join(base, subdir), base):
    if os.path.isfile(os.path.join(root, marker)):
      return root
  raise FileNotFoundError(f'{what}: no {marker} under {os.path.join(base, subdir)} or {base}; pass '
                          '--config.data.data_dir=<the folder that holds it>')


def load_waterbirds(data_dir=None, *, num_clients: int = 10, group_alpha: float = 0.0, image_size: int = 64,
                    max_samples: int = 0, seed: int = 0):
  root = _root(data_dir, 'metadata.csv', WATERBIRDS_DIR, 'waterbirds')
  names, y, split, place = read_waterbirds_metadata(os.path.join(root, 'metadata.csv'))
  paths = [_inside(root, n, 'waterbirds') for n in names]

  def decode(rows):
    return celeba.decode_paths([paths[j] for j in rows], image_size, 'waterbirds')
  return _assemble(decode, y, 2 * y + place, split,
                   num_clients=num_clients, group_alpha=group_alpha, max_samples=max_samples, seed=seed,
                   group_names=WATERBIRDS_GROUPS, name=f'waterbirds(group_alpha={group_alpha})')


def read_partition(path: str) -> dict:
  """list_eval_partition.txt -> {file name: 0 | 1 | 2}."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'celeba_blond: {path} not found (the official list_eval_partition.txt, in raw/)')
  out = {}
  with open(path) as f:
    for i, line in enumerate(f, start=1):
      parts = line.split()
      if not parts:
        continue
      if len(parts) != 2 or parts[1] not in ('0', '1', '2'):
        raise DataFormatError(f'{path}: line {i} is not "<file> <0 | 1 | 2>"')
      out[parts[0]] = int(parts[1])
  return out


def load_celeba_blond(data_dir=None, *, num_clients: int = 10, group_alpha: float = 0.0, image_size: int = 64,
                      max_samples: int = 0, seed: int = 0):
  root = _root(data_dir, celeba.ATTR_FILE, 'celeba', 'celeba_blond')
  attr_names, table = celeba.read_attributes(os.path.join(root, celeba.ATTR_FILE))
  parts = read_partition(os.path.join(root, CELEBA_PARTITION))
  for a in ('Blond_Hair', 'Male'):
    if a not in attr_names:
      raise DataFormatError(f'celeba_blond: attribute {a!r} is not in {celeba.ATTR_FILE}')
  names = sorted(parts)
  missing = [n for n in names if n not in table]
  if missing:
    raise DataFormatError(f'celeba_blond: image {missing[0]!r} of {CELEBA_PARTITION} has no line in '
                          f'{celeba.ATTR_FILE}')
  attrs = np.stack([table[n] for n in names]).astype(np.int64)
  blond, male = attrs[:, attr_names.index('Blond_Hair')], attrs[:, attr_names.index('Male')]
  split = np.asarray([parts[n] for n in names], np.int64)
  return _assemble(lambda i: celeba.decode_images(root, [names[j] for j in i], image_size), blond,
                   2 * blond + male, split, num_clients=num_clients, group_alpha=group_alpha,
                   max_samples=max_samples, seed=seed, group_names=CELEBA_GROUPS,
                   name=f'celeba_blond(group_alpha={group_alpha})')


RULES = {
    'group_alpha': DataValue(None, 'number', lo=0, what='0: IID clients; > 0: Dirichlet group skew per client'),
    'max_samples': DataValue(None, 'int', lo=0, what='examples kept per split, 0 = all'),
    'image_size': DataValue(None, 'int', lo=8, what='images are resized to image_size x image_size'),
}


@register('waterbirds', task='group_labelled', rules=RULES)
def _waterbirds(data_dir=None, num_clients=10, group_alpha=0.0, image_size=64, max_samples=0, seed=0, **unused):
  del unused
  return load_waterbirds(data_dir, num_clients=int(num_clients), group_alpha=float(group_alpha),
                         image_size=int(image_size), max_samples=int(max_samples), seed=int(seed))


@register('celeba_blond', task='group_labelled', rules=RULES)
def _celeba_blond(data_dir=None, num_clients=10, group_alpha=0.0, image_size=64, max_samples=0, seed=0, **unused):
  del unused
  return load_celeba_blond(data_dir, num_clients=int(num_clients), group_alpha=float(group_alpha),
                           image_size=int(image_size), max_samples=int(max_samples), seed=int(seed))
