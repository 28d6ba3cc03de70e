"""CIFAR100-PAM: the TFF/FedJAX federated CIFAR-100 (500 train clients x 100, 100 test clients x 100).

Two sources:

* `source='sqlite'` reads FedJAX's `federated_cifar100_{train,test}.sqlite`:
  `CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL, num_examples
  INTEGER NOT NULL)`, one row per client in insertion (rowid) order; `data` = zlib-compressed msgpack of
  the client's dict of numpy arrays ({'image': uint8 [n, 32, 32, 3], 'label': int64 [n], 'coarse_label':
  int64 [n]}). Arrays use msgpack extension type 1 holding msgpack((shape, dtype name, C-order bytes));
  type 3 = numpy scalar (same payload), 2 = complex, 4 = ndarray of bytes (msgpack((shape, [bytes]))).
  The reader here is an independent implementation of that format (no fedjax/TF import) that validates
  every payload's size. `convert_tff_sqlite` builds these files from TFF's `cifar100.sqlite` (the file
  FedJAX downloads as cifar100.sqlite.lzma) without TensorFlow, by decoding the tf.train.Example protos
  with a small protobuf wire-format reader.
* `source='generate'` builds the split from the raw CIFAR-100 tarball with `pachinko_split` (Pachinko
  Allocation, Reddi et al. 2021 / TFF), for users without the SQLite files; the split is saved/reused.

The global test set is the union of the test clients; the per-client test index sets are the 100 TFF
*test clients* (a population separate from the 500 train clients: test client k is not train client k).
"""
from __future__ import annotations

import os
import sqlite3
import zlib
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_flat import errors
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.registry import register
from fedjax_flat.data.download import default_data_dir
from fedjax_flat.data.sources import cifar

TRAIN_FILE = 'federated_cifar100_train.sqlite'
TEST_FILE = 'federated_cifar100_test.sqlite'
TFF_SQLITE = 'cifar100.sqlite'
NUM_TRAIN_CLIENTS, NUM_TEST_CLIENTS, EXAMPLES_PER_CLIENT = 500, 100, 100

_EXT_NDARRAY, _EXT_COMPLEX, _EXT_SCALAR, _EXT_BYTES_NDARRAY = 1, 2, 3, 4
_NUMERIC_KINDS = set('biufc')


class PamFormatError(errors.DataFormatError):
  """A CIFAR100-PAM file exists but is corrupted or not in the FedJAX/TFF format."""


def _msgpack():
  try:
    import msgpack  # a flax dependency
  except ImportError as e:  # pragma: no cover
    raise ImportError('reading FedJAX SQLite files needs msgpack (pip install msgpack)') from e
  return msgpack


# ----------------------------------------------------------------------------------------------------
# FedJAX client blobs: zlib(msgpack(dict of arrays)).


def _ndarray_from_payload(payload: bytes) -> np.ndarray:
  msgpack = _msgpack()
  shape, dtype_name, buf = msgpack.unpackb(payload, raw=True)
  name = dtype_name.decode() if isinstance(dtype_name, bytes) else str(dtype_name)
  try:
    dtype = np.dtype(name)
  except TypeError as e:
    raise PamFormatError(f'unknown array dtype {name!r} in client data') from e
  if dtype.kind not in _NUMERIC_KINDS:
    raise PamFormatError(f'refused non-numeric array dtype {name!r} in client data')
  shape = tuple(int(s) for s in shape)
  if any(s < 0 for s in shape) or int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(buf):
    raise PamFormatError(f'array payload has {len(buf)} bytes for shape {shape} {dtype} '
                         f'({int(np.prod(shape)) * dtype.itemsize} expected)')
  return np.frombuffer(buf, dtype=dtype).reshape(shape)


