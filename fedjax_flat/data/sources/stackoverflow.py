"""StackOverflow next-word prediction (TFF's federated Stack Overflow; Reddi et al. 2021's task).

Files read (both real public formats; `data.format='auto'` picks by the tables present):
* TFF SQLite `stackoverflow.sqlite` (the decompressed `stackoverflow.sqlite.lzma` that TFF's
  `tff.simulation.datasets.stackoverflow.load_data` downloads): tables
    examples(split_name TEXT, client_id TEXT, serialized_example_proto BLOB)   one tf.train.Example per row
    client_metadata(client_id TEXT, split_name TEXT, num_examples INTEGER)
  with split names 'train', 'heldout', 'test' and features creation_date, score, tags, title, tokens, type;
  only `tokens` (a space-separated sentence, bytes) is read, by a minimal protobuf reader
  (pam.parse_tf_example: no TensorFlow needed).
* FedJAX SQLite `stackoverflow_{train,held_out,test}.sqlite` (one row per client: zlib(msgpack(dict of
  arrays)), `tokens` a bytes array), read by pam.read_fedjax_sqlite.
* The vocabulary: TFF's `stackoverflow.word_count` (one "word count" line per word, most frequent first;
  from stackoverflow.word_count.tar.bz2, which may be given as is).

Tokenization (TFF's word_prediction_preprocessing, re-implemented): the `vocab_size` (10,000) first words of the
word-count file get ids 1..V; pad = 0, oov = V + 1, bos = V + 2, eos = V + 3 (V + 4 = 10,004 ids). A sentence
is split on single spaces, cut to `sequence_length` (20) words, mapped to ids (unknown words -> oov), followed by
eos only when it has fewer than 20 words, preceded by bos, right-padded to 21; x = ids[:-1], y = ids[1:].
At most `max_sentences_per_client` (1,000) sentences per client, its first ones in stored order (TFF's
`dataset.take(1000)` before shuffling). The task is `next_token` with TFF's headline accuracy (targets that
are pad, oov, bos or eos excluded; tasks/next_token.py).

Population: `num_clients` training clients (0 = all 342,477), a seeded random subset of the train split in
client-id order. Test: `test_examples` sentences drawn at random (seeded) from the test split (the thesis
evaluates 10,000 random test sentences; 0 = the whole test split). The tokenized arrays are cached in
`<data_dir>/stackoverflow_cache/` keyed by every argument and the source files' sizes, so parsing happens once.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import tarfile
import tempfile
import zipfile
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from fedjax_flat import errors
from fedjax_flat.data.sources import pam
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.registry import check_arg
from fedjax_flat.schema import DataValue
from fedjax_flat.data.registry import register
from fedjax_flat.data.download import default_data_dir
from fedjax_flat.tasks import next_token as text_tasks

TFF_FILE = 'stackoverflow.sqlite'
FEDJAX_FILES = {'train': 'stackoverflow_train.sqlite', 'test': 'stackoverflow_test.sqlite',
                'heldout': 'stackoverflow_held_out.sqlite'}
WORD_COUNT_FILE = 'stackoverflow.word_count'
WORD_COUNT_ARCHIVE = 'stackoverflow.word_count.tar.bz2'
CACHE_VERSION = 1


class StackOverflowFormatError(errors.DataFormatError):
  """A StackOverflow file exists but is not in the TFF / FedJAX format."""


def special_ids(vocab_size: int) -> Dict[str, int]:
  """TFF's layout with one oov bucket: pad 0, words 1..V, oov V+1, bos V+2, eos V+3."""
  return {'pad': 0, 'oov': vocab_size + 1, 'bos': vocab_size + 2, 'eos': vocab_size + 3}


def task(vocab_size: int):
  s = special_ids(vocab_size)
  return text_tasks.NextToken(ignore_index=s['pad'], oov_ids=(s['oov'],), bos_id=s['bos'], eos_id=s['eos'])


# ----------------------------------------------------------------------------------------------------
# Vocabulary.


def _download_hint(data_dir: str) -> str:
  return f'python experiments/download.py --dataset=stackoverflow --data_dir={data_dir}'


def read_word_counts(path: str, limit: Optional[int] = None) -> List[Tuple[str, int]]:
  """(word, count) pairs of `stackoverflow.word_count` (or its .tar.bz2), in file order; the first `limit`."""
  if path.endswith('.tar.bz2'):
    with tarfile.open(path, 'r:bz2') as tar:
      member = next((m for m in tar if m.isfile() and os.path.basename(m.name) == WORD_COUNT_FILE), None)
      if member is None:
        raise StackOverflowFormatError(f'{path} holds no {WORD_COUNT_FILE}')
      text = tar.extractfile(member).read().decode('utf-8')
  else:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  out, seen = [], set()
  for i, line in enumerate(io.StringIO(text)):
    if limit is not None and len(out) >= limit:
      break
    parts = line.split()
    if not parts:
      continue
    if len(parts) != 2 or not parts[1].lstrip('-').isdigit():
      raise StackOverflowFormatError(f'{path} line {i + 1}: expected "word count", got {line.strip()[:60]!r}')
    if parts[0] in seen:
      raise StackOverflowFormatError(f'{path} line {i + 1}: word {parts[0]!r} listed twice')
    seen.add(parts[0])
    out.append((parts[0], int(parts[1])))
  return out


