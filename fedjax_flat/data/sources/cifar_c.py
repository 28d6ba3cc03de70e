"""CIFAR-10-C / CIFAR-100-C (Hendrycks & Dietterich 2019) from the official .npy files.

Layout (Zenodo records 2535967 / 3555552, `CIFAR-10-C.tar` / `CIFAR-100-C.tar` extracted into data_dir):
`<data_dir>/CIFAR-10-C/<corruption>.npy` uint8 [50000, 32, 32, 3] = severities 1..5 x the 10,000 test
images (severity s is rows (s-1)*10000 : s*10000), and `labels.npy` [50000] (the test labels, 5 times).

Files are memory-mapped and their sizes checked against the .npy header, so a truncated download raises
`CifarCFormatError` instead of returning short or wrong data.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator, Tuple

import numpy as np

from fedjax_flat import errors

CORRUPTIONS = (
    'brightness', 'contrast', 'defocus_blur', 'elastic_transform', 'fog', 'frost', 'gaussian_blur',
    'gaussian_noise', 'glass_blur', 'impulse_noise', 'jpeg_compression', 'motion_blur', 'pixelate',
    'saturate', 'shot_noise', 'snow', 'spatter', 'speckle_noise', 'zoom_blur')
# The 15 of the original benchmark (the 4 others are the "extra" held-out corruptions).
BENCHMARK_CORRUPTIONS = (
    'gaussian_noise', 'shot_noise', 'impulse_noise', 'defocus_blur', 'glass_blur', 'motion_blur',
    'zoom_blur', 'snow', 'frost', 'fog', 'brightness', 'contrast', 'elastic_transform', 'pixelate',
    'jpeg_compression')
SEVERITIES = (1, 2, 3, 4, 5)
_DIRNAMES = {'cifar10_c': 'CIFAR-10-C', 'cifar100_c': 'CIFAR-100-C'}
OFFICIAL_PER_SEVERITY = 10000


class CifarCFormatError(errors.DataFormatError):
  """A CIFAR-C file has the wrong size, shape or dtype (truncated or not the official file)."""


def locate(data_dir: str, name: str = 'cifar10_c') -> str:
  """The directory holding labels.npy: <data_dir>/CIFAR-10-C (or -100-), or data_dir itself."""
  if name not in _DIRNAMES:
    raise ValueError(f'unknown corrupted dataset {name!r}; allowed: {sorted(_DIRNAMES)}')
  for d in (os.path.join(data_dir, _DIRNAMES[name]), data_dir):
    if os.path.isfile(os.path.join(d, 'labels.npy')):
      return d
  raise FileNotFoundError(
      f'{_DIRNAMES[name]} not found: expected {os.path.join(data_dir, _DIRNAMES[name], "labels.npy")} and '
      f'<corruption>.npy files. Download with:\n  python experiments/download.py --dataset={name} '
      f'--data_dir={data_dir}')


def _check_npy(path: str) -> Tuple[tuple, np.dtype]:
  """Reads a .npy header and checks the file holds exactly the bytes it declares."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} not found (CIFAR-C file)')
  with open(path, 'rb') as f:
    try:
      version = np.lib.format.read_magic(f)
      shape, fortran, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                               else np.lib.format.read_array_header_2_0(f))
    except ValueError as e:
      raise CifarCFormatError(f'{path} is not a valid .npy file ({e})') from e
    header_len = f.tell()
  if fortran or dtype.hasobject:
    raise CifarCFormatError(f'{path}: expected a C-order numeric array, got {dtype} fortran={fortran}')
  expected = header_len + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  actual = os.path.getsize(path)
  if actual != expected:
    raise CifarCFormatError(f'{path} has {actual} bytes but its header declares {dtype} {shape} ({expected} '
                            f'bytes): the file is truncated or corrupted; re-download/extract it')
  return tuple(shape), dtype


def _labels(d: str, check_official_sizes: bool) -> Tuple[np.ndarray, int]:
  path = os.path.join(d, 'labels.npy')
  shape, dtype = _check_npy(path)
  if len(shape) != 1 or dtype.kind not in 'iu' or shape[0] % len(SEVERITIES):
    raise CifarCFormatError(f'{path}: {dtype} {shape}; expected int [5 * N]')
  n = shape[0] // len(SEVERITIES)
  if check_official_sizes and n != OFFICIAL_PER_SEVERITY:
    raise CifarCFormatError(f'{path} has {shape[0]} labels; the official files have '
                            f'{len(SEVERITIES) * OFFICIAL_PER_SEVERITY}')
  return np.load(path, allow_pickle=False).astype(np.int32), n


def load_corruption(data_dir: str, corruption: str, severity: int, *, name: str = 'cifar10_c',
                    check_official_sizes: bool = True) -> Tuple[np.ndarray, np.ndarray]:
  """Returns (x uint8 [N, 32, 32, 3], y int32 [N]) of one corruption at one severity (1..5)."""
  if corruption not in CORRUPTIONS:
    raise ValueError(f'unknown corruption {corruption!r}; allowed: {CORRUPTIONS}')
  if severity not in SEVERITIES:
    raise ValueError(f'severity={severity} must be one of {SEVERITIES}')
  d = locate(data_dir, name)
  labels, n = _labels(d, check_official_sizes)
  path = os.path.join(d, f'{corruption}.npy')
  shape, dtype = _check_npy(path)
  if dtype != np.uint8 or shape != (len(labels), 32, 32, 3):
    raise CifarCFormatError(f'{path}: {dtype} {shape}; expected uint8 {(len(labels), 32, 32, 3)} '
                            f'(5 severities x {n} images, matching labels.npy): wrong or truncated file')
  x = np.load(path, mmap_mode='r', allow_pickle=False)
  lo, hi = (severity - 1) * n, severity * n
  return np.array(x[lo:hi]), labels[lo:hi]


def iterate(data_dir: str, *, name: str = 'cifar10_c', corruptions: Iterable[str] = CORRUPTIONS,
            severities: Iterable[int] = SEVERITIES, check_official_sizes: bool = True
            ) -> Iterator[Tuple[str, int, np.ndarray, np.ndarray]]:
  """Yields (corruption, severity, x, y) for every requested test set (one in memory at a time)."""
  for c in corruptions:
    for s in severities:
      x, y = load_corruption(data_dir, c, s, name=name, check_official_sizes=check_official_sizes)
      yield c, s, x, y


def available(data_dir: str, name: str = 'cifar10_c') -> Tuple[str, ...]:
  """The corruptions whose .npy files are present."""
  d = locate(data_dir, name)
  return tuple(c for c in CORRUPTIONS if os.path.isfile(os.path.join(d, f'{c}.npy')))
