"""FEMNIST and Shakespeare from LEAF's JSON files (Caldas et al. 2018, github.com/TalwalkarLab/leaf).

Format (every `*.json` of a directory, read in sorted file order):
  {"users": [u, ...], "num_samples": [n_u, ...], "user_data": {u: {"x": [...], "y": [...]}, ...},
   "hierarchies": [...] (optional: Shakespeare's play of each role)}
FEMNIST: x = 784 floats (a 28x28 grey image / 255, row-major, 1.0 = white paper), y = class 0..61 (digits,
upper case, lower case); one user = one writer. Shakespeare: x = an 80-character string, y = the character
that follows it; one user = one speaking role of a play.

Preparing the files (no download URL exists: LEAF's scripts build them from NIST SD19 / Project Gutenberg):
  git clone https://github.com/TalwalkarLab/leaf && cd leaf/data/femnist   (or .../shakespeare)
  ./preprocess.sh                                    # writes data/all_data/*.json only (full data)
and point `data.data_dir` at that `data/` directory (or a copy holding `femnist/data/all_data` or
`femnist/all_data`). Sampling (IID / NIID), the minimum user size and the train/test split are then done
here with LEAF's semantics, keyed by `data.seed`. Train/test files made by LEAF itself
(`./preprocess.sh -s niid --sf 1.0 -k 0 -t sample --tf 0.9` -> data/train, data/test) are used as they are
with `data.source='leaf_split'`.

LEAF's semantics, reproduced (data/utils/{sample,remove_users,split_data}.py), each all_data file on its own:
  niid   (`split='niid'`) the natural users. With `fraction` < 1: users in random order until their
         cumulative samples reach int(fraction * file total); the last one is cut to the missing count
         (LEAF keeps that user's *first* samples, in random order).
  iid    (`split='iid'`) the file's samples pooled; int(fraction * total) of them drawn at random and dealt
         to max(1, round(iid_user_fraction * users)) new users named '0', '1', ... in equal shares
         (LEAF's `iid_divide`: sizes floor(n/g) then floor(n/g)+1). `iid_sizes='natural'` keeps every user
         and its size and only reshuffles the samples among the file's users (needs fraction = 1).
  min_samples  users with num_samples <= min_samples are dropped (LEAF's `-k`: "keep if n > k").
  num_clients, max_samples (not LEAF's; 0 = off): then `num_clients` users drawn at random (seeded) and each
         cut to its first `max_samples` samples, before the train/test split: a fixed-size subset such as the
         FedSeq release's Shakespeare (100 roles x 2,000 training windows: min_samples=2222,
         max_samples=2223, train_fraction=0.9).
  train/test   `train_split='sample'`: each user's samples split, num_train = max(1, int(train_fraction * n))
         (1 when n == 2), users with < 2 samples dropped, original order kept in both parts; the test part is
         that client's own test split (per-client test sets) and their union the global test set.
         `train_split='user'`: int(train_fraction * users) users train, the others form a separate test
         population.
Randomness is numpy's (LEAF uses Python's `random`): the same semantics, not LEAF's bits. The resulting
arrays are cached in <root>/fedjax_flat_cache/ (keyed by every argument and the JSON files' names, sizes and
times; `data.cache=False` to skip), so the JSON is parsed once per setting.

Labels: FEMNIST `classification` (62 classes; x stored as uint8 [28, 28, 1], the exact k/255 values).
Shakespeare ids are TFF's character vocabulary (86 characters: 1..86; pad 0, oov 87, bos 88, eos 89: 90
ids), so `target='sequence'` (default) gives x = the 80 ids and y = the next 80 ids (x shifted by one with
LEAF's y appended) under the `next_token` task (tasks/next_token.py; accuracy over non-pad targets as TFF's
Shakespeare task), and `target='next'` gives y = the one next character (the LEAF / FedSeq-release protocol,
`classification` over the 90 ids; use `model_kwargs.readout='last'`). LEAF's windows overlap (stride 1) and
the per-sample split puts overlapping windows of one role on both sides: a known property of LEAF's split.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import tempfile
import zipfile
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.registry import check_arg, register
from fedjax_flat.schema import DataValue
from fedjax_flat.errors import ConfigError, DataFormatError, reading
from fedjax_flat.data.download import default_data_dir
from fedjax_flat.tasks import next_token as text_tasks

# TFF's Shakespeare character vocabulary (char_prediction_preprocessing.CHAR_VOCAB): 86 characters.
SHAKESPEARE_CHARS = ('dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#\'/37;?bfjnrvzBFJNRVZ"&*.26:\naeimquyAEIMQUY]!%)-159\r')
SHAKESPEARE_PAD, SHAKESPEARE_OOV, SHAKESPEARE_BOS, SHAKESPEARE_EOS = 0, 87, 88, 89
SHAKESPEARE_VOCAB = len(SHAKESPEARE_CHARS) + 4     # 90
SEQUENCE_LENGTH = 80
FEMNIST_CLASSES = 62
CACHE_VERSION = 1


class LeafFormatError(DataFormatError):
  """A LEAF JSON file exists but is not in LEAF's format (or is inconsistent)."""