def find_word_counts(data_dir: str) -> str:
  for name in (WORD_COUNT_FILE, WORD_COUNT_ARCHIVE):
    p = os.path.join(data_dir, name)
    if os.path.isfile(p):
      return p
  raise FileNotFoundError(f'StackOverflow vocabulary not found: expected {os.path.join(data_dir, WORD_COUNT_FILE)} '
                          f'or {WORD_COUNT_ARCHIVE}. Download it with:\n  {_download_hint(data_dir)}')


class Tokenizer:
  """TFF's StackOverflow word tokenizer (module docstring), in numpy."""

  def __init__(self, vocab: Sequence[str], sequence_length: int = 20):
    self.vocab_size = len(vocab)
    self.sequence_length = int(sequence_length)
    self.ids = {w: i + 1 for i, w in enumerate(vocab)}
    s = special_ids(self.vocab_size)
    self.pad, self.oov, self.bos, self.eos = s['pad'], s['oov'], s['bos'], s['eos']
    self.dtype = np.int16 if self.vocab_size + 4 <= np.iinfo(np.int16).max else np.int32

  def __call__(self, sentences: Iterable) -> Tuple[np.ndarray, np.ndarray]:
    rows = []
    for s in sentences:
      s = s.decode('utf-8', errors='replace') if isinstance(s, bytes) else str(s)
      words = s.split(' ')[:self.sequence_length]
      ids = [self.bos] + [self.ids.get(w, self.oov) for w in words]
      if len(words) < self.sequence_length:
        ids.append(self.eos)
      rows.append(ids + [self.pad] * (self.sequence_length + 1 - len(ids)))
    a = np.array(rows, self.dtype).reshape(-1, self.sequence_length + 1)
    return a[:, :-1], a[:, 1:]


# ----------------------------------------------------------------------------------------------------
# Sentences from the TFF or FedJAX SQLite files.


def _tables(path: str) -> set:
  con = sqlite3.connect(f'file:{path}?mode=ro', uri=True)
  try:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table';")}
  except sqlite3.DatabaseError as e:
    raise StackOverflowFormatError(f'{path} is not an SQLite file ({e})') from e
  finally:
    con.close()


def _tokens_of_proto(proto: bytes, where: str) -> bytes:
  try:
    ex = pam.parse_tf_example(bytes(proto))
  except pam.PamFormatError as e:
    raise StackOverflowFormatError(f'{where}: {e}') from e
  tok = ex.get('tokens')
  if not isinstance(tok, list) or len(tok) != 1:
    raise StackOverflowFormatError(f'{where}: example has no bytes feature "tokens"')
  return tok[0]


class TffSource:
  """TFF's one-example-per-row SQLite."""

  def __init__(self, path: str):
    self.path = path
    self.con = sqlite3.connect(f'file:{path}?mode=ro', uri=True)

  def client_ids(self, split: str) -> List[str]:
    try:
      return [str(r[0]) for r in self.con.execute(
          'SELECT client_id FROM client_metadata WHERE split_name = ? ORDER BY client_id;', [split])]
    except sqlite3.DatabaseError as e:
      raise StackOverflowFormatError(f'{self.path}: not TFF\'s stackoverflow.sqlite ({e})') from e

  def sentences(self, split: str, cid: str, limit: int) -> List[bytes]:
    q = 'SELECT serialized_example_proto FROM examples WHERE split_name = ? AND client_id = ? ORDER BY rowid'
    rows = self.con.execute(q + (' LIMIT ?;' if limit else ';'), [split, cid] + ([limit] if limit else []))
    return [_tokens_of_proto(p, f'{self.path}: client {cid}') for (p,) in rows]

  def random_sentences(self, split: str, n: int, rng) -> List[bytes]:
    rowids = np.fromiter((r[0] for r in self.con.execute(
        'SELECT rowid FROM examples WHERE split_name = ?;', [split])), np.int64)
    if n and n < len(rowids):
      rowids = np.sort(rng.choice(rowids, n, replace=False))
    out = []
    for i in range(0, len(rowids), 500):
      chunk = [int(r) for r in rowids[i:i + 500]]
      q = f'SELECT serialized_example_proto FROM examples WHERE rowid IN ({",".join("?" * len(chunk))}) ORDER BY rowid;'
      out += [_tokens_of_proto(p, f'{self.path}: {split}') for (p,) in self.con.execute(q, chunk)]
    return out

  def close(self):
    self.con.close()


