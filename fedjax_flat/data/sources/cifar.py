"""CIFAR-10 / CIFAR-100 from the official python tarballs, federated with the Dirichlet split.

Files (https://www.cs.toronto.edu/~kriz/cifar.html), read either as the tarball or as its extracted
directory inside `data_dir`:

* `cifar-10-python.tar.gz` -> `cifar-10-batches-py/data_batch_{1..5}`, `test_batch`: pickled dicts with
  b'data' [10000, 3072] uint8 (row-major, channel planes R, G, B of 32x32) and b'labels'.
* `cifar-100-python.tar.gz` -> `cifar-100-python/train` (50000), `test` (10000): b'data',
  b'fine_labels', b'coarse_labels', b'filenames'.

Batches are unpickled with `safe_pickle` (no code execution). Images are returned as [N, 32, 32, 3]
uint8 (normalization happens on device). Array sizes are checked against each other and, with
`check_official_sizes` (default), against the official counts: a truncated or corrupted file raises
`CifarFormatError`, never returns wrong data.

Federation (`load_federated`): `dirichlet_split` (100 clients x 500, alpha grids CIFAR10 {0, 0.05, 100},
CIFAR100 {0, 0.5, 1000}). The split is saved to `<data_dir>/splits/<name>_alpha..._seed....npz` and reused
when present, so runs compare on the same partition. `split_json=PATH` loads a FedSAM/LEAF split JSON
(`{users, num_samples, user_data: {uid: {x: [file names], y: [labels]}}}`) instead. `partition='random'`
(alpha unused): a seeded permutation of the training set cut into consecutive clients of
`examples_per_client` images, so each client's class counts are random (pfl-research's `cifar10_iid`: 1000 users
x 50; `alpha=inf` instead gives every client the global class proportions); saved and reused the same way.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
import tempfile
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from fedjax_flat import errors
from fedjax_flat.errors import reading
from fedjax_flat.data import safe_pickle
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.partition import PROCEDURE as DIRICHLET_PROCEDURE   # `partition` is a field here
from fedjax_flat.data.partition import dirichlet_split
from fedjax_flat.data.registry import register
from fedjax_flat.data.download import default_data_dir

CIFAR10_TARBALL = 'cifar-10-python.tar.gz'
CIFAR10_DIR = 'cifar-10-batches-py'
CIFAR100_TARBALL = 'cifar-100-python.tar.gz'
CIFAR100_DIR = 'cifar-100-python'

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)

# alpha grids of the FedSAM paper (thesis Table 3.2 / Section 2.2 of the chapter-4 digest).
ALPHA_GRID = {'cifar10': (0.0, 0.05, 100.0), 'cifar100': (0.0, 0.5, 1000.0)}
# The FedSeq chapter (thesis 5.2, Table 5.1): 500 clients x 100 images (num_clients=500, examples_per_client=100),
# both datasets; alpha = 100 for the label-flipping experiments (Table 5.5).
ALPHA_GRID_FEDSEQ = (0.0, 0.2, 0.5, 100.0)

_SPECS = {
    'cifar10': dict(tarball=CIFAR10_TARBALL, dirname=CIFAR10_DIR, num_classes=10,
                    train_members=[f'data_batch_{i}' for i in range(1, 6)], test_members=['test_batch'],
                    label_key=b'labels', train_size=50000, test_size=10000),
    'cifar100': dict(tarball=CIFAR100_TARBALL, dirname=CIFAR100_DIR, num_classes=100,
                     train_members=['train'], test_members=['test'],
                     label_key=b'fine_labels', train_size=50000, test_size=10000),
}


class CifarFormatError(errors.DataFormatError):
  """A CIFAR file exists but is truncated, corrupted or not in the official format."""


def _download_hint(name: str, data_dir: str) -> str:
  return f'python experiments/download.py --dataset={name} --data_dir={data_dir}'


def locate(name: str, data_dir: str) -> Tuple[str, str]:
  """Returns ('dir' | 'tar', path) of the CIFAR files in data_dir (or data_dir itself is one of them)."""
  spec = _SPECS[name]
  data_dir = os.fspath(data_dir)
  candidates = [('dir', os.path.join(data_dir, spec['dirname'])),
                ('tar', os.path.join(data_dir, spec['tarball']))]
  if os.path.isfile(data_dir) and data_dir.endswith('.tar.gz'):
    candidates.insert(0, ('tar', data_dir))
  if os.path.isfile(os.path.join(data_dir, spec['test_members'][0])):
    candidates.insert(0, ('dir', data_dir))
  for kind, path in candidates:
    if (kind == 'dir' and os.path.isdir(path)) or (kind == 'tar' and os.path.isfile(path)):
      return kind, path
  raise FileNotFoundError(
      f'{name} not found: expected {candidates[-1][1]} (the official tarball) or its extracted directory '
      f'{candidates[-2][1]}/. Download it with:\n  {_download_hint(name, data_dir)}\n'
      f'or place the file there by hand.')


def _read_members(name: str, kind: str, path: str, members: Sequence[str]) -> Dict[str, bytes]:
  spec = _SPECS[name]
  out = {}
  if kind == 'dir':
    for m in members:
      p = os.path.join(path, m)
      if not os.path.isfile(p):
        raise FileNotFoundError(f'{name}: missing {p} (expected the official {spec["dirname"]}/ layout). '
                                f'Re-download with: {_download_hint(name, os.path.dirname(path))}')
      with open(p, 'rb') as f:
        out[m] = f.read()
    return out
  wanted = {f'{spec["dirname"]}/{m}': m for m in members}
  try:
    with tarfile.open(path, mode='r:gz') as tar:
      for info in tar:
        m = wanted.get(info.name.lstrip('./'))
        if m is not None and info.isfile():
          out[m] = tar.extractfile(info).read()
          if len(out[m]) != info.size:
            raise CifarFormatError(f'{path}: member {info.name} is truncated '
                                   f'({len(out[m])} of {info.size} bytes)')
      # Read to the end of the gzip stream so its CRC-32 and length trailer are verified: a corrupted
      # byte inside a member must fail here rather than yield wrong pixels.
      while tar.fileobj.read(1 << 20):
        pass
  except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
    if isinstance(e, FileNotFoundError):
      raise
    raise CifarFormatError(
        f'{path} is truncated or corrupted ({type(e).__name__}: {e}). Delete it and re-download with: '
        f'{_download_hint(name, os.path.dirname(path))}') from e
  missing = sorted(set(wanted) - {f'{spec["dirname"]}/{m}' for m in out})
  if missing:
    raise CifarFormatError(f'{path} lacks the official members {missing}; is it the right tarball '
                           f'({spec["tarball"]})? Re-download with: {_download_hint(name, os.path.dirname(path))}')
  return out


def _get(d: dict, key: bytes):
  if key in d:
    return d[key]
  skey = key.decode()
  if skey in d:
    return d[skey]
  raise KeyError(key)


def _decode_batch(name: str, member: str, raw: bytes, label_keys: Sequence[bytes]):
  try:
    d = safe_pickle.loads(raw, encoding='bytes')
  except safe_pickle.UnsafePickleError:
    raise
  except Exception as e:  # truncated / corrupted pickle stream
    raise CifarFormatError(f'{name} batch {member!r} is not a readable pickle '
                           f'({type(e).__name__}: {e}); the file is truncated or corrupted') from e
  if not isinstance(d, dict):
    raise CifarFormatError(f'{name} batch {member!r}: expected a dict, got {type(d).__name__}')
  try:
    data = _get(d, b'data')
    labels = [np.asarray(_get(d, k)) for k in label_keys]
  except KeyError as e:
    raise CifarFormatError(f'{name} batch {member!r} lacks key {e.args[0]!r} (keys: {sorted(d)})') from None
  data = np.asarray(data)
  if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
    raise CifarFormatError(f'{name} batch {member!r}: b"data" must be uint8 [N, 3072], got '
                           f'{data.dtype} {data.shape}')
  for k, lab in zip(label_keys, labels):
    if lab.ndim != 1 or len(lab) != len(data):
      raise CifarFormatError(f'{name} batch {member!r}: {k!r} has shape {lab.shape} for {len(data)} images')
    if not np.issubdtype(lab.dtype, np.integer):    # astype(int32) below would truncate 3.7 to 3 silently
      raise CifarFormatError(f'{name} batch {member!r}: {k!r} must be integer class ids, got {lab.dtype} '
                             f'(e.g. {lab[:3].tolist()}); the file is not the official one')
  images = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
  extra = {}
  if b'filenames' in d or 'filenames' in d:
    fn = [f.decode() if isinstance(f, bytes) else str(f) for f in _get(d, b'filenames')]
    if len(fn) != len(data):
      raise CifarFormatError(f'{name} batch {member!r}: {len(fn)} filenames for {len(data)} images')
    extra['filenames'] = fn
  return images, [lab.astype(np.int32) for lab in labels], extra


def load_arrays(name: str, data_dir: Optional[str] = None, *, check_official_sizes: bool = True) -> dict:
  """Reads CIFAR-10/100 into numpy.

  Returns a dict with x_train [50000, 32, 32, 3] uint8, y_train int32, x_test, y_test, and for
  CIFAR-100 also coarse_train, coarse_test, filenames_train, filenames_test.
  check_official_sizes: require the official 50,000/10,000 examples (tests write smaller files).
  """
  if name not in _SPECS:
    raise ValueError(f'unknown CIFAR dataset {name!r}; allowed: {sorted(_SPECS)}')
  spec = _SPECS[name]
  data_dir = data_dir or default_data_dir()
  kind, path = locate(name, data_dir)
  raw = _read_members(name, kind, path, spec['train_members'] + spec['test_members'])
  label_keys = [spec['label_key']] + ([b'coarse_labels'] if name == 'cifar100' else [])
  out = {}
  for split, members, size in (('train', spec['train_members'], spec['train_size']),
                               ('test', spec['test_members'], spec['test_size'])):
    parts = [_decode_batch(name, m, raw[m], label_keys) for m in members]
    x = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    y = np.concatenate([p[1][0] for p in parts])
    if check_official_sizes and len(x) != size:
      raise CifarFormatError(f'{name} {split}: {len(x)} images, expected {size} (official); the file is '
                             f'truncated or not the official one. Re-download with: {_download_hint(name, data_dir)}')
    if check_official_sizes and name == 'cifar10' and any(len(p[0]) != 10000 for p in parts):
      raise CifarFormatError(f'{name} {split}: batch sizes {[len(p[0]) for p in parts]}, expected 10000 each')
    if y.min() < 0 or y.max() >= spec['num_classes']:
      raise CifarFormatError(f'{name} {split}: labels outside [0, {spec["num_classes"]})')
    out[f'x_{split}'], out[f'y_{split}'] = x, y
    if name == 'cifar100':
      out[f'coarse_{split}'] = np.concatenate([p[1][1] for p in parts])
      out[f'filenames_{split}'] = sum((p[2].get('filenames', []) for p in parts), [])
  out['num_classes'] = spec['num_classes']
  return out


# ----------------------------------------------------------------------------------------------------
# Splits: saved/reused Dirichlet splits and FedSAM (LEAF-format) split JSONs.


def _labels_fingerprint(y: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(y, np.int64).tobytes()).hexdigest()[:16]


def split_path(split_dir: str, name: str, *, alpha, num_clients, examples_per_client, seed,
               quantity_skew=None, tag: str = '') -> str:
  qs = '' if not quantity_skew else f'_qskew{float(quantity_skew):g}'
  epc = '' if examples_per_client is None else f'_epc{int(examples_per_client)}'
  return os.path.join(split_dir, f'{name}{tag}_alpha{float(alpha):g}_clients{int(num_clients)}{epc}'
                      f'{qs}_seed{int(seed)}.npz')


def save_split(path: str, client_indices: Sequence[np.ndarray], labels: np.ndarray, meta: dict) -> None:
  """Atomically writes a split (.npz: CSR index/offsets + labels fingerprint + JSON metadata)."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  sizes = np.array([len(c) for c in client_indices], np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  index = (np.concatenate([np.asarray(c, np.int64) for c in client_indices]) if len(client_indices)
           else np.zeros((0,), np.int64))
  meta = dict(meta, labels_sha256_16=_labels_fingerprint(labels), num_examples=int(len(labels)))
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or '.', suffix='.npz.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      np.savez(f, index=index, offsets=offsets, meta=np.array(json.dumps(meta, sort_keys=True)))
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def load_split(path: str, labels: Optional[np.ndarray] = None) -> Tuple[List[np.ndarray], dict]:
  """Reads a split saved by `save_split`; checks it was made for these labels."""
  with np.load(path, allow_pickle=False) as z:
    index, offsets, meta = z['index'], z['offsets'], json.loads(str(z['meta']))
  if offsets[0] != 0 or offsets[-1] != len(index) or np.any(np.diff(offsets) < 0):
    raise errors.DataFormatError(f'split file {path} is corrupted (bad offsets); delete it to regenerate')
  if labels is not None:
    if meta.get('num_examples') != len(labels) or meta.get('labels_sha256_16') != _labels_fingerprint(labels):
      raise errors.DataFormatError(f'split file {path} was made for different data (labels fingerprint/size mismatch); '
                       f'delete it to regenerate the split for the current files')
    if len(index) and (index.min() < 0 or index.max() >= len(labels)):
      raise errors.DataFormatError(f'split file {path} indexes outside the data; delete it to regenerate')
  return [index[offsets[k]:offsets[k + 1]] for k in range(len(offsets) - 1)], meta


