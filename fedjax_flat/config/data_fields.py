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
import numbers
import os

from fedjax_flat.config.default_config import default_config
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.transforms.pipeline import SEG_AUGMENT_FIELDS
from fedjax_flat.errors import ConfigError

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
    'max_samples': ('int', 0, False, None, False, "a user's first samples kept (LEAF); 0 = all"),
}

def _bad(name, value, allowed):
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
  for field, limit in entry.meta.get('limits', {}).items():
    v = data.get(field)
    if v is None:
      continue
    if isinstance(limit[0], str):
      if v not in limit:
        raise _bad(field, v, f'dataset {name!r} allows {list(limit)}')
    elif not limit[0] <= v <= limit[1]:
      raise _bad(field, v, f'dataset {name!r} needs {limit[0]} <= {field} <= {limit[1]} ({limit[2]})')
  leave_out = data.get('leave_out')
  if leave_out is not None and data.get('num_clients') is not None and leave_out >= data['num_clients']:
    raise _bad('leave_out', leave_out, f'must be -1 or a client in [0, {data["num_clients"]})')
  check = entry.meta.get('check')
  if check is not None:
    check(data)
