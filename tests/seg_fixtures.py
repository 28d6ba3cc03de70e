"""Writers of small segmentation datasets in exactly the official layouts (Cityscapes, IDDAsmall, FedDrive's
LEAF split JSONs), for tests/test_data_seg_*.py."""
from __future__ import annotations

import json
import os
from typing import Dict, Sequence, Tuple

import numpy as np
from PIL import Image

# Every Cityscapes labelId value a gtFine *_labelIds.png can hold (0..33; license plate is written as 0 here).
CITYSCAPES_LABEL_IDS = np.arange(34)


def _label_ids(rng, h, w, values):
  """A label map with blocks of random ids (so nearest-neighbour resizing keeps most of them)."""
  bh, bw = max(1, h // 4), max(1, w // 4)
  blocks = rng.choice(values, size=(-(-h // bh), -(-w // bw)))
  return np.kron(blocks, np.ones((bh, bw), np.int64))[:h, :w].astype(np.uint8)


def make_cityscapes(root: str, train: Dict[str, int], val: Dict[str, int], size=(16, 32), seed=0
                    ) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
  """Writes leftImg8bit/{train,val}/<city>/*_leftImg8bit.png and gtFine/.../*_gtFine_labelIds.png.

  Returns {image path relative to leftImg8bit: (rgb uint8 [H, W, 3], labelIds uint8 [H, W])}.
  """
  rng = np.random.default_rng(seed)
  out = {}
  for split, cities in (('train', train), ('val', val)):
    for city, n in cities.items():
      for d in ('leftImg8bit', 'gtFine'):
        os.makedirs(os.path.join(root, d, split, city), exist_ok=True)
      for i in range(n):
        stem = f'{city}_{i:06d}_000019'
        img = rng.integers(0, 256, size + (3,), dtype=np.uint8)
        lab = _label_ids(rng, *size, CITYSCAPES_LABEL_IDS)
        Image.fromarray(img).save(os.path.join(root, 'leftImg8bit', split, city, f'{stem}_leftImg8bit.png'))
        Image.fromarray(lab, mode='L').save(os.path.join(root, 'gtFine', split, city, f'{stem}_gtFine_labelIds.png'))
        out[f'{split}/{city}/{stem}_leftImg8bit.png'] = (img, lab)
  return out


def idda_domains(towns=('T01', 'T07'), weathers=('CN', 'HRN'), viewpoints=('A', 'B')) -> Sequence[str]:
  return [f'{t}_{w}_{v}' for t in towns for w in weathers for v in viewpoints]


def make_idda(root: str, domains: Sequence[str], per_domain: int = 5, size=(12, 20), seed=0, rgb_labels=False
              ) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
  """Writes IDDAsmall/<domain>/RGB/<id>_<domain>.jpg and Semantic/<id>_<domain>.png (raw values 0..23).

  rgb_labels: CARLA-style RGB label PNGs (class in R, G = B = 0) instead of single-channel ones.
  Returns {image path relative to root: (rgb as decoded back from the JPEG, raw label uint8 [H, W])}.
  """
  rng = np.random.default_rng(seed)
  out = {}
  for d in domains:
    os.makedirs(os.path.join(root, d, 'RGB'), exist_ok=True)
    os.makedirs(os.path.join(root, d, 'Semantic'), exist_ok=True)
    for i in range(per_domain):
      sid = f'{1000 + i * 37}_{d}'
      img = rng.integers(0, 256, size + (3,), dtype=np.uint8)
      lab = _label_ids(rng, *size, np.arange(24))
      ipath = os.path.join(root, d, 'RGB', f'{sid}.jpg')
      Image.fromarray(img).save(ipath, quality=95)
      if rgb_labels:
        rgb = np.zeros(size + (3,), np.uint8)
        rgb[..., 0] = lab
        Image.fromarray(rgb).save(os.path.join(root, d, 'Semantic', f'{sid}.png'))
      else:
        Image.fromarray(lab, mode='L').save(os.path.join(root, d, 'Semantic', f'{sid}.png'))
      with Image.open(ipath) as im:
        out[f'{d}/RGB/{sid}.jpg'] = (np.asarray(im.convert('RGB')), lab)
  return out


def write_leaf(path: str, users: Dict[str, Tuple[Sequence[str], Sequence[str]]]):
  """A split JSON in the FedDrive release format."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    json.dump({'users': list(users), 'num_samples': [len(x) for x, _ in users.values()],
               'user_data': {u: {'x': list(x), 'y': list(y)} for u, (x, y) in users.items()}}, f)