class FedjaxSource:
  """FedJAX's one-client-per-row SQLite files (one per split)."""

  def __init__(self, paths: Dict[str, str]):
    self.paths = paths
    self._order: Dict[str, List[str]] = {}

  def _path(self, split):
    p = self.paths.get(split)
    if not p or not os.path.isfile(p):
      raise FileNotFoundError(f'FedJAX StackOverflow file for split {split!r} not found ({p})')
    return p

  def client_ids(self, split: str) -> List[str]:
    con = sqlite3.connect(f'file:{self._path(split)}?mode=ro', uri=True)
    try:
      ids = [r[0] for r in con.execute('SELECT client_id FROM federated_data ORDER BY client_id;')]
    except sqlite3.DatabaseError as e:
      raise StackOverflowFormatError(f'{self._path(split)}: not a FedJAX SQLite file ({e})') from e
    finally:
      con.close()
    return [c.decode() if isinstance(c, bytes) else str(c) for c in ids]

  def _client(self, split, cid) -> np.ndarray:
    con = sqlite3.connect(f'file:{self._path(split)}?mode=ro', uri=True)
    try:
      row = con.execute('SELECT data FROM federated_data WHERE client_id = ?;', [cid.encode()]).fetchone()
      if row is None:
        row = con.execute('SELECT data FROM federated_data WHERE client_id = ?;', [cid]).fetchone()
    finally:
      con.close()
    try:
      ex = pam.decode_client_blob(row[0])
    except pam.PamFormatError as e:
      raise StackOverflowFormatError(f'{self._path(split)}: client {cid}: {e}') from e
    if 'tokens' not in ex:
      raise StackOverflowFormatError(f'{self._path(split)}: client {cid} has no "tokens" (has {sorted(ex)})')
    return np.asarray(ex['tokens'], object).reshape(-1)

  def sentences(self, split, cid, limit) -> List[bytes]:
    t = self._client(split, cid)
    return list(t[:limit] if limit else t)

  def random_sentences(self, split, n, rng) -> List[bytes]:
    everything = []
    for _, ex in pam.read_fedjax_sqlite(self._path(split)):
      if 'tokens' not in ex:
        raise StackOverflowFormatError(f'{self._path(split)}: a client has no "tokens"')
      everything.extend(np.asarray(ex['tokens'], object).reshape(-1))
    if n and n < len(everything):
      everything = [everything[i] for i in np.sort(rng.choice(len(everything), n, replace=False))]
    return everything

  def close(self):
    pass


def open_source(data_dir: str, fmt: str):
  tff = os.path.join(data_dir, TFF_FILE)
  fj = {k: os.path.join(data_dir, v) for k, v in FEDJAX_FILES.items()}
  if fmt in ('auto', 'tff') and os.path.isfile(tff):
    tables = _tables(tff)
    if not {'examples', 'client_metadata'} <= tables:
      raise StackOverflowFormatError(f'{tff}: tables {sorted(tables)}; TFF\'s format has examples and '
                                     'client_metadata')
    return TffSource(tff), [tff]
  if fmt in ('auto', 'fedjax') and os.path.isfile(fj['train']):
    return FedjaxSource(fj), [p for p in fj.values() if os.path.isfile(p)]
  raise FileNotFoundError(
      f'StackOverflow not found in {data_dir}: expected TFF\'s {TFF_FILE} (format=tff) or FedJAX\'s '
      f'{FEDJAX_FILES["train"]} + {FEDJAX_FILES["test"]} (format=fedjax). Download TFF\'s file with:\n'
      f'  {_download_hint(data_dir)}')


# ----------------------------------------------------------------------------------------------------
# The federated dataset.


