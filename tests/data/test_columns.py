"""data/columns.py: the partitioners (the project's Dirichlet split and Flower's) over a label column, their field
rules, and a table's columns as one input array."""
import sys

import numpy as np
import pytest

from fedjax_flat.data import columns
from fedjax_flat.data.partition import dirichlet_split
from fedjax_flat.errors import BadInputError, ConfigError


class Arrays(columns.Table):
  """A table over in-memory columns (what a source opens, without any optional package)."""

  def __init__(self, **cols):
    self._cols = cols
    self.column_names, self.num_rows = list(cols), len(next(iter(cols.values())))

  def read(self, cols, rows=None):
    return {c: self._cols[c] if rows is None else self._cols[c][np.asarray(rows)] for c in cols}


def _labels(n=400, classes=10, seed=0):
  return np.random.default_rng(seed).integers(0, classes, n).astype(np.int32)


def _options(**over):
  return {f: over.get(f) for f in columns.PARTITION_FIELDS + ['alpha', 'examples_per_client', 'quantity_skew']}


def _check_partition(parts, n):
  every = np.concatenate(parts)
  assert len(every) == len(np.unique(every)) and every.min() >= 0 and every.max() < n    # disjoint rows


def test_hsu_dirichlet_is_the_projects_split_bit_for_bit():
  y = _labels()
  got = columns.partition(y, None, partitioner='hsu_dirichlet', num_clients=8, seed=3,
                          options=_options(alpha=0.5), num_classes=10)
  want = dirichlet_split(y, 8, 0.5, num_classes=10, seed=3)
  assert all(np.array_equal(a, b) for a, b in zip(got, want)) and len(got) == 8


def test_flower_dirichlet_differs_from_the_projects_split_in_sizes_and_is_seeded():
  """Where the two Dirichlet splits differ: the project's gives every client the same size (N / K, FedSAM's
  500 per client) and draws each client's class mix; Flower's draws each class's spread over the clients, so
  client sizes vary. Same labels, alpha and seed."""
  y = _labels(1000)
  ours = columns.partition(y, None, partitioner='hsu_dirichlet', num_clients=10, seed=0,
                           options=_options(alpha=0.5), num_classes=10)
  flower = columns.partition(y, None, partitioner='dirichlet', num_clients=10, seed=0,
                             options=_options(alpha=0.5, min_partition_size=1), num_classes=10)
  _check_partition(flower, len(y))
  assert sorted(len(c) for c in ours) == [100] * 10
  assert len({len(c) for c in flower}) > 1 and sum(len(c) for c in flower) == 1000   # Flower uses every row
  again = columns.partition(y, None, partitioner='dirichlet', num_clients=10, seed=0,
                            options=_options(alpha=0.5, min_partition_size=1), num_classes=10)
  other = columns.partition(y, None, partitioner='dirichlet', num_clients=10, seed=1,
                            options=_options(alpha=0.5, min_partition_size=1), num_classes=10)
  assert all(np.array_equal(a, b) for a, b in zip(flower, again))
  assert not all(np.array_equal(a, b) for a, b in zip(flower, other))     # data.seed reaches Flower


@pytest.mark.parametrize('partitioner,opts,check', [
    ('iid', {}, lambda parts, y, by: sorted(map(len, parts)) == [40] * 10),
    ('pathological', {'num_classes_per_partition': 2},
     lambda parts, y, by: all(len(np.unique(y[p])) <= 2 for p in parts)),
    ('shard', {'num_shards_per_partition': 2}, lambda parts, y, by: len(parts) == 10),
    ('size', {'partition_sizes': [10, 20, 30]}, lambda parts, y, by: list(map(len, parts)) == [10, 20, 30]),
    ('natural_id', {'partition_by': 'writer'},
     lambda parts, y, by: len(parts) == 7 and all(len(np.unique(by[p])) == 1 for p in parts)),
])
def test_each_flower_partitioner_gives_disjoint_rows_of_its_kind(partitioner, opts, check):
  y = _labels()
  by = np.arange(len(y)) % 7 if partitioner == 'natural_id' else None
  parts = columns.partition(y, by, partitioner=partitioner, num_clients=None if partitioner in (
      'size', 'natural_id') else 10, seed=0, options=_options(**opts), num_classes=10)
  _check_partition(parts, len(y))
  assert check(parts, y, by)


