"""Writers of small files in exactly the official dataset formats (used by the tests/test_data_*.py)."""
from __future__ import annotations

import csv
import io
import os
import pickle
import struct
import tarfile

import numpy as np


class _Py2Pickler(pickle._Pickler):  # pure-Python pickler so `dispatch` can be extended
  """Writes bytes as Python 2 `str` opcodes (SHORT_BINSTRING/BINSTRING), as cPickle did for CIFAR."""

  def save_bytes(self, obj):
    n = len(obj)
    if n < 256:
      self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
    else:
      self.write(pickle.BINSTRING + struct.pack('<i', n) + obj)
    self.memoize(obj)

  dispatch = dict(pickle._Pickler.dispatch)
  dispatch[bytes] = save_bytes


def py2_pickle(obj) -> bytes:
  """A protocol-2 pickle shaped like the official CIFAR batches (Python 2 cPickle + numpy 1.x names)."""
  buf = io.BytesIO()
  _Py2Pickler(buf, protocol=2).dump(obj)
  return buf.getvalue().replace(b'numpy._core.multiarray', b'numpy.core.multiarray')


def to_rows(x: np.ndarray) -> np.ndarray:
  """[N, 32, 32, 3] -> the official [N, 3072] row layout (R plane, G plane, B plane)."""
  return np.ascontiguousarray(x.transpose(0, 3, 1, 2).reshape(len(x), 3072))


def _add(tar: tarfile.TarFile, name: str, data: bytes):
  info = tarfile.TarInfo(name)
  info.size = len(data)
  info.mode = 0o644
  tar.addfile(info, io.BytesIO(data))


def make_cifar10(out_dir: str, per_batch: int = 20, n_test: int = 20, *, as_tar: bool = True, seed: int = 0):
  """Writes cifar-10-python.tar.gz (or the extracted cifar-10-batches-py/); returns the arrays."""
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 256, (5 * per_batch, 32, 32, 3), dtype=np.uint8)
  y = np.tile(np.arange(10), (5 * per_batch) // 10 + 1)[:5 * per_batch]
  rng.shuffle(y)
  tx = rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8)
  ty = rng.integers(0, 10, n_test)
  members = {}
  for b in range(5):
    sl = slice(b * per_batch, (b + 1) * per_batch)
    members[f'cifar-10-batches-py/data_batch_{b + 1}'] = py2_pickle({
        b'batch_label': f'training batch {b + 1} of 5'.encode(), b'labels': [int(v) for v in y[sl]],
        b'data': to_rows(x[sl]), b'filenames': [f'f{i}.png'.encode() for i in range(sl.start, sl.stop)]})
  members['cifar-10-batches-py/test_batch'] = py2_pickle({
      b'batch_label': b'testing batch 1 of 1', b'labels': [int(v) for v in ty], b'data': to_rows(tx),
      b'filenames': [f't{i}.png'.encode() for i in range(n_test)]})
  members['cifar-10-batches-py/batches.meta'] = py2_pickle({b'label_names': [b'airplane'] * 10})
  members['cifar-10-batches-py/readme.html'] = b'<html></html>'
  _write(out_dir, 'cifar-10-python.tar.gz', members, as_tar)
  return dict(x_train=x, y_train=y.astype(np.int32), x_test=tx, y_test=ty.astype(np.int32))


