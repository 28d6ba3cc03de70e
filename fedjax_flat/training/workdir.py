"""A run's hold on its workdir: an exclusive lock, cleanup of its own interrupted writes, a write probe.

Two runs on one workdir would race on metrics.jsonl, duplicate its rows, and let orbax's start-up cleanup of
temporary directories delete the other run's checkpoint while it is being written. So `run` takes an
exclusive `flock` on WORKDIR/.run.lock first. The kernel drops the lock when the holder's process ends,
however it ends (SIGKILL, OOM, power loss of the host), so a killed run never blocks its own resume; the file
holds the holder's pid and host, so a refused run can name it. On filesystems without flock (some network
mounts) the run goes on with a warning. Multi-host runs: process 0 locks (it is the only writer).

A run refused before it trains (a config that does not fit the data, a deadline no client meets, ...) leaves the
workdir as it was (`Snapshot`): what it created (the directory itself, the lock file, checkpoints/, tensorboard/,
config.json) is removed, what was there before is never touched.

Only once the lock is held are the run's own interrupted writes (`checkpoints/*.orbax-checkpoint-tmp*`,
`*.<pid>.tmp` result files) removed, and only then is writability probed: on a full disk, the half-written
checkpoint of a killed run is usually what filled it.
"""
from __future__ import annotations

import errno
import fcntl
import glob
import os
import shutil
import socket
from typing import Optional

from absl import logging

from fedjax_flat import errors
from fedjax_flat.config import validate
from fedjax_flat.training.checkpoint import CheckpointError

LOCK_NAME = '.run.lock'


class WorkdirBusyError(validate.ConfigError):
  """Another live process holds the workdir's lock."""

  def __init__(self, workdir: str, holder: str):
    ValueError.__init__(self, f'workdir {workdir} is in use by {holder} (lock {os.path.join(workdir, LOCK_NAME)}); '
                        'wait for it to finish, stop it, or choose another --workdir')
    self.field, self.value, self.allowed = 'workdir', workdir, f'in use by {holder}'


def _describe_holder(text: str) -> str:
  pid, _, host = text.strip().partition(' ')
  if not pid.isdigit():
    return 'another process (its pid is not recorded yet)'
  return f'process {pid}' + (f' on host {host}' if host and host != socket.gethostname() else '')


class WorkdirLock:
  """Exclusive lock on a workdir for the lifetime of a run (a context manager)."""

  def __init__(self, workdir: str):
    if not isinstance(workdir, (str, os.PathLike)) or not str(workdir).strip():
      # os.path.abspath('') is the current directory: never lock (or write) there by accident
      raise errors.BadInputError(f'--workdir={workdir!r} is empty: give the run\'s directory, e.g. '
                                 '--workdir=runs/quickstart')
    self.workdir = os.path.abspath(workdir)
    self.path = os.path.join(self.workdir, LOCK_NAME)
    self._fd: Optional[int] = None

  def acquire(self) -> 'WorkdirLock':
    try:
      os.makedirs(self.workdir, exist_ok=True)
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
      raise validate.ConfigError('workdir', self.workdir,
                                 f'is not writable ({e.strerror}); choose another --workdir') from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 256, 0).decode(errors='replace')
      os.close(fd)
      raise WorkdirBusyError(self.workdir, _describe_holder(holder)) from None
    except OSError as e:
      if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        os.close(fd)
        raise
      logging.warning('cannot lock %s (%s): this filesystem has no flock, so a second run on this workdir would '
                      'not be detected', self.path, e.strerror)
    self._fd = fd
    try:        # best effort: on a full disk the lock still holds, the refused run just cannot name us
      os.ftruncate(fd, 0)
      os.pwrite(fd, f'{os.getpid()} {socket.gethostname()}\n'.encode(), 0)
    except OSError:
      pass
    return self

  def release(self) -> None:
    if self._fd is not None:
      try:
        os.ftruncate(self._fd, 0)
      except OSError:
        pass
      os.close(self._fd)            # closing the last descriptor releases the flock
      self._fd = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


