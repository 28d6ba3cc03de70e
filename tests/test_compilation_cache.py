"""XLA's persistent compilation cache in the binaries (fedjax_flat/devices.py: configure_compilation_cache).

The choice (flag, environment, the user's JAX_COMPILATION_CACHE_DIR, the default under the user cache), an
unusable directory (one warning line, no cache), 'off'; and whole runs of experiments/train.py: two processes
writing one cold cache at once, then a warm run and a run with the cache off give the same metrics and final
parameters bit for bit, the warm run compiles nothing new; with every entry torn (half-written, as a reader
racing a writer would see it) the run still finishes with the same bits.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_flat import devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE_VARS = (devices.CACHE_ENV, devices.JAX_CACHE_ENV, devices.ENABLE_ENV, devices.MIN_COMPILE_ENV,
              devices.MIN_ENTRY_ENV)


def _configure(argv=None, env=None):
  env = {} if env is None else env
  return devices.configure_compilation_cache([] if argv is None else argv, env, jax_started=False), env


# ------------------------------------------------------------------------------------ the choice itself

def test_default_is_under_the_user_cache(tmp_path, monkeypatch):
  rec, env = _configure(env={'XDG_CACHE_HOME': str(tmp_path / 'xdg')})
  want = str(tmp_path / 'xdg' / 'fedjax_flat' / 'xla')
  assert (rec.dir, rec.source, rec.label, rec.warning) == (want, 'default', want, '')
  assert os.path.isdir(want) and os.listdir(want) == []        # created; the write probe is gone
  assert env == {'XDG_CACHE_HOME': str(tmp_path / 'xdg'), devices.JAX_CACHE_ENV: want, devices.CACHE_ENV: want,
                 devices.MIN_COMPILE_ENV: devices.MIN_COMPILE_SECS, devices.MIN_ENTRY_ENV: devices.MIN_ENTRY_BYTES}
  child, _ = _configure(env=dict(env))                          # a sweep's run: the same directory, and why
  assert (child.dir, child.source, child.why) == (want, 'env', f'{devices.CACHE_ENV}={want}')
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))            # no XDG_CACHE_HOME: ~/.cache
  rec, _ = _configure()
  assert rec.dir == str(tmp_path / 'home' / '.cache' / 'fedjax_flat' / 'xla')


def test_users_jax_settings_are_kept(tmp_path):
  own = str(tmp_path / 'own')
  rec, env = _configure(env={devices.JAX_CACHE_ENV: own, devices.MIN_COMPILE_ENV: '0'})
  assert (rec.dir, rec.source) == (own, 'user')
  assert env[devices.JAX_CACHE_ENV] == own and env[devices.MIN_COMPILE_ENV] == '0'
  assert env[devices.CACHE_ENV] == own                          # the children: the same directory
  rec, env = _configure(env={devices.ENABLE_ENV: 'false', devices.JAX_CACHE_ENV: own})
  assert (rec.label, rec.source) == ('off', 'user') and devices.JAX_CACHE_ENV not in env


@pytest.mark.parametrize('argv', [['train.py', '--compilation_cache={d}', '--x'],
                                  ['train.py', '--compilation_cache', '{d}', '--x']])
def test_flag_wins_leaves_argv_and_reaches_children(tmp_path, argv):
  d = str(tmp_path / 'flagged')
  argv = [a.format(d=d) for a in argv]
  rec, env = _configure(argv, {devices.JAX_CACHE_ENV: str(tmp_path / 'theirs'), devices.CACHE_ENV: 'off'})
  assert (rec.dir, rec.source) == (d, 'flag') and argv == ['train.py', '--x']
  assert env[devices.JAX_CACHE_ENV] == d and env[devices.CACHE_ENV] == d
  child, _ = _configure(env=dict(env))                          # a sweep's run: the same directory
  assert (child.dir, child.source) == (d, 'env')


def test_off_and_relative_paths(tmp_path, monkeypatch):
  rec, env = _configure(['x', '--compilation_cache=OFF'], {devices.JAX_CACHE_ENV: str(tmp_path)})
  assert (rec.dir, rec.label) == ('', 'off')
  assert env == {devices.CACHE_ENV: 'off', devices.ENABLE_ENV: 'false'}
  child, child_env = _configure(env=dict(env))
  assert (child.label, child.source) == ('off', 'env') and devices.JAX_CACHE_ENV not in child_env
  monkeypatch.chdir(tmp_path)
  rec, env = _configure(env={devices.CACHE_ENV: 'rel/xla'})     # absolute for children in other directories
  assert rec.dir == env[devices.JAX_CACHE_ENV] == str(tmp_path / 'rel' / 'xla')


@pytest.mark.parametrize('value', ['', ' '])
def test_empty_value_is_one_clear_error(value):
  with pytest.raises(devices.HostDevicesError, match=r'--compilation_cache=.*empty; use --compilation_cache=DIR or '
                                                     r'--compilation_cache=off'):
    _configure(['x', f'--compilation_cache={value}'])
  with pytest.raises(devices.HostDevicesError, match='needs a value'):
    _configure(['x', '--compilation_cache'])


def test_unusable_directory_is_one_warning_and_no_cache(tmp_path, capsys):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  rec, env = _configure(env={devices.CACHE_ENV: str(blocker / 'xla')})   # fails as root too (chmod would not)
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f'warning: compilation cache {blocker / "xla"} is not usable (')
  assert 'running without it' in err[0]
  assert (rec.label, rec.source) == ('off', 'env') and rec.warning
  assert env == {devices.CACHE_ENV: 'off', devices.ENABLE_ENV: 'false'}   # the children: off, no second warning


def test_jax_started_changes_nothing(tmp_path):
  env = {}
  rec = devices.configure_compilation_cache(['x', f'--compilation_cache={tmp_path}'], env, jax_started=True)
  assert env == {} and rec.dir == str(tmp_path) and 'jax was already imported' in rec.why


def test_record_names_the_cache(tmp_path, monkeypatch):
  monkeypatch.setattr(devices, '_CONFIGURED', None)
  assert devices.describe({})['compilation_cache'] == 'off'                # library use: what jax will do
  assert devices.describe({devices.JAX_CACHE_ENV: '/c'})['compilation_cache'] == '/c'
  assert devices.describe({devices.JAX_CACHE_ENV: '/c', devices.ENABLE_ENV: '0'})['compilation_cache'] == 'off'
  rec = devices.HostDevices(1, 'shared', 2, 'why', 'flag', '', compilation_cache=str(tmp_path))
  assert rec.line().endswith(f'(why); compilation cache: {tmp_path}')
  assert rec.as_dict()['compilation_cache'] == str(tmp_path)


# ------------------------------------------------------------------------------------ whole runs

FLAGS = ['--config.model=mlp', '--config.rounds=2', '--config.eval_every=1', '--config.data.num_clients=6',
         '--config.clients_per_round=3', '--config.progress_every_s=0']


def _cmd(wd, cache, flags=FLAGS):
  return [sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
          f'--config={os.path.join(REPO, "configs", "quickstart.py")}', f'--workdir={wd}', *flags,
          f'--compilation_cache={cache}']


def _env():
  env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
  env[devices.MIN_COMPILE_ENV] = '0'       # the tiny test programs compile in < MIN_COMPILE_SECS: cache them all
  return env


def _result(wd):
  from fedjax_flat.training import checkpoint as ckpt_lib
  with open(os.path.join(wd, 'metrics.jsonl')) as f:
    rows = [{k: v for k, v in json.loads(line).items() if k not in ('elapsed_s', 'rounds_per_s')} for line in f]
  ck = ckpt_lib.read_checkpoint(os.path.join(wd, 'checkpoints'))
  return rows, list(ck['server_leaves']) + list(ck['client_leaves'] or [])


def _same(a, b):
  assert a[0] == b[0] and len(a[0]) >= 1
  for x, y in zip(a[1], b[1], strict=True):
    np.testing.assert_array_equal(x, y)


def _entries(cache):
  return sorted(os.listdir(cache))


def _run(wd, cache, flags, env):
  res = subprocess.run(_cmd(wd, cache, flags), env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  assert f'; compilation cache: {cache}; jax sees' in res.stdout.splitlines()[0], res.stdout
  return res


def test_cold_then_warm_bit_identical(tmp_path):
  """The fast variant: one tiny run compiled and written, then read back: same bits, nothing new written."""
  cache, env, flags = str(tmp_path / 'xla'), _env(), FLAGS[:1] + ['--config.rounds=1'] + FLAGS[2:]
  _run(tmp_path / 'cold', cache, flags, env)
  assert json.loads((tmp_path / 'cold' / 'config.json').read_text())['host_devices']['compilation_cache'] == cache
  written = _entries(cache)
  assert any(e.startswith('jit_block') for e in written), written      # the round program
  _run(tmp_path / 'warm', cache, flags, env)
  assert _entries(cache) == written          # every program came from the cache: nothing new was written
  _same(_result(tmp_path / 'warm'), _result(tmp_path / 'cold'))


@pytest.mark.slow   # the quickstart's CNN for 3 rounds, six processes
def test_quickstart_concurrent_cold_warm_off_and_torn_entries_bit_identical(tmp_path):
  """Two cold processes at once on one cache, then warm, off, and every entry torn: all bit-identical."""
  cache, env = str(tmp_path / 'xla'), _env()
  flags = ['--config.rounds=3', '--config.eval_every=1', '--config.progress_every_s=0']
  procs = [subprocess.Popen(_cmd(tmp_path / f'cold{i}', cache, flags), env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  for p in procs:
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    assert f'; compilation cache: {cache}; jax sees' in out.splitlines()[0], out
  written = _entries(cache)
  assert any(e.startswith('jit_block') for e in written), written
  _run(tmp_path / 'warm', cache, flags, env)
  assert _entries(cache) == written
  _run(tmp_path / 'off', 'off', flags, env)
  ref = _result(tmp_path / 'off')
  for name in ('cold0', 'cold1', 'warm'):
    _same(_result(tmp_path / name), ref)
  for name in _entries(cache):               # every entry half-written, as a reader racing a writer finds it
    path = os.path.join(cache, name)
    with open(path, 'r+b') as f:
      f.truncate(os.path.getsize(path) // 2)
  torn = _run(tmp_path / 'torn', cache, flags, env)
  assert 'Error reading persistent compilation cache entry' in torn.stderr
  _same(_result(tmp_path / 'torn'), ref)
