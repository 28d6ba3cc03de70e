"""TFDS data sources and ArrayRecord files (the `tfds` extra), partitioned into clients (data/columns.py;
docs/hf_tfds.md). Neither needs TensorFlow: both read records by index.

`config.dataset='tfds'`: a prepared TFDS dataset read through `tfds.data_source` (its ArrayRecord files).
  data.name       the TFDS name ('mnist', 'cifar10:3.0.2'); data.data_dir where it was prepared (TFDS' default
                  when None); nothing is downloaded: a dataset not prepared there is one line naming `tfds build`
  data.split / data.test_split / data.features / data.label / data.partitioner / data.stream / data.seed: as for
                  'hf' (sources/hf.py)

`config.dataset='array_record'`: ArrayRecord files read by Grain's `ArrayRecordDataSource`, for data larger than
memory (with data.stream=True only the labels are held; a client's records are read when its round batches are
built). Each record is `flax.serialization.msgpack_serialize({column: value, ...})` (numpy arrays and scalars).
  data.path       the training files (a path or a glob: shards); data.test_path the global test split's
"""
from __future__ import annotations

import glob
import importlib
import os

from fedjax_flat.data import columns
from fedjax_flat.data.registry import register
from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import DataValue

TFDS_RULES = {**columns.RULES, 'name': DataValue(None, 'str', what="the TFDS name, e.g. 'mnist'"),
              'data_dir': DataValue(None, 'str', what='where the TFDS dataset was prepared')}
AR_RULES = {**columns.RULES, 'path': DataValue(None, 'str', what='the training ArrayRecord files (a glob)'),
            'test_path': DataValue(None, 'str', what="the test split's ArrayRecord files (a glob)")}


def _options(**options):
  return options


def _tfds_tables(tfds, name, data_dir, split, test_split):
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:     # tfds raises DatasetNotFoundError and friends for an unknown name
    raise ConfigError('data.name', name, f'not a TFDS dataset ({type(e).__name__}: '
                      f'{str(e).splitlines()[0][:160] if str(e) else ""})') from None
  splits = list(builder.info.splits.keys())
  for field, s in (('split', split), ('test_split', test_split)):
    if splits and s not in splits:
      raise ConfigError(f'data.{field}', s, f'TFDS {name!r} has the splits {splits}')
  features = builder.info.features
  classes = {c: f.num_classes for c, f in features.items() if hasattr(f, 'num_classes')}
  images = [c for c, f in features.items() if isinstance(f, tfds.features.Image)]
  tables = []
  for s in (split, test_split):
    try:
      source = tfds.data_source(name, split=s, data_dir=data_dir, download=False)
    except Exception as e:    # not prepared in data_dir, or prepared in another file format
      raise ConfigError('data.name', name, f'no prepared ArrayRecord files of split {s!r} in data_dir='
                        f'{data_dir!r}: run `tfds build {name} --file_format=array_record` '
                        f'({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ""})') from None
    # record by record: tfds 4.9.10's __getitems__ fails on its mock data sources (tfds.testing.mock_data)
    tables.append(columns.RecordTable(source, column_names=list(features.keys()), class_counts=classes,
                                      images=images, batched=False))
  return tables


@register('tfds', rules=TFDS_RULES, check=columns.check_fields)
def tfds_dataset(name=None, data_dir=None, split='train', test_split='test', features='image', label='label',
                 partitioner='hsu_dirichlet', num_clients=None, alpha=None, examples_per_client=None,
                 quantity_skew=None, partition_by=None, min_partition_size=None, self_balancing=None,
                 num_classes_per_partition=None, class_assignment_mode=None, num_shards_per_partition=None,
                 shard_size=None, partition_sizes=None, num_classes=None, tokenizer=None, seq_len=None, stream=False,
                 seed=0):
  if not name:
    raise ConfigError('data.name', name, "set it to a TFDS dataset name, e.g. 'mnist'")
  tfds = columns.require('tensorflow_datasets', 'tfds', 'tensorflow-datasets')
  train, test = _tfds_tables(tfds, name, data_dir, split, test_split)
  return columns.federate(
      f'tfds:{name}', train, test, features=features, label=label, partitioner=partitioner, num_clients=num_clients,
      seed=seed, num_classes=num_classes, tokenizer=tokenizer, seq_len=seq_len, stream=stream, split=split,
      test_split=test_split, **_options(
          alpha=alpha, examples_per_client=examples_per_client, quantity_skew=quantity_skew,
          partition_by=partition_by, min_partition_size=min_partition_size, self_balancing=self_balancing,
          num_classes_per_partition=num_classes_per_partition, class_assignment_mode=class_assignment_mode,
          num_shards_per_partition=num_shards_per_partition, shard_size=shard_size,
          partition_sizes=partition_sizes))


def _record_table(field: str, pattern: str) -> columns.RecordTable:
  grain = columns.require('grain.python', 'tfds', 'grain')
  serialization = importlib.import_module('flax.serialization')   # the records' format; jax only when asked
  paths = sorted(glob.glob(pattern)) if any(ch in pattern for ch in '*?[') else [pattern]
  paths = [p for p in paths if os.path.isfile(p)]
  if not paths:
    raise ConfigError(f'data.{field}', pattern, 'no such ArrayRecord file')
  try:
    source = grain.ArrayRecordDataSource(paths)
    return columns.RecordTable(source, serialization.msgpack_restore)
  except Exception as e:     # array_record's reader and msgpack raise their own types on a foreign file
    raise ConfigError(f'data.{field}', pattern, 'not ArrayRecord files of msgpack records '
                      f'({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ""})') from None


@register('array_record', rules=AR_RULES, check=columns.check_fields)
def array_record(path=None, test_path=None, features='image', label='label', partitioner='hsu_dirichlet',
                 num_clients=None, alpha=None, examples_per_client=None, quantity_skew=None, partition_by=None,
                 min_partition_size=None, self_balancing=None, num_classes_per_partition=None,
                 class_assignment_mode=None, num_shards_per_partition=None, shard_size=None, partition_sizes=None,
                 num_classes=None, tokenizer=None, seq_len=None, stream=False, seed=0):
  for field, v in (('path', path), ('test_path', test_path)):
    if not v:
      raise ConfigError(f'data.{field}', v, 'set it to ArrayRecord files (a path or a glob)')
  train, test = _record_table('path', path), _record_table('test_path', test_path)
  return columns.federate(
      f'array_record:{os.path.basename(path)}', train, test, features=features, label=label,
      partitioner=partitioner, num_clients=num_clients, seed=seed, num_classes=num_classes, tokenizer=tokenizer,
      seq_len=seq_len, stream=stream, split='path', test_split='test_path', **_options(
          alpha=alpha, examples_per_client=examples_per_client, quantity_skew=quantity_skew,
          partition_by=partition_by, min_partition_size=min_partition_size, self_balancing=self_balancing,
          num_classes_per_partition=num_classes_per_partition, class_assignment_mode=class_assignment_mode,
          num_shards_per_partition=num_shards_per_partition, shard_size=shard_size,
          partition_sizes=partition_sizes))
