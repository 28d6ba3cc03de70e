"""XLA:CPU's kernel path per machine (fedjax_flat/cpu_paths.py): the choice, the record kept per machine, the
binaries' flag, and the paths' results against the default path's to fp32 rounding.

The equality test runs the library's digits CNN client step (both conv lowerings, SGD and SAM) in one fresh
process per path (XLA reads its flags once per process) and compares the parameters after 4 local steps with
the default path's. The whole candidate list runs in the slow mark; the suite runs the paths the measurements
in benchmarks/speed/README.xla_paths.md found closest to winning.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_flat import cpu_paths, devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _row(eps, diff=0.0):
  return {'examples_per_s': eps, 'max_rel_diff': diff}


def test_choose_needs_a_margin_on_every_workload_and_equal_results():
  rows = {'paper|sgd': {'default|im2col': _row(100), 'onednn|im2col': _row(120), 'ynn_conv|im2col': _row(130)},
          'pfl|sgd': {'default|im2col': _row(100), 'onednn|im2col': _row(110), 'ynn_conv|im2col': _row(101)}}
  assert cpu_paths.choose(rows, ['default', 'onednn', 'ynn_conv']) == 'onednn'   # ynn_conv misses the margin
  rows['pfl|sgd']['onednn|im2col'] = _row(110, diff=1e-3)                         # not equal to fp32 rounding
  assert cpu_paths.choose(rows, ['default', 'onednn', 'ynn_conv']) == 'default'
  rows['pfl|sgd']['ynn_conv|im2col'] = _row(140)
  assert cpu_paths.choose(rows, ['default', 'onednn', 'ynn_conv']) == 'ynn_conv'
  del rows['pfl|sgd']['ynn_conv|im2col']                                          # not measured everywhere
  assert cpu_paths.choose(rows, ['default', 'onednn', 'ynn_conv']) == 'default'
  # the same program (bit-identical parameters everywhere): a 1.3x 'gain' is noise, never a winner
  same = {w: {'default|im2col': _row(100), 'xnn_off|im2col': {**_row(130), 'bit_equal': True}}
          for w in ('paper|sgd', 'pfl|sgd')}
  assert cpu_paths.choose(same, ['default', 'xnn_off']) == 'default'
  same['pfl|sgd']['xnn_off|im2col']['bit_equal'] = False                          # another program somewhere
  assert cpu_paths.choose(same, ['default', 'xnn_off']) == 'xnn_off'


def test_auto_applies_the_path_kept_for_this_machine_only(tmp_path):
  env = {'XDG_CACHE_HOME': str(tmp_path)}
  rec = cpu_paths.configure('auto', env, jax_started=False)
  assert rec['path'] == 'default' and 'XLA_FLAGS' not in env and env[cpu_paths.ENV] == 'default'
  where = cpu_paths.keep('onednn', env, evidence={'x_default': 1.3})
  assert where == cpu_paths.record_path(env) and where.startswith(str(tmp_path))
  env = {'XDG_CACHE_HOME': str(tmp_path), 'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}
  rec = cpu_paths.configure(None, env, jax_started=False)                      # auto is the default value
  assert rec['path'] == 'onednn' and env['XLA_FLAGS'].split() == [
      '--xla_force_host_platform_device_count=2', '--xla_cpu_use_onednn=true']
  assert env[cpu_paths.ENV] == 'onednn'
  # another machine (another key) has no record: default
  assert cpu_paths.recorded(env, key='other cpu|x86_64|avx2|jaxlib 0.10.2') is None
  # a record file that is not JSON is no record
  with open(cpu_paths.record_path(env), 'w') as f:
    f.write('{broken')
  assert cpu_paths.resolve('auto', env)[0] == 'default'


def test_explicit_path_user_flags_and_started_jax(tmp_path):
  env = {'XDG_CACHE_HOME': str(tmp_path)}
  assert cpu_paths.configure('xnn_off', env, jax_started=False)['path'] == 'xnn_off'
  assert env['XLA_FLAGS'] == '--xla_cpu_use_xnnpack=false'
  env = {'XLA_FLAGS': '--xla_cpu_use_onednn=false'}                              # the user's own choice wins
  rec = cpu_paths.configure('onednn', env, jax_started=False)
  assert rec['path'] == 'user' and env['XLA_FLAGS'] == '--xla_cpu_use_onednn=false'
  env = {}
  rec = cpu_paths.configure('onednn', env, jax_started=True)                      # too late: nothing applied
  assert rec['path'] == 'default' and 'XLA_FLAGS' not in env and 'already started' in rec['why']
  with pytest.raises(cpu_paths.CpuPathError, match='--cpu_path=fastest: unknown path; use auto, or one of'):
    cpu_paths.configure('fastest', {}, jax_started=False)


def test_isa_and_machine_key_read_cpuinfo(tmp_path):
  info = tmp_path / 'cpuinfo'
  info.write_text('processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: fpu sse avx2 fma avx512f avx512_bf16\n')
  i = cpu_paths.isa(str(info))
  assert i['model'] == 'Some CPU 9000' and i['features'] == ['avx2', 'fma', 'avx512f', 'avx512_bf16']
  assert cpu_paths.machine_key('0.10.2').endswith('|jaxlib 0.10.2')
  capped = cpu_paths.machine_key('0.10.2', env={'XLA_FLAGS': '--xla_cpu_max_isa=avx2'})
  assert capped.endswith(' max_isa=AVX2|jaxlib 0.10.2') and capped != cpu_paths.machine_key('0.10.2', env={})


def test_applied_labels_the_path_a_checkpoint_keeps():
  assert cpu_paths.max_isa({'XLA_FLAGS': '--xla_cpu_max_isa=AVX512 --a=1 --xla_cpu_max_isa=avx2'}) == 'AVX2'
  assert cpu_paths.max_isa({}) == ''
  assert cpu_paths.applied({}) == 'default'
  assert cpu_paths.applied({cpu_paths.ENV: 'dense_direct'}) == 'dense_direct'
  env = {}
  cpu_paths.configure('onednn', env, jax_started=False)          # the path's own flags are not the user's
  assert cpu_paths.applied(env) == 'onednn'
  assert cpu_paths.applied({'XLA_FLAGS': '--xla_cpu_use_xnnpack=false --xla_cpu_max_isa=AVX2'}) == (
      'user: --xla_cpu_use_xnnpack=false max_isa=AVX2')
  assert cpu_paths.applied({cpu_paths.ENV: 'nope'}) == 'default'


def test_binary_rejects_a_bad_path_in_one_line():
  p = subprocess.run([sys.executable, '-c', 'from fedjax_flat import devices; devices.configure_or_exit()',
                      '--cpu_path=nope'], capture_output=True, text=True, cwd=REPO, timeout=60)
  assert p.returncode == 2 and p.stderr.strip().splitlines() == [
      f'error: --cpu_path=nope: unknown path; use auto, or one of {", ".join(cpu_paths.CANDIDATES)}']


_STEP = r'''
import json, sys
import numpy as np
from fedjax_flat import devices
rec = devices.configure_or_exit()
import jax, jax.numpy as jnp
from fedjax_flat.algorithms.local import LocalState, local_step, make_loss
from fedjax_flat.config.default_config import default_config
from fedjax_flat.models.registry import get_model
from fedjax_flat.optimizers.client import make_client_tx
out = {}
rng = np.random.default_rng(0)
xs = jnp.asarray(rng.standard_normal((4, 16, 8, 8, 1)).astype(np.float32))
ys = jnp.asarray(rng.integers(0, 10, (4, 16)).astype(np.int32))
for conv in ('im2col', 'lax'):
  model = get_model('digits_cnn', 10, (8, 8, 1), conv_impl=conv)
  params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
  for opt in ('sgd', 'sam'):
    cfg = default_config().client
    cfg.optimizer, cfg.lr, cfg.rho, cfg.momentum = opt, 0.05, 0.05, 0.0
    tx = make_client_tx(cfg, {'lr': jnp.float32(0.05), 'rho': jnp.float32(0.05)})
    loss_fn = make_loss(model)
    def body(local, b):
      return local_step(local, {'x': b[0], 'y': b[1], 'mask': jnp.ones((16,))}, None, loss_fn=loss_fn, tx=tx)[0], None
    final = jax.jit(lambda p: jax.lax.scan(body, LocalState(p, tx.init(p), p), (xs, ys))[0].params)(params)
    out[f'{conv}|{opt}'] = np.concatenate([np.ravel(l) for l in jax.tree_util.tree_leaves(final)]).tolist()
print(json.dumps({'cpu_path': rec.cpu_path, 'xla_flags': __import__('os').environ.get('XLA_FLAGS', ''), 'out': out}))
'''


def _run_path(name, tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', cpu_paths.ENV)}
  env['XDG_CACHE_HOME'] = str(tmp_path)
  p = subprocess.run([sys.executable, '-c', _STEP, f'--cpu_path={name}', '--host_devices=1',
                      '--compilation_cache=off'], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def default_step(tmp_path_factory):
  return _run_path('default', tmp_path_factory.mktemp('default'))


def _check_equal(name, default_step, tmp_path):
  got = _run_path(name, tmp_path)
  assert got['cpu_path'] == name and cpu_paths.CANDIDATES[name] in got['xla_flags']
  for k, ref in default_step['out'].items():
    a, b = np.asarray(got['out'][k]), np.asarray(ref)
    assert np.max(np.abs(a - b)) <= cpu_paths.EQUAL_RTOL * np.max(np.abs(b)), (name, k)


@pytest.mark.parametrize('name', ['ynn_off'])    # the one candidate that compiles another program here
def test_paths_equal_the_default_to_fp32_rounding(name, default_step, tmp_path):
  _check_equal(name, default_step, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize('name', [n for n in cpu_paths.CANDIDATES if n not in ('default', 'ynn_off')])
def test_every_path_equals_the_default_to_fp32_rounding(name, default_step, tmp_path):
  _check_equal(name, default_step, tmp_path)


def test_default_path_adds_nothing(default_step):
  assert default_step['cpu_path'] == 'default' and 'xla_cpu_use' not in default_step['xla_flags']
  assert devices.HostDevices(1, 'shared', 1, '', 'auto', '', cpu_path='default').line().find('kernel path') < 0


def test_kernel_benchmark_runs_the_engines_step_form(tmp_path):
  """xla_paths.py times the client step as the engine's one-client CPU path runs it (each step under a batch-1
  vmap), and its program path dense_direct equals the default there to fp32 rounding (bit for bit on the AVX-512
  EPYC measured: models/layers.py grad_impl)."""
  out = str(tmp_path / 'xp')
  p = subprocess.run([sys.executable, '-m', 'benchmarks.speed.xla_paths', '--workloads=digits', '--opts=sgd',
                      '--paths=default,dense_direct', '--convs=im2col', '--repeats=1', '--peers=none', f'--out={out}'],
                     capture_output=True, text=True, cwd=REPO, timeout=600)
  assert p.returncode == 0, p.stderr[-2000:]
  rec = json.load(open(out + '.json'))
  assert rec['form'] == 'engine' and 'batch-1 vmap' in open(out + '.md').read()
  row = rec['results']['digits|sgd']
  assert row['default|im2col']['examples_per_s'] > 0
  assert row['dense_direct|im2col']['max_rel_diff'] <= cpu_paths.EQUAL_RTOL


@pytest.mark.slow    # a measurement script's plumbing, 12 s of child processes: outside the 15-minute suite
def test_isa_caps_benchmark_times_every_cap_in_its_own_process(tmp_path):
  """benchmarks/speed/isa_caps.py: one child per (stack, cap), each given only its cap's environment."""
  p = subprocess.run([sys.executable, '-m', 'benchmarks.speed.isa_caps', '--smoke', '--stacks=xla',
                      f'--out={tmp_path / "caps"}'], capture_output=True, text=True, cwd=REPO, timeout=600,
                     env={**os.environ, 'XLA_FLAGS': '--xla_cpu_max_isa=AVX'})   # the parent's cap is not passed on
  assert p.returncode == 0, p.stderr[-2000:]
  res = json.loads((tmp_path / 'caps.json').read_text())
  assert [(r['stack'], r['cap'], r['env']) for r in res['rows']] == [
      ('xla', 'none', {}), ('xla', 'AVX2', {'XLA_FLAGS': '--xla_cpu_max_isa=AVX2'}),
      ('xla', 'SSE4_2', {'XLA_FLAGS': '--xla_cpu_max_isa=SSE4_2'})]
  for r in res['rows']:
    assert r['gemm_gflops'] > 0 and r['conv_grad_ms'] > 0 and r['elementwise_ms'] > 0, r
  assert 'SMOKE RUN' in (tmp_path / 'caps.md').read_text()
