"""LEAF FEMNIST / Shakespeare readers on JSON files written in LEAF's format; LEAF's sampling and split
semantics; the Shakespeare vocabulary and targets against hand-computed ids."""
import os

import numpy as np
import pytest

from fedjax_flat.data.sources import leaf

from fedjax_flat.data import registry
from fedjax_flat.errors import ConfigError
from tests.fixtures.data_files import make_femnist_leaf, make_shakespeare_leaf, shakespeare_windows, write_leaf_json

SIZES = ((5, 9, 3, 1, 2), (7, 4, 12))


def _rows(x):
  return sorted(map(bytes, np.asarray(x).reshape(len(x), -1)))


def test_femnist_niid_by_sample_split(tmp_path):
  raw = make_femnist_leaf(str(tmp_path), SIZES)
  ds = registry.get_dataset('femnist', data_dir=str(tmp_path), seed=3)
  # users with < 2 samples are dropped (LEAF's split_data); the others keep their order within each file
  assert list(ds.client_names) == ['f0_0000', 'f0_0001', 'f0_0002', 'f0_0004', 'f1_0000', 'f1_0001', 'f1_0002']
  assert ds.num_classes == 62 and ds.input_shape == (28, 28, 1) and ds.x.dtype == np.uint8
  for k, u in enumerate(ds.client_names):
    x, y = ds.client_examples(k)
    tx, ty = ds.client_test_examples(k)
    n = len(raw[u][1])
    assert len(y) == (1 if n == 2 else max(1, int(0.9 * n))) and len(y) + len(ty) == n
    # train + test = the writer's samples, exactly (pixels k/255 -> uint8 k)
    want = np.round(raw[u][0] * 255).astype(np.uint8)
    assert _rows(np.concatenate([x, tx])) == _rows(want)
    # both parts keep the original order (LEAF iterates j in range(n))
    pos = [next(i for i in range(n) if np.array_equal(want[i], r.ravel())) for r in x]
    assert pos == sorted(pos)
    lab = {bytes(want[i]): raw[u][1][i] for i in range(n)}
    assert [lab[bytes(r.ravel())] for r in x] == list(y)
  assert len(ds.test_x) == sum(len(ds.client_test_examples(k)[1]) for k in range(ds.num_clients))


def test_femnist_split_is_seeded(tmp_path):
  make_femnist_leaf(str(tmp_path), SIZES)
  a = registry.get_dataset('femnist', data_dir=str(tmp_path), seed=1)
  b = registry.get_dataset('femnist', data_dir=str(tmp_path), seed=1)
  c = registry.get_dataset('femnist', data_dir=str(tmp_path), seed=2)
  np.testing.assert_array_equal(a.x, b.x)
  assert not np.array_equal(a.x, c.x)


def _users(sizes, seed=0):
  rng = np.random.default_rng(seed)
  return [(f'u{i}', np.arange(n)[:, None] + 1000 * i, rng.integers(0, 5, n), 'h') for i, n in enumerate(sizes)]


def test_niid_sampling_whole_users_until_the_fraction():
  users = _users((10, 20, 30, 40))
  out = leaf.sample_niid(users, 0.5, np.random.default_rng(0))
  assert sum(len(u[2]) for u in out) == int(0.5 * 100)
  full = {u[0]: u for u in users}
  for name, x, y, _ in out[:-1]:                 # whole users
    np.testing.assert_array_equal(x, full[name][1])
  name, x, _, _ = out[-1]                         # the last one cut to the missing count: its FIRST samples
  assert sorted(x[:, 0] - 1000 * int(name[1:])) == list(range(len(x)))


