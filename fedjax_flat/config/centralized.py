"""config.centralized: the centralized upper bound's fields and rules (the runner is training/centralized.py).

`read_reference` reads a centralized run's `centralized.json` (or its workdir): the accuracy that summary.json's
rounds_to_<X>pct_centralized are measured against (`rounds_to_centralized`, called by training/loop.py).
"""
from __future__ import annotations

import json
import math
import numbers
import os
from typing import Dict, List, Optional

import numpy as np

from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import Choice, Field, Section, String, Test

RESULT_FILE = 'centralized.json'
# cosine annealing; constant; poly: lr (1 - t / T) ** 0.9 (the LADD release's poly policy)
SCHEDULES = ('cosine', 'constant', 'poly')
POLY_POWER = 0.9


def _finite(v) -> bool:
  return isinstance(v, numbers.Number) and not isinstance(v, bool) and math.isfinite(v)


def reference_path(path: str) -> str:
  return os.path.join(path, RESULT_FILE) if os.path.isdir(path) else path


def read_reference(path: str) -> float:
  """The `final_test_accuracy` of a centralized run's JSON (or workdir); ValueError if unreadable."""
  p = reference_path(path)
  try:
    with open(p) as f:
      d = json.load(f)
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f'cannot read {p} ({type(e).__name__}: {e})') from e
  acc = d.get('final_test_accuracy') if isinstance(d, dict) else None
  if not _finite(acc) or not 0 < acc <= 1:
    raise ValueError(f'{p} has no final_test_accuracy in (0, 1] (got {acc!r}); is it a centralized.json?')
  return float(acc)


def reference_accuracy(config):
  """(accuracy, source) of the configured centralized reference, or (None, None)."""
  c = config.get('centralized')
  if c is None:
    return None, None
  if c.path:
    return read_reference(c.path), os.path.abspath(reference_path(c.path))
  if c.accuracy:
    return float(c.accuracy), 'config.centralized.accuracy'
  return None, None


def fraction_key(f: float) -> str:
  return f'rounds_to_{100 * f:g}pct_centralized'


def rounds_to(records: List[Dict], key: str, target: float, window: int = 1) -> Optional[int]:
  """The first record's round where the mean of `key` over the last `window` records (fewer at the start)
  reaches target."""
  accs = []
  for rec in records:
    if rec.get(key) is None:
      continue
    accs.append(float(rec[key]))
    if np.mean(accs[-window:]) >= target:
      return int(rec['round'])
  return None


def rounds_to_centralized(records: List[Dict], config, model: str = 'global') -> Dict:
  """summary.json fields: the centralized reference and the rounds to each fraction of it ({} if none)."""
  acc, source = reference_accuracy(config)
  if acc is None:
    return {}
  key = ('' if model == 'global' else f'{model}/') + 'test_accuracy'
  c = config.centralized
  out = {'centralized_accuracy': acc, 'centralized_source': source, 'rounds_to_centralized_window': int(c.window),
         'rounds_to_centralized_model': model}
  for f in c.fractions:
    out[fraction_key(f)] = rounds_to(records, key, f * acc, int(c.window))
  return out


def _fractions(fr) -> bool:
  return (isinstance(fr, (tuple, list)) and bool(fr) and all(_finite(f) and 0 < f <= 1 for f in fr)
          and len(set(fr)) == len(fr))


def _path_check(cfg) -> None:
  c = cfg.centralized
  if c.path:
    if c.accuracy:
      raise ConfigError('centralized.path', c.path, f'centralized.accuracy={c.accuracy} is set too: use one of the two')
    try:
      read_reference(c.path)
    except ValueError as e:
      raise ConfigError('centralized.path', c.path, str(e)) from None


def _rule(default, ok, allowed, what):
  """A finite number that `ok` accepts, else the message `allowed`."""
  return Test(default, ok=lambda v: _finite(v) and ok(v), message=allowed, what=what)


# config.centralized: how experiments/centralized.py trains the upper bound and, for federated runs, its
# accuracy (or the path of its centralized.json) for summary.json's rounds_to_<70|90>pct_centralized.
SECTION = Section('centralized', (
    Field('epochs', _rule(10, lambda v: isinstance(v, numbers.Integral) and v >= 1, 'an integer >= 1',
                          'integer >= 1'), 'epochs of the centralized run'),
    Field('lr', _rule(0.0, lambda v: v >= 0, 'a number >= 0 (0 = client.lr)', 'number >= 0'),
          '0 = client.lr; annealed over all steps (schedule)'),
    Field('momentum', _rule(0.9, lambda v: 0 <= v < 1, 'a number in [0, 1)', 'number in [0, 1)'), 'SGD momentum'),
    Field('weight_decay', _rule(-1.0, lambda v: v >= 0 or v == -1, 'a number >= 0, or -1 (= client.weight_decay)',
                                'number >= 0 | -1'), '-1 = client.weight_decay'),
    Field('batch_size', _rule(0, lambda v: isinstance(v, numbers.Integral) and v >= 0,
                              'an integer >= 0 (0 = client.batch_size)', 'integer >= 0'), '0 = client.batch_size'),
    Field('schedule', Choice('cosine', SCHEDULES, sort=True), "'cosine' | 'constant' | 'poly' (power 0.9)"),
    Field('accuracy', _rule(0.0, lambda v: 0 <= v <= 1, 'a fraction in [0, 1] (summary.json accuracies are '
                            'fractions; 0 = no reference)', 'fraction in [0, 1]'),
          'federated runs: the centralized accuracy (a fraction); 0 = none'),
    Field('path', String('', "a path to a centralized run's centralized.json or workdir"),
          "or a centralized run's centralized.json / workdir"),
    Field('fractions', Test((0.7, 0.9), ok=_fractions, message='distinct numbers in (0, 1], e.g. (0.7, 0.9)',
                            what='distinct numbers in (0, 1]'), 'rounds_to_<100 f>pct_centralized for f in these'),
    Field('window', _rule(1, lambda v: isinstance(v, numbers.Integral) and v >= 1,
                          'an integer >= 1 (evaluations averaged)', 'integer >= 1'),
          'evaluations averaged (the FedSeq release: 5)'),
), check=_path_check, doc='the centralized upper bound (training/centralized.py) and the rounds to reach it')


def validate(cfg) -> None:
  """config.centralized: ConfigError naming the field (called from config/validate.py)."""
  SECTION.validate(cfg)