# A user: (name, x array, y array, hierarchy or None). A "file": the list of users of one LEAF json file.
User = Tuple[str, np.ndarray, np.ndarray, Optional[str]]


def read_leaf_dir(path: str, encode: Callable[[list, list, str], Tuple[np.ndarray, np.ndarray]]) -> List[List[User]]:
  """Reads every *.json of `path` (sorted); `encode(xs, ys, where)` turns a user's lists into arrays."""
  files = sorted(glob.glob(os.path.join(path, '*.json')))
  if not files:
    raise FileNotFoundError(f'no LEAF .json files in {path}')
  seen = set()
  out = []
  for i, f in enumerate(files):
    logging.info('LEAF: reading %s (%d/%d)', f, i + 1, len(files))
    with open(f, 'rb') as fh:
      raw = fh.read()
    try:
      d = json.loads(raw)
    except (ValueError, RecursionError) as e:       # JSONDecodeError, UnicodeDecodeError, nesting
      raise LeafFormatError(f'{f} is not valid JSON ({e}); is the file truncated?') from e
    with reading(f, 'a LEAF JSON file (users, num_samples, user_data)'):
      if not isinstance(d, dict) or not isinstance(d.get('users'), list) or not isinstance(d.get('user_data'), dict):
        raise LeafFormatError(f'{f}: not a LEAF file (expected an object with "users", "num_samples", "user_data")')
      ns = d.get('num_samples')
      if ns is not None and (not isinstance(ns, list) or len(ns) != len(d['users'])):
        raise LeafFormatError(f'{f}: "num_samples" must list one count per user')
      hier = d.get('hierarchies')
      users = []
      for j, u in enumerate(d['users']):
        u = str(u)
        if u in seen:
          raise LeafFormatError(f'{f}: user {u!r} appears twice in {path}')
        seen.add(u)
        entry = d['user_data'].get(u)
        if not isinstance(entry, dict) or not isinstance(entry.get('x'), list) or not isinstance(entry.get('y'), list):
          raise LeafFormatError(f'{f}: user {u!r} has no user_data {{"x": [...], "y": [...]}}')
        if len(entry['x']) != len(entry['y']) or (ns is not None and ns[j] != len(entry['y'])):
          raise LeafFormatError(f'{f}: user {u!r}: {len(entry["x"])} x, {len(entry["y"])} y, num_samples '
                                f'{ns[j] if ns is not None else "-"}')
        x, y = encode(entry['x'], entry['y'], f'{f}: user {u!r}')
        users.append((u, x, y, None if hier is None else str(hier[j])))
    out.append(users)
  return out


# ----------------------------------------------------------------------------------------------------
# LEAF's sampling, user filter and train/test split.


def sample_niid(users: List[User], fraction: float, rng) -> List[User]:
  total = sum(len(y) for _, _, y, _ in users)
  want = int(fraction * total)
  out, have = [], 0
  for k in rng.permutation(len(users)):
    if have >= want:
      break
    u, x, y, h = users[k]
    n = len(y)
    if have + n > want:          # LEAF keeps the first (want - have) samples, in random order
      n = want - have
      p = rng.permutation(n)
      x, y = x[:n][p], y[:n][p]
    out.append((u, x, y, h))
    have += n
  return out


