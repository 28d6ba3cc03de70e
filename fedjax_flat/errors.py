"""The project's bad-input errors: the bottom layer, so that every layer can raise them.

A binary turns each into one line and exit status 2 (training/cli.py): `ConfigError` for a config field,
`DataFormatError` for a data file that exists but is truncated, corrupted, unsafe or not in its format.
"""
from __future__ import annotations


class ConfigError(ValueError):
  """config.<field>=<value> is invalid, with what is allowed."""

  def __init__(self, field, value, allowed):
    self.field, self.value, self.allowed = field, value, allowed
    super().__init__(f'config.{field}={value!r} is invalid: {allowed}')


class DataFormatError(ValueError):
  """A data file exists but is truncated, corrupted, unsafe or not in the expected format."""
