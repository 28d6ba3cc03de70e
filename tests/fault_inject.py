"""Runs a Python script with injected filesystem faults, for tests that run experiments/train.py.

  python tests/fault_inject.py [--deny=DIR [--deny_after=N]] [--enospc=NAME] [--slow_rename=S] -- SCRIPT ARGS...

Tests run as root in containers, where chmod does not make a directory unwritable and a disk cannot be
filled safely; so the faults are injected at the os / io level of the process under test:
  --deny=DIR        creating directories or opening files for writing under DIR fails with EACCES, as on a
                    read-only directory; with --deny_after=N, the first N directories created directly in DIR
                    (and everything inside them, also once renamed) are still allowed
  --enospc=NAME     writes to files whose name starts with NAME fail with ENOSPC (the open succeeds), as on a
                    full disk
  --slow_rename=S   renames of orbax's temporary checkpoint directories (the commit of a save) take S seconds
                    (a slow disk); prints 'fault_inject: slow rename' to stderr when one starts
"""
import argparse
import builtins
import errno
import os
import runpy
import sys
import time


def _under(path, root):
  return root is not None and os.path.abspath(os.fspath(path)).startswith(root)


class FullFile:
  """An open file whose writes fail as on a full disk."""

  def __init__(self, f):
    self._f = f

  def write(self, *args):
    raise OSError(errno.ENOSPC, 'No space left on device', self._f.name)

  writelines = write

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._f.close()

  def __getattr__(self, name):
    return getattr(self._f, name)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--deny')
  ap.add_argument('--deny_after', type=int, default=0)
  ap.add_argument('--enospc')
  ap.add_argument('--slow_rename', type=float, default=0.0)
  ap.add_argument('argv', nargs=argparse.REMAINDER)
  a = ap.parse_args()
  argv = a.argv[1:] if a.argv[:1] == ['--'] else a.argv
  deny = os.path.abspath(a.deny) + os.sep if a.deny else None
  budget, allowed = [a.deny_after], set()       # directories still allowed; top-level names allowed
  real_mkdir, real_open, real_os_open = os.mkdir, builtins.open, os.open
  real_rename, real_replace = os.rename, os.replace

  def top(path):
    return os.path.relpath(os.path.abspath(os.fspath(path)), deny).split(os.sep)[0]

  def check(path, is_dir=False):
    if not _under(path, deny) or top(path) in allowed:
      return
    if budget[0] > 0 and is_dir and os.path.dirname(os.path.abspath(os.fspath(path))) + os.sep == deny:
      budget[0] -= 1
      allowed.add(top(path))
      return
    if budget[0] > 0 and not is_dir:
      return
    raise PermissionError(errno.EACCES, 'Permission denied', os.fspath(path))

  def mkdir(path, *args, **kwargs):
    check(path, is_dir=True)
    return real_mkdir(path, *args, **kwargs)

  def os_open(path, flags, *args, **kwargs):
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
      check(path)
    return real_os_open(path, flags, *args, **kwargs)

  def open_(file, mode='r', *args, **kwargs):
    writing = any(c in mode for c in 'wax+')
    if writing and isinstance(file, (str, bytes, os.PathLike)):
      check(file)
      if a.enospc and os.path.basename(os.fspath(file)).startswith(a.enospc):
        return FullFile(real_open(file, mode, *args, **kwargs))
    return real_open(file, mode, *args, **kwargs)

  def slow(real):
    def rename(src, dst, *args, **kwargs):
      if a.slow_rename and 'orbax-checkpoint-tmp' in os.fspath(src):
        print('fault_inject: slow rename', file=sys.stderr, flush=True)
        time.sleep(a.slow_rename)
      if _under(src, deny) and top(src) in allowed:
        allowed.add(top(dst))
      return real(src, dst, *args, **kwargs)
    return rename

  os.mkdir, os.open, builtins.open = mkdir, os_open, open_
  os.rename, os.replace = slow(real_rename), slow(real_replace)
  sys.argv = argv
  sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
  runpy.run_path(argv[0], run_name='__main__')


if __name__ == '__main__':
  main()