def iid_divide(n: int, groups: int) -> List[int]:
  """LEAF's group sizes: (groups - big) groups of n // groups, then `big` of n // groups + 1."""
  size = n // groups
  big = n - groups * size
  return [size] * (groups - big) + [size + 1] * big


def sample_iid(users: List[User], fraction: float, user_fraction: float, sizes: str, rng,
               first_name: int) -> List[User]:
  x = np.concatenate([x for _, x, _, _ in users])
  y = np.concatenate([y for _, _, y, _ in users])
  if sizes == 'natural':
    p = rng.permutation(len(y))
    offs = np.cumsum([0] + [len(uy) for _, _, uy, _ in users])
    return [(u, x[p[offs[i]:offs[i + 1]]], y[p[offs[i]:offs[i + 1]]], None)
            for i, (u, _, _, _) in enumerate(users)]
  groups = max(1, int(round(user_fraction * len(users))))
  chosen = rng.choice(len(y), int(fraction * len(y)), replace=False)
  offs = np.cumsum([0] + iid_divide(len(chosen), groups))
  return [(str(first_name + g), x[chosen[offs[g]:offs[g + 1]]], y[chosen[offs[g]:offs[g + 1]]], None)
          for g in range(groups)]


def split_by_sample(users: List[User], train_fraction: float, rng) -> Tuple[List[User], List[User]]:
  train, test = [], []
  for u, x, y, h in users:
    n = len(y)
    if n < 2:
      continue
    k = 1 if n == 2 else max(1, int(train_fraction * n))
    is_train = np.zeros(n, bool)
    is_train[rng.choice(n, k, replace=False)] = True
    train.append((u, x[is_train], y[is_train], h))
    test.append((u, x[~is_train], y[~is_train], h))
  return train, test


def subset_users(kept: List[List[User]], num_clients: int, max_samples: int, rng) -> List[List[User]]:
  """`num_clients` random users (0 = all; file order kept), each cut to its first `max_samples` (0 = all)."""
  if num_clients:
    have = sum(len(users) for users in kept)
    if have < num_clients:
      raise ConfigError('data.num_clients', num_clients, f'only {have} users are left after the sampling and '
                        'min_samples: use at most that many (0 = all)')
    pick = np.zeros(have, bool)
    pick[rng.choice(have, num_clients, replace=False)] = True
    offs = np.cumsum([0] + [len(users) for users in kept])
    kept = [[u for u, p in zip(users, pick[offs[i]:offs[i + 1]]) if p] for i, users in enumerate(kept)]
  if max_samples:
    kept = [[(u, x[:max_samples], y[:max_samples], h) for u, x, y, h in users] for users in kept]
  return kept


def prepare(files: List[List[User]], *, split: str, fraction: float, iid_user_fraction: float, iid_sizes: str,
            min_samples: int, train_split: str, train_fraction: float, seed: int, num_clients: int = 0,
            max_samples: int = 0):
  """all_data files -> (train users, test users, test_is_population) with LEAF's semantics (module doc)."""
  rng = np.random.default_rng(seed)
  kept, named = [], 0
  for users in files:
    if split == 'iid':
      users = sample_iid(users, fraction, iid_user_fraction, iid_sizes, rng, named)
      named += len(users)
    elif fraction < 1:
      users = sample_niid(users, fraction, rng)
    kept.append([u for u in users if len(u[2]) > min_samples])
  kept = subset_users(kept, num_clients, max_samples, rng)
  if train_split == 'user':
    flat = [u for users in kept for u in users]
    is_train = np.zeros(len(flat), bool)
    is_train[rng.choice(len(flat), int(train_fraction * len(flat)), replace=False)] = True
    return [u for u, t in zip(flat, is_train) if t], [u for u, t in zip(flat, is_train) if not t], True
  train, test = [], []
  for users in kept:
    a, b = split_by_sample(users, train_fraction, rng)
    train += a
    test += b
  return train, test, False


# ----------------------------------------------------------------------------------------------------
# Encoders: LEAF lists -> arrays.


