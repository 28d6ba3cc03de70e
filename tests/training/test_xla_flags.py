"""The library sets no XLA flags and no jax config of its own (benchmarks/speed/README.cnn_step.md: every flag tried
was within noise), so a user's XLA_FLAGS / jax settings are exactly what runs."""
import os
import subprocess
import sys

from tests.fixtures.paths import REPO

_PROBE = r'''
import os, jax
before = (os.environ.get('XLA_FLAGS'), jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)
import fedjax_flat.training.run, fedjax_flat.training.loop, fedjax_flat.models.registry, fedjax_flat.core.engine
from fedjax_flat.models.registry import get_model
m = get_model('cifar_cnn', 10, (32, 32, 3))
m.init(jax.random.key(0), jax.numpy.zeros((1, 32, 32, 3)))
after = (os.environ.get('XLA_FLAGS'), jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision)
assert before == after, (before, after)
print('unchanged', after)
'''


def test_library_sets_no_xla_flags_or_jax_config():
  env = {**os.environ, 'XLA_FLAGS': '--xla_cpu_enable_fast_math=false'}
  out = subprocess.run([sys.executable, '-c', _PROBE], cwd=REPO, env={**env, 'PYTHONPATH': REPO},
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "unchanged ('--xla_cpu_enable_fast_math=false', False, None)" in out.stdout
