"""StackOverflow: TFF's tokenization against hand-computed ids, the word-count file, TFF's SQLite and FedJAX's
per-client SQLite written by the tests in those formats, the cache, errors."""
import os
import tarfile

import numpy as np
import pytest

from fedjax_flat.data import registry

from fedjax_flat.data.sources import stackoverflow as so
from fedjax_flat.errors import ConfigError
from tests.fixtures.data_files import make_stackoverflow_fedjax, make_stackoverflow_tff, write_word_counts

WORDS = [('the', 90), ('.', 80), ('is', 70), ('a', 60), ('to', 50), ('python', 40)]


def test_special_ids_follow_tff():
  assert so.special_ids(10000) == {'pad': 0, 'oov': 10001, 'bos': 10002, 'eos': 10003}


def test_tokenizer_hand_computed():
  tok = so.Tokenizer([w for w, _ in WORDS[:3]], sequence_length=4)  # the 1, . 2, is 3; oov 4, bos 5, eos 6
  x, y = tok([b'the cat is .', 'the', 'is the the the is', 'a  b'])
  # 'the cat is .': 4 words = sequence_length -> no eos; [bos the oov is .]
  np.testing.assert_array_equal(x[0], [5, 1, 4, 3]); np.testing.assert_array_equal(y[0], [1, 4, 3, 2])
  # 'the': [bos the eos pad pad]
  np.testing.assert_array_equal(x[1], [5, 1, 6, 0]); np.testing.assert_array_equal(y[1], [1, 6, 0, 0])
  # 5 words: cut to 4, no eos
  np.testing.assert_array_equal(x[2], [5, 3, 1, 1]); np.testing.assert_array_equal(y[2], [3, 1, 1, 1])
  # split on single spaces (TF's tf.strings.split(sep=' ')): 'a  b' -> ['a', '', 'b'], all oov
  np.testing.assert_array_equal(x[3], [5, 4, 4, 4]); np.testing.assert_array_equal(y[3], [4, 4, 4, 6])
  assert x.dtype == np.int16


def test_word_counts_plain_and_archive(tmp_path):
  p = tmp_path / so.WORD_COUNT_FILE
  write_word_counts(str(p), WORDS)
  assert so.read_word_counts(str(p), 3) == WORDS[:3]
  arc = tmp_path / 'a' / so.WORD_COUNT_ARCHIVE
  arc.parent.mkdir()
  with tarfile.open(arc, 'w:bz2') as tar:
    tar.add(str(p), arcname=so.WORD_COUNT_FILE)
  assert so.read_word_counts(str(arc)) == WORDS
  assert so.find_word_counts(str(arc.parent)) == str(arc)
  p.write_text('the 3\nthe 2\n')
  with pytest.raises(so.StackOverflowFormatError, match='twice'):
    so.read_word_counts(str(p))
  p.write_text('the three\n')
  with pytest.raises(so.StackOverflowFormatError, match='word count'):
    so.read_word_counts(str(p))


def _splits():
  rng = np.random.default_rng(0)
  vocab = [w for w, _ in WORDS] + ['java', 'null']
  sent = lambda: ' '.join(rng.choice(vocab, rng.integers(1, 8)))   # noqa: E731
  return {'train': {f'{k:05d}': [sent() for _ in range(n)] for k, n in enumerate((3, 7, 2, 5, 4))},
          'heldout': {'99999': ['the']},
          'test': {'10': [sent() for _ in range(6)], '11': [sent() for _ in range(5)]}}


def _write(tmp_path, fmt='tff'):
  splits = _splits()
  write_word_counts(str(tmp_path / so.WORD_COUNT_FILE), WORDS)
  if fmt == 'tff':
    make_stackoverflow_tff(str(tmp_path / so.TFF_FILE), splits)
  else:
    for split, name in so.FEDJAX_FILES.items():
      make_stackoverflow_fedjax(str(tmp_path / name), splits[split])
  return splits


def _load(tmp_path, **kw):
  args = dict(data_dir=str(tmp_path), vocab_size=4, sequence_length=5, max_sentences_per_client=4,
              test_examples=8, seed=0)
  args.update(kw)
  return registry.get_dataset('stackoverflow', **args)