def _int(v, lo):
  return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _cache_key(args: dict, files: Sequence[str]) -> str:
  stamp = [(os.path.basename(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
  blob = json.dumps({'v': CACHE_VERSION, 'args': args, 'files': stamp}, sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load(data_dir: Optional[str] = None, *, format: str = 'auto', num_clients: int = 0, vocab_size: int = 10000,  # noqa: A002
         sequence_length: int = 20, max_sentences_per_client: int = 1000, test_examples: int = 10000,
         seed: int = 0, cache: bool = True) -> FederatedDataset:
  """The federated StackOverflow next-word dataset (module docstring)."""
  check_arg('format', format, format in ('auto', 'tff', 'fedjax'), "allowed: 'auto', 'tff', 'fedjax'")
  check_arg('num_clients', num_clients, _int(num_clients, 0), 'an integer >= 0 (0 = every training client)')
  check_arg('vocab_size', vocab_size, _int(vocab_size, 1), 'an integer >= 1 (the thesis: 10000)')
  check_arg('sequence_length', sequence_length, _int(sequence_length, 1), 'an integer >= 1 (the thesis: 20)')
  check_arg('max_sentences_per_client', max_sentences_per_client, _int(max_sentences_per_client, 0),
         'an integer >= 0 (0 = no cap; the thesis: 1000)')
  check_arg('test_examples', test_examples, _int(test_examples, 0), 'an integer >= 0 (0 = the whole test split)')
  check_arg('seed', seed, _int(seed, 0), 'an integer >= 0')
  data_dir = data_dir or default_data_dir()
  vocab_path = find_word_counts(data_dir)
  src, files = open_source(data_dir, format)
  args = dict(num_clients=num_clients, vocab_size=vocab_size, sequence_length=sequence_length,
              max_sentences_per_client=max_sentences_per_client, test_examples=test_examples, seed=seed,
              format=type(src).__name__)
  name = f'stackoverflow(clients={num_clients or "all"}, seed={seed})'
  path = os.path.join(data_dir, 'stackoverflow_cache', _cache_key(args, files + [vocab_path]) + '.npz')
  arrays = None
  if cache and os.path.isfile(path):
    logging.info('StackOverflow: tokenized arrays from the cache %s', path)
    try:
      with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:   # a damaged cache: rebuilt
      logging.warning('StackOverflow: the cache %s is unreadable (%s: %s); rebuilding it', path,
                      type(e).__name__, e)
  if arrays is not None:
    src.close()
  else:
    try:
      with errors.reading(' / '.join(files), "TFF's or FedJAX's StackOverflow SQLite"):
        arrays = _tokenize_all(src, vocab_path, **{k: v for k, v in args.items() if k != 'format'})
    finally:
      src.close()
    if cache:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix='.npz.tmp')
      with os.fdopen(fd, 'wb') as f:
        np.savez(f, **arrays)
      os.replace(tmp, path)
  offs = arrays['offsets']
  groups = [np.arange(offs[k], offs[k + 1]) for k in range(len(offs) - 1)]
  return FederatedDataset.from_client_indices(
      arrays['x'], arrays['y'], groups, arrays['test_x'], arrays['test_y'], vocab_size + 4, name=name,
      client_names=[str(c) for c in arrays['client_ids']], task=task(vocab_size))


def _tokenize_all(src, vocab_path, *, num_clients, vocab_size, sequence_length, max_sentences_per_client,
                  test_examples, seed) -> Dict[str, np.ndarray]:
  vocab = [w for w, _ in read_word_counts(vocab_path, vocab_size)]
  if len(vocab) < vocab_size:
    raise StackOverflowFormatError(f'{vocab_path} lists {len(vocab)} words, fewer than vocab_size={vocab_size}')
  tok = Tokenizer(vocab, sequence_length)
  rng = np.random.default_rng(seed)
  ids = src.client_ids('train')
  if not ids:
    raise StackOverflowFormatError('the train split has no clients')
  if num_clients and num_clients < len(ids):
    ids = [ids[i] for i in np.sort(rng.choice(len(ids), num_clients, replace=False))]
  xs, ys, sizes = [], [], []
  for i, cid in enumerate(ids):
    if i % 1000 == 0:
      logging.info('StackOverflow: tokenizing client %d/%d', i, len(ids))
    x, y = tok(src.sentences('train', cid, max_sentences_per_client))
    xs.append(x)
    ys.append(y)
    sizes.append(len(x))
  logging.info('StackOverflow: sampling %s test sentences', test_examples or 'all')
  tx, ty = tok(src.random_sentences('test', test_examples, rng))
  return {'x': np.concatenate(xs), 'y': np.concatenate(ys), 'offsets': np.concatenate([[0], np.cumsum(sizes)]),
          'test_x': tx, 'test_y': ty, 'client_ids': np.array(ids, dtype=str)}


@register('stackoverflow', task='next_token',
          rules={'num_clients': DataValue(None, 'int', lo=0,
                                          what='users sampled as clients; 0 = every user of the training split')})
def _stackoverflow(data_dir=None, format='auto', num_clients=0, vocab_size=10000, sequence_length=20,  # noqa: A002
                   max_sentences_per_client=1000, test_examples=10000, seed=0, cache=True, **unused):
  del unused
  return load(data_dir, format=format, num_clients=num_clients, vocab_size=vocab_size,
              sequence_length=sequence_length, max_sentences_per_client=max_sentences_per_client,
              test_examples=test_examples, seed=seed, cache=cache)