def _ext_hook(code: int, payload: bytes):
  msgpack = _msgpack()
  if code == _EXT_NDARRAY:
    return _ndarray_from_payload(payload)
  if code == _EXT_SCALAR:
    return _ndarray_from_payload(payload)[()]
  if code == _EXT_COMPLEX:
    re_, im = msgpack.unpackb(payload)
    return complex(re_, im)
  if code == _EXT_BYTES_NDARRAY:
    shape, flat = msgpack.unpackb(payload, raw=True)
    if not all(isinstance(v, bytes) for v in flat):
      raise PamFormatError('bytes-array payload holds non-bytes values')
    return np.array(flat, dtype=object).reshape(tuple(shape))
  raise PamFormatError(f'unknown msgpack extension type {code} in client data')


def decode_client_blob(blob: bytes) -> Dict[str, np.ndarray]:
  """zlib-decompresses and msgpack-decodes one FedJAX client record."""
  msgpack = _msgpack()
  try:
    raw = zlib.decompress(blob)
  except zlib.error as e:
    raise PamFormatError(f'client data is not a valid zlib stream ({e})') from e
  try:
    out = msgpack.unpackb(raw, ext_hook=_ext_hook, raw=False, strict_map_key=False)
  except PamFormatError:
    raise
  except Exception as e:
    raise PamFormatError(f'client data is not valid msgpack ({type(e).__name__}: {e})') from e
  if not isinstance(out, dict):
    raise PamFormatError(f'client data decodes to {type(out).__name__}, expected a dict of arrays')
  return out


def _pack_ndarray(x) -> 'object':
  msgpack = _msgpack()
  if isinstance(x, np.ndarray) and x.dtype.hasobject:
    flat = list(x.ravel())
    return msgpack.ExtType(_EXT_BYTES_NDARRAY, msgpack.packb((x.shape, flat), use_bin_type=True))
  if isinstance(x, np.ndarray):
    payload = msgpack.packb((x.shape, x.dtype.name, np.ascontiguousarray(x).tobytes('C')), use_bin_type=True)
    return msgpack.ExtType(_EXT_NDARRAY, payload)
  if isinstance(x, np.generic):
    a = np.asarray(x)
    return msgpack.ExtType(_EXT_SCALAR, msgpack.packb((a.shape, a.dtype.name, a.tobytes('C')), use_bin_type=True))
  if isinstance(x, complex):
    return msgpack.ExtType(_EXT_COMPLEX, msgpack.packb((x.real, x.imag)))
  raise TypeError(f'cannot serialize {type(x).__name__}')


def encode_client_blob(examples: Dict[str, np.ndarray]) -> bytes:
  """The inverse of `decode_client_blob` (FedJAX's on-disk encoding)."""
  return zlib.compress(_msgpack().packb(examples, default=_pack_ndarray, strict_types=True))


def write_fedjax_sqlite(path: str, clients: Iterable[Tuple[str, Dict[str, np.ndarray]]]) -> None:
  """Writes a FedJAX-format SQLite file (client ids stored as bytes, one row per client)."""
  if os.path.exists(path):
    raise FileExistsError(path)
  tmp = path + '.tmp'
  if os.path.exists(tmp):
    os.remove(tmp)
  con = sqlite3.connect(tmp)
  try:
    con.execute('CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL, '
                'num_examples INTEGER NOT NULL);')
    def rows():
      for cid, ex in clients:
        n = {len(v) for v in ex.values()}
        if len(n) != 1:
          raise errors.DataFormatError(f'client {cid}: features have different lengths {n}')
        yield (cid.encode() if isinstance(cid, str) else bytes(cid)), encode_client_blob(ex), n.pop()
    con.executemany('INSERT INTO federated_data VALUES (?, ?, ?);', rows())
    con.commit()
  finally:
    con.close()
  os.replace(tmp, path)