def test_federate_decodes_the_used_rows_once_and_streams_on_request():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(60, 3)), rng.integers(0, 4, 60)
  train, test = Arrays(f=x, label=y), Arrays(f=x[:9], label=y[:9])
  d = columns.federate('t', train, test, features='f', label='label', partitioner='size', seed=0,
                       partition_sizes=[5, 7])
  assert d.x.dtype == np.float32 and len(d.x) == 12 and list(d.client_sizes()) == [5, 7]
  s = columns.federate('t', train, test, features='f', label='label', partitioner='size', seed=0,
                       partition_sizes=[5, 7], stream=True)
  for k in range(2):
    np.testing.assert_array_equal(np.sort(s.client_examples(k)[1]), np.sort(d.client_examples(k)[1]))
  stacked = columns.federate('t', Arrays(a=x[:, 0], b=x[:, 1], label=y), test=Arrays(a=x[:4, 0], b=x[:4, 1],
                             label=y[:4]), features=['a', 'b'], label='label', partitioner='iid', num_clients=3)
  assert stacked.input_shape == (2,) and stacked.test_x.shape == (4, 2)


def test_bad_columns_labels_and_empty_clients_are_one_config_error():
  y = _labels(30, 3)
  train = Arrays(f=np.zeros((30, 2)), label=y, score=y * 0.5)
  with pytest.raises(ConfigError, match=r"data.features='g'.*no column 'g'; its columns: \['f', 'label'"):
    columns.federate('t', train, train, features='g', label='label', partitioner='iid', num_clients=2)
  with pytest.raises(ConfigError, match=r"data.label='score'.*one integer class id"):
    columns.federate('t', train, train, features='f', label='score', partitioner='iid', num_clients=2)
  with pytest.raises(ConfigError, match=r"data.num_clients=40 .*'train' split has 30 rows: at most 30 clients"):
    columns.federate('t', train, train, features='f', label='label', partitioner='iid', num_clients=40)
  with pytest.raises(ConfigError, match=r'data.partitioner=.*clients get no examples.*lower data.num_clients'):
    columns.federate('t', train, train, features='f', label='label', partitioner='dirichlet', num_clients=10,
                     alpha=0.01, min_partition_size=0)
  with pytest.raises(ConfigError, match=r"data.partitioner='pathological'.*cannot split 30 examples"):
    columns.federate('t', train, train, features='f', label='label', partitioner='pathological', num_clients=2,
                     num_classes_per_partition=5)
  with pytest.raises(ConfigError, match=r"data.features='text'.*holds text: set data.tokenizer"):
    t = Arrays(text=np.array(['a b'] * 30), label=y)
    columns.federate('t', t, t, features='text', label='label', partitioner='iid', num_clients=2)


@pytest.mark.parametrize('fields,match', [
    ({'partitioner': 'iid', 'num_clients': 4, 'alpha': 0.5}, r"data.alpha=0.5 .*'iid' does not read it"),
    ({'partitioner': 'dirichlet', 'num_clients': 4}, r"data.alpha=None .*'dirichlet' needs it"),
    ({'partitioner': 'dirichlet', 'num_clients': 4, 'alpha': 0.0}, r"Flower's Dirichlet needs alpha > 0"),
    ({'partitioner': 'size', 'partition_sizes': [3, 4], 'num_clients': 3}, r'one client per entry'),
    ({'partitioner': 'natural_id', 'partition_by': 'w', 'num_clients': 3}, r'one client per value'),
    ({'partitioner': 'shard', 'num_shards_per_partition': 2}, r"data.num_clients=None .*needs the number"),
    ({'partitioner': 'iid', 'num_clients': 2, 'seq_len': 8}, r'data.seq_len=8 .*with data.tokenizer only'),
])
def test_check_fields_refuses_options_of_another_partitioner_and_missing_ones(fields, match):
  with pytest.raises(ConfigError, match=match):
    columns.check_fields(fields)


def test_a_missing_extra_is_one_line_naming_the_pip_install(monkeypatch):
  monkeypatch.setitem(sys.modules, 'flwr_datasets.partitioner', None)     # None: the import fails (not installed)
  with pytest.raises(BadInputError, match=r"^this dataset needs the flwr-datasets package: pip install "
                                          r"'fedjax_flat\[hf\]' \(or pip install flwr-datasets\)$"):
    columns.require('flwr_datasets.partitioner', 'hf', 'flwr-datasets')
