"""Out-of-memory segmentation data (Cityscapes, IDDA): image + label-map files decoded on the host.

`SegmentationSource` implements the `ClientDataSource` protocol (data/federated.py) for a federated split
given as lists of (image, label) files per client, plus held-out *test clients* (FedDrive: the unseen-city
client of Cityscapes; the seen-domain and unseen-domain clients of IDDA):

  client_examples(k)      -> (x uint8 [n, H, W, 3], y uint8 [n, H, W]); y holds train ids, 255 = ignore
  test_client_examples(j) -> the same for test client j (`test_client_names[j]`: 'seen' / 'unseen')
  test_examples()         -> every test client's examples, concatenated (small sets only; else test_batches)
  test_batches(b, client) -> decoded test batches, so a full-resolution test set never sits in memory
  prefetch_clients(ids)   -> (k, client_examples(k)) in order, decoded ahead on a thread pool (PIL releases
                             the GIL): a round's decoding overlaps the previous round's training
  examples(indices)       -> training examples by position over all clients (num_examples of them): a server
                             streaming the whole split (LADD's source pre-training, training/source_pretrain.py)

Unlabelled examples (label path '': FFREEDA's target clients, e.g. CrossCity's training images) decode to an
all-255 label map.
Decoding: images with PIL, converted to RGB; label PNGs read as single-channel values (modes L, P, I, I;16)
and mapped to train ids with a 256-entry lookup table (values outside it -> 255). A 3-channel label PNG is
an error unless `label_rgb_channel` says which channel holds the class (CARLA's raw output keeps it in R).
Optional resize at load (`image_size` = (H, W)): images with `resample` (PIL, antialiased when shrinking),
label maps with nearest neighbour; without it every image must already have one size (shapes are fixed per
run). Images and label maps of one example must have the same size. Decoding is deterministic: all random
augmentation happens on the device (data/transforms/augment.py: make_seg_augment).

`double=True` appends every client's images flipped horizontally (the release's `double_dataset` for
Cityscapes: twice the local steps per epoch). `cache_clients=N` keeps the last N decoded clients in memory.
Split files come from outside and are untrusted: paths must be relative and stay inside their root.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import threading
from collections import OrderedDict
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.errors import DataFormatError, reading
from fedjax_flat.data.federated import ClientDataSource
from fedjax_flat.data.prefetch import DecodePool, prefetch_map
from fedjax_flat.data.transforms.pipeline import number, pair
from fedjax_flat.schema import Choice, Flag, String

IGNORE = 255
RESAMPLE = ('bilinear', 'bicubic', 'nearest')

# The rules of the `config.data` fields the FedDrive release loaders (Cityscapes, IDDA) share; each adds its own
# (data/registry.py `rules=`).
_PATH = String(None, 'must be a string (a path; empty = default)')
RELEASE_RULES = dict(
    data_dir=_PATH, root=_PATH, split_dir=_PATH,
    distribution=Choice(None, ('uniform', 'heterogeneous'), sort=True),
    split_source=Choice(None, ('generate', 'released'), sort=True),
    image_size=pair(allow_empty=True), double=Flag(None), num_workers=number(1, integer=True),
    cache_clients=number(0, integer=True))


def _pil():
  try:
    from PIL import Image
  except ImportError as e:  # pragma: no cover
    raise ImportError('segmentation datasets need pillow (pip install pillow)') from e
  return Image


@dataclasses.dataclass
class SegClient:
  """One client of a split: image and label paths (relative to the source's roots), the client's domain
  (None when it mixes domains) and each example's domain (city, IDDA domain)."""
  name: str
  images: List[str]
  labels: List[str]
  domain: Optional[str] = None
  example_domains: Optional[List[str]] = None

  def __post_init__(self):
    if len(self.images) != len(self.labels):
      raise DataFormatError(f'client {self.name!r}: {len(self.images)} images for {len(self.labels)} label maps')
    if self.example_domains is not None and len(self.example_domains) != len(self.images):
      raise DataFormatError(f'client {self.name!r}: {len(self.example_domains)} domains for {len(self.images)} images')


def safe_join(root: str, rel: str) -> str:
  """root/rel for a relative path that stays inside root (split files are untrusted)."""
  rel_n = rel.replace('\\', '/')
  if not rel_n or rel_n.startswith('/') or os.path.isabs(rel) or '..' in rel_n.split('/') or ':' in rel_n:
    raise DataFormatError(f'path {rel!r} in a split file must be relative to {root} without ".." (untrusted input)')
  return os.path.join(root, *rel_n.split('/'))


def lookup_table(mapping: dict, size: int = 256) -> np.ndarray:
  """uint8 [size] table: raw value -> train id (mapping), everything else -> 255."""
  lut = np.full(size, IGNORE, np.uint8)
  for raw, train_id in mapping.items():
    lut[int(raw)] = int(train_id)
  return lut


def map_labels(raw: np.ndarray, lut: np.ndarray) -> np.ndarray:
  """Raw label values -> uint8 train ids (values outside the table -> 255)."""
  raw = np.asarray(raw)
  out = np.full(raw.shape, IGNORE, np.uint8)
  ok = (raw >= 0) & (raw < len(lut))
  out[ok] = lut[raw[ok].astype(np.int64)]
  return out


def _resample(name: str):
  Image = _pil()
  return {'bilinear': Image.BILINEAR, 'bicubic': Image.BICUBIC, 'nearest': Image.NEAREST}[name]


def image_size_of(path: str) -> Tuple[int, int]:
  """(H, W) from the file header (no decoding)."""
  with _pil().open(path) as im:
    w, h = im.size
  return h, w


def decode_pair(image_path: str, label_path: str, lut: np.ndarray, size: Optional[Tuple[int, int]] = None,
                resample: str = 'bilinear', label_rgb_channel: Optional[int] = None
                ) -> Tuple[np.ndarray, np.ndarray]:
  """`_decode_pair` with every parse error of a malformed file a DataFormatError naming it."""
  with reading(f'{image_path} / {label_path}', 'an image / label-map pair (PNG or JPEG)', images=True):
    return _decode_pair(image_path, label_path, lut, size, resample, label_rgb_channel)


def _decode_pair(image_path: str, label_path: str, lut: np.ndarray, size: Optional[Tuple[int, int]] = None,
                 resample: str = 'bilinear', label_rgb_channel: Optional[int] = None
                 ) -> Tuple[np.ndarray, np.ndarray]:
  """One example: (uint8 [H, W, 3], uint8 [H, W] train ids), resized to size = (H, W) when given."""
  Image = _pil()
  with Image.open(image_path) as im, Image.open(label_path) as lb:
    if im.size != lb.size:
      raise DataFormatError(f'{image_path} is {im.size[0]}x{im.size[1]} but its label map {label_path} is '
                       f'{lb.size[0]}x{lb.size[1]} (W x H): wrong pairing or a corrupted file')
    im = im.convert('RGB')
    if lb.mode in ('RGB', 'RGBA'):
      if label_rgb_channel is None:
        raise DataFormatError(f'{label_path}: label map has mode {lb.mode}; expected a single-channel PNG of label '
                         f'ids (for CARLA-style RGB labels set the class channel)')
      lb = lb.getchannel(int(label_rgb_channel))
    elif lb.mode not in ('L', 'P', 'I', 'I;16', 'I;16B', 'I;16L'):
      raise DataFormatError(f'{label_path}: unsupported label PNG mode {lb.mode}')
    if size is not None and (im.size[1], im.size[0]) != tuple(size):
      im = im.resize((size[1], size[0]), _resample(resample))
      lb = lb.resize((size[1], size[0]), Image.NEAREST)
    x = np.asarray(im, np.uint8)
    raw = np.asarray(lb)
  return x, map_labels(raw, lut)


def decode_image(image_path: str, size: Optional[Tuple[int, int]] = None, resample: str = 'bilinear'
                 ) -> Tuple[np.ndarray, np.ndarray]:
  """An unlabelled example (label path ''): (uint8 [H, W, 3], a label map of 255 = ignore everywhere)."""
  Image = _pil()
  with Image.open(image_path) as im:
    im = im.convert('RGB')
    if size is not None and (im.size[1], im.size[0]) != tuple(size):
      im = im.resize((size[1], size[0]), _resample(resample))
    x = np.asarray(im, np.uint8)
  return x, np.full(x.shape[:2], IGNORE, np.uint8)


class SegmentationSource(ClientDataSource, DecodePool):
  """A federated segmentation split over image/label files (ClientDataSource protocol, see module doc)."""
  _pool_prefix = 'segmentation-decode'
  input_dtype = np.dtype(np.uint8)                       # decoded images (batches keep uint8)

  def __init__(self, *, name: str, image_root: str, label_root: str, clients: Sequence[SegClient],
               test_clients: Sequence[SegClient], lut: np.ndarray, class_names: Sequence[str],
               image_size: Optional[Sequence[int]] = None, resample: str = 'bilinear',
               label_rgb_channel: Optional[int] = None, double: bool = False, num_workers: int = 2,
               cache_clients: int = 0, missing_hint: str = '', meta: Optional[dict] = None):
    if resample not in RESAMPLE:
      raise ValueError(f'resample={resample!r}; allowed: {RESAMPLE}')
    if not clients:
      raise ValueError(f'{name}: the split has no training clients')
    self.name = name
    self.image_root, self.label_root = image_root, label_root
    self.clients, self.test_clients = list(clients), list(test_clients)
    self.lut = np.asarray(lut, np.uint8)
    self.class_names = tuple(class_names)
    self.num_classes = len(self.class_names)
    self.ignore_index = IGNORE
    self.task = seg_tasks.Segmentation(ignore_index=IGNORE)   # OHEM loss, mIoU (tasks/base.py; config.segmentation)
    self.label_dtype = np.uint8                            # batches keep uint8 label maps (data/batching.py)
    self.resample = resample
    self.label_rgb_channel = label_rgb_channel
    self.double = bool(double)
    self.num_workers = max(1, int(num_workers))
    self.cache_clients = max(0, int(cache_clients))
    self.meta = dict(meta or {})
    self._check_files(missing_hint)
    if image_size:
      self.image_size: Optional[Tuple[int, int]] = (int(image_size[0]), int(image_size[1]))
      self.label_shape = self.image_size
    else:
      self.image_size = None
      self.label_shape = image_size_of(self._image_path(self.clients[0], 0))
    self.input_shape = self.label_shape + (3,)
    self.num_clients = len(self.clients)
    self.client_names = [c.name for c in self.clients]
    self.client_domains = [c.domain for c in self.clients]
    self.test_client_names = [c.name for c in self.test_clients]
    self._cache: 'OrderedDict[int, Tuple[np.ndarray, np.ndarray]]' = OrderedDict()
    self._lock = threading.Lock()
    self._pool: Optional[cf.ThreadPoolExecutor] = None

  # -- ClientDataSource ----------------------------------------------------------------------------
  def client_sizes(self) -> np.ndarray:
    return np.array([len(c.images) * (2 if self.double else 1) for c in self.clients], np.int64)

  def client_examples(self, k: int) -> Tuple[np.ndarray, np.ndarray]:
    if not 0 <= k < self.num_clients:
      raise IndexError(f'client {k} out of range [0, {self.num_clients})')
    with self._lock:
      hit = self._cache.get(k)
      if hit is not None:
        self._cache.move_to_end(k)
        return hit
    x, y = self._decode(self.clients[k])
    if self.double:
      x = np.concatenate([x, x[:, :, ::-1]])
      y = np.concatenate([y, y[:, :, ::-1]])
    if self.cache_clients:
      with self._lock:
        self._cache[k] = (x, y)
        while len(self._cache) > self.cache_clients:
          self._cache.popitem(last=False)
    return x, y

  def test_examples(self) -> Tuple[np.ndarray, np.ndarray]:
    parts = [self.test_client_examples(j) for j in range(self.num_test_clients)]
    if not parts:
      return (np.zeros((0,) + self.input_shape, np.uint8), np.zeros((0,) + self.label_shape, np.uint8))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

  # -- examples by index (a server streaming the whole split: LADD's source pre-training) --------------
  @property
  def num_examples(self) -> int:
    """Training examples over every client (clients concatenated in order; `double` not applied)."""
    return sum(len(c.images) for c in self.clients)

  def examples(self, indices: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """The training examples at `indices` (positions in the clients' concatenation), decoded now, in that order."""
    if not hasattr(self, '_flat'):
      self._flat = [(c.images[i], c.labels[i]) for c in self.clients for i in range(len(c.images))]
    n = len(self._flat)
    bad = [int(i) for i in indices if not 0 <= int(i) < n]
    if bad:
      raise IndexError(f'examples {bad[:3]} out of range [0, {n})')
    picked = [self._flat[int(i)] for i in indices]
    return self._decode(SegClient('examples', [p[0] for p in picked], [p[1] for p in picked]))

  # -- test clients --------------------------------------------------------------------------------
  @property
  def num_test_clients(self) -> int:
    return len(self.test_clients)

  def test_client_sizes(self) -> np.ndarray:
    return np.array([len(c.images) for c in self.test_clients], np.int64)

  def test_client_examples(self, j: int) -> Tuple[np.ndarray, np.ndarray]:
    if not 0 <= j < self.num_test_clients:
      raise IndexError(f'test client {j} out of range [0, {self.num_test_clients})')
    return self._decode(self.test_clients[j])

  def test_example_domains(self, j: int) -> List[Optional[str]]:
    """The domain (city / IDDA domain) of each example of test client j (FedBN: which client's BN to use)."""
    c = self.test_clients[j]
    return list(c.example_domains) if c.example_domains is not None else [c.domain] * len(c.images)

  def test_batches(self, batch_size: int, client: Optional[int] = None) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Decoded test examples in batches of up to batch_size (one test client, or all in order)."""
    clients = range(self.num_test_clients) if client is None else [client]
    for j in clients:
      c = self.test_clients[j]
      starts = list(range(0, len(c.images), batch_size))
      part = lambda lo: self._decode(SegClient(c.name, c.images[lo:lo + batch_size], c.labels[lo:lo + batch_size]))
      for _, xy in prefetch_map(self._get_pool(), part, starts, 2):
        yield xy

  # -- internals -----------------------------------------------------------------------------------
  def _image_path(self, c: SegClient, i: int) -> str:
    return safe_join(self.image_root, c.images[i])

  def _label_path(self, c: SegClient, i: int) -> str:
    return safe_join(self.label_root, c.labels[i])

  def _check_files(self, hint: str):
    missing, total = [], 0
    for c in self.clients + self.test_clients:
      for i in range(len(c.images)):
        for p in (self._image_path(c, i), self._label_path(c, i) if c.labels[i] else None):
          if p is None:      # an unlabelled example (FFREEDA's target clients)
            continue
          total += 1
          if not os.path.isfile(p):
            missing.append(p)
    if missing:
      raise FileNotFoundError(f'{self.name}: {len(missing)} of {total} files of the split are missing (e.g. '
                              f'{missing[:3]}).{(" " + hint) if hint else ""}')

  def _decode(self, c: SegClient) -> Tuple[np.ndarray, np.ndarray]:
    n = len(c.images)
    x = np.empty((n,) + self.input_shape, np.uint8)
    y = np.empty((n,) + self.label_shape, np.uint8)
    for i in range(n):
      if not c.labels[i]:
        xi, yi = decode_image(self._image_path(c, i), self.image_size, self.resample)
      else:
        xi, yi = decode_pair(self._image_path(c, i), self._label_path(c, i), self.lut, self.image_size,
                             self.resample, self.label_rgb_channel)
      if xi.shape != self.input_shape:
        raise ValueError(f'{self._image_path(c, i)} is {xi.shape[0]}x{xi.shape[1]} (H x W) but the run uses '
                         f'{self.label_shape}: set config.data.image_size to resize every image at load')
      x[i], y[i] = xi, yi
    return x, y