_C10_NAME = re.compile(r'^img_(\d+)_label_(\d+)\.png$')


def load_leaf_split(path: str, name: str, labels: np.ndarray,
                    filenames: Optional[Sequence[str]] = None) -> Tuple[List[np.ndarray], List[str]]:
  """`_load_leaf_split`, every parse error of a malformed file a DataFormatError naming it."""
  with reading(path, 'a FedSAM/LEAF split JSON (users, num_samples, user_data)'):
    return _load_leaf_split(path, name, labels, filenames)


def _load_leaf_split(path: str, name: str, labels: np.ndarray,
                     filenames: Optional[Sequence[str]] = None) -> Tuple[List[np.ndarray], List[str]]:
  """Maps a FedSAM/LEAF split JSON onto indices of the official train arrays.

  CIFAR-10 names are `img_{index}_label_{y}.png` with index into the concatenated data_batch_1..5.
  CIFAR-100 names are the train pickle's `filenames`; the official train set has one repeated file name
  ('baby_s_000333.png', labels 2 and 35), so names are matched together with their label.
  Clients come in the JSON's `users` order; returns (index arrays, client ids).
  """
  with open(path) as f:
    try:
      d = json.load(f)
    except (ValueError, RecursionError) as e:      # JSONDecodeError, UnicodeDecodeError, nesting
      raise errors.DataFormatError(f'{path} is not valid JSON ({e}); is the split file truncated?') from e
  for key in ('users', 'user_data'):
    if key not in d:
      raise errors.DataFormatError(f'{path}: not a LEAF split JSON (missing {key!r}; expected users/num_samples/'
                                   'user_data)')
  labels = np.asarray(labels)
  by_name: Dict[Tuple[str, int], List[int]] = {}
  if name == 'cifar100':
    if filenames is None or len(filenames) != len(labels):
      raise ValueError('CIFAR-100 split JSONs need the train filenames (from the official train pickle)')
    for i in range(len(filenames) - 1, -1, -1):  # popped from the end: first occurrence first
      by_name.setdefault((filenames[i], int(labels[i])), []).append(i)
  used = np.zeros(len(labels), bool)
  out, users = [], []
  for uid in d['users']:
    entry = d['user_data'].get(str(uid))
    if entry is None:
      raise errors.DataFormatError(f'{path}: user {uid!r} listed in users but absent from user_data')
    xs, ys = entry['x'], entry['y']
    if len(xs) != len(ys):
      raise errors.DataFormatError(f'{path}: user {uid}: {len(xs)} x for {len(ys)} y')
    idx = np.empty(len(xs), np.int64)
    for j, (x, y) in enumerate(zip(xs, ys)):
      if name == 'cifar10':
        m = _C10_NAME.match(os.path.basename(x))
        if not m:
          raise errors.DataFormatError(f'{path}: user {uid}: CIFAR-10 file name {x!r} is not img_<index>_label_<y>.png')
        i = int(m.group(1))
        if i >= len(labels) or int(m.group(2)) != int(y) or int(labels[i]) != int(y):
          raise errors.DataFormatError(f'{path}: user {uid}: {x!r} (y={y}) does not match train example {i} '
                           f'(label {labels[i] if i < len(labels) else "n/a"}); wrong data or split file?')
      else:
        cands = by_name.get((os.path.basename(x), int(y)))
        if not cands:
          raise errors.DataFormatError(f'{path}: user {uid}: no unused train image named {x!r} with label {y}')
        i = cands.pop()
      if used[i]:
        raise errors.DataFormatError(f'{path}: train example {i} ({x!r}) is assigned twice')
      used[i] = True
      idx[j] = i
    out.append(idx)
    users.append(str(uid))
  return out, users