class Snapshot:
  """The top-level entries of a workdir before a run touched it (and the directories it will create), so that a
  run refused before training leaves the workdir as it was: `restore(lock)` removes only what is new, with the
  lock still held (its own lock file last), then releases it."""

  def __init__(self, workdir: str):
    self.workdir = os.path.abspath(workdir)
    self.created = None                       # the topmost directory the run will create (None: it exists)
    d = self.workdir
    while not os.path.lexists(d):
      self.created, parent = d, os.path.dirname(d)
      if parent == d:
        break
      d = parent
    try:
      self.entries = set(os.listdir(self.workdir)) if self.created is None else set()
    except OSError:
      self.entries = None                     # unreadable: restore nothing

  def restore(self, lock: 'WorkdirLock') -> None:
    """Removes what the run created (call with `lock` held; it is released here)."""
    if self.entries is None:
      lock.release()
      return
    try:
      names = os.listdir(self.workdir)
    except OSError:
      names = []
    for name in names:
      if name in self.entries or name == LOCK_NAME:
        continue
      p = os.path.join(self.workdir, name)
      try:
        if os.path.isdir(p) and not os.path.islink(p):
          shutil.rmtree(p, ignore_errors=True)
        else:
          os.remove(p)
      except OSError:
        pass
    new_lock = LOCK_NAME not in self.entries
    if new_lock:
      try:                                    # unlinked while still held: no other run can take it meanwhile
        os.remove(lock.path)
      except OSError:
        pass
    lock.release()
    if self.created is not None:              # the directories the run made, if nothing else appeared in them
      d = self.workdir
      while True:
        try:
          os.rmdir(d)
        except OSError:
          break
        if d == self.created:
          break
        d = os.path.dirname(d)


def remove_interrupted_writes(workdir: str) -> None:
  """Deletes what a killed earlier run of this workdir left half-written (call with the lock held)."""
  ckpt = os.path.join(workdir, 'checkpoints')
  for p in glob.glob(os.path.join(glob.escape(ckpt), '*.orbax-checkpoint-tmp*')):
    logging.info('removing the interrupted checkpoint write %s', p)
    shutil.rmtree(p, ignore_errors=True)
  for pattern in RESULT_TEMPORARIES:
    for p in glob.glob(os.path.join(glob.escape(workdir), pattern)):
      try:
        os.remove(p)
      except OSError:
        pass


# Temporary files of training/writers.py (`<name>.<pid>.tmp`) and of the probe below.
RESULT_TEMPORARIES = ('metrics.jsonl.*tmp', 'metrics.csv.*tmp', 'summary.json.*tmp', 'summary.md.*tmp',
                      'config.json.*tmp', '.write_test.*')


def _probe(directory: str) -> None:
  probe = os.path.join(directory, f'.write_test.{os.getpid()}')
  os.makedirs(directory, exist_ok=True)
  try:
    with open(probe, 'w') as f:
      f.write('ok')
  finally:        # the probe must not outlive a failed write (ENOSPC at write or at close)
    if os.path.lexists(probe):
      os.remove(probe)


def check_writable(workdir: str) -> None:
  """Writes a probe file in the workdir and in its checkpoints/ (a read-only checkpoints/ is reported now,
  not after the first rounds have been computed)."""
  try:
    _probe(workdir)
  except OSError as e:
    raise validate.ConfigError('workdir', workdir, f'is not writable ({e.strerror}); free disk space, fix the '
                               'permissions or choose another --workdir') from None
  ckpt = os.path.join(workdir, 'checkpoints')
  try:
    _probe(ckpt)
  except OSError as e:
    raise CheckpointError(f'cannot write to the checkpoint directory {ckpt} ({type(e).__name__}: {e.strerror}). '
                          'Free disk space or fix permissions, then rerun the same command.') from None


def prepare(workdir: str) -> None:
  """With the lock held: clean up interrupted writes, then probe writability."""
  remove_interrupted_writes(workdir)
  check_writable(workdir)