def test_iid_sampling_leaf_equal_shares_and_natural_sizes():
  users = _users((10, 20, 31))
  out = leaf.sample_iid(users, 1.0, 2 / 3, 'leaf', np.random.default_rng(0), first_name=7)
  assert [u[0] for u in out] == ['7', '8'] and [len(u[2]) for u in out] == leaf.iid_divide(61, 2) == [30, 31]
  assert sorted(np.concatenate([u[1] for u in out])[:, 0]) == sorted(np.concatenate([u[1] for u in users])[:, 0])
  out = leaf.sample_iid(users, 0.5, 1.0, 'leaf', np.random.default_rng(0), first_name=0)
  assert [len(u[2]) for u in out] == [10, 10, 10]           # int(0.5 * 61) = 30 over round(1.0 * 3) users
  nat = leaf.sample_iid(users, 1.0, 1.0, 'natural', np.random.default_rng(0), first_name=0)
  assert [(u[0], len(u[2])) for u in nat] == [('u0', 10), ('u1', 20), ('u2', 31)]
  assert sorted(np.concatenate([u[1] for u in nat])[:, 0]) == sorted(np.concatenate([u[1] for u in users])[:, 0])
  assert leaf.iid_divide(10, 3) == [3, 3, 4]


def test_fixed_size_subset_num_clients_and_max_samples():
  """num_clients random users among those min_samples keeps (file order kept), each cut to its FIRST
  max_samples samples (the FedSeq release's Shakespeare: 100 roles x 2,000 training windows)."""
  files = [_users((10, 20, 3)), [(f'v{i}',) + u[1:] for i, u in enumerate(_users((30, 5, 40), seed=1))]]
  kept = [[u for u in users if len(u[2]) > 4] for users in files]
  out = leaf.subset_users(kept, 3, 6, np.random.default_rng(0))
  names = [u[0] for users in out for u in users]
  assert len(names) == 3 and set(names) <= {'u0', 'u1', 'v0', 'v1', 'v2'}
  order = [u[0] for users in kept for u in users]
  assert names == sorted(names, key=order.index)
  full = {u[0]: u for users in files for u in users}
  for users in out:
    for name, x, y, _ in users:
      np.testing.assert_array_equal(x, full[name][1][:6])
      assert len(y) == min(6, len(full[name][2]))
  assert leaf.subset_users(kept, 0, 0, np.random.default_rng(0)) == kept
  with pytest.raises(ConfigError, match='data.num_clients.*only 5 users'):
    leaf.subset_users(kept, 6, 0, np.random.default_rng(0))
  train, test, _ = leaf.prepare(files, split='niid', fraction=1.0, iid_user_fraction=1.0, iid_sizes='leaf',
                                min_samples=5, train_split='sample', train_fraction=0.5, seed=0, num_clients=2,
                                max_samples=10)
  assert [len(u[2]) for u in train] == [5, 5] and [len(u[2]) for u in test] == [5, 5]


def test_femnist_iid_min_samples_and_user_split(tmp_path):
  make_femnist_leaf(str(tmp_path), SIZES)
  ds = registry.get_dataset('femnist', data_dir=str(tmp_path), split='iid', seed=0)
  # per file: round(1.0 * users) users, equal shares of the file's samples, named '0', '1', ... across files
  assert list(ds.client_names) == [str(i) for i in range(8)]
  sizes = ds.client_sizes() + np.array([len(ds.client_test_examples(k)[1]) for k in range(8)])
  assert list(sizes) == leaf.iid_divide(20, 5) + leaf.iid_divide(23, 3)
  ds = registry.get_dataset('femnist', data_dir=str(tmp_path), min_samples=5)
  assert list(ds.client_names) == ['f0_0001', 'f1_0000', 'f1_0002']     # LEAF keeps n > min_samples
  ds = registry.get_dataset('femnist', data_dir=str(tmp_path), train_split='user', train_fraction=0.5)
  assert ds.num_clients == 4 and ds.num_test_clients == 4 and ds.client_test_offsets is None
  assert not set(ds.client_names) & set(ds.test_client_names)
  assert len(ds.x) + len(ds.test_x) == sum(map(sum, SIZES))


