"""Column datasets (Hugging Face `datasets`, TFDS data sources, ArrayRecord files) as federated data: the label
column split into clients by the project's Dirichlet split or one of Flower Datasets' partitioners.

A source module (sources/hf.py, sources/tfds.py) opens its splits as `Table`s (rows of named columns, read by
index) and calls `federate`: the labels (and `partition_by` column) are read once, the clients are the index sets
the partitioner returns, and the inputs are decoded once into one array (in memory: the device path) or read per
client when its round batches are built (`stream=True`: data larger than memory, the host path).

  partitioner    what splits the training split into `num_clients` clients
  hsu_dirichlet  data/partition.dirichlet_split (alpha, examples_per_client, quantity_skew): the FedSAM papers'
                 split, the default
  iid | dirichlet | pathological | natural_id | size | shard
                 flwr_datasets.partitioner.{Iid,Dirichlet,Pathological,NaturalId,Size,Shard}Partitioner with the
                 options below passed through (None: Flower's own default); seeded with data.seed

The optional packages are imported only here and only when such a dataset is asked for; a missing one is one
BadInputError line naming the pip install (`require`). Every bad field (an unknown column, a missing split, a
partitioner that leaves a client without data) is one ConfigError line, raised while loading, before anything
compiles.
"""
from __future__ import annotations

import abc
import importlib
import os
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.partition import dirichlet_split
from fedjax_flat.data.user import as_source
from fedjax_flat.errors import BadInputError, ConfigError
from fedjax_flat.schema import DataValue, Test

# Which config.data fields each partitioner reads (the others must stay None) and which it needs.
FLOWER = {'iid': 'IidPartitioner', 'dirichlet': 'DirichletPartitioner', 'pathological': 'PathologicalPartitioner',
          'natural_id': 'NaturalIdPartitioner', 'size': 'SizePartitioner', 'shard': 'ShardPartitioner'}
OPTIONS = {
    'hsu_dirichlet': ('alpha', 'examples_per_client', 'quantity_skew'),
    'iid': (),
    'dirichlet': ('alpha', 'partition_by', 'min_partition_size', 'self_balancing'),
    'pathological': ('partition_by', 'num_classes_per_partition', 'class_assignment_mode'),
    'natural_id': ('partition_by',),
    'size': ('partition_sizes',),
    'shard': ('partition_by', 'num_shards_per_partition', 'shard_size'),
}
NEEDS = {'dirichlet': ('alpha',), 'pathological': ('num_classes_per_partition',), 'natural_id': ('partition_by',),
         'size': ('partition_sizes',)}
PARTITION_FIELDS = sorted({f for fields in OPTIONS.values() for f in fields} - {'alpha', 'examples_per_client',
                                                                               'quantity_skew'})


def _columns_ok(v) -> bool:
  return (isinstance(v, str) and bool(v)) or (isinstance(v, (list, tuple)) and bool(v)
                                              and all(isinstance(c, str) and c for c in v))


# The rules of the fields these datasets add (data/registry.py `rules=`); the common ones (num_clients, alpha, seed,
# examples_per_client, quantity_skew, num_classes) keep config/data_fields.RULES.
RULES = {
    'split': DataValue(None, 'str', what='the training split'),
    'test_split': DataValue(None, 'str', what='the global test split'),
    'features': Test(None, ok=_columns_ok, message='must be a column name or a list of column names',
                     what='a column name | [names]'),
    'label': DataValue(None, 'str', what='the label column (integer class ids)'),
    'partitioner': Test(None, ok=lambda v: v in OPTIONS, message=f'allowed: {sorted(OPTIONS)}',
                        what=' | '.join(sorted(OPTIONS))),
    'partition_by': DataValue(None, 'str', what="the column Flower's partitioner splits by (default: data.label)"),
    'min_partition_size': DataValue(None, 'int', 0, what="Flower's Dirichlet: the fewest examples of a client"),
    'self_balancing': DataValue(None, 'bool', what="Flower's Dirichlet: stop filling clients above the mean size"),
    'num_classes_per_partition': DataValue(None, 'int', 1, what="Flower's pathological: classes per client"),
    'class_assignment_mode': Test(None, ok=lambda v: v in ('random', 'deterministic', 'first-deterministic'),
                                  message="allowed: 'random' | 'deterministic' | 'first-deterministic'",
                                  what='random | deterministic | first-deterministic'),
    'num_shards_per_partition': DataValue(None, 'int', 1, what="Flower's shard: shards per client"),
    'shard_size': DataValue(None, 'int', 1, what="Flower's shard: examples per shard"),
    'partition_sizes': Test(None, ok=lambda v: isinstance(v, (list, tuple)) and bool(v) and all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1 for s in v),
                            message='must be a list of client sizes >= 1', what='[size, ...]'),
    'tokenizer': DataValue(None, 'str', what='a tokenizers JSON file or a Hub tokenizer name, for text columns'),
    'seq_len': DataValue(None, 'int', 1, what='tokens per example (padded with 0 / truncated)'),
    'stream': DataValue(None, 'bool', what='read each client when its round batches are built (larger than memory)'),
}


