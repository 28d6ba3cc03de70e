"""Tiny-ImageNet-200 (CS231n) from its official zip layout, federated with the Dirichlet split (MAN, seed 003).

Files (http://cs231n.stanford.edu/tiny-imagenet-200.zip, 248,100,043 bytes, md5 90528d7c...; the download
catalogue fetches and extracts it) under `<data_dir>/tiny-imagenet-200/`:

* `wnids.txt`: the 200 WordNet ids, one per line. Class index = position in the sorted ids (torchvision's
  ImageFolder order, which MAN's and FedDC's loaders use).
* `train/<wnid>/images/<wnid>_<i>.JPEG`: 500 64x64 JPEGs per class (some are greyscale: converted to RGB).
* `val/images/val_<i>.JPEG` + `val/val_annotations.txt`: tab-separated `file, wnid, x0, y0, x1, y1`; the 10,000
  labelled validation images are the test set (the official test split has no labels and is not read).

Every name read from the annotation file is checked (a file name with a path part, an unknown wnid, a missing
image, an image that is not 64x64 or does not decode) and raises `TinyImageNetFormatError` naming the file and
the fix; with `check_official_sizes` the counts must be the official 100,000 / 10,000 / 200.

Federation: `cifar.federate` (Dirichlet split saved under `<data_dir>/splits` and reused, `split_json`, or
`partition='random'`); MAN's setting is 100 clients x 1,000 images.
"""
from __future__ import annotations

import concurrent.futures as cf
import io
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from fedjax_flat import errors
from fedjax_flat.data.download import default_data_dir
from fedjax_flat.data.registry import register
from fedjax_flat.data.sources import cifar

DIRNAME = 'tiny-imagenet-200'
SIZE = 64
OFFICIAL = {'classes': 200, 'train': 100000, 'test': 10000}
IMAGENET_MEAN = (0.485, 0.456, 0.406)     # the normalisation preset 'imagenet' (config.data.normalize)
IMAGENET_STD = (0.229, 0.224, 0.225)


class TinyImageNetFormatError(errors.DataFormatError):
  """A Tiny-ImageNet file exists but is not in the official layout or format."""


def _hint(data_dir: str) -> str:
  return f'python experiments/download.py --dataset=tiny_imagenet --data_dir={data_dir}'


def locate(data_dir: str) -> str:
  """The `tiny-imagenet-200` directory inside data_dir (or data_dir itself)."""
  for root in (os.path.join(data_dir, DIRNAME), data_dir):
    if os.path.isfile(os.path.join(root, 'wnids.txt')):
      return root
  raise FileNotFoundError(f'Tiny-ImageNet not found: expected {os.path.join(data_dir, DIRNAME)}/wnids.txt (the '
                          f'extracted official zip). Download it with:\n  {_hint(data_dir)}')


def _decode(path: str) -> np.ndarray:
  from_pil = _pil()
  try:
    with open(path, 'rb') as f:
      raw = f.read()
    with from_pil.open(io.BytesIO(raw)) as im:
      arr = np.asarray(im.convert('RGB'), dtype=np.uint8)
  except FileNotFoundError:
    raise
  except Exception as e:   # PIL raises several types for a corrupt image; each becomes one data-format error
    raise TinyImageNetFormatError(f'{path}: not a decodable image ({type(e).__name__}: {e})') from e
  if arr.shape != (SIZE, SIZE, 3):
    raise TinyImageNetFormatError(f'{path}: image is {arr.shape[1]}x{arr.shape[0]}, expected {SIZE}x{SIZE} '
                                  f'(the official 64x64 release)')
  return arr


def _pil():
  try:
    from PIL import Image
  except ImportError as e:  # pragma: no cover
    raise ImportError('Tiny-ImageNet needs pillow (pip install pillow)') from e
  return Image


def _read_lines(path: str) -> List[str]:
  try:
    with open(path, encoding='utf-8') as f:
      return [ln.rstrip('\n\r') for ln in f if ln.strip()]
  except UnicodeDecodeError as e:
    raise TinyImageNetFormatError(f'{path}: not a UTF-8 text file ({e})') from e


def _plain_name(name: str, where: str) -> str:
  if not name or os.path.basename(name) != name or name in ('.', '..'):
    raise TinyImageNetFormatError(f'{where}: {name!r} is not a plain file name (the official files list plain '
                                  f'names); re-extract the official zip')
  return name