def test_leaf_own_train_test_files(tmp_path):
  root = tmp_path / 'femnist' / 'data'
  rng = np.random.default_rng(0)
  data = lambda n: {'x': (rng.integers(0, 256, (n, 784)) / 255).tolist(), 'y': [int(v) for v in rng.integers(0, 62, n)]}  # noqa: E731
  write_leaf_json(str(root / 'train' / 'all_data_0_niid_1_keep_0_train_9.json'), ['a', 'b'],
                  {'a': data(4), 'b': data(3)})
  write_leaf_json(str(root / 'test' / 'all_data_0_niid_1_keep_0_test_9.json'), ['a', 'b'], {'a': data(1), 'b': data(2)})
  ds = registry.get_dataset('femnist', data_dir=str(tmp_path))       # finds <dir>/femnist/data/{train,test}
  assert list(ds.client_names) == ['a', 'b'] and list(ds.client_sizes()) == [4, 3]
  assert [len(ds.client_test_examples(k)[1]) for k in range(2)] == [1, 2]
  with pytest.raises(ConfigError, match='data.split'):
    registry.get_dataset('femnist', data_dir=str(tmp_path), split='iid')


def test_shakespeare_vocabulary_and_targets(tmp_path):
  assert len(leaf.SHAKESPEARE_CHARS) == 86 and len(set(leaf.SHAKESPEARE_CHARS)) == 86
  assert leaf.SHAKESPEARE_VOCAB == 90
  # TFF's order: 'd' -> 1, 'h' -> 2, ' ' -> 14 (index 13 + 1); '~' is not in the vocabulary -> oov 87
  np.testing.assert_array_equal(leaf.char_ids('dh ~'), [1, 2, 14, 87])
  text_a = ('To be, or not to be, that is the question: whether tis nobler in the mind to suffer the '
            'slings and arrows~')
  text_b = 'A horse! a horse! my kingdom for a horse! ' * 3
  make_shakespeare_leaf(str(tmp_path), [('TEMPEST_PROSPERO', text_a), ('TEMPEST_ARIEL', text_b)])
  ds = registry.get_dataset('shakespeare', data_dir=str(tmp_path), seed=0)
  assert ds.num_classes == 90 and ds.input_shape == (80,) and ds.label_shape == (80,)
  assert ds.task.name == 'next_token' and ds.task.accuracy_excludes == ('pad',)
  for k, text in enumerate((text_a, text_b)):
    xs, _ = shakespeare_windows(text)
    x, y = ds.client_examples(k)
    tx, ty = ds.client_test_examples(k)
    assert len(y) + len(ty) == len(xs)
    for xi, yi in zip(np.concatenate([x, tx]), np.concatenate([y, ty])):
      window = ''.join(leaf.SHAKESPEARE_CHARS[v - 1] if v <= 86 else '~' for v in xi)
      i = next(j for j in range(len(text) - 80) if text[j:j + 80] == window)
      np.testing.assert_array_equal(xi, leaf.char_ids(text[i:i + 80]))
      np.testing.assert_array_equal(yi, leaf.char_ids(text[i + 1:i + 81]))   # the next 80 characters
  nxt = registry.get_dataset('shakespeare', data_dir=str(tmp_path), seed=0, target='next')
  assert nxt.label_shape == () and nxt.task is None
  np.testing.assert_array_equal(nxt.y, ds.y[:, -1])
  assert np.any(ds.y == leaf.SHAKESPEARE_OOV)                      # '~' became oov


def test_shorter_windows_are_right_padded():
  x = np.stack([leaf.char_ids('abc'.ljust(3)).astype(np.int16)])
  xp = np.zeros((1, 80), np.int16)
  xp[0, :3] = x[0]
  y = leaf.shakespeare_targets(xp, np.array([leaf.char_ids('d')[0]]))
  np.testing.assert_array_equal(y[0, :4], np.r_[leaf.char_ids('bcd'), 0])
  assert not y[0, 3:].any()


