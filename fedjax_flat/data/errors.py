"""The base class of "this dataset file is malformed or unsafe" errors (bad input: train.py exits 2)."""


class DataFormatError(ValueError):
  """A data file exists but is truncated, corrupted, unsafe or not in the expected format."""
