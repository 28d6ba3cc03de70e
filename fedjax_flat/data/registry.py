"""Dataset registry: `config.dataset` name -> a builder returning a federated dataset.

Builders take the `config.data` section as keyword arguments and return an object with the `FederatedDataset` /
`ClientDataSource` interface. Each dataset module under data/sources/ registers its builder where it is defined,
with what it declares about its `config.data` fields:

  @register('name', rules={field: rule}, limits={field: (lo, hi, why) | (allowed, ...)}, check=fn(data) -> None,
            fields={field: default, ...})

  rules    fedjax_flat/schema.py rules (e.g. `DataValue`): a field whose meaning differs from the common rule of
           config/data_fields.RULES; for a dataset declared whole (`fields`), the rule of each of its own fields
  limits   dataset-specific bounds on top of the common rule, checked before loading (stored as schema rules)
  check    a cross-field rule on the `config.data` dict (raise ConfigError); a segmentation dataset (`fields=`)
           gets the shared augmentation rules (data/transforms/pipeline.SEG_AUGMENT_RULES), then its `rules`,
           then its check
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

from fedjax_flat.data import virtual_clients
from fedjax_flat.errors import ConfigError
from fedjax_flat.registry import Registry
from fedjax_flat.schema import Rule, Test

DATASETS = Registry('dataset', package='fedjax_flat.data.sources')


def _limit(name: str, field: str, limit) -> Rule:
  """`limits=` entry -> a schema rule: (lo, hi, why) bounds, or the allowed values (strings)."""
  if isinstance(limit[0], str):
    allowed = tuple(limit)
    return Test(None, ok=lambda v: v in allowed, message=f'dataset {name!r} allows {list(allowed)}',
                what=' | '.join(repr(a) for a in allowed))
  lo, hi, why = limit
  return Test(None, ok=lambda v: lo <= v <= hi, message=f'dataset {name!r} needs {lo} <= {field} <= {hi} ({why})',
              what=f'[{lo}, {hi}]')


def register(name: str, *, rules=None, limits=None, replace: bool = False, **meta):
  """Registers a dataset builder with its declarations (module docstring); every rule is a schema rule."""
  for field, rule in (rules or {}).items():
    if not isinstance(rule, Rule):
      raise TypeError(f'dataset {name!r}: rules[{field!r}] must be a fedjax_flat.schema rule, got {rule!r}')
  if rules:
    meta['rules'] = dict(rules)
  if limits:
    meta['limits'] = {field: _limit(name, field, limit) for field, limit in limits.items()}
  return DATASETS.register(name, replace=replace, **meta)

# config.data fields that every config declares (config/default_config.data_section), so that they can be set on
# the command line; None = unset, the builder's own default applies.
OPTIONAL_FIELDS = {'data_dir': str, 'split_json': str, 'split_dir': str, 'examples_per_client': int,
                   'quantity_skew': float, 'seed': int, 'check_official_sizes': bool}


def names():
  return DATASETS.names()


def get_dataset(name: str, /, **kwargs):   # positional: a dataset may take a `name` field (tfds, hf)
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


def check_rules(d, rules) -> None:
  """Each `config.data` field of `d` against its schema rule: ConfigError naming config.data.<field>."""
  for field, rule in rules.items():
    why = rule.why_not(d[field])
    if why:
      raise ConfigError(f'data.{field}', d[field], why)


def check_arg(field, value, ok, allowed):
  """A dataset builder's argument: ConfigError naming config.data.<field> unless `ok`."""
  if not ok:
    raise ConfigError(f'data.{field}', value, allowed)


def run_data(config, data=None):
  """(training data, the name records give them) of a run: `data` when given (ff.train(data=...): named by its
  own `name`, else config.dataset), else config.dataset loaded; FedVC's equal-size virtual clients
  (config.fedvc.virtual_size) on top. The run plan's data part (training/plan.py)."""
  name = str(getattr(data, 'name', '') or config.dataset) if data is not None else config.dataset
  data = data if data is not None else get_dataset(config.dataset, **config.data.to_dict())
  if config.get('fedvc') is not None and config.fedvc.virtual_size:     # FedVC: equal-size virtual clients
    data = virtual_clients.virtual_clients(data, config.fedvc.virtual_size, seed=config.seed)
  return data, name
