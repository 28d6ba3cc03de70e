"""`config.data`: the rule of every field a dataset builder takes, checked before any data are loaded.

`config.data` is passed as keyword arguments to the builder of `config.dataset` (data/registry.py). A field
that builder does not take would be silently ignored, so it is refused (with the fields it does take) unless
it still holds the default config's value (`--config.dataset=...` on a config written for the digits); every
known field is checked against its rule below; fields of builders added later still get the finiteness check
of `validate.validate_config`.

`OPTIONAL` fields are declared (value None = the builder's default) in every config, so that
`--config.data.split_json=...` works on the command line for configs that do not set them; `get_dataset`
drops them while they are None. Config files that replace `config.data` build it with `section(...)`.
"""
from __future__ import annotations

import difflib
import inspect
import math
import numbers
import os

import ml_collections

from fedjax_flat.data.registry import OPTIONAL_FIELDS as OPTIONAL   # declared everywhere; None = default

# Fields that are not builder arguments (data/batching.py reads them).
NOT_BUILDER_ARGS = ('shuffle',)

# name -> (kind, lo, lo_open, hi, hi_open, what). Kinds: int, number, bool, str, shape, sizes (an int or a
# list of per-client ints). Bounds None = unbounded; `inf` accepted only where `what` says what it means.
RULES = {
    'num_clients': ('int', 1, False, None, False, 'the number of training clients'),
    'alpha': ('number', 0, False, math.inf, False,
              'Dirichlet label concentration; 0 = one class per client, inf = every client gets the global '
              'label proportions (IID)'),
    'beta': ('number', 0, True, math.inf, False, 'PAM: concentration of the fine labels within a coarse label'),
    'examples_per_client': ('sizes', 1, False, None, False, 'examples of each client'),
    'quantity_skew': ('number', 0, False, None, False, 'log-normal sigma of the client sizes; 0 = equal sizes'),
    'seed': ('int', 0, False, None, False, 'seed of the split'),
    'test_fraction': ('number', 0, True, 1, True, 'held-out share of the examples'),
    'val_fraction': ('number', 0, False, 1, True, 'validation share of each client'),
    'global_fraction': ('number', 0, False, 1, True, 'global test share of each source; 0 = paper-sized'),
    'leave_out': ('int', -1, False, None, False, 'the left-out client, -1 = none'),
    'num_classes': ('int', 1, False, None, False, 'the number of classes'),
    'test_size': ('int', 1, False, None, False, 'test examples'),
    'num_test_clients': ('int', 0, False, None, False, 'unseen test clients'),
    'input_shape': ('shape', 1, False, None, False, 'the input shape'),
    'short_side': ('int', 1, False, None, False, 'pixels of the short side of the stored images'),
    'image_size': ('int', 1, False, None, False, 'pixels of the model input'),
    'num_workers': ('int', 0, False, None, False, 'decoding threads'),
    'shuffle': ('bool',) + (None,) * 4 + ('reshuffle client examples every epoch',),
    'train_augment': ('bool',) + (None,) * 4 + ('augment in the loader',),
    'check_official_sizes': ('bool',) + (None,) * 4 + ('require the official example counts',),
    'data_dir': ('str',) + (None,) * 4 + ('the directory of the dataset files',),
    'shards_dir': ('str',) + (None,) * 4 + ('the directory of the prepared shards',),
    'split_dir': ('str',) + (None,) * 4 + ('where generated splits are saved',),
    'split_json': ('str',) + (None,) * 4 + ('a FedSAM/LEAF split JSON file',),
    'source': ('str',) + (None,) * 4 + ('where the clients come from',),
    'partition': ('str',) + (None,) * 4 + ('how the training set is split into clients',),
    'max_samples': ('int', 0, False, None, False, "a user's first samples kept (LEAF); 0 = all"),
}

# Dataset-specific limits (checked here so that they fail before loading, not inside the builder).
DATASET_RULES = {
    'digits_feature_shift': {'num_clients': (2, 5, 'one distinct transform per client')},
    'cifar100_pam': {'source': ('sqlite', 'generate')},
    'cifar10': {'partition': ('dirichlet', 'random')},     # data/cifar.py PARTITIONS
    'cifar100': {'partition': ('dirichlet', 'random')},
}


# A dataset whose field means something else than RULES says (checked with this rule instead).
RULE_OVERRIDES = {
    'stackoverflow': {'num_clients': ('int', 0, False, None, False,
                                      'users sampled as clients; 0 = every user of the training split')},
    'femnist': {'num_clients': ('int', 0, False, None, False, 'users drawn at random; 0 = every user')},
    'shakespeare': {'num_clients': ('int', 0, False, None, False, 'users drawn at random; 0 = every user')},
}


def section(**values) -> ml_collections.ConfigDict:
  """A `config.data` with the OPTIONAL fields declared (None) and `values` set."""
  d = ml_collections.ConfigDict()
  for name, typ in OPTIONAL.items():
    d[name] = ml_collections.FieldReference(None, field_type=typ)
  for k, v in values.items():
    d[k] = v
  return d


