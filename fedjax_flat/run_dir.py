"""What a finished or running fedjax_flat run directory is: `config.json` + `checkpoints/`.

Config fields that name another run (init.checkpoint, grouping.probe_checkpoint) are checked against this
before anything is loaded; training/init.py and the analysis tools load from it.
"""
from __future__ import annotations

import os


def run_dir_of(path: str) -> str:
  """A run directory from either the run directory or its checkpoints/ folder."""
  path = os.path.abspath(path)
  if not os.path.exists(os.path.join(path, 'config.json')) and os.path.basename(path.rstrip('/')) == 'checkpoints':
    path = os.path.dirname(path.rstrip('/'))
  return path


def is_run_dir(path: str) -> bool:
  d = run_dir_of(path)
  return os.path.isfile(os.path.join(d, 'config.json')) and os.path.isdir(os.path.join(d, 'checkpoints'))
