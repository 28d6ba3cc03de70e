"""What experiments/train.py prints and returns: one line per error with its exit status, quiet logs.

Exit status (documented in train.py): 0 done or stopped by a signal after checkpointing; 1 the run failed
(divergence, a checkpoint or result file could not be written, no checkpoint restores); 2 bad input (config,
command line, config file, dataset files, a workdir in use). absl's own flag-parsing errors (a value that
does not parse, e.g. `--config.client.lr=abc`, or an unknown flag) keep absl's exit status 1 and its
"FATAL Flags parsing error" line.

`preflight(argv)` runs before absl parses the flags, so that the errors absl would report as tracebacks of
ml_collections (a missing or broken config file, `--config.x` naming no field) are one line and exit 2.
"""
from __future__ import annotations

import difflib
import logging as std_logging
import os
import traceback
from typing import Optional, Sequence
from fedjax_flat.config import families as config_strings
from fedjax_flat.errors import ConfigError
from fedjax_flat.errors import DataFormatError
from fedjax_flat.training import checkpoint, loop, writers
from fedjax_flat.training.checkpoint import CheckpointMismatchError

BAD_INPUT, FAILED = 2, 1


def _where(e: BaseException, path: str) -> str:
  """'file:line' of the innermost frame of the config file in e's traceback."""
  frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename) == os.path.abspath(path)]
  return f' ({path}:{frames[-1].lineno})' if frames else ''


def _override_paths(argv: Sequence[str]):
  for a in argv:
    for prefix in ('--config.', '--noconfig.'):
      if a.startswith(prefix):
        yield a.partition('=')[0], a[len(prefix):].partition('=')[0]


def missing_field(config, dotted: str) -> Optional[str]:
  """Why `config.<dotted>` names no field (with a 'did you mean' hint), or None if it does."""
  import ml_collections
  node, walked = config, []
  for part in dotted.split('.'):
    if '[' in part:                       # indexing syntax: left to ml_collections
      return None
    if not isinstance(node, ml_collections.ConfigDict):
      return f'config.{".".join(walked)} is a value, not a section: it has no field {part!r}'
    if part not in node:
      keys = sorted(node.keys())
      close = difflib.get_close_matches(part, keys, n=1)
      hint = f'did you mean {close[0]!r}? ' if close else ''
      where = f'config.{".".join(walked)}' if walked else 'the config'
      return f'{where} has no field {part!r}; {hint}its fields: {", ".join(keys)}'
    node = node[part]
    walked.append(part)
  return None


def preflight(argv: Sequence[str]) -> Optional[str]:
  """The one-line error for the --config flag and the --config.<field> overrides, or None if they are fine.

  --config.algo.* overrides must already be out of argv (config/algo_flags.py checks them).
  """
  spec = config_strings.config_spec(argv)
  if not spec:
    return None                            # absl reports the missing required flag
  path = spec.partition(':')[0]
  if not os.path.isfile(path):
    return f'--config={spec}: no such config file {path!r}'
  try:
    config = config_strings.load_config(spec)
  except ConfigError as e:
    return str(e)
  except SyntaxError as e:
    return f'--config={spec}: syntax error in {e.filename}:{e.lineno}: {e.msg}'
  except Exception as e:  # noqa: BLE001 -- any error of the user's config file is one line, not a traceback
    return f'--config={spec}: get_config failed{_where(e, path)}: {type(e).__name__}: {e}'
  for flag, dotted in _override_paths(argv):
    why = missing_field(config, dotted)
    if why:
      return f'{flag}: {why}'
  return None


def exit_status(e: BaseException) -> Optional[int]:
  """The exit status for an error of the run (None: an unexpected error, shown with its traceback)."""
  if isinstance(e, (ConfigError, DataFormatError, FileNotFoundError)):
    return BAD_INPUT
  if isinstance(e, (loop.DivergenceError, checkpoint.CheckpointError, writers.ResultsWriteError)):
    return FAILED
  return None


def message(e: BaseException) -> str:
  """'error: ...' on one line (a config mismatch keeps its per-field lines)."""
  text = str(e)
  if not isinstance(e, CheckpointMismatchError):
    text = ' '.join(line.strip() for line in text.splitlines() if line.strip())
  return f'error: {text}'


class QuietLogs(std_logging.Filter):
  """The default terminal log: warnings and errors of everything, INFO only from fedjax_flat itself (progress,
  resume). The ~50 INFO lines of jax, orbax and matplotlib show with --verbosity=0 (or higher)."""

  def filter(self, record):
    if record.levelno >= std_logging.WARNING:
      return True
    path = record.pathname.replace(os.sep, '/')
    return '/fedjax_flat/' in path or '/experiments/' in path


def configure_logging(verbosity_given: bool) -> None:
  """absl INFO with the QuietLogs filter, unless --verbosity was given (then absl's own level, unfiltered)."""
  from absl import logging
  if verbosity_given:
    return
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(QuietLogs())