PARTITIONS = ('dirichlet', 'random')
# Stored in a random partition's saved file: the procedure that made it (a different one is regenerated).
RANDOM_PROCEDURE = 'random-permutation-consecutive-v1'


def random_split(num_examples: int, num_clients: int, examples_per_client: int, seed: int) -> List[np.ndarray]:
  """pfl-research's IID users: one seeded permutation of the examples, client k = its k-th run of E."""
  need = num_clients * examples_per_client
  if need > num_examples:
    raise ValueError(f'data.num_clients * data.examples_per_client = {num_clients} * {examples_per_client} = '
                     f'{need} exceeds the {num_examples} training examples: lower one of them')
  perm = np.random.default_rng(seed).permutation(num_examples)
  return [perm[k * examples_per_client:(k + 1) * examples_per_client] for k in range(num_clients)]


def _random_partition(name, y, *, data_dir, split_dir, num_clients, examples_per_client, seed, save):
  split_dir = split_dir or os.path.join(data_dir or default_data_dir(), 'splits')
  path = os.path.join(split_dir, f'{name}_random_clients{int(num_clients)}_epc{int(examples_per_client)}'
                                 f'_seed{int(seed)}.npz')
  if os.path.exists(path):
    clients, meta = load_split(path, y)
    if meta.get('procedure') == RANDOM_PROCEDURE:
      return clients
  clients = random_split(len(y), int(num_clients), int(examples_per_client), int(seed))
  if save:
    save_split(path, clients, y, dict(dataset=name, partition='random', num_clients=int(num_clients),
                                      examples_per_client=int(examples_per_client), seed=int(seed),
                                      procedure=RANDOM_PROCEDURE))
  return clients