def test_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='preprocess.sh'):
    registry.get_dataset('femnist', data_dir=str(tmp_path))
  make_femnist_leaf(str(tmp_path), SIZES)
  for field, value in (('fraction', 0.0), ('fraction', float('nan')), ('split', 'dirichlet'),
                       ('train_fraction', 1.0), ('min_samples', -1), ('source', 'zip')):
    with pytest.raises(ConfigError, match=f'data.{field}'):
      registry.get_dataset('femnist', data_dir=str(tmp_path), **{field: value})
  with pytest.raises(ConfigError, match='data.iid_sizes'):
    registry.get_dataset('femnist', data_dir=str(tmp_path), split='iid', iid_sizes='natural', fraction=0.5)
  bad = tmp_path / 'all_data' / 'all_data_9.json'
  bad.write_text('{"users": ["z"], "num_samples": [1], "user_data": {"z": {"x": [[0.5]], "y": [1]}}}')
  with pytest.raises(leaf.LeafFormatError, match='784'):
    registry.get_dataset('femnist', data_dir=str(tmp_path))
  bad.write_text('{"users": ["z"], "num_samples": [3], "user_data": {"z": {"x": [], "y": []}}}')
  with pytest.raises(leaf.LeafFormatError, match='num_samples'):
    registry.get_dataset('femnist', data_dir=str(tmp_path))
  bad.write_text('{"users": ["f0_0000"], "user_data": {"f0_0000": {"x": [], "y": []}}}')
  with pytest.raises(leaf.LeafFormatError, match='twice'):
    registry.get_dataset('femnist', data_dir=str(tmp_path))
  bad.write_text('{"users": [')
  with pytest.raises(leaf.LeafFormatError, match='truncated'):
    registry.get_dataset('femnist', data_dir=str(tmp_path))


def test_cache_skips_json_parsing(tmp_path, monkeypatch):
  make_femnist_leaf(str(tmp_path), SIZES)
  a = registry.get_dataset('femnist', data_dir=str(tmp_path), seed=4)
  assert len(os.listdir(tmp_path / 'fedjax_flat_cache')) == 1
  monkeypatch.setattr(leaf, 'read_leaf_dir', lambda *a, **k: (_ for _ in ()).throw(AssertionError('parsed')))
  b = registry.get_dataset('femnist', data_dir=str(tmp_path), seed=4)
  for f in ('x', 'y', 'test_x', 'test_y', 'client_offsets', 'client_test_offsets'):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
  assert list(a.client_names) == list(b.client_names)
  with pytest.raises(AssertionError, match='parsed'):
    registry.get_dataset('femnist', data_dir=str(tmp_path), seed=4, cache=False)


def test_readout_must_match_the_labels(tmp_path):
  from fedjax_flat.training import trainers
  make_shakespeare_leaf(str(tmp_path), [('A', 'x' * 90), ('B', 'y' * 95)])
  import importlib
  c = importlib.import_module('configs.quickstart_shakespeare').get_config()
  c.data.data_dir, c.data.fraction, c.data.min_samples, c.clients_per_round = str(tmp_path), 1.0, 0, 2
  c.data.target = 'next'                          # one label per window, but a per-position model
  with pytest.raises(ConfigError, match="model_kwargs.readout.*'last'"):
    trainers.make_trainer(c, write_files=False)


@pytest.mark.parametrize('case', sorted(__import__('tests.fixtures.hostile', fromlist=['x']).LEAF_CASES))
def test_malformed_leaf_json_is_a_data_format_error(tmp_path, case):
  """Every malformed all_data file: the project's DataFormatError naming the file, never a raw parser error."""
  from fedjax_flat.errors import DataFormatError
  from tests.fixtures import hostile
  hostile.femnist_root(str(tmp_path), case)
  with pytest.raises(DataFormatError, match='all_data_0.json'):
    registry.get_dataset('femnist', data_dir=str(tmp_path))


def test_corrupt_cache_is_rebuilt_from_the_json(tmp_path):
  make_femnist_leaf(str(tmp_path), ((6, 9, 5), (7, 8)))
  a = registry.get_dataset('femnist', data_dir=str(tmp_path), seed=1)
  cache = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path) for f in fs if f.endswith('.npz')]
  assert len(cache) == 1
  with open(cache[0], 'r+b') as f:
    f.truncate(os.path.getsize(cache[0]) // 2)
  b = registry.get_dataset('femnist', data_dir=str(tmp_path), seed=1)
  np.testing.assert_array_equal(a.x, b.x)
