"""Google Landmarks v2 federated splits: gld23k and gld160k (Hsu, Qi, Brown 2020; TFF `gldv2.py`).

Inputs (no images are distributed with the splits):

* split CSVs: gld160k = `landmarks-user-160k.zip` -> `landmarks-user-160k/federated_train.csv`
  (columns `user_id,image_id,class`) and `test.csv` (`image_id,class`); gld23k = `mini_gld_train_split.csv`
  (`user_id,image_id,class`) and `mini_gld_test.csv` (`image_id,class`), kept under `<data_dir>/gld23k/`.
* GLDv2 train JPEGs, as extracted from the official `images_%03d.tar` shards: `<images_dir>/<a>/<b>/<c>/
  <image_id>.jpg` with a, b, c the first three characters of the id (a flat `<images_dir>/<image_id>.jpg`,
  TFF's copy layout, is also accepted).

Published sizes: gld23k 233 clients / 203 classes / 23,080 train images; gld160k 1,262 clients (the
google-research README says 1,062) / 2,028 classes / 164,172 train images. `split_info` counts the CSVs.

`prepare(...)` writes one shard per client: the client's images re-encoded as JPEG with the shorter side
resized to `short_side` (default 256), concatenated in `train/<k>.bin`, plus `index.npz` (labels, byte
offsets/lengths, client ranges) and `index.json` (client ids, settings). The format needs no dependency
and gives random access per client: a round reads only its clients' files. Preparation resumes: a
finished client shard is skipped on restart.

`LandmarksSource` (the `ClientDataSource` protocol) decodes a client's JPEGs on demand and applies the
Flax ImageNet train transform (random-resized-crop: area 8-100 %, aspect 3/4-4/3, 10 attempts then a
center crop; bicubic resize to `image_size`; horizontal flip) or the eval transform (center crop of
image_size / (image_size + 32) of the shorter side, resized). `prefetch_clients(ids)` decodes the next
clients in a background thread pool (PIL releases the GIL) so decoding overlaps training.
"""
from __future__ import annotations

import concurrent.futures as cf
import csv
import io
import json
import logging
import math
import os
import threading
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_flat.data.federated import ClientDataSource
from fedjax_flat.data.prefetch import DecodePool
from fedjax_flat.errors import DataFormatError, reading
from fedjax_flat.data.registry import register
from fedjax_flat.data.download import default_data_dir

SPLITS = {
    'gld23k': dict(train_csv=os.path.join('gld23k', 'mini_gld_train_split.csv'),
                   test_csv=os.path.join('gld23k', 'mini_gld_test.csv'),
                   num_clients=233, num_classes=203, num_train=23080),
    'gld160k': dict(train_csv=os.path.join('landmarks-user-160k', 'federated_train.csv'),
                    test_csv=os.path.join('landmarks-user-160k', 'test.csv'),
                    num_clients=1262, num_classes=2028, num_train=164172),
}
FORMAT = 'fedjax_flat.landmarks_shards/1'
DEFAULT_SHORT_SIDE = 256
CROP_PADDING = 32  # Flax ImageNet example: center crop = image_size / (image_size + 32) of the shorter side

log = logging.getLogger(__name__)


def _pil():
  try:
    from PIL import Image
  except ImportError as e:  # pragma: no cover
    raise ImportError('Landmarks needs pillow (pip install pillow)') from e
  return Image


def default_images_dir(data_dir: str) -> str:
  return os.path.join(data_dir, 'gldv2', 'train')


def default_shards_dir(name: str, data_dir: str, short_side: int = DEFAULT_SHORT_SIDE) -> str:
  return os.path.join(data_dir, 'landmarks_shards', f'{name}_s{int(short_side)}')


# ----------------------------------------------------------------------------------------------------
# Split CSVs.


def read_split_csv(path: str, with_users: bool) -> Tuple[Optional[List[str]], List[str], np.ndarray]:
  """`_read_split_csv` with every parse error of a malformed file a DataFormatError naming it."""
  with reading(path, 'a TFF gldv2 split CSV (user_id, image_id, class)'):
    return _read_split_csv(path, with_users)


