"""One host CPU device per core (fedjax_flat/devices.py): the choice, and runs on 2 simulated devices.

XLA fixes its device count when it starts and jax is already running in pytest, so the 2-device runs are
subprocesses: this file run as a script (`--worker OUT N NAME...`, N host devices via the binaries' own
`configure_host_devices`) and experiments/train.py. Checked: the same device count gives bit-identical reruns
and a bit-identical resume after SIGKILL; 1 vs 2 devices agree to float32 reduction order; a checkpoint
written on 2 devices resumes on 1; the device path (rounds in one program) runs sharded. Chain algorithms
on several devices: tests/test_fedseq_sharding.py.
Run as a script it is that worker.
"""
import os
import sys

from fedjax_flat import devices

if __name__ == '__main__':
  devices.configure_host_devices()      # before jax: FEDJAX_FLAT_HOST_DEVICES from the test decides

import json  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE_DIR = os.path.join(os.environ.get('TMPDIR', '/tmp'), f'fedjax_flat_scale_tests_xla_cache_{os.getuid()}')
CACHE_ENV = {'JAX_COMPILATION_CACHE_DIR': CACHE_DIR, 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
             'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}


# ------------------------------------------------------------------------------------ the choice itself

@pytest.fixture
def four_cores(monkeypatch):
  monkeypatch.setattr(devices, 'usable_cores', lambda: 4)


def _configure(argv=None, env=None):
  env = {} if env is None else env
  return devices.configure_host_devices([] if argv is None else argv, env, jax_started=False), env


def test_auto_is_one_device_per_core(four_cores):
  rec, env = _configure()
  assert (rec.devices, rec.source, rec.cores) == (4, 'auto', 4)
  assert rec.threads == ('1' if devices.THREADS_PER_DEVICE_FLAGS else 'shared')
  assert env['XLA_FLAGS'] == ('--xla_force_host_platform_device_count=4 '
                              + ' '.join(devices.THREADS_PER_DEVICE_FLAGS)).strip()
  assert rec.xla_flags == env['XLA_FLAGS'] == env[devices.APPLIED_ENV]
  assert 'host devices: 4 CPU device(s) on 4 usable core(s)' in rec.line()


def test_users_xla_flag_is_kept(four_cores):
  flags = '--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=3'
  rec, env = _configure(env={'XLA_FLAGS': flags, devices.ENV: '2'})
  assert (rec.devices, rec.source, rec.threads) == (3, 'user', 'shared')
  assert env['XLA_FLAGS'] == flags and devices.APPLIED_ENV not in env
  rec, env = _configure(env={'JAX_NUM_CPU_DEVICES': '2'})
  assert (rec.devices, rec.source) == (2, 'user') and 'XLA_FLAGS' not in env


@pytest.mark.parametrize('argv,env,want', [
    (['train.py', '--host_devices=1', '--x'], {}, 1),
    (['train.py', '--host_devices', '3'], {devices.ENV: '1'}, 3),     # the flag wins over the environment
    (['train.py'], {devices.ENV: '2'}, 2),
    (['train.py'], {devices.ENV: 'auto'}, 4),
])
def test_flag_and_environment(four_cores, argv, env, want):
  rec, env = _configure(argv, env)
  assert rec.devices == want
  assert argv == ['train.py'] + (['--x'] if '--x' in argv else [])     # the flag is taken out of argv
  if want == 1:
    assert 'XLA_FLAGS' not in env and rec.threads == 'shared'
  else:
    assert f'--xla_force_host_platform_device_count={want}' in env['XLA_FLAGS']


def test_users_thread_flag_is_kept(four_cores):
  rec, env = _configure(env={'XLA_FLAGS': '--xla_cpu_multi_thread_eigen=true'})
  assert rec.threads == 'XLA_FLAGS' and env['XLA_FLAGS'].count('xla_cpu_multi_thread_eigen') == 1


@pytest.mark.parametrize('value', ['0', '-1', 'two', '1.5', ''])
def test_bad_count_is_one_clear_error(four_cores, value):
  with pytest.raises(devices.HostDevicesError, match=r'--host_devices=.*positive number'):
    _configure(['train.py', f'--host_devices={value}'])


def test_child_decides_again_and_sweeps_split_the_cores(four_cores, monkeypatch):
  _, env = _configure()                          # a parent's automatic 4 devices ...
  env[devices.ENV] = '2'
  rec, env = _configure(env=env)                 # ... is not taken for the user's choice by its child
  assert rec.devices == 2 and env['XLA_FLAGS'].count('device_count') == 1
  assert '--xla_force_host_platform_device_count=2' in env['XLA_FLAGS']
  # A local sweep: 2 runs at a time on 4 cores -> 2 devices each; a user's count is passed on.
  monkeypatch.setattr(devices, '_CONFIGURED', None)
  assert devices.child_env(2, {})[devices.ENV] == '2'
  assert devices.child_env(8, {})[devices.ENV] == '1'
  assert devices.child_env(2, {devices.ENV: '3'})[devices.ENV] == '3'
  _configure(['sweep.py', '--host_devices=1'])
  assert devices.child_env(2, {})[devices.ENV] == '1'


def test_binary_rejects_a_bad_count_before_jax(tmp_path):
  res = subprocess.run([sys.executable, os.path.join(REPO, 'experiments', 'train.py'), '--host_devices=0',
                        '--config=configs/quickstart.py', f'--workdir={tmp_path}'], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
  assert res.returncode == 2
  assert res.stderr.strip().splitlines() == [
      "error: --host_devices='0': use a positive number of host CPU devices (1 = one device, no client sharding) "
      'or auto (one per usable core)']


# ------------------------------------------------------------------------------------ runs on 2 devices

WORKER_CONFIGS = {
    # name: (model, algorithm, extra overrides)
    'fedavg_cnn': ('digits_cnn', 'fedavg', {}),
    'scaffold_mlp': ('mlp', 'scaffold', {'server.optimizer': 'adam', 'server.lr': 0.01}),
}


def _worker_config(name):
  from fedjax_flat.config.default_config import default_config
  model, alg, extra = WORKER_CONFIGS[name]
  c = default_config()
  c.dataset = 'digits'
  c.data.num_clients = 20
  c.data.alpha = 0.5
  c.model = model
  c.algorithm = alg
  if alg != 'fedavg':
    from fedjax_flat.algorithms import registry
    c.algo.update(registry.default_hparams(alg))
  c.rounds = 4
  c.clients_per_round = 5          # 2 devices: cohort padded to 6
  c.client.lr = 0.05
  c.client.batch_size = 16
  c.eval_every = 2
  c.progress_every_s = 1e9
  for k, v in extra.items():
    node = c
    *path, last = k.split('.')
    for p in path:
      node = node[p]
    node[last] = v
  return c


def _train(name):
  import jax
  from fedjax_flat.training import loop
  t = loop.Trainer(_worker_config(name))
  t.train()
  out = {f's{i}': np.asarray(a) for i, a in enumerate(jax.tree_util.tree_leaves(jax.device_get(t.server_state)))}
  if t.store is not None:
    sd = t.store.state_dict()
    out.update({f'c{i}': np.asarray(a) for i, a in enumerate(jax.tree_util.tree_leaves(sd['states']))})
    out['ids'] = np.asarray(sd['ids'])
  out['devices'] = np.asarray(jax.device_count())
  out['sharded'] = np.asarray(t.plan.mesh is not None)
  out['device_rounds'] = np.asarray(bool(t.plan.device_rounds))
  out['block_cache'] = np.asarray(t.driver.block_fn._cache_size() if t.plan.device_rounds else 0)
  out['test_accuracy'] = np.asarray([r['test_accuracy'] for r in t.records])
  return out


def _run_worker(tmp_path, tag, n_devices, names):
  out = tmp_path / tag
  out.mkdir()
  env = {**os.environ, **CACHE_ENV, 'JAX_PLATFORMS': 'cpu', devices.ENV: str(n_devices)}
  env.pop('XLA_FLAGS', None)
  res = subprocess.run([sys.executable, os.path.abspath(__file__), '--worker', str(out), *names], env=env,
                       capture_output=True, text=True, timeout=900, cwd=REPO)
  assert res.returncode == 0, res.stderr[-3000:]
  return {n: dict(np.load(out / f'{n}.npz')) for n in names}


def _params(d):
  return [d[k] for k in sorted(k for k in d if k[0] in 'sc' and k[1:].isdigit())]


@pytest.mark.slow   # ~24 s; two host devices stay in the default suite (core/test_sharding, the evaluator's test)
def test_two_devices_rerun_bit_identical_and_close_to_one_device(tmp_path):
  names = list(WORKER_CONFIGS)
  two_a = _run_worker(tmp_path, 'two_a', 2, names)
  two_b = _run_worker(tmp_path, 'two_b', 2, names)
  one = _run_worker(tmp_path, 'one', 1, names)
  for n in names:
    assert int(two_a[n]['devices']) == 2 and bool(two_a[n]['sharded']), n
    assert int(one[n]['devices']) == 1 and not bool(one[n]['sharded']), n
    for a, b in zip(_params(two_a[n]), _params(two_b[n]), strict=True):
      np.testing.assert_array_equal(a, b)            # same device count: the same bits
    for a, b in zip(_params(two_a[n]), _params(one[n]), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)   # 1 vs 2 devices: reduction order only
      # (measured after 4 rounds: 4.4e-6 at most, on a conv bias; tests/test_sharding.py asks the same 1e-5)
    np.testing.assert_allclose(two_a[n]['test_accuracy'], one[n]['test_accuracy'], atol=1 / 359 + 1e-9)
  for n in ('fedavg_cnn', 'scaffold_mlp'):           # rounds in one program, sharded, compiled once
    assert bool(two_a[n]['device_rounds']) and int(two_a[n]['block_cache']) == 1, n


ROUNDS = 8
TRAIN_FLAGS = ['--config.model=mlp', f'--config.rounds={ROUNDS}', '--config.eval_every=2',
               '--config.progress_every_s=0', '--config.algorithm=scaffold', '--config.server.optimizer=adam',
               '--config.server.lr=0.01', '--config.checkpoint_every=1']


def _train_cmd(wd):
  return [sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
          f'--config={os.path.join(REPO, "configs", "quickstart.py")}', f'--workdir={wd}', *TRAIN_FLAGS]


def _env(n):
  env = {**os.environ, **CACHE_ENV, 'JAX_PLATFORMS': 'cpu', devices.ENV: str(n)}
  env.pop('XLA_FLAGS', None)
  return env


def _latest_step(wd):
  d = wd / 'checkpoints'
  return max([int(p) for p in os.listdir(d) if p.isdigit()] if d.exists() else [], default=0)


def _kill_at(wd, target, n):
  proc = subprocess.Popen(_train_cmd(wd), env=_env(n), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 600
  while proc.poll() is None and time.time() < deadline and _latest_step(wd) < target:
    time.sleep(0.01)
  finished_early = proc.poll() is not None
  proc.send_signal(signal.SIGKILL)
  _, err = proc.communicate(timeout=120)
  assert not finished_early, err[-2000:]
  return _latest_step(wd)


def _final(wd):
  from fedjax_flat.training import checkpoint as ckpt_lib
  return ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))


def _leaves(ck):
  return list(ck['server_leaves']) + list(ck['client_leaves'] or [])


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_two_devices_header_config_and_bit_identical_resume(tmp_path):
  ref = tmp_path / 'ref'
  res = subprocess.run(_train_cmd(ref), env=_env(2), capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  first = res.stdout.splitlines()[0]
  assert first.startswith('host devices: 2 CPU device(s)') and 'jax sees 2 cpu device(s)' in first, first
  saved = json.loads((ref / 'config.json').read_text())['host_devices']
  assert (saved['devices'], saved['source'], saved['device_count']) == (2, 'env', 2)
  assert _final(ref)['meta']['num_devices'] == 2
  # SIGKILL at a random checkpointed round, rerun: the same bits as the uninterrupted 2-device run.
  wd = tmp_path / 'killed'
  k = random.Random(int(time.time())).randint(1, ROUNDS - 3)
  assert _kill_at(wd, k, 2) >= 1
  res = subprocess.run(_train_cmd(wd), env=_env(2), capture_output=True, text=True, timeout=600)
  assert res.returncode == 0 and 'resumed from round' in res.stdout, res.stderr[-3000:]
  got, want = _final(wd), _final(ref)
  assert got['step'] == want['step'] == ROUNDS
  for a, b in zip(_leaves(got), _leaves(want), strict=True):
    np.testing.assert_array_equal(a, b)
  # Written on 2 devices, resumed on 1: runs to the end, says why it is not bit-identical, agrees to fp32.
  wd1 = tmp_path / 'other_count'
  stopped = _kill_at(wd1, 3, 2)
  res = subprocess.run(_train_cmd(wd1), env=_env(1), capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  assert f'resumed from round {stopped}' in res.stdout
  assert 'resuming on 1 device(s) from a checkpoint written on 2' in res.stderr
  got = _final(wd1)
  assert got['step'] == ROUNDS and got['meta']['num_devices'] == 1
  for a, b in zip(_leaves(got), _leaves(want), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _worker_main(argv):
  out, names = argv[0], argv[1:]
  for name in names:
    np.savez(os.path.join(out, f'{name}.npz'), **_train(name))


if __name__ == '__main__':
  if sys.argv[1:2] == ['--worker']:
    _worker_main(sys.argv[2:])
