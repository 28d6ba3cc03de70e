"""`--config.algo.<name>=<value>` for any config and any algorithm.

ml_collections' config flags can only override keys the config file already has, and most configs leave
`config.algo` empty (the algorithm's registered defaults apply). So the experiment binaries take these flags
out of argv before absl parses it, and apply them once the config (and so `config.algorithm`) is known:
`config.algo` is filled with the algorithm's declared defaults (its rules, algorithms/hparams.py), then each
override is parsed with the type of its default. Values are parsed as literals, never evaluated.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple
from fedjax_flat.errors import ConfigError
from fedjax_flat.config import schema

_PREFIX = '--config.algo.'


def _is_value(text: str) -> bool:
  """A following argument that can be a value: not a flag ('-0.1' is a value, '--fresh' is not)."""
  if not text.startswith('-'):
    return True
  try:
    float(text)
    return True
  except ValueError:
    return False


def split_argv(argv: Sequence[str]) -> Tuple[List[str], List[Tuple[str, str]]]:
  """(argv without the --config.algo.* flags, [(name, value text), ...]) in command-line order.

  Raises validate.ConfigError when a flag has no value (`--config.algo.mu` last, or followed by a flag).
  """
  rest, overrides = [], []
  i = 0
  while i < len(argv):
    arg = argv[i]
    if arg.startswith(_PREFIX):
      name, eq, value = arg[len(_PREFIX):].partition('=')
      if not eq:                        # "--config.algo.mu 0.1"
        if i + 1 >= len(argv) or not _is_value(argv[i + 1]):
          raise ConfigError(f'algo.{name}', None, f'{arg} needs a value: {arg}=<value>')
        value = argv[i + 1]
        i += 1
      overrides.append((name, value))
    else:
      rest.append(arg)
    i += 1
  return rest, overrides


def _parse(name: str, text: str, like):
  if isinstance(like, bool):
    low = text.strip().lower()
    if low in ('true', '1', 'yes'):
      return True
    if low in ('false', '0', 'no'):
      return False
    raise ValueError(f'algo.{name}={text!r}: expected true or false')
  if isinstance(like, int):
    try:
      return int(text)
    except ValueError:
      raise ValueError(f'algo.{name}={text!r}: expected an integer') from None
  if isinstance(like, float):
    try:
      return float(text)
    except ValueError:
      raise ValueError(f'algo.{name}={text!r}: expected a number') from None
  return text


def apply(config, overrides: Sequence[Tuple[str, str]]):
  """Fills config.algo with the algorithm's registered defaults and applies the overrides (in place).

  Raises validate.ConfigError naming the field when the algorithm or a hyperparameter name is unknown or a
  value does not parse.
  """
  if not overrides:
    return config
  d = schema.declared(config.algorithm)
  if d is None:
    raise ConfigError('algorithm', config.algorithm, f'allowed: {sorted(schema.algorithm_names())}')
  defaults = d.defaults()
  with config.unlocked():
    for name, value in defaults.items():
      if name not in config.algo:
        config.algo[name] = value
    for name, text in overrides:
      if name not in config.algo:
        known = ', '.join(sorted(config.algo.keys())) or 'none'
        raise ConfigError(f'algo.{name}', text, f'not a hyperparameter of {config.algorithm} (it has: {known})')
      try:
        config.algo[name] = _parse(name, text, config.algo[name])
      except ValueError as e:
        raise ConfigError(f'algo.{name}', text, str(e)) from None
  return config
