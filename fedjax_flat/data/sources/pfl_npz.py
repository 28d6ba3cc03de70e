"""The FedSoup release's preprocessed layout (PFLlib's, which the release builds on), read without pickle's
code execution.

  <data_dir>/<dataset_dir>/train/<k>.npz     client k's training split
  <data_dir>/<dataset_dir>/test/<k>.npz      client k's local test split
  each .npz: one member 'data' = a pickled dict {'x': float32 [n, 3, H, W] (a list of such arrays, or one
  array), 'y': int64 [n]}, written by np.savez_compressed(f, data={...}) (release: dataset/utils/
  dataset_utils.save_file; read there with np.load(allow_pickle=True)).

Images are the release's tensors after ToTensor + Normalize((0.5,) * 3, (0.5,) * 3): values in [-1, 1]; they are
stored back as uint8 HWC, round((x + 1) / 2 * 255) (the pipeline's config.normalize maps them again).
The 'data' member is parsed as a .npy header plus a pickle stream through data/safe_pickle.SafeUnpickler
(builtin containers and numpy arrays only); anything else, a wrong shape, a value outside [-1, 1] or a label
outside the classes is one DataFormatError naming the file.
"""
from __future__ import annotations

import os
import zipfile
from typing import List, Tuple

import numpy as np

from fedjax_flat import errors
from fedjax_flat.data import safe_pickle

MEMBER = 'data.npy'


def read_split(path: str, *, num_classes: int, image_size: int) -> Tuple[np.ndarray, np.ndarray]:
  """One <k>.npz of the release -> (uint8 [n, H, W, 3], int32 [n])."""
  with errors.reading(path, "a PFLlib/FedSoup client .npz (member 'data': a pickled {'x', 'y'} dict)"):
    with zipfile.ZipFile(path) as z:
      if MEMBER not in z.namelist():
        raise errors.DataFormatError(f"{path}: no member {MEMBER!r} (members: {z.namelist()[:5]})")
      with z.open(MEMBER) as f:
        version = np.lib.format.read_magic(f)
        shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                           else np.lib.format.read_array_header_2_0(f))
        if dtype != np.dtype(object) or shape != ():
          raise errors.DataFormatError(f'{path}: data is a {dtype} array of shape {shape}, not a pickled dict')
        try:
          obj = safe_pickle.SafeUnpickler(f, encoding='latin1').load()
        except safe_pickle.UnsafePickleError as e:     # name the file (the unpickler does not know it)
          raise errors.DataFormatError(f'{path}: {e}') from None
  d = obj.item() if isinstance(obj, np.ndarray) and obj.dtype == object and obj.shape == () else obj
  if not isinstance(d, dict) or 'x' not in d or 'y' not in d:
    raise errors.DataFormatError(f"{path}: data is not a dict with 'x' and 'y'")
  x = np.stack([np.asarray(a, np.float32) for a in d['x']]) if isinstance(d['x'], list) else \
      np.asarray(d['x'], np.float32)
  y = np.asarray(d['y'])
  want = (3, image_size, image_size)
  if x.ndim != 4 or x.shape[1:] != want or y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
    raise errors.DataFormatError(f'{path}: x has shape {x.shape}, y {y.shape} {y.dtype}; expected x [n, '
                                 f'{", ".join(map(str, want))}] and integer y [n]')
  if not np.all(np.isfinite(x)) or x.min(initial=0) < -1.0001 or x.max(initial=0) > 1.0001:
    raise errors.DataFormatError(f'{path}: image values outside [-1, 1] (or not finite): not the release\'s '
                                 'Normalize((0.5,)*3, (0.5,)*3) tensors')
  if y.size and (y.min() < 0 or y.max() >= num_classes):
    raise errors.DataFormatError(f'{path}: labels outside [0, {num_classes})')
  img = np.clip(np.rint((x.transpose(0, 2, 3, 1) + 1.0) * 127.5), 0, 255).astype(np.uint8)
  return img, y.astype(np.int32)


def read_release(root: str, num_clients: int, *, num_classes: int, image_size: int, what: str,
                 download_hint: str) -> List[dict]:
  """Every client's {'train': (x, y), 'test': (x, y)} from <root>/{train,test}/<k>.npz."""
  silos = []
  for k in range(num_clients):
    paths = {s: os.path.join(root, s, f'{k}.npz') for s in ('train', 'test')}
    for p in paths.values():
      if not os.path.isfile(p):
        raise FileNotFoundError(f'{what} not found: expected {p} (the FedSoup release\'s preprocessed layout '
                                f'<dir>/{{train,test}}/<client>.npz); {download_hint}')
    silos.append({s: read_split(p, num_classes=num_classes, image_size=image_size) for s, p in paths.items()})
  extra = os.path.join(root, 'train', f'{num_clients}.npz')
  if os.path.exists(extra):
    raise errors.DataFormatError(f'{root}: more than {num_clients} clients ({extra} exists); this dataset has '
                                 f'{num_clients}')
  return silos