def listing(root: str) -> Tuple[List[str], List[Tuple[str, int]], List[Tuple[str, int]]]:
  """(sorted wnids, [(train image path, label)], [(val image path, label)]) from the official layout."""
  wnids_path = os.path.join(root, 'wnids.txt')
  wnids = sorted(_plain_name(w.strip(), wnids_path) for w in _read_lines(wnids_path))
  if len(set(wnids)) != len(wnids):
    raise TinyImageNetFormatError(f'{wnids_path}: repeated wnids')
  index = {w: i for i, w in enumerate(wnids)}
  train = []
  for w in wnids:
    d = os.path.join(root, 'train', w, 'images')
    if not os.path.isdir(d):
      raise TinyImageNetFormatError(f'{d}: missing (wnids.txt lists {w}); re-extract the official zip')
    train += [(os.path.join(d, f), index[w]) for f in sorted(os.listdir(d)) if f.lower().endswith('.jpeg')]
  ann = os.path.join(root, 'val', 'val_annotations.txt')
  if not os.path.isfile(ann):
    raise TinyImageNetFormatError(f'{ann}: missing; re-extract the official zip')
  val = []
  for n, line in enumerate(_read_lines(ann), 1):
    parts = line.split('\t')
    if len(parts) < 2:
      raise TinyImageNetFormatError(f'{ann}:{n}: expected tab-separated "file, wnid, box", got {line[:80]!r}')
    name, w = _plain_name(parts[0].strip(), f'{ann}:{n}'), parts[1].strip()
    if w not in index:
      raise TinyImageNetFormatError(f'{ann}:{n}: wnid {w!r} is not in wnids.txt')
    val.append((os.path.join(root, 'val', 'images', name), index[w]))
  return wnids, train, val


def _decode_all(items: Sequence[Tuple[str, int]], threads: int) -> Tuple[np.ndarray, np.ndarray]:
  x = np.empty((len(items), SIZE, SIZE, 3), np.uint8)
  with cf.ThreadPoolExecutor(max(1, threads)) as pool:    # PIL's JPEG decoder releases the GIL
    for i, arr in enumerate(pool.map(_decode, [p for p, _ in items])):
      x[i] = arr
  return x, np.asarray([y for _, y in items], np.int32)


def load_arrays(data_dir: Optional[str] = None, *, check_official_sizes: bool = True, threads: int = 4) -> dict:
  """Decoded uint8 arrays: x_train [100000, 64, 64, 3], y_train, x_test [10000, ...], y_test, num_classes."""
  data_dir = data_dir or default_data_dir()
  root = locate(data_dir)
  wnids, train, val = listing(root)
  if check_official_sizes:
    got = {'classes': len(wnids), 'train': len(train), 'test': len(val)}
    if got != OFFICIAL:
      raise TinyImageNetFormatError(f'{root}: {got} differs from the official {OFFICIAL}; re-extract the '
                                    f'official zip, or set data.check_official_sizes=False for a subset')
  try:
    x_train, y_train = _decode_all(train, threads)
    x_test, y_test = _decode_all(val, threads)
  except FileNotFoundError as e:
    raise TinyImageNetFormatError(f'{e.filename}: listed but missing; re-extract the official zip') from e
  return {'x_train': x_train, 'y_train': y_train, 'x_test': x_test, 'y_test': y_test,
          'num_classes': len(wnids), 'wnids': wnids}


@register('tiny_imagenet', limits={'partition': cifar.PARTITIONS})
def _tiny_imagenet(data_dir=None, num_clients=100, alpha=0.3, examples_per_client=1000, seed=0, split_json=None,
                   quantity_skew=None, split_dir=None, check_official_sizes=True, partition='dirichlet', **unused):
  del unused
  if partition not in cifar.PARTITIONS:   # before decoding 110,000 JPEGs
    raise ValueError(f'data.partition={partition!r}; allowed: {cifar.PARTITIONS}')
  data_dir = data_dir or default_data_dir()
  arrays = load_arrays(data_dir, check_official_sizes=check_official_sizes)
  return cifar.federate('tiny_imagenet', arrays, data_dir=data_dir, num_clients=num_clients, alpha=alpha,
                        examples_per_client=examples_per_client, seed=seed, split_json=split_json,
                        quantity_skew=quantity_skew, split_dir=split_dir, partition=partition)