def builder_args(dataset: str):
  """The keyword arguments the builder of `dataset` takes (None when it takes arbitrary ones)."""
  from fedjax_flat.data import registry
  registry.names()
  fn = registry._BUILDERS[dataset]   # pylint: disable=protected-access
  params = inspect.signature(fn).parameters.values()
  named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
  if not named and any(p.kind == p.VAR_KEYWORD for p in params):
    return None
  return named


def _bad(name, value, allowed):
  from fedjax_flat.training.validate import ConfigError
  return ConfigError(f'data.{name}', value, allowed)


def _is_int(v):
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check(name, v, rule):
  kind, lo, lo_open, hi, hi_open, what = rule
  if kind == 'bool':
    if not isinstance(v, bool):
      raise _bad(name, v, f'must be True or False ({what})')
    return
  if kind == 'str':
    if not isinstance(v, str):
      raise _bad(name, v, f'must be a string ({what})')
    if name == 'split_json' and v and not os.path.isfile(v):
      raise _bad(name, v, 'no such file (a FedSAM/LEAF split JSON: users, num_samples, user_data)')
    return
  if kind == 'shape':
    if not (isinstance(v, (tuple, list)) and v and all(_is_int(d) and d >= 1 for d in v)):
      raise _bad(name, v, f'must be a tuple of positive integers ({what})')
    return
  if kind == 'sizes' and isinstance(v, (tuple, list)):
    if not (v and all(_is_int(d) and d >= 0 for d in v)):
      raise _bad(name, v, f'must be an integer >= 1 or a list of per-client integers >= 0 ({what})')
    return
  integer = kind in ('int', 'sizes')
  if (integer and not _is_int(v)) or isinstance(v, bool) or not isinstance(v, numbers.Real):
    raise _bad(name, v, f'must be {"an integer" if integer else "a number"} ({what})')
  if math.isnan(v) or (math.isinf(v) and hi != math.inf):
    raise _bad(name, v, f'must be finite ({what})')
  if lo is not None and (v <= lo if lo_open else v < lo):
    raise _bad(name, v, f'must be {">" if lo_open else ">="} {lo} ({what})')
  if hi is not None and hi != math.inf and (v >= hi if hi_open else v > hi):
    raise _bad(name, v, f'must be {"<" if hi_open else "<="} {hi} ({what})')


def validate(cfg) -> None:
  """Every `config.data` field of `cfg.dataset` (a registered name) against its rule; ConfigError otherwise."""
  from fedjax_flat.training.default_config import default_config
  from fedjax_flat.training.default_config import SEG_AUGMENT_FIELDS, SEGMENTATION_DATA
  if cfg.dataset in SEGMENTATION_DATA:
    return   # every field declared in SEGMENTATION_DATA, checked by validate._validate_segmentation_data
  data = cfg.data.to_dict()
  takes = builder_args(cfg.dataset)
  not_builder_args = NOT_BUILDER_ARGS + SEG_AUGMENT_FIELDS   # the segmentation transforms read these
  inherited = default_config().data.to_dict()     # the default config's digits fields, e.g. alpha=0.0
  for name, v in data.items():
    if v is None:
      continue                      # unset: the builder's default
    if (takes is not None and name not in takes and name not in not_builder_args
        and not (name in inherited and inherited[name] == v)):
      close = difflib.get_close_matches(name, takes, n=1)
      hint = f'did you mean {close[0]!r}? ' if close else ''
      raise _bad(name, v, f'is not a field of dataset {cfg.dataset!r}: {hint}it takes {sorted(takes)}')
    if name in RULES and name not in RULE_OVERRIDES.get(cfg.dataset, {}):
      _check(name, v, RULES[name])
  for name, rule in RULE_OVERRIDES.get(cfg.dataset, {}).items():
    if data.get(name) is not None:
      _check(name, data[name], rule)
  for name, limit in DATASET_RULES.get(cfg.dataset, {}).items():
    v = data.get(name)
    if v is None:
      continue
    if isinstance(limit[0], str):
      if v not in limit:
        raise _bad(name, v, f'dataset {cfg.dataset!r} allows {list(limit)}')
    elif not limit[0] <= v <= limit[1]:
      raise _bad(name, v, f'dataset {cfg.dataset!r} needs {limit[0]} <= {name} <= {limit[1]} ({limit[2]})')
  leave_out = data.get('leave_out')
  if leave_out is not None and data.get('num_clients') is not None and leave_out >= data['num_clients']:
    raise _bad('leave_out', leave_out, f'must be -1 or a client in [0, {data["num_clients"]})')
  fracs = [data.get(k) or 0.0 for k in ('val_fraction', 'test_fraction', 'global_fraction')]
  if cfg.dataset == 'digits_feature_shift' and sum(fracs) >= 0.8:
    raise _bad('val_fraction', data.get('val_fraction'), 'val_fraction + test_fraction + global_fraction must '
               'be < 0.8 (each client keeps some training examples)')