def make_cifar100(out_dir: str, per_class: int = 4, n_test: int = 50, *, as_tar: bool = True, seed: int = 0,
                  duplicate_name: bool = True):
  """Writes cifar-100-python.tar.gz with `train`/`test`/`meta`; coarse label = fine // 5 here."""
  rng = np.random.default_rng(seed)
  n = 100 * per_class
  y = rng.permutation(np.repeat(np.arange(100), per_class))
  x = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
  names = [f'class{int(c)}_s_{i:06d}.png' for i, c in enumerate(y)]
  if duplicate_name:  # the official train set repeats 'baby_s_000333.png' (labels 2 and 35)
    i2, i35 = int(np.flatnonzero(y == 2)[0]), int(np.flatnonzero(y == 35)[0])
    names[i2] = names[i35] = 'baby_s_000333.png'
  tx = rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8)
  ty = rng.integers(0, 100, n_test)

  def batch(label, xs, ys, fn):
    return py2_pickle({b'filenames': [f.encode() for f in fn], b'batch_label': label,
                       b'fine_labels': [int(v) for v in ys], b'coarse_labels': [int(v) // 5 for v in ys],
                       b'data': to_rows(xs)})

  members = {
      'cifar-100-python/train': batch(b'training batch 1 of 1', x, y, names),
      'cifar-100-python/test': batch(b'testing batch 1 of 1', tx, ty, [f't{i}.png' for i in range(n_test)]),
      'cifar-100-python/meta': py2_pickle({b'fine_label_names': [b'x'] * 100, b'coarse_label_names': [b'y'] * 20}),
      'cifar-100-python/file.txt~': b'',
  }
  _write(out_dir, 'cifar-100-python.tar.gz', members, as_tar)
  return dict(x_train=x, y_train=y.astype(np.int32), x_test=tx, y_test=ty.astype(np.int32),
              coarse_train=(y // 5).astype(np.int32), filenames=names)


def _write(out_dir, tar_name, members, as_tar):
  os.makedirs(out_dir, exist_ok=True)
  if as_tar:
    with tarfile.open(os.path.join(out_dir, tar_name), 'w:gz') as tar:
      for name, data in members.items():
        _add(tar, name, data)
  else:
    for name, data in members.items():
      p = os.path.join(out_dir, name)
      os.makedirs(os.path.dirname(p), exist_ok=True)
      with open(p, 'wb') as f:
        f.write(data)


def write_jpeg(path: str, w: int, h: int, seed: int = 0, quality: int = 90):
  from PIL import Image
  rng = np.random.default_rng(seed)
  # smooth gradients + noise: compresses like a photo, not like pure noise
  yy, xx = np.mgrid[0:h, 0:w]
  base = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)),
                   np.full_like(xx, int(rng.integers(0, 256)))], -1)
  img = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.fromarray(img).save(path, format='JPEG', quality=quality)


def make_landmarks(data_dir: str, name: str = 'gld23k', num_users: int = 4, per_user=(3, 5, 2, 4),
                   num_test: int = 5, num_classes: int = 7, size=(96, 64), nested: bool = True, seed: int = 0):
  """TFF-style split CSVs + GLDv2-layout JPEGs (<images>/<a>/<b>/<c>/<id>.jpg). Returns the rows."""
  rng = np.random.default_rng(seed)
  csv_dir = os.path.join(data_dir, 'gld23k' if name == 'gld23k' else 'landmarks-user-160k')
  train_csv = 'mini_gld_train_split.csv' if name == 'gld23k' else 'federated_train.csv'
  test_csv = 'mini_gld_test.csv' if name == 'gld23k' else 'test.csv'
  os.makedirs(csv_dir, exist_ok=True)
  images_dir = os.path.join(data_dir, 'gldv2', 'train')
  rows, test_rows, k = [], [], 0
  for u in range(num_users):
    for _ in range(per_user[u % len(per_user)]):
      rows.append((f'{u * 37 + 11}', f'{int(rng.integers(0, 16 ** 15)):016x}', int(rng.integers(0, num_classes))))
  for _ in range(num_test):
    test_rows.append((f'{int(rng.integers(0, 16 ** 15)):016x}', int(rng.integers(0, num_classes))))
  with open(os.path.join(csv_dir, train_csv), 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['user_id', 'image_id', 'class'])
    w.writerows(rows)
  with open(os.path.join(csv_dir, test_csv), 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['image_id', 'class'])
    w.writerows(test_rows)
  for i, image_id in enumerate([r[1] for r in rows] + [r[0] for r in test_rows]):
    sub = os.path.join(image_id[0], image_id[1], image_id[2]) if nested else ''
    ww, hh = (size if i % 2 == 0 else size[::-1])
    write_jpeg(os.path.join(images_dir, sub, f'{image_id}.jpg'), ww, hh, seed=i)
  return dict(rows=rows, test_rows=test_rows, images_dir=images_dir)


# ----------------------------------------------------------------------------------------------------
# LEAF JSON (FEMNIST, Shakespeare), written as LEAF's data_to_json / sample / split scripts write it.


def write_leaf_json(path: str, users, user_data, hierarchies=None):
  import json
  d = {'users': list(users)}
  if hierarchies is not None:
    d['hierarchies'] = list(hierarchies)
  d['num_samples'] = [len(user_data[u]['y']) for u in users]
  d['user_data'] = user_data
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(d, f)


