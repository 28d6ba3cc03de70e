"""The one error contract of every entry point (experiments/*.py): one `error:` line, an exit status, quiet logs.

Exit status: 0 done (or stopped by a signal after checkpointing); 1 a failed operation (`errors.OperationError`:
divergence, a checkpoint or result file that could not be written, no checkpoint restores, a full disk, a
download that failed; any other OSError; an unexpected error); 2 bad input (`errors.BadInputError`: config,
command line and flag values, config file, dataset files, a workdir in use, a file given to a tool).
Flag-parsing errors (a value that does not parse, e.g. `--config.client.lr=abc`, an unknown flag, a missing
required flag) are bad input too: one line, exit 2. No traceback unless --verbosity is given (then an
unexpected error shows its traceback). `run_main(main)` is what each binary calls instead of absl's `app.run`.

`preflight(argv)` runs before absl parses the flags, so that the errors absl would report as tracebacks of
ml_collections (a missing or broken config file, `--config.x` naming no field) are one line and exit 2.
"""
from __future__ import annotations

import difflib
import logging as std_logging
import os
import sys
import traceback
from typing import Optional, Sequence

from absl import app, flags, logging

from fedjax_flat.config import families as config_strings
from fedjax_flat.config import schema as config_schema
from fedjax_flat.errors import BadInputError
from fedjax_flat.errors import ConfigError
from fedjax_flat.errors import OperationError
from fedjax_flat.training.checkpoint import CheckpointMismatchError

BAD_INPUT, FAILED = 2, 1


def where(e: BaseException, path: str) -> str:
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
      if walked == ['published']:    # often empty: list what a published number may be named, not just its keys
        have = ', '.join(keys) or 'none (this config publishes no number)'
        return (f'{where} has no field {part!r}; {hint}its fields: {have}; the fields a published number may '
                f'have: {", ".join(config_schema.PUBLISHED_FIELDS)} (each number may add <field>_std)')
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
    return f'--config={spec}: get_config failed{where(e, path)}: {type(e).__name__}: {e}'
  for flag, dotted in _override_paths(argv):
    why = missing_field(config, dotted)
    if why:
      return f'{flag}: {why}'
  return None


def exit_status(e: BaseException) -> Optional[int]:
  """The exit status for an error (None: an unexpected error)."""
  if isinstance(e, (BadInputError, FileNotFoundError, NotADirectoryError, IsADirectoryError)):
    return BAD_INPUT
  if isinstance(e, (OperationError, OSError)):
    return FAILED
  return None


def message(e: BaseException) -> str:
  """'error: ...' on one line (a config mismatch keeps its per-field lines)."""
  text = str(e)
  if exit_status(e) is None:
    text = f'unexpected {type(e).__name__}: {text}; rerun with --verbosity=1 for the traceback'
  elif isinstance(e, OSError) and not isinstance(e, OperationError) and e.strerror:
    where = ' '.join(repr(f) for f in (e.filename, e.filename2) if f)
    text = f'{e.strerror}{": " + where if where else ""}' + (
        '' if exit_status(e) == BAD_INPUT else '. Free disk space or fix permissions, then rerun the same command')
  if not isinstance(e, CheckpointMismatchError):
    text = ' '.join(line.strip() for line in text.splitlines() if line.strip())
  return f'error: {text}'


def fail(e: BaseException, code: Optional[int] = None, hard_exit: bool = True) -> None:
  """Prints `message(e)` and exits with its status. A failed operation exits at once (os._exit, unless
  hard_exit=False): an I/O failure can leave library writer threads (orbax, tensorboard) waiting on what
  will never come."""
  code = (exit_status(e) or FAILED) if code is None else code
  print(message(e), file=sys.stderr, flush=True)
  if code == FAILED and hard_exit:
    logging.flush()
    sys.stdout.flush()
    os._exit(code)
  sys.exit(code)


def parse_flags(argv):
  """absl's flag parser with the contract's error: a flag that does not parse, an unknown or missing flag is
  one line and exit 2 (absl's own parser prints 'FATAL Flags parsing error' and exits 1)."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f'error: {e}; see --helpshort for the flags', file=sys.stderr, flush=True)
    sys.exit(BAD_INPUT)


def verbose() -> bool:
  """Whether --verbosity was given (then unexpected errors show their traceback)."""
  return 'verbosity' in flags.FLAGS and flags.FLAGS['verbosity'].present > 0


def run_main(main, *, config_preflight: bool = False, quiet_logs: bool = True, hard_exit: bool = True) -> None:
  """What every binary calls instead of `absl.app.run(main)`: flags parsed under the contract, the quiet log
  filter, and every error of `main` one line with its exit status (an unexpected one: exit 1, its traceback
  only with --verbosity). config_preflight: `preflight(sys.argv)` first (binaries with a --config file)."""
  if config_preflight:
    bad = preflight(sys.argv)
    if bad:
      print(f'error: {bad}', file=sys.stderr, flush=True)
      sys.exit(BAD_INPUT)

  def guarded(argv):
    if quiet_logs:
      configure_logging(verbose())
    try:
      return main(argv)
    except Exception as e:  # noqa: BLE001 -- the contract: one line and an exit status, never a traceback
      if exit_status(e) is None and verbose():
        raise
      fail(e, hard_exit=hard_exit)
  app.run(guarded, flags_parser=parse_flags)


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
  if verbosity_given:
    return
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(QuietLogs())