def encode_femnist(xs: list, ys: list, where: str) -> Tuple[np.ndarray, np.ndarray]:
  try:
    x = np.asarray(xs, np.float64).reshape(len(xs), -1) if xs else np.zeros((0, 784))
    y = np.asarray(ys, np.int64).reshape(-1)
  except (ValueError, TypeError) as e:
    raise LeafFormatError(f'{where}: FEMNIST x must be lists of 784 numbers and y integers ({e})') from e
  if x.shape[1] != 784:
    raise LeafFormatError(f'{where}: FEMNIST images have {x.shape[1]} values, expected 784 (28x28)')
  if len(y) and (y.min() < 0 or y.max() >= FEMNIST_CLASSES):
    raise LeafFormatError(f'{where}: FEMNIST labels outside [0, {FEMNIST_CLASSES})')
  if not np.all(np.isfinite(x)) or (x.size and (x.min() < 0 or x.max() > 1)):
    raise LeafFormatError(f'{where}: FEMNIST pixel values outside [0, 1]')
  q = np.round(x * 255.0)
  if np.max(np.abs(q - x * 255.0), initial=0.0) > 1e-3:
    raise LeafFormatError(f'{where}: FEMNIST pixel values are not k/255 (LEAF writes grey levels / 255)')
  return q.astype(np.uint8).reshape(-1, 28, 28, 1), y.astype(np.int32)


def char_ids(s: str) -> np.ndarray:
  """Characters -> TFF ids (1..86; anything else is oov = 87)."""
  table = _CHAR_TABLE
  return np.array([table.get(c, SHAKESPEARE_OOV) for c in s], np.int16)


_CHAR_TABLE = {c: i + 1 for i, c in enumerate(SHAKESPEARE_CHARS)}


def encode_shakespeare(xs: list, ys: list, where: str) -> Tuple[np.ndarray, np.ndarray]:
  """x: [n, 80] ids (shorter strings right-padded with pad), y: [n] the next character's id."""
  x = np.zeros((len(xs), SEQUENCE_LENGTH), np.int16)
  y = np.zeros((len(ys),), np.int16)
  for i, (s, t) in enumerate(zip(xs, ys)):
    if not isinstance(s, str) or not isinstance(t, str) or len(t) != 1:
      raise LeafFormatError(f'{where}: Shakespeare x must be strings and y single characters (sample {i})')
    if len(s) > SEQUENCE_LENGTH:
      raise LeafFormatError(f'{where}: sample {i} has {len(s)} characters, more than {SEQUENCE_LENGTH}')
    x[i, :len(s)] = char_ids(s)
    y[i] = char_ids(t)[0]
  return x, y


def shakespeare_targets(x: np.ndarray, nxt: np.ndarray) -> np.ndarray:
  """The next 80 ids: x shifted left by one with the next character at the end of each (unpadded) window."""
  y = np.zeros_like(x)
  y[:, :-1] = x[:, 1:]
  lengths = np.sum(x != SHAKESPEARE_PAD, axis=1)
  y[np.arange(len(x)), np.maximum(lengths - 1, 0)] = nxt
  return y


# ----------------------------------------------------------------------------------------------------
# Builders.


def find_root(data_dir: str, name: str) -> str:
  """The directory holding all_data/ or train/+test/: data_dir itself, data_dir/<name>, or data_dir/<name>/data."""
  for d in (data_dir, os.path.join(data_dir, name), os.path.join(data_dir, name, 'data')):
    if os.path.isdir(os.path.join(d, 'all_data')) or os.path.isdir(os.path.join(d, 'train')):
      return d
  raise FileNotFoundError(
      f'{name}: no LEAF data under {data_dir} (looked for all_data/ or train/+test/ in {data_dir}, '
      f'{os.path.join(data_dir, name)} and {os.path.join(data_dir, name, "data")}). '
      + leaf_instructions(name, data_dir))


# LEAF's FEMNIST and Shakespeare have no file to download: LEAF's scripts build the JSON files from NIST SD19
# (by_class.zip, by_write.zip) and Project Gutenberg's complete works.
LEAF_DATASETS = ('femnist', 'shakespeare')


def leaf_instructions(dataset: str, data_dir: str) -> str:
  return (f'{dataset} is built by LEAF\'s own scripts (no file of it is published): on a machine with internet '
          f'access run\n  git clone https://github.com/TalwalkarLab/leaf && cd leaf/data/{dataset} && ./preprocess.sh\n'
          f'(it downloads the raw data and writes data/all_data/*.json), then copy leaf/data/{dataset}/data to '
          f'{os.path.join(data_dir, dataset)} or pass --config.data.data_dir=<...>/leaf/data/{dataset}/data')