def make_femnist_leaf(root: str, sizes_per_file=((5, 9, 3), (7, 4)), seed: int = 0):
  """root/all_data/all_data_<i>.json: writers f<i>_<j> with `size` 784-float images (k/255) and labels."""
  rng = np.random.default_rng(seed)
  out = {}
  for i, sizes in enumerate(sizes_per_file):
    users, data = [], {}
    for j, n in enumerate(sizes):
      u = f'f{i}_{j:04d}'
      x = rng.integers(0, 256, (n, 784)) / 255.0
      y = rng.integers(0, 62, n)
      users.append(u)
      data[u] = {'x': x.tolist(), 'y': [int(v) for v in y]}
      out[u] = (x, y)
    write_leaf_json(os.path.join(root, 'all_data', f'all_data_{i}.json'), users, data)
  return out


def shakespeare_windows(text: str, seq_len: int = 80):
  """LEAF's examples of one role's text: every window of seq_len characters and the character after it."""
  return [text[i:i + seq_len] for i in range(len(text) - seq_len)], [text[i + seq_len] for i in range(len(text) - seq_len)]


def make_shakespeare_leaf(root: str, roles, play: str = 'THE_TEMPEST'):
  """root/all_data/all_data.json with one user per (role name, text) and LEAF's hierarchies (the play)."""
  users, data = [], {}
  for name, text in roles:
    x, y = shakespeare_windows(text)
    users.append(name)
    data[name] = {'x': x, 'y': y}
  write_leaf_json(os.path.join(root, 'all_data', 'all_data.json'), users, data, hierarchies=[play] * len(users))
  return data


# ----------------------------------------------------------------------------------------------------
# StackOverflow: TFF's SQLite (one tf.train.Example per row) and FedJAX's per-client SQLite.


def _bytes_feature(values):
  from test_data_pam import _ld
  return _ld(1, b''.join(_ld(1, v) for v in values))


def stackoverflow_example(tokens: str, score: int = 3) -> bytes:
  """A serialized tf.train.Example with TFF's six StackOverflow features."""
  from test_data_pam import _int64_feature, _tf_example
  return _tf_example({'creation_date': _bytes_feature([b'2010-01-08 09:34:05 UTC']),
                      'score': _int64_feature([score], False), 'tags': _bytes_feature([b'python|sql']),
                      'title': _bytes_feature([b'a title']), 'tokens': _bytes_feature([tokens.encode()]),
                      'type': _bytes_feature([b'answer'])})


def make_stackoverflow_tff(path: str, splits):
  """splits: {split_name: {client_id: [sentence, ...]}} -> TFF's stackoverflow.sqlite (with its indices)."""
  import sqlite3
  con = sqlite3.connect(path)
  con.execute('CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
              'serialized_example_proto BLOB NOT NULL);')
  con.execute('CREATE INDEX idx_examples_client_id ON examples (client_id);')
  con.execute('CREATE INDEX idx_examples_client_id_split ON examples (split_name, client_id);')
  con.execute('CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, '
              'num_examples INTEGER NOT NULL);')
  for split, clients in splits.items():
    for cid, sents in clients.items():
      for s in sents:
        con.execute('INSERT INTO examples VALUES (?, ?, ?)', (split, cid, stackoverflow_example(s)))
      con.execute('INSERT INTO client_metadata VALUES (?, ?, ?)', (cid, split, len(sents)))
  con.commit()
  con.close()


def make_stackoverflow_fedjax(path: str, clients):
  """{client_id: [sentence, ...]} -> a FedJAX SQLite file; `tokens` a bytes array (msgpack ExtType 4)."""
  import sqlite3
  import zlib
  import msgpack

  def ext(x):
    if isinstance(x, np.ndarray) and x.dtype == object:
      return msgpack.ExtType(4, msgpack.packb((x.shape, list(x.ravel())), use_bin_type=True))
    if isinstance(x, np.ndarray):
      return msgpack.ExtType(1, msgpack.packb((x.shape, x.dtype.name, x.tobytes('C')), use_bin_type=True))
    raise TypeError(type(x))
  con = sqlite3.connect(path)
  con.execute('CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY, data BLOB NOT NULL, '
              'num_examples INTEGER NOT NULL);')
  for cid, sents in clients.items():
    ex = {'tokens': np.array([s.encode() for s in sents], dtype=object),
          'type': np.array([b'answer'] * len(sents), dtype=object), 'score': np.arange(len(sents), dtype=np.int64)}
    con.execute('INSERT INTO federated_data VALUES (?, ?, ?);',
                (cid.encode(), zlib.compress(msgpack.packb(ex, default=ext, strict_types=True)), len(sents)))
  con.commit()
  con.close()


def write_word_counts(path: str, words_counts):
  with open(path, 'w') as f:
    for w, c in words_counts:
      f.write(f'{w} {c}\n')
