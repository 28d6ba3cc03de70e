"""Short config strings for the config families: `--config=configs/<family>.py:cifar100,fedasam,swa,alpha=0.5`.

ml_collections' `DEFINE_config_file` passes the text after ':' to the file's `get_config(arg)`. A family file
declares its fields once and calls `parse`:

  FIELDS = {'dataset': ('cifar10', ('cifar10', 'cifar100')),   # enumerated: a bare token or dataset=cifar100
            'swa': (False, bool),                               # flag: the bare token `swa`, or swa=0|1
            'alpha': (0.0, float)}                              # typed: alpha=0.05 only
  opts = config_strings.parse(arg, FIELDS, family='configs/fedsam_cifar.py')

A bad token raises `ConfigStringError` (a `validate.ConfigError`): one line naming the token and every allowed
one. `experiments/train.py` calls `preflight` before absl parses its flags, so the binary prints that line and
exits 2 instead of absl's traceback of the config file. Values are parsed as literals, never evaluated.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, Optional, Sequence, Tuple

from fedjax_flat.errors import ConfigError

_TRUE, _FALSE = ('1', 'true', 'yes'), ('0', 'false', 'no')


class ConfigStringError(ConfigError):
  """A config string token that the family does not know (or a cell it has no setting for)."""

  def __init__(self, family: str, token: str, allowed: str):
    ValueError.__init__(self, f'{family}:{token!r} is invalid: {allowed}')
    self.field, self.value, self.allowed = f'{family}:', token, allowed


def describe(fields: Dict[str, Tuple[Any, Any]]) -> str:
  """'dataset = cifar10 | cifar100; swa (flag); alpha=<float>' for the error message and docstrings."""
  parts = []
  for name, (_, allowed) in fields.items():
    if allowed is bool:
      parts.append(f'{name} (flag)')
    elif isinstance(allowed, tuple):
      parts.append(f'{name} = ' + ' | '.join(map(str, allowed)))
    else:
      parts.append(f'{name}=<{allowed.__name__}>')
  return '; '.join(parts)


def _typed(family, fields, name, text):
  allowed = fields[name][1]
  bad = lambda why: ConfigStringError(family, f'{name}={text}', f'{why}; allowed: {describe(fields)}')  # noqa: E731
  if allowed is bool:
    if text.lower() in _TRUE:
      return True
    if text.lower() in _FALSE:
      return False
    raise bad('expected 0 or 1')
  if isinstance(allowed, tuple):
    if text not in allowed:
      raise bad(f'{name} must be one of {" | ".join(allowed)}')
    return text
  try:
    return allowed(text)
  except ValueError:
    raise bad(f'expected a {allowed.__name__}') from None


def parse(arg: Optional[str], fields: Dict[str, Tuple[Any, Any]], *, family: str) -> Dict[str, Any]:
  """`key,key=value,...` -> {field: value} with every field (defaults filled in)."""
  out = {name: default for name, (default, _) in fields.items()}
  seen = {}
  for token in filter(None, (t.strip() for t in (arg or '').split(','))):
    name, eq, text = token.partition('=')
    if eq:
      if name not in fields:
        raise ConfigStringError(family, token, f'unknown key {name!r}; allowed: {describe(fields)}')
      value = _typed(family, fields, name, text)
    elif token in fields and fields[token][1] is bool:
      name, value = token, True
    else:
      owners = [n for n, (_, allowed) in fields.items() if isinstance(allowed, tuple) and token in allowed]
      if len(owners) != 1:
        raise ConfigStringError(family, token, f'unknown token; allowed: {describe(fields)}')
      name, value = owners[0], token
    if name in seen:
      raise ConfigStringError(family, token, f'{name} is already set by {seen[name]!r}; allowed: '
                              f'{describe(fields)}')
    seen[name] = token
    out[name] = value
  return out


def check(family: str, name: str, value, allowed: Sequence, *, context: str = '') -> None:
  """Raises ConfigStringError unless value is one of allowed (numbers compared as floats)."""
  ok = any(float(value) == float(a) for a in allowed) if isinstance(value, (int, float)) else value in allowed
  if not ok:
    where = f' {context}' if context else ''
    raise ConfigStringError(family, f'{name}={value:g}' if isinstance(value, float) else f'{name}={value}',
                            f'the table has no such cell{where}; allowed {name}: '
                            f'{" | ".join(f"{a:g}" if isinstance(a, float) else str(a) for a in allowed)}')


def set_published(config, source: str, accuracy: Optional[float], std: Optional[float] = None,
                  **metrics) -> None:
  """Fills config.published (documentation only; see default_config). accuracy None = nothing published."""
  if accuracy is None:
    return
  config.published.source = source
  config.published.accuracy = float(accuracy)
  if std is not None:
    config.published.accuracy_std = float(std)
  for k, v in metrics.items():
    if v is not None:
      config.published[k] = float(v)


def load_module(path: str):
  """A config file as a fresh module (its get_config, and CELLS for a family)."""
  mod_spec = importlib.util.spec_from_file_location('config_' + os.path.basename(path)[:-3], path)
  mod = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(mod)
  return mod


def load_config(spec: str):
  """`path[:arg]` -> the file's get_config(arg) (or get_config()), as DEFINE_config_file calls it."""
  path, _, arg = spec.partition(':')
  mod = load_module(path)
  return mod.get_config(arg) if arg else mod.get_config()


def config_spec(argv: Sequence[str]) -> Optional[str]:
  """The value of the --config flag in argv (`path[:arg]`), or None."""
  spec = None
  for i, a in enumerate(argv):
    if a.startswith('--config='):
      spec = a[len('--config='):]
    elif a == '--config' and i + 1 < len(argv):
      spec = argv[i + 1]
  return spec


def preflight(argv: Sequence[str]) -> Optional[str]:
  """The ConfigError message of the --config flag's get_config(arg), or None (no flag, a good string, or an
  error of another kind, which absl then reports as usual)."""
  spec = config_spec(argv)
  if not spec or not os.path.isfile(spec.partition(':')[0]):
    return None
  try:
    load_config(spec)
  except ConfigError as e:
    return str(e)
  except Exception:  # noqa: BLE001 -- absl's flag parsing reports everything else with its context
    return None
  return None