def _finite_in(v, lo, hi, lo_open=False):
  return (isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
          and (v > lo if lo_open else v >= lo) and v <= hi)


def check_args(*, source, split, fraction, iid_user_fraction, iid_sizes, min_samples, train_split,
               train_fraction, seed, num_clients=0, max_samples=0):
  """Bad arguments -> ConfigError naming the data field (before any file is read)."""
  check_arg('source', source, source in ('auto', 'all_data', 'leaf_split'), "allowed: 'auto', 'all_data', 'leaf_split'")
  check_arg('split', split, split in ('', 'niid', 'iid'), "allowed: 'niid', 'iid' ('' = niid; as made by LEAF "
         "with source='leaf_split')")
  check_arg('fraction', fraction, _finite_in(fraction, 0, 1, lo_open=True), 'a number in (0, 1]')
  check_arg('iid_user_fraction', iid_user_fraction, _finite_in(iid_user_fraction, 0, 1e6, lo_open=True), 'a number > 0')
  check_arg('iid_sizes', iid_sizes, iid_sizes in ('leaf', 'natural'), "allowed: 'leaf' (equal shares), 'natural'")
  if split == 'iid' and iid_sizes == 'natural':
    check_arg('iid_sizes', iid_sizes, fraction == 1 and iid_user_fraction == 1,
           "'natural' keeps every user and its size: needs data.fraction = 1 and data.iid_user_fraction = 1")
  check_arg('min_samples', min_samples, isinstance(min_samples, int) and not isinstance(min_samples, bool)
         and min_samples >= 0, 'an integer >= 0 (users with num_samples <= min_samples are dropped)')
  for name, v, what in (('num_clients', num_clients, 'users drawn at random'),
                        ('max_samples', max_samples, "the cap of a user's samples")):
    check_arg(name, v, isinstance(v, int) and not isinstance(v, bool) and v >= 0, f'an integer >= 0 ({what}; 0 = all)')
  check_arg('train_split', train_split, train_split in ('sample', 'user'), "allowed: 'sample', 'user'")
  check_arg('train_fraction', train_fraction, _finite_in(train_fraction, 0, 1, lo_open=True) and train_fraction < 1,
         'a number in (0, 1)')
  check_arg('seed', seed, isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, 'an integer >= 0')


def _pack(users: List[User], tag: str) -> Dict[str, np.ndarray]:
  return {f'{tag}_x': np.concatenate([u[1] for u in users]), f'{tag}_y': np.concatenate([u[2] for u in users]),
          f'{tag}_sizes': np.array([len(u[2]) for u in users], np.int64),
          f'{tag}_names': np.array([u[0] for u in users], dtype=str),
          f'{tag}_hier': np.array(['' if u[3] is None else u[3] for u in users], dtype=str)}


def _unpack(z, tag: str) -> List[User]:
  offs = np.concatenate([[0], np.cumsum(z[f'{tag}_sizes'])])
  x, y = z[f'{tag}_x'], z[f'{tag}_y']
  return [(str(n), x[offs[i]:offs[i + 1]], y[offs[i]:offs[i + 1]], str(h) or None)
          for i, (n, h) in enumerate(zip(z[f'{tag}_names'], z[f'{tag}_hier']))]


