"""Hugging Face datasets (`config.dataset='hf'`, the `hf` extra): a Hub dataset, one saved with `save_to_disk`,
or local files `datasets.load_dataset` reads, partitioned into clients (data/columns.py; docs/hf_tfds.md).

  data.path         a Hub name ('uoft-cs/cifar10'), a directory written by Dataset(Dict).save_to_disk, a directory
                    of data files, or one .csv / .json / .jsonl / .parquet / .arrow file
  data.name         the Hub dataset's configuration (load_dataset's `name`), None = its default
  data.split        the training split ('train'); data.test_split the global test split ('test')
  data.features     the input column, or a list of scalar columns stacked into a vector; data.label the class ids
  data.partitioner  hsu_dirichlet (default) | iid | dirichlet | pathological | natural_id | size | shard
  data.tokenizer    for a text column: a tokenizers JSON file or a Hub tokenizer name; data.seq_len tokens
  data.stream       read each client's rows when its round batches are built instead of decoding all at load
  data.seed         the partitioner's seed (explicit: Flower's own default is a constant)

Images (an `Image` column) are decoded once by `datasets` into one uint8 array. A missing split or column, or a
path that is neither on disk nor on the Hub, is one ConfigError line before anything compiles.
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from fedjax_flat.data import columns
from fedjax_flat.data.registry import register
from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import DataValue

RULES = {**columns.RULES, 'path': DataValue(None, 'str', what='a Hub name, a save_to_disk directory or data files'),
         'name': DataValue(None, 'str', what="the Hub dataset's configuration")}
FILE_BUILDERS = {'.csv': 'csv', '.json': 'json', '.jsonl': 'json', '.parquet': 'parquet', '.arrow': 'arrow'}


class HFTable(columns.Table):
  """One split of a `datasets.Dataset`."""

  def __init__(self, ds):
    self._ds = ds
    self.num_rows, self.column_names = ds.num_rows, list(ds.column_names)

  def read(self, cols, rows=None):
    ds = self._ds.select_columns(list(cols)).with_format('numpy')
    out = ds[:] if rows is None else ds[np.asarray(rows, np.int64)]
    return {c: np.asarray(out[c]) for c in cols}

  def num_classes(self, column):
    return getattr(self._ds.features.get(column), 'num_classes', None)     # a ClassLabel column declares it

  def is_image(self, column):
    return type(self._ds.features.get(column)).__name__ == 'Image'


def _load(datasets, path: str, name: Optional[str]):
  """The DatasetDict (or Dataset) at `path` (data.path)."""
  try:
    if os.path.isdir(path) and any(os.path.exists(os.path.join(path, f))
                                   for f in ('dataset_dict.json', 'state.json')):
      return datasets.load_from_disk(path)
    if os.path.isfile(path):
      ext = os.path.splitext(path)[1].lower()
      if ext not in FILE_BUILDERS:
        raise ConfigError('data.path', path, f'a data file is one of {sorted(FILE_BUILDERS)}')
      return datasets.load_dataset(FILE_BUILDERS[ext], name, data_files={'train': path})
    return datasets.load_dataset(path, name)
  except ConfigError:
    raise
  except Exception as e:    # datasets raises FileNotFoundError, DatasetNotFoundError, ValueError, hub errors...
    raise ConfigError('data.path', path, f'not a save_to_disk directory, data files or a reachable Hub dataset '
                      f'({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ""})') from None


def _split(dd, field: str, split: str, path: str):
  splits = list(dd.keys()) if hasattr(dd, 'keys') else ['train']
  if split not in splits:
    raise ConfigError(f'data.{field}', split, f'{path!r} has the splits {splits}')
  return HFTable(dd[split] if hasattr(dd, 'keys') else dd)


@register('hf', rules=RULES, check=columns.check_fields)
def hf(path=None, name=None, split='train', test_split='test', features='image', label='label',
       partitioner='hsu_dirichlet', num_clients=None, alpha=None, examples_per_client=None, quantity_skew=None,
       partition_by=None, min_partition_size=None, self_balancing=None, num_classes_per_partition=None,
       class_assignment_mode=None, num_shards_per_partition=None, shard_size=None, partition_sizes=None,
       num_classes=None, tokenizer=None, seq_len=None, stream=False, seed=0):
  if not path:
    raise ConfigError('data.path', path, 'set it to a Hub name, a save_to_disk directory or data files')
  datasets = columns.require('datasets', 'hf', 'datasets')
  dd = _load(datasets, path, name)
  train, test = _split(dd, 'split', split, path), _split(dd, 'test_split', test_split, path)
  options = dict(alpha=alpha, examples_per_client=examples_per_client, quantity_skew=quantity_skew,
                 partition_by=partition_by, min_partition_size=min_partition_size, self_balancing=self_balancing,
                 num_classes_per_partition=num_classes_per_partition, class_assignment_mode=class_assignment_mode,
                 num_shards_per_partition=num_shards_per_partition, shard_size=shard_size,
                 partition_sizes=partition_sizes)
  return columns.federate(f'hf:{os.path.basename(os.path.normpath(path))}', train, test, features=features,
                          label=label, partitioner=partitioner, num_clients=num_clients, seed=seed,
                          num_classes=num_classes, tokenizer=tokenizer, seq_len=seq_len, stream=stream, split=split,
                          test_split=test_split, **options)