def require(module: str, extra: str, package: str):
  """`module` imported now; missing: one line naming the pip install."""
  try:
    return importlib.import_module(module)
  except ImportError:
    raise BadInputError(f"this dataset needs the {package} package: pip install 'fedjax_flat[{extra}]' "
                        f'(or pip install {package})') from None


def check_fields(d: dict) -> None:
  """The cross-field rule of these datasets (before loading): each partitioner's options, and only its own."""
  part = d.get('partitioner') or 'hsu_dirichlet'
  for field in PARTITION_FIELDS + ['alpha', 'examples_per_client', 'quantity_skew']:
    if d.get(field) is not None and field not in OPTIONS[part]:
      users = [p for p, fields in OPTIONS.items() if field in fields]
      raise ConfigError(f'data.{field}', d[field], f"partitioner={part!r} does not read it (it is for "
                        f"{' | '.join(users)}): set it to None")
  for field in NEEDS.get(part, ()):
    if d.get(field) is None:
      raise ConfigError(f'data.{field}', None, f'partitioner={part!r} needs it')
  if part == 'dirichlet' and not d['alpha'] > 0:
    raise ConfigError('data.alpha', d['alpha'], "Flower's Dirichlet needs alpha > 0 (hsu_dirichlet takes 0: one "
                      'class per client)')
  if part in ('natural_id', 'size') and d.get('num_clients') is not None:
    if part == 'size' and d['num_clients'] != len(d['partition_sizes']):
      raise ConfigError('data.num_clients', d['num_clients'], f'partitioner=size makes one client per entry of '
                        f'data.partition_sizes ({len(d["partition_sizes"])}): set it to None')
    if part == 'natural_id':
      raise ConfigError('data.num_clients', d['num_clients'], 'partitioner=natural_id makes one client per value '
                        'of data.partition_by: set it to None')
  if part not in ('natural_id', 'size') and d.get('num_clients') is None:
    raise ConfigError('data.num_clients', None, f'partitioner={part!r} needs the number of clients')
  if d.get('seq_len') is not None and d.get('tokenizer') is None:
    raise ConfigError('data.seq_len', d['seq_len'], 'is read with data.tokenizer only (text columns)')


