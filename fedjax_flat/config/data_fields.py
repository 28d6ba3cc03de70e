"""`config.data`: the rule of every field a dataset builder takes, checked before any data are loaded.

`config.data` is passed as keyword arguments to the builder of `config.dataset` (data/registry.py). A field
that builder does not take would be silently ignored, so it is refused (with the fields it does take) unless
it still holds the default config's value (`--config.dataset=...` on a config written for the digits); every
known field is checked against its rule below; fields of builders added later still get the finiteness check
of `validate.validate_config`.

The OPTIONAL fields (data/registry.OPTIONAL_FIELDS) are declared (value None = the builder's default) in
every config, so that `--config.data.split_json=...` works on the command line for configs that do not set
them; `get_dataset` drops them while they are None. Config files that replace `config.data` build it with
`default_config.data_section(...)`. A dataset's own rules (a field that means something else there, limits, a
cross-field check) are declared by its module when it registers (data/registry.py).
"""
from __future__ import annotations

import difflib
import math
import os

from fedjax_flat.config.default_config import default_config
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.transforms.pipeline import SEG_AUGMENT_FIELDS
from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import EXECUTION, INPUT, DataValue, Field, Section
from fedjax_flat.schema import tagged as schema_tagged

# Fields that are not builder arguments (data/batching.py reads them).
NOT_BUILDER_ARGS = ('shuffle',)


def _field(name, kind, lo=None, lo_open=False, hi=None, hi_open=False, what='', tags=()):
  return Field(name, DataValue(None, kind, lo, lo_open, hi, hi_open, what), what, tags)


# The common rule of every builder argument name (a dataset whose field means something else declares its own:
# data/registry.py `rules=`, a schema rule such as DataValue). Kinds: int, number,
# bool, str, shape, sizes (an int or a list of per-client ints); `inf` accepted only where `what` says what it means.
# Tags: the seed, partition and number of clients are a batched program's per-run inputs (core/runs.INPUT_FIELDS);
# where the files are says how a run was executed, not what (sweeps/report.EXECUTION_KEYS).
FIELDS = (
    _field('num_clients', 'int', 1, what='the number of training clients', tags={INPUT}),
    _field('alpha', 'number', 0, hi=math.inf, what='Dirichlet label concentration; 0 = one class per client, inf = '
           'every client gets the global label proportions (IID)', tags={INPUT}),
    _field('beta', 'number', 0, True, math.inf, what='PAM: concentration of the fine labels within a coarse label'),
    _field('examples_per_client', 'sizes', 1, what='examples of each client'),
    _field('quantity_skew', 'number', 0, what='log-normal sigma of the client sizes; 0 = equal sizes'),
    _field('seed', 'int', 0, what='seed of the split', tags={INPUT}),
    _field('test_fraction', 'number', 0, True, 1, True, what='held-out share of the examples'),
    _field('val_fraction', 'number', 0, False, 1, True, what='validation share of each client'),
    _field('global_fraction', 'number', 0, False, 1, True, what='global test share of each source; 0 = paper-sized'),
    _field('leave_out', 'int', -1, what='the left-out client, -1 = none'),
    _field('num_classes', 'int', 1, what='the number of classes'),
    _field('test_size', 'int', 1, what='test examples'),
    _field('num_test_clients', 'int', 0, what='unseen test clients'),
    _field('input_shape', 'shape', 1, what='the input shape'),
    _field('short_side', 'int', 1, what='pixels of the short side of the stored images'),
    _field('image_size', 'int', 1, what='pixels of the model input'),
    _field('num_workers', 'int', 0, what='decoding threads'),
    _field('shuffle', 'bool', what='reshuffle client examples every epoch'),
    _field('train_augment', 'bool', what='augment in the loader'),
    _field('check_official_sizes', 'bool', what='require the official example counts'),
    _field('data_dir', 'str', what='the directory of the dataset files', tags={EXECUTION}),
    _field('shards_dir', 'str', what='the directory of the prepared shards'),
    _field('split_dir', 'str', what='where generated splits are saved'),
    _field('split_json', 'str', what='a FedSAM/LEAF split JSON file'),
    _field('source', 'str', what='where the clients come from'),
    _field('partition', 'str', what='how the training set is split into clients'),
    _field('max_samples', 'int', 0, what="a user's first samples kept (LEAF); 0 = all"),
)
RULES = {f.name: f.rule for f in FIELDS}


def tagged(tag: str):
  """'data.<field>' of the common data fields carrying `tag` (the kind tables: fedjax_flat/schema.py)."""
  return schema_tagged((Section('data', FIELDS),), tag)


def _bad(name, value, allowed):
  return ConfigError(f'data.{name}', value, allowed)


def _check(name, v, rule):
  why = rule.why_not(v)
  if why:
    raise _bad(name, v, why)
  if name == 'split_json' and v and not os.path.isfile(v):
    raise _bad(name, v, 'no such file (a FedSAM/LEAF split JSON: users, num_samples, user_data)')


def validate(cfg) -> None:
  """Every `config.data` field of `cfg.dataset` (a registered name) against its rule; ConfigError otherwise.
  The dataset's own declarations (data/registry.py: rules, limits, check) come from its module."""
  name = cfg.dataset
  if data_registry.declared_fields(name) is not None:
    return   # declared whole by the dataset (segmentation), checked by validate._validate_segmentation_data
  data = cfg.data.to_dict()
  takes = data_registry.builder_args(name)
  not_builder_args = NOT_BUILDER_ARGS + SEG_AUGMENT_FIELDS   # the segmentation transforms read these
  inherited = default_config().data.to_dict()     # the default config's digits fields, e.g. alpha=0.0
  entry = data_registry.DATASETS.entry(name)
  own_rules = entry.meta.get('rules', {})
  for field, v in data.items():
    if v is None:
      continue                      # unset: the builder's default
    if (takes is not None and field not in takes and field not in not_builder_args
        and not (field in inherited and inherited[field] == v)):
      close = difflib.get_close_matches(field, takes, n=1)
      hint = f'did you mean {close[0]!r}? ' if close else ''
      raise _bad(field, v, f'is not a field of dataset {name!r}: {hint}it takes {sorted(takes)}')
    if field in RULES and field not in own_rules:
      _check(field, v, RULES[field])
  for field, rule in own_rules.items():
    if data.get(field) is not None:
      _check(field, data[field], rule)
  for field, limit in entry.meta.get('limits', {}).items():   # schema rules (data/registry.py `limits=`)
    if data.get(field) is not None:
      _check(field, data[field], limit)
  leave_out = data.get('leave_out')
  if leave_out is not None and data.get('num_clients') is not None and leave_out >= data['num_clients']:
    raise _bad('leave_out', leave_out, f'must be -1 or a client in [0, {data["num_clients"]})')
  check = entry.meta.get('check')
  if check is not None:
    check(data)
