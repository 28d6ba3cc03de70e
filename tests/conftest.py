import os

from tests.fixtures.paths import REPO

# Tests run on CPU; keep XLA from grabbing every core for intra-op threads in a way that starves pytest-xdist.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# Subprocesses (experiments/*.py, benchmarks, workers run with -m) import fedjax_flat and tests/ from this
# checkout, whichever checkout the installed package points at.
os.environ['PYTHONPATH'] = os.pathsep.join([REPO] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep)
                                                      if p and os.path.abspath(p) != REPO])
