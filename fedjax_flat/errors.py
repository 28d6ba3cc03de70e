"""The project's error contract: the bottom layer, so that every layer can raise them.

Every entry point (experiments/*.py) turns them into one `error: ...` line without a traceback
(training/cli.run_main):

  BadInputError (exit 2)    the user's input is wrong: a flag, a config field, a file given to the tool.
    ConfigError             config.<field>=<value> with what is allowed.
    DataFormatError         a data file that exists but is truncated, corrupted, unsafe or not in its format
                            (every data reader raises it for malformed JSON, SQLite, images, CSV, pickles).
  OperationError (exit 1)   a correct request that could not be carried out (a run that failed, a disk that
                            is full, a child process that died).
"""
from __future__ import annotations

import contextlib
import csv
import sqlite3
import zipfile


class BadInputError(ValueError):
  """Bad input: the message names the value and the fix (exit status 2)."""


class OperationError(RuntimeError):
  """A failed operation: the message says what failed and what to do (exit status 1)."""


class ConfigError(BadInputError):
  """config.<field>=<value> is invalid, with what is allowed."""

  def __init__(self, field, value, allowed):
    self.field, self.value, self.allowed = field, value, allowed
    super().__init__(f'config.{field}={value!r} is invalid: {allowed}')


class DataFormatError(BadInputError):
  """A data file exists but is truncated, corrupted, unsafe or not in the expected format."""


# What the parsers of the standard library, numpy, PIL and msgpack raise on a malformed file (json:
# JSONDecodeError / UnicodeDecodeError are ValueErrors; sqlite3.DatabaseError; zipfile.BadZipFile; a LEAF or
# split JSON of the wrong shape: KeyError / TypeError / IndexError / AttributeError).
_MALFORMED = (ValueError, KeyError, TypeError, IndexError, AttributeError, EOFError, RecursionError,
              sqlite3.DatabaseError, zipfile.BadZipFile, csv.Error)


@contextlib.contextmanager
def reading(path, what: str, *, images: bool = False):
  """Turns the parser errors of a malformed file into one `DataFormatError` naming the file and what it should
  be. images=True: PIL's OSErrors (an unidentified or truncated image) too; a missing or unreadable file stays
  the OSError it is. `DataFormatError`s raised inside pass unchanged."""
  try:
    yield
  except DataFormatError:
    raise
  except _MALFORMED as e:
    raise DataFormatError(f'{path}: not {what} ({type(e).__name__}: {_short(e)}); the file is truncated, '
                          'corrupted or in another format') from e
  except (OSError, SyntaxError) as e:      # PIL: UnidentifiedImageError, "image file is truncated", "broken PNG"
    if not images or isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)) or \
        (isinstance(e, OSError) and e.errno is not None):     # a real I/O error stays what it is
      raise
    raise DataFormatError(f'{path}: not {what} ({type(e).__name__}: {_short(e)}); the file is truncated, '
                          'corrupted or in another format') from e


def _short(e: BaseException, n: int = 200) -> str:
  text = ' '.join(str(e).split())
  return text if len(text) <= n else text[:n] + '...'
