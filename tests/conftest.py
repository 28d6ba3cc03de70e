import os

from tests.fixtures.paths import REPO

# Tests run on CPU; keep XLA from grabbing every core for intra-op threads in a way that starves pytest-xdist.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# The binaries the tests start (experiments/*.py) would give XLA one host device per core
# (fedjax_flat/devices.py); the in-process references they are compared with bit for bit run on the one
# device of this process, so the binaries get one too. tests/test_devices.py sets other counts.
os.environ.setdefault('FEDJAX_FLAT_HOST_DEVICES', '1')
# Subprocesses (experiments/*.py, benchmarks, workers run with -m) import fedjax_flat and tests/ from this
# checkout, whichever checkout the installed package points at.
os.environ['PYTHONPATH'] = os.pathsep.join([REPO] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)
                                                      if p and os.path.abspath(p) != REPO])
