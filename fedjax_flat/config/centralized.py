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


def validate(cfg) -> None:
  """config.centralized: ConfigError naming the field (called from config/validate.py)."""
  c = cfg.centralized

  def num(name, ok, allowed):
    v = c[name]
    if not _finite(v) or not ok(v):
      raise ConfigError(f'centralized.{name}', v, allowed)
  num('epochs', lambda v: isinstance(v, numbers.Integral) and v >= 1, 'an integer >= 1')
  num('lr', lambda v: v >= 0, 'a number >= 0 (0 = client.lr)')
  num('momentum', lambda v: 0 <= v < 1, 'a number in [0, 1)')
  num('weight_decay', lambda v: v >= 0 or v == -1, 'a number >= 0, or -1 (= client.weight_decay)')
  num('batch_size', lambda v: isinstance(v, numbers.Integral) and v >= 0, 'an integer >= 0 (0 = client.batch_size)')
  if c.schedule not in SCHEDULES:
    raise ConfigError('centralized.schedule', c.schedule, f'allowed values: {sorted(SCHEDULES)}')
  num('accuracy', lambda v: 0 <= v <= 1, 'a fraction in [0, 1] (summary.json accuracies are fractions; '
      '0 = no reference)')
  num('window', lambda v: isinstance(v, numbers.Integral) and v >= 1, 'an integer >= 1 (evaluations averaged)')
  fr = c.fractions
  if (not isinstance(fr, (tuple, list)) or not fr or not all(_finite(f) and 0 < f <= 1 for f in fr)
      or len(set(fr)) != len(fr)):
    raise ConfigError('centralized.fractions', fr, 'distinct numbers in (0, 1], e.g. (0.7, 0.9)')
  if not isinstance(c.path, str):
    raise ConfigError('centralized.path', c.path, "a path to a centralized run's centralized.json or workdir")
  if c.path:
    if c.accuracy:
      raise ConfigError('centralized.path', c.path, f'centralized.accuracy={c.accuracy} is set too: use one of the two')
    try:
      read_reference(c.path)
    except ValueError as e:
      raise ConfigError('centralized.path', c.path, str(e)) from None
