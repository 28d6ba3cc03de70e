import atexit
import os
import shutil
import tempfile

from tests.fixtures.paths import REPO

# Tests run on CPU; keep XLA from grabbing every core for intra-op threads in a way that starves pytest-xdist.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# The binaries the tests start (experiments/*.py) would give XLA one host device per core
# (fedjax_flat/devices.py); the in-process references they are compared with bit for bit run on the one
# device of this process, so the binaries get one too. tests/test_devices.py sets other counts.
os.environ.setdefault('FEDJAX_FLAT_HOST_DEVICES', '1')
# XLA's backend optimizations (LLVM -O2 and its expensive passes) cost more than they save on the suite's small
# programs, compiled hundreds of times and run for a few steps: without them the suite spends 1.4-1.7x less CPU
# (docs/setup.md). What the tests check does not depend on them: results are compared with NumPy or a formula at
# a tolerance, and bit-exactness is checked between two runs compiled alike. Programs as users run them are
# compiled with every optimization by the benchmarks, benchmarks/robustness/bit_identity.py and
# benchmarks/speed/device/side_check.sh; JAX_DISABLE_MOST_OPTIMIZATIONS=0 runs the suite that way too.
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')
# The binaries' XLA:CPU kernel path (fedjax_flat/cpu_paths.py): the default, whatever a developer's machine has
# kept (`benchmarks/speed/xla_paths.py --record`), so that every machine runs the suite's programs alike.
os.environ.setdefault('FEDJAX_FLAT_CPU_PATH', 'default')
# Subprocesses (experiments/*.py, benchmarks, workers run with -m) import fedjax_flat and tests/ from this
# checkout, whichever checkout the installed package points at.
os.environ['PYTHONPATH'] = os.pathsep.join([REPO] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)
                                                      if p and os.path.abspath(p) != REPO])

# One XLA persistent compilation cache per test session, shared by the xdist workers and every binary the
# tests start (they inherit the environment): the suite compiles the same small programs (the quickstart
# config, the tiny MLP rounds) in hundreds of tests and subprocesses, and compiling is most of its time. A
# cached executable is the same compiled code, so results and bit-exactness checks are unaffected, and the
# compile-counter tests count jit's own cache (`_cache_size()`), not XLA compilations. A fresh directory per
# session (removed at the end) keeps one run's timing from depending on an earlier run's leftovers; a user's
# own JAX_COMPILATION_CACHE_DIR is kept as it is.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _session_cache = tempfile.mkdtemp(prefix='fedjax_flat_tests_xla_cache_')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _session_cache
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
  # Only the process that made the directory (the xdist controller, or pytest without -n) removes it.
  atexit.register(shutil.rmtree, _session_cache, True)

# DP noise calibrations (privacy/accounting.calibrate) are kept on disk like compiled programs: one directory per
# test session as well, so no test depends on an earlier session's files.
if 'FEDJAX_FLAT_DP_CACHE' not in os.environ:
  _dp_cache = tempfile.mkdtemp(prefix='fedjax_flat_tests_dp_cache_')
  os.environ['FEDJAX_FLAT_DP_CACHE'] = _dp_cache
  atexit.register(shutil.rmtree, _dp_cache, True)
