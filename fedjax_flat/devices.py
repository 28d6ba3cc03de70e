"""Host CPU devices and the XLA compilation cache, decided before jax starts: one XLA CPU device per usable
core; compiled programs kept on disk (`--compilation_cache=DIR|off`) so that a later run loads them.

XLA fixes its number of host (CPU) devices when its CPU client starts, from
`--xla_force_host_platform_device_count` in XLA_FLAGS. Its default, one device, spreads the ops of a
federated round poorly over the cores (small GEMMs, memory-bound gradients); with one device per core the
engine shards each round's clients over them (core/sharding.py) and every core runs its own clients
(benchmarks/README.md, "Every core busy"). The binaries call `configure_host_devices()` first thing, before
anything imports jax, which is why this module imports nothing but the standard library.

Where the count comes from (the first that applies):
  1. the user's own setting, left untouched: `--xla_force_host_platform_device_count` in XLA_FLAGS, or
     JAX_NUM_CPU_DEVICES;
  2. `--host_devices=N` on the command line (taken out of argv);
  3. FEDJAX_FLAT_HOST_DEVICES=N in the environment;
  4. auto: one device per usable core (`os.sched_getaffinity`: the cores this process may run on).
N=1 keeps XLA's single device; 'auto' asks for rule 4. The chosen flags are marked in the environment
(FEDJAX_FLAT_HOST_DEVICES_APPLIED), so that a child process (a sweep's runs) decides again instead of taking
its parent's automatic choice for the user's.

Threads: XLA:CPU runs the intra-op work of every device on one shared pool of one thread per usable core,
so N devices on N cores do not oversubscribe them, and nothing is added for threads. Measured
(benchmarks/README.md, "Every core busy"): `--xla_cpu_multi_thread_eigen=false` does not keep a GEMM on one
thread in this XLA (the per-thread CPU time of a 1536^3 GEMM loop shows the pool's threads busy with and
without it), so per-device thread flags would only risk the single-device work (evaluation, Hessians).

XLA:CPU's kernel path (`--cpu_path=auto|default|NAME`, cpu_paths.py), also chosen by `configure_or_exit`:
which library runs the convolutions and dots, measured per machine and kept; nothing is added unless a
measurement on this machine found a faster path with the same results to fp32 rounding.

The returned `HostDevices` record (devices, threads, why, flags) is printed in the run's header and written
into WORKDIR/config.json (`host_devices`).

XLA's persistent compilation cache (`configure_compilation_cache`, also called by `configure_or_exit`): a
resumed run, another seed of the same config or a sweep's next cell loads its compiled programs from disk
instead of compiling them again (the same executable: results are bit-identical with and without it). Where
it lives (the first that applies): `--compilation_cache=DIR|off` on the command line (taken out of argv),
FEDJAX_FLAT_COMPILATION_CACHE=DIR|off (where the choice is passed on to child processes), the user's own
JAX_COMPILATION_CACHE_DIR (kept as is), else `$XDG_CACHE_HOME/fedjax_flat/xla` (`~/.cache/fedjax_flat/xla`).
Only programs that take at least MIN_COMPILE_SECS to compile are written (a user's
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS is kept): the round and evaluation programs, not the dozens of
per-op programs a run also compiles (benchmarks/speed/README.compile_cache.md measured the choice). A
directory that cannot be created or written is one warning line and a run without the cache. Concurrent
writers (a sweep's parallel children): jax writes each entry under its own content-addressed name, without a
lock, and reads it back through a decompression that fails on a torn (half-written) entry; a failed read is
a warning and a normal compilation, never a wrong program (tests/test_compilation_cache.py runs two
processes on one cold cache and a run on torn entries).
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
import tempfile
from typing import List, Mapping, MutableMapping, Optional

from fedjax_flat import cpu_paths

ENV = 'FEDJAX_FLAT_HOST_DEVICES'
APPLIED_ENV = 'FEDJAX_FLAT_HOST_DEVICES_APPLIED'
FLAG = '--host_devices'
COUNT_FLAG = '--xla_force_host_platform_device_count'
THREAD_FLAG = '--xla_cpu_multi_thread_eigen'
# Added with N > 1 devices unless the user set THREAD_FLAG: none (see "Threads" above).
THREADS_PER_DEVICE_FLAGS = ()

_COUNT_RE = re.compile(r'--xla_force_host_platform_device_count=(\d+)')


class HostDevicesError(ValueError):
  """A bad --host_devices / FEDJAX_FLAT_HOST_DEVICES value (the binaries print it as one line, exit 2)."""


@dataclasses.dataclass(frozen=True)
class HostDevices:
  devices: int                 # host CPU devices XLA creates
  threads: str                 # intra-op threads: 'shared' (XLA's one pool, a thread per core, for all
                               # devices), '1' (per-device flags) or 'XLA_FLAGS' (the user's own setting)
  cores: int                   # usable cores of this process
  why: str                     # where the count came from
  source: str                  # 'user' (XLA_FLAGS / JAX_NUM_CPU_DEVICES), 'flag', 'env' or 'auto'
  xla_flags: str               # what this module added to XLA_FLAGS ('' when nothing)
  compilation_cache: str = ''  # XLA's persistent compilation cache: its directory or 'off' ('' = not configured)
  cpu_path: str = ''           # XLA:CPU's kernel path (cpu_paths.py): 'default', a candidate, 'user' ('' = not set)

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)

  def line(self) -> str:
    threads = {'shared': "XLA's pool, shared by the devices", '1': 'one per device'}.get(self.threads, self.threads)
    cache = f'; compilation cache: {self.compilation_cache}' if self.compilation_cache else ''
    cache += f'; CPU kernel path: {self.cpu_path}' if self.cpu_path not in ('', 'default') else ''
    return (f'host devices: {self.devices} CPU device(s) on {self.cores} usable core(s), intra-op threads: '
            f'{threads} ({self.why}){cache}')


def usable_cores() -> int:
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except (AttributeError, OSError):     # not Linux
    return max(1, os.cpu_count() or 1)


def _parse_count(value: str, source: str) -> Optional[int]:
  """'auto' -> None; a positive integer -> int; anything else a HostDevicesError naming the source."""
  v = value.strip().lower()
  if v == 'auto':
    return None
  if v.isdigit() and int(v) >= 1:
    return int(v)
  raise HostDevicesError(f'{source}={value!r}: use a positive number of host CPU devices (1 = one device, '
                         f'no client sharding) or auto (one per usable core)')


def _take_flag(argv: List[str], flag: str = FLAG, usage: str = f'{FLAG}=N or {FLAG}=auto') -> Optional[str]:
  """Removes --flag=V / --flag V from argv (in place); returns V (the last one) or None."""
  value, i = None, 0
  while i < len(argv):
    a = argv[i]
    if a.startswith(flag + '='):
      value = a.split('=', 1)[1]
      del argv[i]
    elif a == flag:
      if i + 1 >= len(argv):
        raise HostDevicesError(f'{flag} needs a value: {usage}')
      value = argv[i + 1]
      del argv[i:i + 2]
    else:
      i += 1
  return value


def _strip_applied(env: MutableMapping[str, str]) -> None:
  """Removes the flags a parent process added automatically (so this process decides for itself)."""
  applied = env.pop(APPLIED_ENV, None)
  flags = env.get('XLA_FLAGS', '')
  if applied and applied in flags:
    rest = ' '.join(flags.replace(applied, ' ', 1).split())
    if rest:
      env['XLA_FLAGS'] = rest
    else:
      env.pop('XLA_FLAGS', None)


def configure_host_devices(argv: Optional[List[str]] = None, env: MutableMapping[str, str] = os.environ, *,
                           jax_started: Optional[bool] = None) -> HostDevices:
  """Chooses the host CPU device count and thread setting, and writes them into env['XLA_FLAGS'].

  Call before jax is imported: a jax already imported keeps its devices (nothing is written; the record says
  so). argv (default sys.argv) loses its --host_devices flag. Raises HostDevicesError for a bad value.
  """
  argv = sys.argv if argv is None else argv
  jax_started = ('jax' in sys.modules) if jax_started is None else jax_started
  flag_value = _take_flag(argv)
  _strip_applied(env)
  cores = usable_cores()
  flags = env.get('XLA_FLAGS', '')
  user_threads = THREAD_FLAG in flags
  user_count = _COUNT_RE.findall(flags)
  if user_count or env.get('JAX_NUM_CPU_DEVICES', '').strip():
    n = int(user_count[-1]) if user_count else _parse_count(env['JAX_NUM_CPU_DEVICES'], 'JAX_NUM_CPU_DEVICES')
    why = (f'{COUNT_FLAG}={n} set by the user in XLA_FLAGS' if user_count else 'JAX_NUM_CPU_DEVICES set by the user')
    return _record(n, 'XLA_FLAGS' if user_threads else 'shared', cores, why, 'user', '', jax_started)
  count, why, source = None, '', 'auto'
  if flag_value is not None:
    count, why, source = _parse_count(flag_value, FLAG), f'{FLAG}={flag_value}', 'flag'
  elif env.get(ENV, '').strip():
    count, why, source = _parse_count(env[ENV], ENV), f'{ENV}={env[ENV]}', 'env'
  if count is None:
    count, source = cores, 'auto'
    why = (why + ': ' if why else '') + 'auto, one device per usable core'
  added = []
  if count > 1:
    added.append(f'{COUNT_FLAG}={count}')
    if THREADS_PER_DEVICE_FLAGS and not user_threads:
      added.extend(THREADS_PER_DEVICE_FLAGS)
  threads = 'XLA_FLAGS' if user_threads else ('1' if count > 1 and THREADS_PER_DEVICE_FLAGS else 'shared')
  if jax_started:
    return _record(count, threads, cores, why, source, '', True)
  if added:
    applied = ' '.join(added)
    env['XLA_FLAGS'] = f'{flags} {applied}'.strip()
    env[APPLIED_ENV] = applied
  return _record(count, threads, cores, why, source, ' '.join(added), False)


def _record(devices, threads, cores, why, source, xla_flags, jax_started) -> HostDevices:
  if jax_started:
    why += ' (jax was already imported: its devices were fixed earlier, nothing was changed)'
  rec = HostDevices(devices=devices, threads=threads, cores=cores, why=why, source=source, xla_flags=xla_flags)
  global _CONFIGURED
  _CONFIGURED = rec
  return rec


_CONFIGURED: Optional[HostDevices] = None


def configured() -> Optional[HostDevices]:
  """The record of this process's `configure_host_devices` call (None when it was not called: library use)."""
  return _CONFIGURED


