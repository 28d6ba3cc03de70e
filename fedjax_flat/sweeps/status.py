"""A sweep's files: the driver's lock on its directory, the runs' workdir locks, run status and sweep.json.

One driver per sweep directory: `lock_sweep_dir` holds an exclusive flock on <dir>/.sweep.lock for the
driver's life (a second driver is refused, naming the first's pid), so sweep.json has one writer; it is written
atomically (a temporary file renamed over it, `write_manifest`). `run_status` tells a finished run (skipped on a
rerun) from a partial one (resumed) or one finished with another config (`sweep_config.txt`, `mark_config`).
"""
from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import shlex
from typing import Any, Dict, List, Optional

from fedjax_flat import errors
from fedjax_flat.sweeps.grid import Run, SweepError, values_equal

SWEEP_LOCK = '.sweep.lock'


def lock_sweep_dir(sweep_dir: str) -> Optional[int]:
  """An exclusive flock on <sweep_dir>/.sweep.lock, held until the returned descriptor is closed (the kernel
  drops it when the driver ends, however it ends). SweepError naming the holder's pid if another driver
  holds it. None on filesystems without flock (then a second driver is not detected)."""
  os.makedirs(sweep_dir, exist_ok=True)
  path = os.path.join(sweep_dir, SWEEP_LOCK)
  fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = os.pread(fd, 64, 0).decode(errors='replace').strip()
    os.close(fd)
    raise SweepError(f'sweep directory {sweep_dir} is in use by another sweep driver '
                     f'({"process " + holder if holder.isdigit() else "its pid is not recorded yet"}; lock {path}): '
                     'wait for it to finish, or stop it (its runs checkpoint and stop), then rerun') from None
  except OSError as e:
    os.close(fd)
    if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
      return None
    raise
  try:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
  except OSError:
    pass
  return fd


def workdir_holder(workdir: str) -> Optional[str]:
  """The pid (as text) of a live process holding the run's workdir lock (training/workdir.py), else None."""
  path = os.path.join(workdir, '.run.lock')
  try:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
  except OSError:
    return None
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except BlockingIOError:
    return os.pread(fd, 64, 0).decode(errors='replace').split(' ')[0].strip() or '?'
  except OSError:
    return None
  finally:
    os.close(fd)       # releases the probe's shared lock, if it got one
  return None


# --------------------------------------------------------------------------------------------- status

def _get(d: Dict, dotted: str):
  for part in dotted.split('.'):
    if not isinstance(d, dict) or part not in d:
      return '<absent>'
    d = d[part]
  return d


def run_status(run: Run) -> str:
  """'finished' (summary.json complete and config.json holds this run's overrides and seed), 'mismatch'
  (finished, but with other values: rerun with --fresh), 'partial' (started: train.py resumes it) or 'new'."""
  try:
    with open(os.path.join(run.workdir, 'summary.json')) as f:
      summary = json.load(f)
    with open(os.path.join(run.workdir, 'config.json')) as f:
      config = json.load(f)
  except (OSError, ValueError):
    return 'partial' if os.path.isdir(os.path.join(run.workdir, 'checkpoints')) else 'new'
  if summary.get('experiment') == 'source pre-training':
    pass              # its summary.json is written once, at the end (training/source_pretrain.py)
  elif summary.get('rounds_completed', -1) < config.get('rounds', math.inf) or summary.get('stopped_by_signal'):
    return 'partial'
  wanted = {**run.overrides, 'seed': run.seed}
  if any(not values_equal(_get(config, k), v) for k, v in wanted.items()):
    return 'mismatch'
  # config.json does not name the config file it came from: the sweep that launched the run wrote it beside
  # (two single-cell sweeps in one --sweep_dir share the cell name 'base' but not their config).
  try:
    with open(os.path.join(run.workdir, CONFIG_MARK)) as f:
      if f.read().strip() != (run.config or '').strip():
        return 'mismatch'
  except OSError:
    pass              # a run from before the mark, or not launched by a sweep: overrides and seed decide
  return 'finished'


CONFIG_MARK = 'sweep_config.txt'


def mark_config(run: Run) -> None:
  """Names the run's config (file[:cell]) in its workdir, for run_status."""
  os.makedirs(run.workdir, exist_ok=True)
  tmp = os.path.join(run.workdir, f'.{CONFIG_MARK}.{os.getpid()}')
  with open(tmp, 'w') as f:
    f.write((run.config or '') + '\n')
  os.replace(tmp, os.path.join(run.workdir, CONFIG_MARK))


# --------------------------------------------------------------------------------------------- manifest

def manifest_writer(manifest_runs: Optional[List[Run]], prior: Optional[Dict[str, Dict]]):
  """write_manifest, or for one stage of a sweep (run_stages) a writer listing every run of the sweep: the other
  stages' with their states `prior`, this stage's with the states it is given."""
  if manifest_runs is None:
    return write_manifest
  return lambda sweep_dir, runs, info, states: write_manifest(sweep_dir, manifest_runs, info,
                                                              {**(prior or {}), **states})


class ManifestWriteError(errors.OperationError):
  """sweep.json could not be written (a full disk, permissions)."""


def write_manifest(sweep_dir: str, runs: List[Run], info: Dict[str, Any], states: Dict[str, Dict]) -> str:
  """sweep.json, atomically (a temporary file of this process renamed over it; the driver holds the sweep
  directory's lock, so it is the one writer). ManifestWriteError on a full disk / permissions."""
  path = os.path.join(sweep_dir, 'sweep.json')
  doc = dict(info, runs=[dict(cell=r.cell, seed=r.seed, workdir=os.path.relpath(r.workdir, sweep_dir),
                              config=r.config, overrides=r.overrides, reference=r.reference,
                              command=shlex.join(r.argv()), **({'stage': r.stage} if r.stage else {}),
                              **states.get(r.key, {})) for r in runs])
  tmp = f'{path}.{os.getpid()}.tmp'
  try:
    os.makedirs(sweep_dir, exist_ok=True)
    with open(tmp, 'w') as f:
      f.write(json.dumps(doc, indent=1, default=str))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise ManifestWriteError(f'could not write {path}: {e.strerror or e}. Free disk space or fix permissions, '
                             'then rerun the same command: finished runs are skipped, interrupted ones resume '
                             'from their checkpoints') from None
  return path


def settled_state(run, fresh: bool):
  """The state of a run a sweep does not start: finished already ('skipped (finished)'), or finished with another
  config or values (failed, unless --fresh starts it over); None: the sweep runs it."""
  st = run_status(run)
  if st == 'finished':
    return {'status': 'skipped (finished)'}
  if st == 'mismatch' and not fresh:
    return {'status': 'failed', 'returncode': None,
            'error': f'{run.workdir} finished with another config or other values; give this sweep its own '
            '--sweep_dir, or rerun it with --fresh'}
  return None
