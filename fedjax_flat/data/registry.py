"""Dataset registry: `config.dataset` name -> a builder returning a federated dataset.

Builders take the `config.data` section as keyword arguments and return an object with the `FederatedDataset` /
`ClientDataSource` interface. Each dataset module under data/sources/ registers its builder where it is defined,
with what it declares about its `config.data` fields:

  @register('name', rules={field: rule}, limits={field: (lo, hi, why) | (allowed, ...)}, check=fn(data) -> None,
            fields={field: default, ...})

  rules    a field whose meaning differs from the common rule of config/data_fields.RULES
  limits   dataset-specific bounds, checked before loading
  check    a cross-field rule on the `config.data` dict (raise ConfigError); a segmentation dataset (`fields=`)
           with a check gets the shared augmentation checks of config/validate.py, then only its own
  task     the task name the dataset's labels have (tasks/), or fn(config.data) -> name; default classification
  fields   every field with its default, for datasets whose config.data is declared whole (segmentation:
           config/default_config.segmentation_data builds it; the augmentation fields come from
           data/transforms/pipeline.SEG_AUGMENT)

Every module of data/sources/ is imported on the first lookup: a new dataset is its module + its test. Real
datasets raise a clear error naming the download command when files are missing.
"""
from __future__ import annotations

import inspect
from typing import Optional

from fedjax_flat.errors import ConfigError
from fedjax_flat.registry import Registry

DATASETS = Registry('dataset', package='fedjax_flat.data.sources')
register = DATASETS.register

# config.data fields that every config declares (config/default_config.data_section), so that they can be set on
# the command line; None = unset, the builder's own default applies.
OPTIONAL_FIELDS = {'data_dir': str, 'split_json': str, 'split_dir': str, 'examples_per_client': int,
                   'quantity_skew': float, 'seed': int, 'check_official_sizes': bool}


def names():
  return DATASETS.names()


def get_dataset(name: str, **kwargs):
  if name not in DATASETS:
    raise ValueError(f'dataset={name!r} is unknown; allowed: {names()}')
  kwargs.pop('shuffle', None)   # config.data.shuffle is for batching (data/batching.py), not the builders
  kwargs = {k: v for k, v in kwargs.items() if not (v is None and k in OPTIONAL_FIELDS)}  # unset: its default
  return DATASETS.get(name)(**kwargs)


def builder_args(name: str):
  """The keyword arguments the builder of `name` takes (None when it takes arbitrary ones)."""
  params = inspect.signature(DATASETS.get(name)).parameters.values()
  named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
  if not named and any(p.kind == p.VAR_KEYWORD for p in params):
    return None
  return named


def declared_fields(name: str) -> Optional[dict]:
  """{field: default} of a dataset that declares its config.data whole (the segmentation datasets), else None."""
  if name not in DATASETS:
    return None
  fields = DATASETS.meta(name, 'fields')
  return dict(fields) if fields is not None else None


def declaring_datasets():
  """The datasets that declare their config.data whole (segmentation), sorted."""
  return [n for n in names() if DATASETS.meta(n, 'fields') is not None]


def task_name(name: str, data_cfg=None) -> str:
  """The task a dataset declares for a `config.data` (known before loading): 'classification' by default."""
  task = DATASETS.meta(name, 'task', 'classification') if name in DATASETS else 'classification'
  return task(dict(data_cfg or {})) if callable(task) else task


def check_arg(field, value, ok, allowed):
  """A dataset builder's argument: ConfigError naming config.data.<field> unless `ok`."""
  if not ok:
    raise ConfigError(f'data.{field}', value, allowed)