def _read_split_csv(path: str, with_users: bool) -> Tuple[Optional[List[str]], List[str], np.ndarray]:
  """Reads a TFF/Hsu et al. split CSV -> (user ids or None, image ids, classes)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} not found: the TFF gldv2 split CSVs come from python experiments/download.py '
                            '--dataset=gld23k (or gld160k) --data_dir=<data_dir>')
  need = (['user_id'] if with_users else []) + ['image_id', 'class']
  users, images, classes = [], [], []
  with open(path, newline='') as f:
    reader = csv.DictReader(f)
    cols = [c.strip() for c in (reader.fieldnames or [])]
    if not all(c in cols for c in need):
      raise DataFormatError(f'{path}: columns {cols}; expected {need} (TFF gldv2 split CSV)')
    reader.fieldnames = cols
    for line, row in enumerate(reader, start=2):
      try:
        cls = int(row['class'])
      except (TypeError, ValueError):
        raise DataFormatError(f'{path}:{line}: class {row.get("class")!r} is not an integer '
                              '(truncated file?)') from None
      image_id = (row['image_id'] or '').strip()
      if not image_id:
        raise DataFormatError(f'{path}:{line}: empty image_id')
      images.append(image_id)
      classes.append(cls)
      if with_users:
        users.append((row['user_id'] or '').strip())
  if not images:
    raise DataFormatError(f'{path} has no rows')
  return (users if with_users else None), images, np.asarray(classes, np.int64)


def _client_order(user_ids: Iterable[str]) -> List[str]:
  ids = sorted(set(user_ids))
  if all(u.isdigit() for u in ids):
    ids.sort(key=int)
  return ids


def _csv_paths(name: str, data_dir: str) -> Tuple[str, str]:
  if name not in SPLITS:
    raise ValueError(f'unknown Landmarks split {name!r}; allowed: {sorted(SPLITS)}')
  spec = SPLITS[name]
  paths = os.path.join(data_dir, spec['train_csv']), os.path.join(data_dir, spec['test_csv'])
  for p in paths:
    if not os.path.isfile(p):
      raise FileNotFoundError(f'{name}: split file {p} not found. Download it with:\n  python experiments/'
                              f'download.py --dataset={name} --data_dir={data_dir}')
  return paths


def split_info(name: str, data_dir: str) -> dict:
  """Counts clients, classes and images in the split CSVs (settles the published numbers)."""
  train_csv, test_csv = _csv_paths(name, data_dir)
  users, images, classes = read_split_csv(train_csv, True)
  _, test_images, test_classes = read_split_csv(test_csv, False)
  sizes = np.bincount(np.unique(users, return_inverse=True)[1])
  return dict(name=name, num_clients=len(sizes), num_train=len(images), num_test=len(test_images),
              num_classes=int(max(classes.max(), test_classes.max())) + 1,
              train_classes=int(len(np.unique(classes))), client_size_min=int(sizes.min()),
              client_size_max=int(sizes.max()), client_size_mean=float(sizes.mean()))


# ----------------------------------------------------------------------------------------------------
# Preparation: per-client shards of resized JPEGs.


def image_path(images_dir: str, image_id: str) -> Optional[str]:
  """GLDv2 layout <a>/<b>/<c>/<id>.jpg, or the flat <id>.jpg; None if neither exists."""
  nested = os.path.join(images_dir, image_id[0], image_id[1], image_id[2], f'{image_id}.jpg')
  if len(image_id) >= 3 and os.path.isfile(nested):
    return nested
  flat = os.path.join(images_dir, f'{image_id}.jpg')
  return flat if os.path.isfile(flat) else None


def resize_jpeg(path_or_bytes, short_side: int = DEFAULT_SHORT_SIDE, quality: int = 90) -> bytes:
  """Decodes a JPEG, scales it so the shorter side is short_side (never upscales), re-encodes it."""
  Image = _pil()
  src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, (bytes, bytearray)) else path_or_bytes
  with Image.open(src) as im:
    w, h = im.size
    scale = short_side / min(w, h)
    if scale < 1:
      im.draft('RGB', (max(1, int(w * scale)), max(1, int(h * scale))))  # DCT-domain downscale: fast
    im = im.convert('RGB')
    w, h = im.size
    scale = short_side / min(w, h)
    if scale < 1:
      im = im.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BICUBIC, reducing_gap=3.0)
    out = io.BytesIO()
    im.save(out, format='JPEG', quality=quality)
  return out.getvalue()


def _write_atomic(path: str, data: bytes) -> None:
  tmp = f'{path}.tmp{os.getpid()}.{threading.get_ident()}'
  with open(tmp, 'wb') as f:
    f.write(data)
  os.replace(tmp, path)


def _prepare_shard(bin_path: str, image_ids: Sequence[str], labels: Sequence[int], images_dir: str,
                   short_side: int, quality: int, allow_missing: bool) -> dict:
  meta_path = bin_path[:-4] + '.json'
  if os.path.isfile(meta_path) and os.path.isfile(bin_path):
    with open(meta_path) as f:
      meta = json.load(f)
    if meta.get('short_side') == short_side and meta.get('requested') == len(image_ids):
      return meta
  blobs, kept_ids, kept_labels, missing = [], [], [], []
  for image_id, label in zip(image_ids, labels):
    p = image_path(images_dir, image_id)
    if p is None:
      missing.append(image_id)
      continue
    try:
      blobs.append(resize_jpeg(p, short_side, quality))
    except Exception as e:  # unreadable / truncated JPEG
      if not allow_missing:
        raise DataFormatError(f'cannot decode {p} ({type(e).__name__}: {e})') from e
      missing.append(image_id)
      continue
    kept_ids.append(image_id)
    kept_labels.append(int(label))
  if missing and not allow_missing:
    raise FileNotFoundError(
        f'{len(missing)} GLDv2 images missing under {images_dir} (e.g. {missing[:3]}; expected '
        f'<images_dir>/<a>/<b>/<c>/<image_id>.jpg as extracted from images_%03d.tar). Download them with '
        f'`python experiments/download.py --dataset=gldv2_images ...` or pass allow_missing=True to skip.')
  lengths = [len(b) for b in blobs]
  _write_atomic(bin_path, b''.join(blobs))
  meta = dict(short_side=short_side, requested=len(image_ids), image_ids=kept_ids, labels=kept_labels,
              lengths=lengths, missing=missing)
  _write_atomic(meta_path, json.dumps(meta).encode())
  return meta


def prepare(name: str, data_dir: str, *, images_dir: Optional[str] = None, out_dir: Optional[str] = None,
            short_side: int = DEFAULT_SHORT_SIDE, quality: int = 90, num_workers: int = 2,
            allow_missing: bool = False, progress: bool = False) -> str:
  """Builds the per-client shards of a split; returns the shards directory.

  images_dir: GLDv2 train images (default <data_dir>/gldv2/train). out_dir: default
  <data_dir>/landmarks_shards/<name>_s<short_side>. Clients whose images are all missing are dropped
  (only possible with allow_missing=True); counts are recorded in index.json.
  """
  train_csv, test_csv = _csv_paths(name, data_dir)
  images_dir = images_dir or default_images_dir(data_dir)
  if not os.path.isdir(images_dir):
    raise FileNotFoundError(f'GLDv2 images directory {images_dir} not found (expected the extracted '
                            f'images_%03d.tar shards). Download with: python experiments/download.py '
                            f'--dataset=gldv2_images --data_dir={data_dir}')
  out_dir = out_dir or default_shards_dir(name, data_dir, short_side)
  os.makedirs(os.path.join(out_dir, 'train'), exist_ok=True)
  users, images, classes = read_split_csv(train_csv, True)
  _, test_images, test_classes = read_split_csv(test_csv, False)
  order = _client_order(users)
  by_user: Dict[str, List[int]] = {u: [] for u in order}
  for i, u in enumerate(users):
    by_user[u].append(i)
  jobs = [(os.path.join(out_dir, 'train', f'{k:05d}.bin'), [images[i] for i in by_user[u]],
           [int(classes[i]) for i in by_user[u]]) for k, u in enumerate(order)]
  jobs.append((os.path.join(out_dir, 'test.bin'), test_images, [int(c) for c in test_classes]))
  metas = [None] * len(jobs)
  with cf.ThreadPoolExecutor(max(1, num_workers)) as pool:
    futs = {pool.submit(_prepare_shard, p, ids, labs, images_dir, short_side, quality, allow_missing): j
            for j, (p, ids, labs) in enumerate(jobs)}
    for done, fut in enumerate(cf.as_completed(futs), 1):
      metas[futs[fut]] = fut.result()
      if progress and done % 50 == 0:
        log.info('prepared %d/%d shards', done, len(jobs))
  test_meta = metas.pop()
  keep = [k for k, m in enumerate(metas) if m['labels']]
  dropped = [order[k] for k, m in enumerate(metas) if not m['labels']]
  sizes = np.array([len(metas[k]['labels']) for k in keep], np.int64)

  def starts(lengths):
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if lengths else np.zeros(0, np.int64)

  np.savez(os.path.join(out_dir, 'index.npz.tmp.npz'),
           client_offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
           labels=(np.concatenate([np.asarray(metas[k]['labels'], np.int32) for k in keep]) if keep
                   else np.zeros(0, np.int32)),
           byte_start=np.concatenate([starts(metas[k]['lengths']) for k in keep]) if keep else np.zeros(0, np.int64),
           byte_len=(np.concatenate([np.asarray(metas[k]['lengths'], np.int64) for k in keep]) if keep
                     else np.zeros(0, np.int64)),
           test_labels=np.asarray(test_meta['labels'], np.int32),
           test_byte_start=starts(test_meta['lengths']),
           test_byte_len=np.asarray(test_meta['lengths'], np.int64))
  os.replace(os.path.join(out_dir, 'index.npz.tmp.npz'), os.path.join(out_dir, 'index.npz'))
  num_classes = int(max(classes.max(), test_classes.max())) + 1
  index = dict(format=FORMAT, name=name, short_side=short_side, quality=quality, num_classes=num_classes,
               client_ids=[order[k] for k in keep], client_files=[f'train/{k:05d}.bin' for k in keep],
               test_file='test.bin', num_train=int(sizes.sum()), num_test=len(test_meta['labels']),
               missing_train=int(sum(len(m['missing']) for m in metas)),
               missing_test=len(test_meta['missing']), dropped_clients=dropped)
  _write_atomic(os.path.join(out_dir, 'index.json'), json.dumps(index, indent=1).encode())
  return out_dir


# ----------------------------------------------------------------------------------------------------
# Reading: decode + transforms, the ClientDataSource, prefetching.


def random_resized_crop_box(w: int, h: int, rng: np.random.Generator, *, scale=(0.08, 1.0),
                            ratio=(3 / 4, 4 / 3), attempts: int = 10, image_size: int = 224):
  """A crop box (left, top, right, bottom) as in the Flax ImageNet example's distorted bounding box."""
  area = w * h
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(attempts):
    target = area * rng.uniform(*scale)
    aspect = math.exp(rng.uniform(*log_ratio))
    cw = int(round(math.sqrt(target * aspect)))
    ch = int(round(math.sqrt(target / aspect)))
    if 0 < cw <= w and 0 < ch <= h:
      x0 = int(rng.integers(0, w - cw + 1))
      y0 = int(rng.integers(0, h - ch + 1))
      return x0, y0, x0 + cw, y0 + ch
  return center_crop_box(w, h, image_size)