def test_tff_sqlite(tmp_path):
  splits = _write(tmp_path)
  ds = _load(tmp_path)
  assert ds.num_classes == 8 and ds.input_shape == (5,) and ds.label_shape == (5,)
  assert ds.task.name == 'next_token' and ds.task.oov_ids == (5,) and (ds.task.bos_id, ds.task.eos_id) == (6, 7)
  assert list(ds.client_names) == sorted(splits['train'])
  tok = so.Tokenizer([w for w, _ in WORDS[:4]], 5)
  for k, cid in enumerate(ds.client_names):
    x, y = ds.client_examples(k)
    wx, wy = tok(splits['train'][cid][:4])           # the client's first 4 sentences, in stored order
    np.testing.assert_array_equal(x, wx)
    np.testing.assert_array_equal(y, wy)
  assert len(ds.test_y) == 8                          # 8 of the 11 test sentences, drawn at random
  all_test = {tuple(r) for r in tok(splits['test']['10'] + splits['test']['11'])[0]}
  assert {tuple(r) for r in ds.test_x} <= all_test
  sub = _load(tmp_path, num_clients=2, seed=1, cache=False)
  assert sub.num_clients == 2 and set(sub.client_names) <= set(splits['train'])
  assert _load(tmp_path, test_examples=0, cache=False).test_y.shape == (11, 5)


def test_cache_is_used_and_keyed_by_arguments(tmp_path, monkeypatch):
  _write(tmp_path)
  a = _load(tmp_path)
  assert len(os.listdir(tmp_path / 'stackoverflow_cache')) == 1
  monkeypatch.setattr(so, '_tokenize_all', lambda *a, **k: (_ for _ in ()).throw(AssertionError('re-parsed')))
  b = _load(tmp_path)
  np.testing.assert_array_equal(a.x, b.x)
  np.testing.assert_array_equal(a.test_y, b.test_y)
  with pytest.raises(AssertionError, match='re-parsed'):
    _load(tmp_path, seed=5)


def test_fedjax_sqlite_gives_the_same_training_data(tmp_path):
  (tmp_path / 'tff').mkdir()
  (tmp_path / 'fj').mkdir()
  _write(tmp_path / 'tff', 'tff')
  _write(tmp_path / 'fj', 'fedjax')
  a, b = _load(tmp_path / 'tff', cache=False), _load(tmp_path / 'fj', cache=False)
  assert list(a.client_names) == list(b.client_names)
  np.testing.assert_array_equal(a.x, b.x)
  np.testing.assert_array_equal(a.y, b.y)
  assert b.test_y.shape == (8, 5)


def test_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='download.py --dataset=stackoverflow'):
    _load(tmp_path)
  write_word_counts(str(tmp_path / so.WORD_COUNT_FILE), WORDS)
  with pytest.raises(FileNotFoundError, match='download.py --dataset=stackoverflow'):
    _load(tmp_path)
  for field, value in (('num_clients', -1), ('vocab_size', 0), ('format', 'h5'), ('sequence_length', 1.5),
                       ('test_examples', True)):
    with pytest.raises(ConfigError, match=f'data.{field}'):
      _load(tmp_path, **{field: value})
  _write(tmp_path)
  with pytest.raises(so.StackOverflowFormatError, match='fewer than vocab_size'):
    _load(tmp_path, vocab_size=50)
  import sqlite3
  con = sqlite3.connect(tmp_path / so.TFF_FILE)
  con.execute("INSERT INTO examples VALUES ('train', '00000', ?)", (b'\x0a\xff\xff',))   # a truncated proto
  con.commit()
  con.close()
  with pytest.raises(so.StackOverflowFormatError, match='client 00000'):
    _load(tmp_path, cache=False)
  (tmp_path / so.TFF_FILE).write_bytes(b'not sqlite at all' * 100)
  with pytest.raises(so.StackOverflowFormatError):
    _load(tmp_path, cache=False)


@pytest.mark.parametrize('case', sorted(__import__('tests.fixtures.hostile', fromlist=['x']).SQLITE_CASES))
def test_corrupt_sqlite_is_a_data_format_error(tmp_path, case):
  """Every damaged stackoverflow.sqlite: the project's DataFormatError naming the file, never sqlite3's."""
  from fedjax_flat.errors import DataFormatError
  from tests.fixtures import hostile
  d = hostile.stackoverflow_dir(str(tmp_path), case)
  with pytest.raises(DataFormatError, match='stackoverflow.sqlite'):
    registry.get_dataset('stackoverflow', data_dir=d, vocab_size=5, test_examples=10, cache=False)