def read_fedjax_sqlite(path: str) -> Iterator[Tuple[str, Dict[str, np.ndarray]]]:
  """Yields (client_id, dict of arrays) in the file's row order (FedJAX's client order)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(path)
  con = sqlite3.connect(f'file:{path}?mode=ro', uri=True)
  try:
    try:
      cur = con.execute('SELECT client_id, data, num_examples FROM federated_data ORDER BY rowid;')
    except sqlite3.DatabaseError as e:
      raise PamFormatError(f'{path} is not a FedJAX SQLite file ({e}); expected table federated_data'
                           f'(client_id, data, num_examples)') from e
    while True:
      try:
        row = cur.fetchone()
      except sqlite3.DatabaseError as e:
        raise PamFormatError(f'{path} is corrupted ({e})') from e
      if row is None:
        break
      cid, blob, n = row
      cid = cid.decode() if isinstance(cid, bytes) else str(cid)
      try:
        ex = decode_client_blob(blob)
      except PamFormatError as e:
        raise PamFormatError(f'{path}: client {cid!r}: {e}') from e
      sizes = {k: len(v) for k, v in ex.items()}
      if any(s != n for s in sizes.values()):
        raise PamFormatError(f'{path}: client {cid!r} has num_examples={n} but features sizes {sizes}')
      yield cid, ex
  finally:
    con.close()


def _client_arrays(path: str) -> Tuple[List[str], np.ndarray, np.ndarray, np.ndarray, List[np.ndarray]]:
  names, xs, ys, cs = [], [], [], []
  for cid, ex in read_fedjax_sqlite(path):
    for key in ('image', 'label', 'coarse_label'):
      if key not in ex:
        raise PamFormatError(f'{path}: client {cid!r} lacks feature {key!r} (has {sorted(ex)})')
    img = ex['image']
    if img.dtype != np.uint8 or img.shape[1:] != (32, 32, 3):
      raise PamFormatError(f'{path}: client {cid!r}: image must be uint8 [n, 32, 32, 3], got {img.dtype} {img.shape}')
    names.append(cid)
    xs.append(img)
    ys.append(np.asarray(ex['label']).astype(np.int32))
    cs.append(np.asarray(ex['coarse_label']).astype(np.int32))
  if not names:
    raise PamFormatError(f'{path} holds no clients')
  sizes = [len(x) for x in xs]
  offs = np.concatenate([[0], np.cumsum(sizes)])
  idx = [np.arange(offs[k], offs[k + 1]) for k in range(len(sizes))]
  return names, np.concatenate(xs), np.concatenate(ys), np.concatenate(cs), idx


def _download_hint(data_dir: str) -> str:
  return f'python experiments/download.py --dataset=cifar100_pam --data_dir={data_dir}'


def load_sqlite(data_dir: str, *, check_official_sizes: bool = True) -> FederatedDataset:
  """Reads federated_cifar100_{train,test}.sqlite from data_dir into a FederatedDataset."""
  paths = [os.path.join(data_dir, f) for f in (TRAIN_FILE, TEST_FILE)]
  for p in paths:
    if not os.path.isfile(p):
      raise FileNotFoundError(
          f'CIFAR100-PAM: {p} not found. Create it with:\n  {_download_hint(data_dir)}\n(downloads TFF\'s '
          f'cifar100.sqlite.lzma and converts it), or use source="generate" to build the Pachinko split '
          f'from the CIFAR-100 tarball.')
  names, x, y, coarse, idx = _client_arrays(paths[0])
  tnames, tx, ty, tcoarse, tidx = _client_arrays(paths[1])
  if check_official_sizes and (len(names), len(tnames), len(x), len(tx)) != (
      NUM_TRAIN_CLIENTS, NUM_TEST_CLIENTS, NUM_TRAIN_CLIENTS * EXAMPLES_PER_CLIENT,
      NUM_TEST_CLIENTS * EXAMPLES_PER_CLIENT):
    raise PamFormatError(f'CIFAR100-PAM: {len(names)} train clients / {len(x)} examples and {len(tnames)} '
                         f'test clients / {len(tx)} examples; expected 500/50000 and 100/10000')
  ds = FederatedDataset.from_client_indices(x, y, idx, tx, ty, num_classes=100, name='cifar100_pam',
                                            test_population_indices=tidx, client_names=names,
                                            test_client_names=tnames)
  ds.coarse_y, ds.test_coarse_y = coarse, tcoarse
  return ds


# ----------------------------------------------------------------------------------------------------
# Pachinko Allocation split (generate mode).


def pachinko_split(fine_labels: np.ndarray, coarse_labels: np.ndarray, num_clients: int = 500,
                   examples_per_client: int = 100, *, alpha: float = 0.1, beta: float = 10.0,
                   seed: int = 0) -> List[np.ndarray]:
  """Pachinko Allocation split (Reddi et al. 2021, TFF's fed CIFAR-100).

  Per client: a multinomial over the coarse labels from the symmetric Dirichlet(alpha) (alpha per
  component), and for each coarse label a multinomial over its fine labels from the symmetric
  Dirichlet(beta). Each of the client's examples draws a coarse label, then a fine label within it, then
  an unused example of that fine label (without replacement). An exhausted fine label is removed from its
  coarse multinomial (renormalized); a coarse label with no fine labels left is removed from the client's
  coarse multinomial (renormalized). Clients are built one after another.
  """
  fine = np.asarray(fine_labels, np.int64)
  coarse = np.asarray(coarse_labels, np.int64)
  if fine.shape != coarse.shape:
    raise ValueError('fine_labels and coarse_labels must have the same shape')
  total = num_clients * examples_per_client
  if total > len(fine):
    raise ValueError(f'{num_clients} clients x {examples_per_client} = {total} exceeds {len(fine)} examples')
  rng = np.random.default_rng(seed)
  n_coarse = int(coarse.max()) + 1
  children: List[List[int]] = [[] for _ in range(n_coarse)]
  parent = {}
  for f, c in zip(*np.unique(np.stack([fine, coarse]), axis=1)):
    if int(f) in parent:
      raise ValueError(f'fine label {f} belongs to coarse labels {parent[int(f)]} and {c}')
    parent[int(f)] = int(c)
    children[int(c)].append(int(f))
  n_fine = int(fine.max()) + 1
  pools = [list(rng.permutation(np.flatnonzero(fine == f))) for f in range(n_fine)]
  remaining = np.array([len(p) for p in pools], np.int64)
  coarse_remaining = np.array([remaining[children[c]].sum() for c in range(n_coarse)], np.int64)

  def draw(p, avail):
    p = p * avail
    s = p.sum()
    if s <= 0:
      p, s = avail.astype(float), avail.sum()
    return int(min(np.searchsorted(np.cumsum(p / s), rng.random(), side='right'), len(p) - 1))

  out = []
  for _ in range(num_clients):
    theta = rng.dirichlet(np.full(n_coarse, alpha))
    phis = [rng.dirichlet(np.full(len(children[c]), beta)) if children[c] else np.zeros(0)
            for c in range(n_coarse)]
    chosen = np.empty(examples_per_client, np.int64)
    for i in range(examples_per_client):
      coarse_avail = coarse_remaining > 0
      c = draw(theta, coarse_avail)
      while not coarse_avail[c]:  # guard against rounding at the cumsum's end
        c = (c + 1) % n_coarse
      kids = children[c]
      fine_avail = remaining[kids] > 0
      j = draw(phis[c], fine_avail)
      while not fine_avail[j]:
        j = (j + 1) % len(kids)
      f = kids[j]
      remaining[f] -= 1
      coarse_remaining[c] -= 1
      chosen[i] = pools[f][remaining[f]]
    out.append(chosen)
  return out


def load_generated(data_dir: str, *, seed: int = 0, alpha: float = 0.1, beta: float = 10.0,
                   num_clients: int = NUM_TRAIN_CLIENTS, examples_per_client: int = EXAMPLES_PER_CLIENT,
                   num_test_clients: int = NUM_TEST_CLIENTS, split_dir: Optional[str] = None,
                   check_official_sizes: bool = True) -> FederatedDataset:
  """Pachinko split of the raw CIFAR-100 tarball (train and test), saved under <data_dir>/splits."""
  arrays = cifar.load_arrays('cifar100', data_dir, check_official_sizes=check_official_sizes)
  split_dir = split_dir or os.path.join(data_dir, 'splits')
  tag = f'_pam_beta{float(beta):g}'
  parts = {}
  for split, k, s in (('train', num_clients, seed), ('test', num_test_clients, seed + 1)):
    y, c = arrays[f'y_{split}'], arrays[f'coarse_{split}']
    epc = min(examples_per_client, len(y) // max(k, 1))
    path = cifar.split_path(split_dir, f'cifar100{tag}_{split}', alpha=alpha, num_clients=k,
                            examples_per_client=epc, seed=s)
    if os.path.exists(path):
      parts[split], _ = cifar.load_split(path, y)
    else:
      parts[split] = pachinko_split(y, c, k, epc, alpha=alpha, beta=beta, seed=s)
      cifar.save_split(path, parts[split], y, dict(dataset='cifar100_pam', split=split, alpha=alpha, beta=beta,
                                                  num_clients=k, examples_per_client=epc, seed=s,
                                                  procedure='pam.pachinko_split'))
  ds = FederatedDataset.from_client_indices(
      arrays['x_train'], arrays['y_train'], parts['train'], arrays['x_test'], arrays['y_test'],
      num_classes=100, name=f'cifar100_pam(generated, seed={seed})', test_population_indices=parts['test'])
  ds.coarse_y, ds.test_coarse_y = arrays['coarse_train'], arrays['coarse_test']
  return ds


# ----------------------------------------------------------------------------------------------------
# TFF cifar100.sqlite (one tf.train.Example per row) -> FedJAX SQLite, without TensorFlow.


def _varint(buf: bytes, pos: int) -> Tuple[int, int]:
  result = shift = 0
  while True:
    if pos >= len(buf):
      raise PamFormatError('truncated varint in tf.train.Example')
    b = buf[pos]
    pos += 1
    result |= (b & 0x7F) << shift
    if not b & 0x80:
      return result, pos
    shift += 7
    if shift > 63:
      raise PamFormatError('varint too long in tf.train.Example')


def _fields(buf: bytes) -> Iterator[Tuple[int, int, object]]:
  """Yields (field number, wire type, value) of one protobuf message (value: int or bytes)."""
  pos = 0
  while pos < len(buf):
    key, pos = _varint(buf, pos)
    num, wt = key >> 3, key & 7
    if wt == 0:
      v, pos = _varint(buf, pos)
    elif wt == 2:
      n, pos = _varint(buf, pos)
      if pos + n > len(buf):
        raise PamFormatError('truncated length-delimited field in tf.train.Example')
      v, pos = buf[pos:pos + n], pos + n
    elif wt == 1:
      v, pos = buf[pos:pos + 8], pos + 8
    elif wt == 5:
      v, pos = buf[pos:pos + 4], pos + 4
    else:
      raise PamFormatError(f'unsupported protobuf wire type {wt}')
    yield num, wt, v


def _decode_varints(data: bytes) -> np.ndarray:
  """Vectorized decoding of a packed run of non-negative varints (< 2**63)."""
  b = np.frombuffer(data, np.uint8)
  if len(b) == 0:
    return np.zeros(0, np.int64)
  if b[-1] & 0x80:
    raise PamFormatError('truncated packed varints in tf.train.Example')
  ends = np.flatnonzero(b < 0x80)
  starts = np.concatenate([[0], ends[:-1] + 1])
  if np.max(ends - starts) >= 9:
    raise PamFormatError('varint too long for a non-negative int64 in tf.train.Example')
  pos_in = np.arange(len(b)) - np.repeat(starts, ends - starts + 1)
  vals = (b & 0x7F).astype(np.int64) << (7 * pos_in).astype(np.int64)
  return np.add.reduceat(vals, starts)


def parse_tf_example(buf: bytes) -> Dict[str, object]:
  """Minimal tf.train.Example decoder: {name: np.int64 array | np.float32 array | list of bytes}."""
  out = {}
  for num, wt, features in _fields(buf):
    if num != 1 or wt != 2:
      continue
    for fnum, fwt, entry in _fields(features):  # Features.feature: map<string, Feature> entries
      if fnum != 1 or fwt != 2:
        continue
      key, feature = None, b''
      for enum, ewt, v in _fields(entry):
        if enum == 1 and ewt == 2:
          key = v.decode()
        elif enum == 2 and ewt == 2:
          feature = v
      value = None
      for knum, kwt, lst in _fields(feature):  # oneof: 1 bytes_list, 2 float_list, 3 int64_list
        if knum == 1:
          value = [v for n, w, v in _fields(lst) if n == 1]
        elif knum == 2:
          chunks = []
          for n, w, v in _fields(lst):
            if n == 1:
              chunks.append(np.frombuffer(v, '<f4'))  # packed (wt 2) or one fixed32 (wt 5)
          value = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        elif knum == 3:
          chunks = []
          for n, w, v in _fields(lst):
            if n == 1:
              chunks.append(_decode_varints(v) if w == 2 else np.array([v], np.int64))
          value = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
      out[key] = value
  return out


def convert_tff_sqlite(tff_path: str, out_dir: str, splits: Sequence[str] = ('train', 'test')) -> List[str]:
  """Converts TFF's cifar100.sqlite (examples + client_metadata tables) into FedJAX's
  federated_cifar100_{train,test}.sqlite, client order = client_id order (as FedJAX does)."""
  con = sqlite3.connect(f'file:{tff_path}?mode=ro', uri=True)
  written = []
  try:
    for split in splits:
      out = os.path.join(out_dir, {'train': TRAIN_FILE, 'test': TEST_FILE}[split])
      if os.path.exists(out):
        written.append(out)
        continue
      try:
        ids = [r[0] for r in con.execute(
            'SELECT client_id FROM client_metadata WHERE split_name = ? ORDER BY client_id;', [split])]
      except sqlite3.DatabaseError as e:
        raise PamFormatError(f'{tff_path} is not TFF\'s cifar100.sqlite ({e})') from e

      def clients():
        for cid in ids:
          rows = con.execute('SELECT serialized_example_proto FROM examples WHERE split_name = ? AND '
                             'client_id = ? ORDER BY rowid;', [split, cid]).fetchall()
          imgs, labels, coarse = [], [], []
          for (proto,) in rows:
            ex = parse_tf_example(bytes(proto))
            img = ex.get('image')
            if img is None or len(img) != 32 * 32 * 3 or ex.get('label') is None or ex.get('coarse_label') is None:
              raise PamFormatError(f'{tff_path}: client {cid}: example lacks image[3072]/label/coarse_label')
            if img.min() < 0 or img.max() > 255:
              raise PamFormatError(f'{tff_path}: client {cid}: pixel values outside [0, 255]')
            imgs.append(img.astype(np.uint8).reshape(32, 32, 3))
            labels.append(int(ex['label'][0]))
            coarse.append(int(ex['coarse_label'][0]))
          yield str(cid), {'coarse_label': np.array(coarse, np.int64),
                           'image': np.stack(imgs) if imgs else np.zeros((0, 32, 32, 3), np.uint8),
                           'label': np.array(labels, np.int64)}

      write_fedjax_sqlite(out, clients())
      written.append(out)
  finally:
    con.close()
  return written


@register('cifar100_pam', limits={'source': ('sqlite', 'generate')})
def _cifar100_pam(data_dir=None, source='sqlite', seed=0, alpha=0.1, beta=10.0, num_clients=500,
                  examples_per_client=100, num_test_clients=100, split_dir=None, check_official_sizes=True,
                  **unused):
  del unused
  data_dir = data_dir or default_data_dir()
  if source == 'sqlite':
    return load_sqlite(data_dir, check_official_sizes=check_official_sizes)
  if source == 'generate':
    return load_generated(data_dir, seed=seed, alpha=alpha, beta=beta, num_clients=num_clients,
                          examples_per_client=examples_per_client, num_test_clients=num_test_clients,
                          split_dir=split_dir, check_official_sizes=check_official_sizes)
  raise ValueError(f'cifar100_pam: source={source!r}; allowed: "sqlite", "generate"')