def center_crop_box(w: int, h: int, image_size: int = 224):
  s = image_size / (image_size + CROP_PADDING) * min(w, h)
  x0, y0 = (w - s) / 2, (h - s) / 2
  return x0, y0, x0 + s, y0 + s


def decode_transform(blob: bytes, image_size: int, rng: Optional[np.random.Generator],
                     flip: bool = True) -> np.ndarray:
  """JPEG bytes -> uint8 [image_size, image_size, 3]; rng=None: eval center crop, else train RRC+flip."""
  Image = _pil()
  with Image.open(io.BytesIO(blob)) as im:
    im = im.convert('RGB')
    w, h = im.size
    box = center_crop_box(w, h, image_size) if rng is None else random_resized_crop_box(
        w, h, rng, image_size=image_size)
    out = im.resize((image_size, image_size), Image.BICUBIC, box=box)
    if rng is not None and flip and rng.random() < 0.5:
      out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(out, np.uint8)


class LandmarksSource(ClientDataSource, DecodePool):
  """Out-of-memory federated Landmarks (ClientDataSource protocol) over prepared shards."""
  _pool_prefix = 'landmarks'
  input_dtype = np.dtype(np.uint8)                       # decoded JPEGs (batches keep uint8)

  def __init__(self, shards_dir: str, *, image_size: int = 224, seed: int = 0, train_augment: bool = True,
               num_workers: int = 2):
    idx_json = os.path.join(shards_dir, 'index.json')
    if not os.path.isfile(idx_json):
      raise FileNotFoundError(f'Landmarks shards not found: {idx_json}. Prepare them with:\n  python '
                              f'experiments/prepare.py --dataset=<gld23k|gld160k> --data_dir=<data_dir> '
                              f'[--images_dir=<GLDv2 train images>]')
    with open(idx_json, 'rb') as f, reading(idx_json, 'a Landmarks shard index (experiments/prepare.py)'):
      self.index = json.loads(f.read())
      self.index.get('format')
    if self.index.get('format') != FORMAT:
      raise DataFormatError(f'{idx_json}: unknown shard format {self.index.get("format")!r} (expected {FORMAT})')
    with np.load(os.path.join(shards_dir, 'index.npz'), allow_pickle=False) as z:
      self._z = {k: z[k] for k in z.files}
    self.shards_dir = shards_dir
    self.name = self.index['name']
    self.num_clients = len(self.index['client_ids'])
    self.num_classes = int(self.index['num_classes'])
    self.image_size = int(image_size)
    self.input_shape = (self.image_size, self.image_size, 3)
    self.client_names = list(self.index['client_ids'])
    self.seed = int(seed)
    self.train_augment = train_augment
    self.num_workers = max(1, int(num_workers))
    self._calls = np.zeros(self.num_clients, np.int64)
    self._lock = threading.Lock()
    self._pool: Optional[cf.ThreadPoolExecutor] = None
    off = self._z['client_offsets']
    if len(off) != self.num_clients + 1 or off[-1] != len(self._z['labels']):
      raise DataFormatError(f'{shards_dir}: index.npz and index.json disagree (re-run prepare)')

  # -- protocol ------------------------------------------------------------------------------------
  def client_sizes(self) -> np.ndarray:
    return np.diff(self._z['client_offsets'])

  def client_labels(self, k: int) -> np.ndarray:
    lo, hi = self._range(k)
    return self._z['labels'][lo:hi].copy()

  def client_examples(self, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Decodes client k; train augmentation draws fresh crops on every call (deterministic per call #)."""
    with self._lock:
      call = int(self._calls[k])
      self._calls[k] += 1
    rng = np.random.default_rng([self.seed, k, call]) if self.train_augment else None
    return self._decode_client(k, rng)

  def test_examples(self) -> Tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for x, y in self.test_batches(1024):
      xs.append(x)
      ys.append(y)
    return (np.concatenate(xs) if xs else np.zeros((0,) + self.input_shape, np.uint8),
            np.concatenate(ys) if ys else np.zeros(0, np.int32))

  # -- extras --------------------------------------------------------------------------------------
  def test_batches(self, batch_size: int = 256) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Center-cropped test images in batches (the full gld160k test set is several GB decoded)."""
    path = os.path.join(self.shards_dir, self.index['test_file'])
    starts, lens, labels = self._z['test_byte_start'], self._z['test_byte_len'], self._z['test_labels']
    with open(path, 'rb') as f:
      for lo in range(0, len(labels), batch_size):
        hi = min(lo + batch_size, len(labels))
        f.seek(int(starts[lo]))
        buf = f.read(int(starts[hi - 1] + lens[hi - 1] - starts[lo]))
        base = int(starts[lo])
        blobs = [buf[int(s) - base:int(s) - base + int(n)] for s, n in zip(starts[lo:hi], lens[lo:hi])]
        pool = self._get_pool()
        x = np.stack(list(pool.map(lambda b: decode_transform(b, self.image_size, None), blobs)))
        yield x, labels[lo:hi].copy()

  # -- internals (decoding pool and prefetch_clients: data/prefetch.DecodePool) ----------------------
  def _range(self, k: int) -> Tuple[int, int]:
    if not 0 <= k < self.num_clients:
      raise IndexError(f'client {k} out of range [0, {self.num_clients})')
    off = self._z['client_offsets']
    return int(off[k]), int(off[k + 1])

  def read_client_blobs(self, k: int) -> List[bytes]:
    lo, hi = self._range(k)
    path = os.path.join(self.shards_dir, self.index['client_files'][k])
    with open(path, 'rb') as f:
      buf = f.read()
    starts, lens = self._z['byte_start'][lo:hi], self._z['byte_len'][lo:hi]
    if len(lens) and int(starts[-1] + lens[-1]) != len(buf):
      raise DataFormatError(f'{path} has {len(buf)} bytes, index expects {int(starts[-1] + lens[-1])}: the shard is '
                       f'truncated or stale; re-run prepare')
    return [buf[int(s):int(s) + int(n)] for s, n in zip(starts, lens)]

  def _decode_client(self, k: int, rng: Optional[np.random.Generator]):
    lo, hi = self._range(k)
    blobs = self.read_client_blobs(k)
    x = np.empty((len(blobs),) + self.input_shape, np.uint8)
    for i, b in enumerate(blobs):
      x[i] = decode_transform(b, self.image_size, rng)
    return x, self._z['labels'][lo:hi].copy()


def load(name: str, data_dir: Optional[str] = None, *, shards_dir: Optional[str] = None,
         short_side: int = DEFAULT_SHORT_SIDE, image_size: int = 224, seed: int = 0, num_workers: int = 2,
         train_augment: bool = True) -> LandmarksSource:
  data_dir = data_dir or default_data_dir()
  shards_dir = shards_dir or default_shards_dir(name, data_dir, short_side)
  if not os.path.isfile(os.path.join(shards_dir, 'index.json')):
    csv_hint = ''
    try:
      _csv_paths(name, data_dir)
    except FileNotFoundError as e:
      csv_hint = f'\nFirst: {e}'
    raise FileNotFoundError(
        f'{name}: prepared shards not found in {shards_dir}. Build them with:\n  python experiments/prepare.py '
        f'--dataset={name} --data_dir={data_dir} --images_dir=<GLDv2 train images, default '
        f'{default_images_dir(data_dir)}>{csv_hint}')
  return LandmarksSource(shards_dir, image_size=image_size, seed=seed, num_workers=num_workers,
                         train_augment=train_augment)


@register('gld23k')
def _gld23k(data_dir=None, shards_dir=None, short_side=DEFAULT_SHORT_SIDE, image_size=224, seed=0,
            num_workers=2, train_augment=True, **unused):
  del unused
  return load('gld23k', data_dir, shards_dir=shards_dir, short_side=short_side, image_size=image_size,
              seed=seed, num_workers=num_workers, train_augment=train_augment)


@register('gld160k')
def _gld160k(data_dir=None, shards_dir=None, short_side=DEFAULT_SHORT_SIDE, image_size=224, seed=0,
             num_workers=2, train_augment=True, **unused):
  del unused
  return load('gld160k', data_dir, shards_dir=shards_dir, short_side=short_side, image_size=image_size,
              seed=seed, num_workers=num_workers, train_augment=train_augment)