class Table(abc.ABC):
  """Rows of named columns read by index: what a source opens for each split."""

  num_rows: int
  column_names: Sequence[str]

  @abc.abstractmethod
  def read(self, columns: Sequence[str], rows: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """{column: array [len(rows), ...]} of `rows` (all when None), decoded."""

  def num_classes(self, column: str) -> Optional[int]:
    """The class count the column's metadata declares (a ClassLabel), else None."""
    return None

  def is_image(self, column: str) -> bool:
    return False


class RecordTable(Table):
  """A table over a random-access source of records, each a {column: value} dict (a TFDS data source, grain's
  ArrayRecordDataSource decoded by `decode`)."""

  def __init__(self, source, decode: Callable = lambda r: r, *, column_names=None, class_counts=None,
               images=(), batched: bool = True):
    self._source, self._decode, self._batched = source, decode, batched
    self.num_rows = len(source)
    self.column_names = list(column_names if column_names is not None else
                             (decode(source[0]).keys() if self.num_rows else ()))
    self._classes, self._images = dict(class_counts or {}), set(images)

  def read(self, columns, rows=None):
    rows = np.arange(self.num_rows) if rows is None else np.asarray(rows)
    getitems = getattr(self._source, '__getitems__', None) if self._batched else None
    records = (getitems([int(i) for i in rows]) if getitems is not None
               else [self._source[int(i)] for i in rows])
    records = [self._decode(r) for r in records]
    return {c: np.asarray([r[c] for r in records]) for c in columns}

  def num_classes(self, column):
    return self._classes.get(column)

  def is_image(self, column):
    return column in self._images


def _check_columns(table: Table, field: str, columns: Sequence[str], split: str) -> None:
  for c in columns:
    if c not in table.column_names:
      raise ConfigError(f'data.{field}', c if len(columns) == 1 else list(columns),
                        f'the {split!r} split has no column {c!r}; its columns: {sorted(table.column_names)}')


def _tokenizer(name: str):
  tokenizers = require('tokenizers', 'hf', 'tokenizers')
  try:
    return (tokenizers.Tokenizer.from_file(name) if os.path.isfile(name)
            else tokenizers.Tokenizer.from_pretrained(name))
  except Exception as e:    # the library raises its own exception types for a bad file or an unknown name
    raise ConfigError('data.tokenizer', name, f'not a tokenizers JSON file or a Hub tokenizer name '
                      f'({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ""})') from None


class Inputs:
  """How the feature columns become one input array: images get a channel axis, float64 becomes float32, text is
  tokenized to `seq_len` ids, several scalar columns are stacked into a vector."""

  def __init__(self, table: Table, features: Sequence[str], tokenizer: Optional[str], seq_len: Optional[int]):
    self.features, self.images = list(features), [table.is_image(c) for c in features]
    self._tok, self.seq_len = (_tokenizer(tokenizer) if tokenizer else None), seq_len or 64

  def __call__(self, cols: Dict[str, np.ndarray]) -> np.ndarray:
    arrays = []
    for c, image in zip(self.features, self.images):
      a = cols[c]
      if a.dtype.kind in 'USO':
        a = self._tokens(c, a)
      elif image and a.ndim == 3:      # grayscale images decode to [n, H, W]: the models take [n, H, W, C]
        a = a[..., None]
      elif a.dtype == np.float64 or a.dtype == np.bool_:
        a = a.astype(np.float32)
      arrays.append(a)
    if len(arrays) == 1:
      return arrays[0]
    return np.stack([np.asarray(a, np.float32).reshape(len(a), -1) for a in arrays], -1).reshape(len(arrays[0]), -1)

  def _tokens(self, column: str, texts: np.ndarray) -> np.ndarray:
    if self._tok is None:
      raise ConfigError('data.features', column, 'this column holds text: set data.tokenizer (a tokenizers JSON '
                        'file or a Hub tokenizer name) and data.seq_len')
    out = np.zeros((len(texts), self.seq_len), np.int32)     # 0 pads (the id a tokenizer gives its pad token)
    for i, enc in enumerate(self._tok.encode_batch([str(t) for t in texts])):
      ids = enc.ids[:self.seq_len]
      out[i, :len(ids)] = ids
    return out


def _labels(y: np.ndarray, column: str) -> np.ndarray:
  if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.bool_)):
    raise ConfigError('data.label', column, f'the label column holds {y.dtype} values of shape {y.shape[1:]}: '
                      'one integer class id per example')
  return y.astype(np.int32)