def federate(name: str, arrays: dict, *, data_dir: Optional[str], num_clients: int = 100,
             alpha: float = 0.5, examples_per_client: Optional[int] = 500, seed: int = 0,
             split_json: Optional[str] = None, quantity_skew: Optional[float] = None,
             split_dir: Optional[str] = None, save: bool = True, partition: str = 'dirichlet') -> FederatedDataset:
  """Builds the FederatedDataset from decoded arrays (see `load_federated`)."""
  if partition not in PARTITIONS:
    raise ValueError(f'data.partition={partition!r}; allowed: {PARTITIONS}')
  y = arrays['y_train']
  names = None
  if partition == 'random' and not split_json:
    if examples_per_client is None or quantity_skew:
      raise ValueError("data.partition='random' needs data.examples_per_client (equal clients, no quantity_skew)")
    clients = _random_partition(name, y, data_dir=data_dir, split_dir=split_dir, num_clients=num_clients,
                                examples_per_client=examples_per_client, seed=seed, save=save)
    desc = f'{name}(random, {num_clients}x{examples_per_client})'
  elif split_json:
    clients, names = load_leaf_split(split_json, name, y, arrays.get('filenames_train'))
    desc = f'{name}(split_json={os.path.basename(split_json)})'
  else:
    split_dir = split_dir or os.path.join(data_dir or default_data_dir(), 'splits')
    path = split_path(split_dir, name, alpha=alpha, num_clients=num_clients,
                      examples_per_client=examples_per_client, seed=seed, quantity_skew=quantity_skew)
    if os.path.exists(path):
      clients, meta = load_split(path, y)
      if meta.get('procedure') != DIRICHLET_PROCEDURE:
        # Kept (runs must compare on the same partition), but said: regenerating would change the split.
        logging.warning('split %s was made by %r, not the current %r; reusing it. Delete the file to '
                        'regenerate with the current procedure.', path, meta.get('procedure'),
                        DIRICHLET_PROCEDURE)
    else:
      clients = dirichlet_split(y, num_clients, alpha, examples_per_client=examples_per_client,
                                quantity_skew=quantity_skew, num_classes=arrays['num_classes'], seed=seed)
      if save:
        save_split(path, clients, y, dict(dataset=name, alpha=float(alpha), num_clients=int(num_clients),
                                          examples_per_client=examples_per_client, seed=int(seed),
                                          quantity_skew=quantity_skew, procedure=DIRICHLET_PROCEDURE))
    desc = f'{name}(alpha={alpha:g})'
  ds = FederatedDataset.from_client_indices(
      arrays['x_train'], y, clients, arrays['x_test'], arrays['y_test'], num_classes=arrays['num_classes'],
      name=desc, client_names=names)
  if name == 'cifar100':
    ds.coarse_y = arrays['coarse_train']
    ds.test_coarse_y = arrays['coarse_test']
  return ds