def describe(env: Mapping[str, str] = os.environ) -> dict:
  """The record to write into config.json: the configured one, or what XLA_FLAGS says (library use)."""
  if _CONFIGURED is not None:
    return _CONFIGURED.as_dict()
  m = _COUNT_RE.findall(env.get('XLA_FLAGS', ''))
  enabled = env.get(ENABLE_ENV, '').strip().lower() not in _FALSE
  return {'devices': int(m[-1]) if m else 1, 'threads': 'shared', 'cores': usable_cores(),
          'why': 'not configured by a binary (library use): XLA_FLAGS as found', 'source': 'library',
          'xla_flags': '', 'compilation_cache': (env.get(JAX_CACHE_ENV) or 'off') if enabled else 'off'}


def child_env(parallel: int, env: Mapping[str, str] = os.environ) -> dict:
  """The environment for binaries run `parallel` at a time (a local sweep): an automatic choice becomes
  usable cores // parallel devices each (at least 1), so that the runs together do not oversubscribe the
  cores; a count the user chose (--host_devices given to the sweep, FEDJAX_FLAT_HOST_DEVICES=N, XLA_FLAGS)
  is passed on unchanged."""
  out = dict(env)
  rec = _CONFIGURED
  user_count = bool(_COUNT_RE.findall(env.get('XLA_FLAGS', ''))) and not env.get(APPLIED_ENV)
  if rec is not None and rec.source in ('flag', 'env'):
    out[ENV] = str(rec.devices)
  elif (rec is not None and rec.source == 'user') or (rec is None and (user_count or env.get(ENV, '').strip())):
    pass
  else:
    out[ENV] = str(max(1, usable_cores() // max(int(parallel), 1)))
  return out


# ---- XLA's persistent compilation cache ----

CACHE_ENV = 'FEDJAX_FLAT_COMPILATION_CACHE'
CACHE_FLAG = '--compilation_cache'
JAX_CACHE_ENV = 'JAX_COMPILATION_CACHE_DIR'
ENABLE_ENV = 'JAX_ENABLE_COMPILATION_CACHE'
MIN_COMPILE_ENV = 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'
MIN_ENTRY_ENV = 'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'
# Every program is written, the per-op ones of the eager model init and the data placement too: together they
# compile for seconds at every start (measured quiet, quickstart warm: 3.9 s to the end of a 1-round run with 0,
# 6.7-7.1 s with 0.5, where only 2 of 56 programs were written; README.compile_cache.md, "The threshold").
MIN_COMPILE_SECS = '0'
# No size floor (jax's default, 0): the per-op entries are 1-10 KB each.
MIN_ENTRY_BYTES = '0'
_FALSE = ('0', 'false', 'no', 'off')


@dataclasses.dataclass(frozen=True)
class CompilationCache:
  dir: str          # the cache directory, '' when off
  why: str          # where the choice came from
  source: str       # 'flag', 'env', 'user' (JAX_COMPILATION_CACHE_DIR / JAX_ENABLE_COMPILATION_CACHE), 'default'
  warning: str = ''  # why a chosen directory is not used ('' when it is, or when the cache is off by choice)

  @property
  def label(self) -> str:
    return self.dir or 'off'


def default_cache_dir(env: Mapping[str, str] = os.environ) -> str:
  """$XDG_CACHE_HOME/fedjax_flat/xla, else ~/.cache/fedjax_flat/xla."""
  return os.path.join(cpu_paths.cache_home(env), 'xla')


def _unusable(path: str) -> str:
  """'' when `path` is (or can be made) a writable directory; else the reason."""
  try:
    os.makedirs(path, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix='.probe-', dir=path)
    os.close(fd)
    os.remove(probe)
    return ''
  except OSError as e:
    return f'{type(e).__name__}: {e.strerror or e}'


def configure_compilation_cache(argv: Optional[List[str]] = None, env: MutableMapping[str, str] = os.environ, *,
                                jax_started: Optional[bool] = None) -> CompilationCache:
  """Chooses XLA's persistent compilation cache directory (or none) and writes it into env for jax.

  Call before jax is imported (jax reads JAX_COMPILATION_CACHE_DIR and friends when it starts). argv (default
  sys.argv) loses its --compilation_cache flag; the choice is also put into env[CACHE_ENV], so the binaries
  this process starts (a sweep's runs) make the same one. A directory that cannot be used prints one
  warning line and the run goes on without the cache. Raises HostDevicesError for an empty value.
  """
  argv = sys.argv if argv is None else argv
  jax_started = ('jax' in sys.modules) if jax_started is None else jax_started
  usage = f'{CACHE_FLAG}=DIR or {CACHE_FLAG}=off'
  value = _take_flag(argv, CACHE_FLAG, usage)
  if value is not None:
    source, why = 'flag', f'{CACHE_FLAG}={value}'
  elif env.get(CACHE_ENV, '').strip():
    value, source, why = env[CACHE_ENV], 'env', f'{CACHE_ENV}={env[CACHE_ENV]}'
  elif env.get(ENABLE_ENV, '').strip().lower() in _FALSE:
    value, source, why = 'off', 'user', f'{ENABLE_ENV}={env[ENABLE_ENV]} set by the user'
  elif env.get(JAX_CACHE_ENV, '').strip():
    value, source, why = env[JAX_CACHE_ENV], 'user', f'{JAX_CACHE_ENV} set by the user'
  else:
    value, source, why = default_cache_dir(env), 'default', 'the default under the user cache'
  if not value.strip():
    raise HostDevicesError(f'{why}: empty; use {usage}')
  off = value.strip().lower() == 'off'
  path = '' if off else os.path.abspath(os.path.expanduser(value.strip()))
  warning = _unusable(path) if path else ''
  if warning:
    print(f'warning: compilation cache {path} is not usable ({warning}); running without it '
          f'(choose another with {CACHE_FLAG}=DIR, or {CACHE_FLAG}=off)', file=sys.stderr, flush=True)
    why, path = f'{why}: not usable, off', ''
  if jax_started:
    why += ' (jax was already imported: its cache settings were fixed earlier, nothing was changed)'
  else:
    env[CACHE_ENV] = path or 'off'    # the children (a sweep's runs) follow it and do not repeat a warning
    if path:
      env[JAX_CACHE_ENV] = path
      env.pop(ENABLE_ENV, None)
      env.setdefault(MIN_COMPILE_ENV, MIN_COMPILE_SECS)
      env.setdefault(MIN_ENTRY_ENV, MIN_ENTRY_BYTES)
    else:
      env.pop(JAX_CACHE_ENV, None)
      env[ENABLE_ENV] = 'false'
  rec = CompilationCache(dir=path, why=why, source=source, warning=warning)
  global _CACHE
  _CACHE = rec
  return rec


_CACHE: Optional[CompilationCache] = None


def compilation_cache() -> Optional[CompilationCache]:
  """The record of this process's `configure_compilation_cache` call (None when it was not called)."""
  return _CACHE


def configure_or_exit(argv: Optional[List[str]] = None) -> HostDevices:
  """The host devices and the compilation cache, for a binary's first lines: a bad value is one `error:` line
  and exit 2. The returned record (the run's header line, config.json's `host_devices`) names the cache."""
  try:
    rec = configure_host_devices(argv)
    cache = configure_compilation_cache(argv)
    path = cpu_paths.configure(_take_flag(sys.argv if argv is None else argv, cpu_paths.FLAG,
                                          f'{cpu_paths.FLAG}=auto|default|NAME'))
  except (HostDevicesError, cpu_paths.CpuPathError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  rec = dataclasses.replace(rec, compilation_cache=cache.label, cpu_path=path['path'])
  global _CONFIGURED
  _CONFIGURED = rec
  return rec