def partition(labels: np.ndarray, by: Optional[np.ndarray], *, partitioner: str, num_clients: Optional[int],
              seed: int, options: dict, num_classes: int) -> List[np.ndarray]:
  """The clients' row indices of the training split: the project's split or Flower's partitioner."""
  if partitioner == 'hsu_dirichlet':
    alpha = options.get('alpha')
    try:
      return dirichlet_split(labels, num_clients, 0.0 if alpha is None else alpha,
                             examples_per_client=options.get('examples_per_client'),
                             quantity_skew=options.get('quantity_skew'), num_classes=num_classes, seed=seed)
    except ValueError as e:
      raise ConfigError('data.num_clients', num_clients, f'hsu_dirichlet: {e}') from None
  datasets = require('datasets', 'hf', 'datasets')
  flower = require('flwr_datasets.partitioner', 'hf', 'flwr-datasets')
  by_name = options.get('partition_by') or '__label__'
  # Flower reads only the column it splits by: a two-column table, so that no image is decoded for it; its rows'
  # positions are the indices into the split.
  table = datasets.Dataset.from_dict({by_name: labels if by is None else by,
                                      '__row__': np.arange(len(labels), dtype=np.int64)})
  kwargs = {k: v for k, v in options.items() if v is not None and k in OPTIONS[partitioner]}
  if partitioner == 'size':
    kwargs['partition_sizes'] = [int(s) for s in kwargs['partition_sizes']]
  else:
    if partitioner != 'natural_id':
      kwargs['num_partitions'] = int(num_clients)
    kwargs['partition_by'] = by_name
  if partitioner == 'iid':
    kwargs.pop('partition_by')
  if partitioner in ('dirichlet', 'pathological', 'shard'):
    kwargs['seed'] = int(seed)     # explicit: Flower's default seed is a constant 42
  try:
    p = getattr(flower, FLOWER[partitioner])(**kwargs)
    p.dataset = table
    count = p.num_partitions
    return [np.asarray(p.load_partition(i)['__row__'], np.int64) for i in range(count)]
  except (ValueError, KeyError, IndexError) as e:    # Flower's refusals: too few examples, classes, shards
    raise ConfigError('data.partitioner', partitioner, f"Flower's {FLOWER[partitioner]} cannot split "
                      f'{len(labels)} examples that way: {str(e).splitlines()[0][:200]}') from None


def federate(name: str, train: Table, test: Table, *, features, label: str, partitioner: str = 'hsu_dirichlet',
             num_clients: Optional[int] = None, seed: int = 0, num_classes: Optional[int] = None,
             tokenizer: Optional[str] = None, seq_len: Optional[int] = None, stream: bool = False,
             split: str = 'train', test_split: str = 'test', **options):
  """The training table split into clients (module docstring) with the test table as the global test split:
  a FederatedDataset, or a streamed ClientDataSource when `stream`."""
  features = [features] if isinstance(features, str) else list(features)
  _check_columns(train, 'features', features, split)
  _check_columns(train, 'label', [label], split)
  _check_columns(test, 'features', features, test_split)
  _check_columns(test, 'label', [label], test_split)
  by_col = options.get('partition_by')
  if by_col is not None:
    _check_columns(train, 'partition_by', [by_col], split)
  if train.num_rows == 0:
    raise ConfigError('data.split', split, 'the split has no rows')
  if num_clients is not None and num_clients > train.num_rows:
    raise ConfigError('data.num_clients', num_clients, f'the {split!r} split has {train.num_rows} rows: at most '
                      f'{train.num_rows} clients')
  meta = train.read([label] + ([by_col] if by_col and by_col != label else []))
  y = _labels(meta[label], label)
  num_classes = int(num_classes or train.num_classes(label) or (int(y.max()) + 1 if y.size else 1))
  if y.size and (y.min() < 0 or y.max() >= num_classes):
    raise ConfigError('data.label', label, f'labels in [{y.min()}, {y.max()}] are not class ids in '
                      f'[0, num_classes={num_classes})')
  clients = partition(y, meta.get(by_col) if by_col else None, partitioner=partitioner, num_clients=num_clients,
                      seed=seed, options=options, num_classes=num_classes)
  empty = [k for k, c in enumerate(clients) if not len(c)]
  if empty:
    raise ConfigError('data.partitioner', partitioner, f'{len(empty)} of {len(clients)} clients get no examples '
                      f'(client {empty[0]} first) from {len(y)}: lower data.num_clients or change its options')
  inputs = Inputs(train, features, tokenizer, seq_len)
  t = test.read(features + [label])
  test_x, test_y = inputs(t), _labels(t[label], label)
  title = f'{name}({partitioner})'
  if stream:
    def client(k):
      cols = train.read(features + [label], np.sort(clients[k]))
      return inputs(cols), _labels(cols[label], label)
    return as_source(name, {'clients': client, 'sizes': [len(c) for c in clients], 'test': (test_x, test_y),
                            'num_classes': num_classes, 'name': title})
  # Decoded once, in row order; only the rows some client holds are read (a `size` partition may leave rows out).
  used = np.unique(np.concatenate(clients))
  cols = train.read(features, used)
  x = inputs(cols)
  where = np.full(train.num_rows, -1, np.int64)
  where[used] = np.arange(len(used))
  return FederatedDataset.from_client_indices(x, y[used], [where[c] for c in clients], test_x, test_y, num_classes,
                                              name=title)