def _cache_path(root: str, name: str, args: dict, dirs: Sequence[str]) -> str:
  files = sorted(f for d in dirs for f in glob.glob(os.path.join(root, d, '*.json')))
  stamp = [(os.path.relpath(f, root), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
  key = hashlib.sha256(json.dumps({'v': CACHE_VERSION, 'name': name, 'args': args, 'files': stamp},
                                  sort_keys=True).encode()).hexdigest()[:16]
  return os.path.join(root, 'fedjax_flat_cache', f'{name}_{key}.npz')


def load(name: str, data_dir: Optional[str], encode, *, source='auto', split='', fraction=1.0,
         iid_user_fraction=1.0, iid_sizes='leaf', min_samples=0, train_split='sample', train_fraction=0.9,
         seed=0, cache=True, num_clients=0, max_samples=0) -> Tuple[List[User], List[User], bool, str]:
  """(train users, test users, test users are a separate population, description).

  With `cache`, the result is kept in <root>/fedjax_flat_cache/ (an .npz keyed by the arguments and the JSON
  files' names, sizes and times), so the JSON files are parsed once per setting.
  """
  args = dict(source=source, split=split, fraction=fraction, iid_user_fraction=iid_user_fraction,
              iid_sizes=iid_sizes, min_samples=min_samples, train_split=train_split,
              train_fraction=train_fraction, seed=seed, num_clients=num_clients, max_samples=max_samples)
  check_args(**args)
  root = find_root(data_dir or default_data_dir(), name)
  has_all = os.path.isdir(os.path.join(root, 'all_data'))
  if source == 'auto':
    source = 'all_data' if has_all else 'leaf_split'
  key = {k: v for k, v in args.items() if v or k not in ('num_clients', 'max_samples')}   # older caches stay valid
  path = _cache_path(root, name, {**key, 'source': source},
                     ('all_data',) if source == 'all_data' else ('train', 'test'))
  if cache and os.path.isfile(path):
    logging.info('LEAF %s: arrays from the cache %s', name, path)
    try:
      with np.load(path, allow_pickle=False) as z:
        return _unpack(z, 'train'), _unpack(z, 'test'), bool(z['population']), str(z['desc'])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:   # a damaged cache: rebuilt
      logging.warning('LEAF %s: the cache %s is unreadable (%s: %s); rebuilding it from the JSON files', name,
                      path, type(e).__name__, e)
  out = _load_json(name, root, encode, source=source, has_all=has_all,
                   **{k: v for k, v in args.items() if k != 'source'})
  if cache:
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix='.npz.tmp')
      with os.fdopen(fd, 'wb') as f:
        np.savez(f, population=np.array(out[2]), desc=np.array(out[3]), **_pack(out[0], 'train'),
                 **_pack(out[1], 'test'))
      os.replace(tmp, path)
    except OSError as e:      # a read-only data directory: no cache, same result
      logging.warning('LEAF %s: could not write the cache %s (%s)', name, path, e)
  return out


def _load_json(name, root, encode, *, source, has_all, split, fraction, iid_user_fraction, iid_sizes, min_samples,
               train_split, train_fraction, seed, num_clients, max_samples):
  if source == 'leaf_split':
    if num_clients or max_samples:
      raise ConfigError('data.num_clients' if num_clients else 'data.max_samples', num_clients or max_samples,
                        "LEAF's own train/test files are used as they are: 0, or read all_data/ with "
                        "data.source='all_data'")
    if split == 'iid':
      raise ConfigError('data.split', split, "LEAF's own train/test files are used as they are: produce IID files "
                        "with LEAF (./preprocess.sh -s iid ...) or read all_data/ with data.source='all_data'")
    for sub in ('train', 'test'):
      if not os.path.isdir(os.path.join(root, sub)):
        raise FileNotFoundError(f'{name}: {os.path.join(root, sub)} not found (LEAF\'s preprocess.sh -t sample '
                                f'writes data/train and data/test)')
    train = [u for users in read_leaf_dir(os.path.join(root, 'train'), encode) for u in users]
    test = [u for users in read_leaf_dir(os.path.join(root, 'test'), encode) for u in users]
    names = {u for u, _, _, _ in train}
    population = any(u not in names for u, _, _, _ in test)      # LEAF's -t user: other users
    return train, test, population, f'{name}(leaf train/test files)'
  if not has_all:
    raise FileNotFoundError(f'{name}: {os.path.join(root, "all_data")} not found (LEAF\'s ./preprocess.sh '
                            f'writes it first)')
  files = read_leaf_dir(os.path.join(root, 'all_data'), encode)
  train, test, population = prepare(files, split=split or 'niid', fraction=fraction,
                                    iid_user_fraction=iid_user_fraction, iid_sizes=iid_sizes,
                                    min_samples=min_samples, train_split=train_split,
                                    train_fraction=train_fraction, seed=seed, num_clients=num_clients,
                                    max_samples=max_samples)
  return train, test, population, f'{name}({split or "niid"}, seed={seed})'


def to_dataset(train: List[User], test: List[User], population: bool, *, num_classes: int, name: str,
               task=None, targets=None) -> FederatedDataset:
  """Users -> FederatedDataset (clients in the given order); `targets(x, y)` maps raw labels if set."""
  if not train:
    raise LeafFormatError(f'{name}: no training users left (check fraction / min_samples)')
  cat = lambda us, i, like: (np.concatenate([u[i] for u in us]) if us else np.zeros((0,) + like.shape[1:], like.dtype))  # noqa: E731
  x, y = cat(train, 1, train[0][1]), cat(train, 2, train[0][2])
  tx, ty = cat(test, 1, train[0][1]), cat(test, 2, train[0][2])
  if targets is not None:
    y, ty = targets(x, y), targets(tx, ty)
  groups = lambda us: np.split(np.arange(sum(len(u[2]) for u in us)), np.cumsum([len(u[2]) for u in us])[:-1])  # noqa: E731
  kw = dict(client_names=[u[0] for u in train])
  if population:
    kw.update(test_population_indices=groups(test), test_client_names=[u[0] for u in test])
  else:
    if [u[0] for u in test] != kw['client_names']:
      raise LeafFormatError(f'{name}: the test files hold other users than the train files (per-sample split '
                            'expected: one test split per training user)')
    kw['client_test_indices'] = groups(test)
  ds = FederatedDataset.from_client_indices(x, y, groups(train), tx, ty, num_classes, name=name, task=task, **kw)
  ds.hierarchies = [u[3] for u in train]
  return ds


@register('femnist', rules={'num_clients': DataValue(None, 'int', lo=0, what='users drawn at random; 0 = every user')})
def _femnist(data_dir=None, source='auto', split='', fraction=1.0, iid_user_fraction=1.0, iid_sizes='leaf',
             min_samples=0, train_split='sample', train_fraction=0.9, seed=0, cache=True, num_clients=0,
             max_samples=0, **unused):
  del unused
  train, test, pop, desc = load('femnist', data_dir, encode_femnist, source=source, split=split,
                                fraction=fraction, iid_user_fraction=iid_user_fraction, iid_sizes=iid_sizes,
                                min_samples=min_samples, train_split=train_split,
                                train_fraction=train_fraction, seed=seed, cache=cache, num_clients=num_clients,
                                max_samples=max_samples)
  return to_dataset(train, test, pop, num_classes=FEMNIST_CLASSES, name=desc)


def shakespeare_task():
  return text_tasks.NextToken(ignore_index=SHAKESPEARE_PAD, oov_ids=(SHAKESPEARE_OOV,), bos_id=SHAKESPEARE_BOS,
                              eos_id=SHAKESPEARE_EOS, accuracy_excludes=('pad',))


@register('shakespeare',
          task=lambda d: 'next_token' if (d.get('target') or 'sequence') == 'sequence' else 'classification',
          rules={'num_clients': DataValue(None, 'int', lo=0, what='users drawn at random; 0 = every user')})
def _shakespeare(data_dir=None, source='auto', split='', fraction=1.0, iid_user_fraction=1.0, iid_sizes='leaf',
                 min_samples=0, train_split='sample', train_fraction=0.9, seed=0, target='sequence', cache=True,
                 num_clients=0, max_samples=0, **unused):
  del unused
  check_arg('target', target, target in ('sequence', 'next'), "allowed: 'sequence' (the next 80 characters), "
         "'next' (the one next character; model_kwargs.readout='last')")
  train, test, pop, desc = load('shakespeare', data_dir, encode_shakespeare, source=source, split=split,
                                fraction=fraction, iid_user_fraction=iid_user_fraction, iid_sizes=iid_sizes,
                                min_samples=min_samples, train_split=train_split,
                                train_fraction=train_fraction, seed=seed, cache=cache, num_clients=num_clients,
                                max_samples=max_samples)
  if target == 'sequence':
    return to_dataset(train, test, pop, num_classes=SHAKESPEARE_VOCAB, name=desc, task=shakespeare_task(),
                      targets=shakespeare_targets)
  return to_dataset(train, test, pop, num_classes=SHAKESPEARE_VOCAB, name=desc,
                    targets=lambda x, y: y.astype(np.int32))