def load_federated(name: str, data_dir: Optional[str] = None, *, num_clients: int = 100,
                   alpha: float = 0.5, examples_per_client: Optional[int] = 500, seed: int = 0,
                   split_json: Optional[str] = None, quantity_skew: Optional[float] = None,
                   split_dir: Optional[str] = None, check_official_sizes: bool = True,
                   partition: str = 'dirichlet') -> FederatedDataset:
  """Loads CIFAR-10/100 and federates it (Dirichlet or random split saved under <data_dir>/splits, or
  split_json)."""
  if partition not in PARTITIONS:   # before reading 170 MB
    raise ValueError(f'data.partition={partition!r}; allowed: {PARTITIONS}')
  data_dir = data_dir or default_data_dir()
  arrays = load_arrays(name, data_dir, check_official_sizes=check_official_sizes)
  return federate(name, arrays, data_dir=data_dir, num_clients=num_clients, alpha=alpha,
                  examples_per_client=examples_per_client, seed=seed, split_json=split_json,
                  quantity_skew=quantity_skew, split_dir=split_dir, partition=partition)


@register('cifar10', limits={'partition': PARTITIONS})
def _cifar10(data_dir=None, num_clients=100, alpha=0.05, examples_per_client=500, seed=0, split_json=None,
             quantity_skew=None, split_dir=None, check_official_sizes=True, partition='dirichlet', **unused):
  del unused
  return load_federated('cifar10', data_dir, num_clients=num_clients, alpha=alpha,
                        examples_per_client=examples_per_client, seed=seed, split_json=split_json,
                        quantity_skew=quantity_skew, split_dir=split_dir,
                        check_official_sizes=check_official_sizes, partition=partition)


@register('cifar100', limits={'partition': PARTITIONS})
def _cifar100(data_dir=None, num_clients=100, alpha=0.5, examples_per_client=500, seed=0, split_json=None,
              quantity_skew=None, split_dir=None, check_official_sizes=True, partition='dirichlet', **unused):
  del unused
  return load_federated('cifar100', data_dir, num_clients=num_clients, alpha=alpha,
                        examples_per_client=examples_per_client, seed=seed, split_json=split_json,
                        quantity_skew=quantity_skew, split_dir=split_dir,
                        check_official_sizes=check_official_sizes, partition=partition)
