"""experiments/sweep.py: grid expansion and naming, local runs (run / skip / fail / resume after SIGKILL), SLURM."""
import glob
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time

import pytest

from fedjax_flat.sweeps import grid as grid_lib
from fedjax_flat.sweeps import local as local_lib
from fedjax_flat.sweeps import status as status_lib
from fedjax_flat.sweeps import sweep as sweep_lib
from tests.fixtures.paths import REPO as ROOT

SWEEP = os.path.join(ROOT, 'experiments', 'sweep.py')
QS = os.path.join(ROOT, 'configs', 'quickstart.py')
# Tiny runs: 2 rounds, one evaluation each, a checkpoint every round.
TINY = ['--set=rounds=2', '--set=eval_every=1', '--set=summary_last_k=1', '--set=checkpoint_every=1']


def _sweep(args, timeout=240):
  return subprocess.run([sys.executable, SWEEP] + args, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _manifest(d):
  with open(os.path.join(d, 'sweep.json')) as f:
    return {f"{r['cell']}/seed={r['seed']}": r for r in json.load(f)['runs']}


# ----------------------------------------------------------------------------------------------- no subprocess

def test_expand_grid_names_and_commands(tmp_path):
  spec = dict(config='configs/quickstart.py:fedprox', fixed={'rounds': 3},
              grid={'client.optimizer': ['sgd', 'sam'], 'client.rho': [0.05, 0.1]}, seeds=[0, 2])
  runs = grid_lib.expand(spec, str(tmp_path))
  assert [r.key for r in runs] == [
      'client.optimizer=sgd,client.rho=0.05/seed=0', 'client.optimizer=sgd,client.rho=0.05/seed=2',
      'client.optimizer=sgd,client.rho=0.1/seed=0', 'client.optimizer=sgd,client.rho=0.1/seed=2',
      'client.optimizer=sam,client.rho=0.05/seed=0', 'client.optimizer=sam,client.rho=0.05/seed=2',
      'client.optimizer=sam,client.rho=0.1/seed=0', 'client.optimizer=sam,client.rho=0.1/seed=2']
  argv = runs[3].argv('PY')
  # The config string with its :arg goes through unchanged; fixed, then cell overrides, then the seed.
  assert argv[2:] == ['--config=configs/quickstart.py:fedprox', '--config.rounds=3', '--config.client.optimizer=sgd',
                      '--config.client.rho=0.1', '--config.seed=2',
                      f'--workdir={tmp_path}/client.optimizer=sgd,client.rho=0.1/seed=2']
  # Same spec, same names (deterministic); named cells and per-cell configs.
  assert [r.workdir for r in grid_lib.expand(spec, str(tmp_path))] == [r.workdir for r in runs]
  cells = grid_lib.expand(dict(grid=[dict(name='a', config='x.py', **{'swa.enabled': True}),
                                      dict(config='y.py:algo=fedavgm')]), 'D')
  assert [r.key for r in cells] == ['a/seed=0', 'config=y_algo=fedavgm/seed=0']
  assert cells[0].argv('PY')[2:4] == ['--config=x.py', '--config.swa.enabled=True']


def test_expand_rejects_bad_input():
  with pytest.raises(grid_lib.SweepError, match='seeds'):
    grid_lib.expand(dict(config='c.py', grid={'seed': [0, 1]}), 'D')
  with pytest.raises(grid_lib.SweepError, match='two cells'):
    grid_lib.expand(dict(config='c.py', grid=[dict(name='x', a=1), dict(name='x', a=2)]), 'D')
  with pytest.raises(grid_lib.SweepError, match='KEY=V1,V2'):
    grid_lib.parse_grid_flags(['client.rho'])
  with pytest.raises(grid_lib.SweepError, match='unknown sweep keys'):
    grid_lib.expand(dict(config='c.py', grids={}), 'D')
  assert grid_lib.parse_grid_flags(['config.client.rho=0.05,1,True,sam']) == {'client.rho': [0.05, 1, True, 'sam']}
  assert grid_lib.parse_seeds('0,1, 2') == [0, 1, 2]


# slow: three sweep.py subprocesses; the default suite covers the binary's one-line exit 2 by
# tests/e2e/test_entry_point_errors.py[sweep: --seeds=-1]
@pytest.mark.slow
def test_bad_flags_exit_2_with_one_line(tmp_path):
  for args, needle in ((['--config=configs/nope.py'], 'no such file'), (['--config=' + QS, '--grid=client.lr'],
                        'KEY=V1,V2'), (['--config=' + QS, '--seeds=a'], '--seeds')):
    p = _sweep(args + [f'--sweep_dir={tmp_path}/s'], timeout=60)
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_slurm_script_array_and_commands(tmp_path):
  d = tmp_path / 'sl'
  p = _sweep([f'--config={QS}', '--grid=client.optimizer=sgd,sam', '--grid=client.lr=0.05,0.1', '--seeds=0,1',
              '--set=rounds=3', f'--sweep_dir={d}', '--launcher=slurm', '--parallel=3', '--sbatch=--time=01:00:00'],
             timeout=60)
  assert p.returncode == 0, p.stderr
  script = (d / 'sweep.sbatch').read_text()
  assert '#SBATCH --array=0-7%3' in script and '#SBATCH --time=01:00:00' in script
  cmds = (d / 'commands.txt').read_text().splitlines()
  assert len(cmds) == 8 and not (d / 'client.lr=0.05,client.optimizer=sgd').exists()   # nothing ran
  assert shlex.split(cmds[1])[-2:] == ['--config.seed=1', f'--workdir={d}/client.lr=0.05,client.optimizer=sgd/seed=1']
  assert f'cd {ROOT}' in script and 'bash -c "$CMD"' in script
  assert all('experiments/train.py' in c and f'--config={QS}' in c and '--config.rounds=3' in c for c in cmds)
  assert len(_manifest(d)) == 8
  # Multi-host: every task is an srun over the nodes, train.py with --distributed (docs/scaling.md).
  p = _sweep([f'--config={QS}', '--grid=client.lr=0.05', f'--sweep_dir={tmp_path}/mh', '--launcher=slurm',
              '--slurm_nodes=4'], timeout=60)
  script = (tmp_path / 'mh' / 'sweep.sbatch').read_text()
  assert '#SBATCH --nodes=4' in script and 'srun --nodes=$SLURM_JOB_NUM_NODES' in script
  assert '#SBATCH --array=0-0\n' in script
  assert (tmp_path / 'mh' / 'commands.txt').read_text().strip().endswith('--distributed')


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_run_skip_and_fail(tmp_path):
  """One good run and one that fails while training (divergence, exit 1): the good one finishes, the failure
  is listed, exit 1; the second invocation skips the finished run and reports the failure again."""
  d = tmp_path / 'sw'
  args = [f'--config={QS}', '--grid=client.lr=0.05,1e30', '--seeds=0', f'--sweep_dir={d}', '--parallel=2'] + TINY
  p = _sweep(args)
  assert p.returncode == 1, p.stdout + p.stderr
  m = _manifest(d)
  assert m['client.lr=0.05/seed=0']['status'] == 'done'
  bad = m['client.lr=1e+30/seed=0']
  assert bad['status'] == 'failed' and bad['returncode'] == 1 and 'divergence' in bad['error']
  assert 'FAILED client.lr=1e+30/seed=0 (exit 1)' in p.stdout
  assert '1 runs done, 0 skipped (finished earlier), 1 failed' in p.stdout
  assert '[sweep] 1/2 done, 0 running, 1 failed' in p.stderr
  with open(d / 'client.lr=0.05' / 'seed=0' / 'summary.json') as f:
    assert json.load(f)['rounds_completed'] == 2
  mtime = os.path.getmtime(d / 'client.lr=0.05' / 'seed=0' / 'summary.json')
  p = _sweep(args)
  assert p.returncode == 1 and '0 runs done, 1 skipped (finished earlier), 1 failed' in p.stdout, p.stdout
  assert os.path.getmtime(d / 'client.lr=0.05' / 'seed=0' / 'summary.json') == mtime
  assert _manifest(d)['client.lr=0.05/seed=0']['status'] == 'skipped (finished)'
  # A bad grid value (train.py would exit 2) stops the sweep before anything launches: one line, exit 2.
  for mode in (['--parallel=2'], ['--batch_runs=2']):
    p = _sweep([f'--config={QS}', '--grid=client.optimizer=sgd,bogus', '--seeds=0', f'--sweep_dir={d}2'] + mode +
               TINY, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert 'client.optimizer=bogus/seed=0' in p.stderr and 'client.optimizer' in p.stderr
    assert not (d.parent / 'sw2').exists()
  # A finished workdir whose config differs from the sweep's is not silently reused.
  run = grid_lib.expand(dict(config=QS, fixed={'rounds': 2, 'client.momentum': 0.5},
                              grid={'client.lr': [0.05, 1e30]}), str(d))[0]
  assert status_lib.run_status(run) == 'mismatch'


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_batched_sweep_writes_every_workdir_and_resumes(tmp_path):
  """--batch_runs on two host devices: compatible runs share a program (the SGD cell's seeds, the SAM
  cell's), every workdir is complete, report.py reads the sweep; a rerun skips everything."""
  d = tmp_path / 'b'
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=2', PYTHONPATH=ROOT)
  args = [f'--config={QS}', '--grid=client.optimizer=sgd,sam', '--seeds=0,1,2', f'--sweep_dir={d}',
          '--batch_runs=auto'] + TINY
  p = subprocess.run([sys.executable, SWEEP] + args, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
  assert p.returncode == 0, p.stdout + p.stderr
  m = _manifest(d)
  assert len(m) == 6 and all(r['status'] == 'done' for r in m.values())
  assert {r['program'] for k, r in m.items() if 'sgd' in k} == {0} and {r['program'] for k, r in m.items()
                                                                       if 'sam' in k} == {1}
  assert {r['lanes'] for r in m.values()} == {4}           # 3 runs -> 4 lanes on 2 devices: really batched
  for r in m.values():
    wd = d / r['workdir']
    assert {'config.json', 'metrics.jsonl', 'metrics.csv', 'summary.json', 'summary.md', 'metrics.png',
            'tensorboard', 'checkpoints'} <= set(os.listdir(wd))
    with open(wd / 'config.json') as f:
      assert json.load(f)['seed'] == r['seed']
    assert 'batched program' in (wd / 'sweep.log').read_text()
  rep = subprocess.run([sys.executable, os.path.join(ROOT, 'experiments', 'report.py'), f'--sweep_dir={d}',
                        f'--out_dir={tmp_path}/rep'], capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert rep.returncode == 0, rep.stderr
  assert 'client.optimizer=sam' in (tmp_path / 'rep' / 'report.md').read_text()
  # The same run alone (one process, one device) gives the batched lane's numbers (fp32 tolerance).
  alone = tmp_path / 'alone'
  q = subprocess.run([sys.executable, os.path.join(ROOT, 'experiments', 'train.py'), f'--config={QS}',
                      '--config.client.optimizer=sam', '--config.rounds=2', '--config.eval_every=1',
                      '--config.summary_last_k=1', '--config.checkpoint_every=1', '--config.seed=1',
                      f'--workdir={alone}'], capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert q.returncode == 0, q.stderr
  read = lambda wd: [json.loads(l) for l in (wd / 'metrics.jsonl').read_text().splitlines()]
  for a, b in zip(read(alone), read(d / 'client.optimizer=sam' / 'seed=1'), strict=True):
    for k in ('test_accuracy', 'test_loss', 'train_loss'):
      assert abs(a[k] - b[k]) <= 1e-4 * max(1.0, abs(a[k])), (k, a[k], b[k])
  p = subprocess.run([sys.executable, SWEEP] + args, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
  assert p.returncode == 0 and '0 runs done, 6 skipped' in p.stdout, p.stdout + p.stderr


@pytest.mark.slow
def test_grid_2x2_two_seeds_all_finish(tmp_path):
  d = tmp_path / 'g'
  p = _sweep([f'--config={QS}', '--grid=client.optimizer=sgd,sam', '--grid=client.lr=0.05,0.1', '--seeds=0,1',
              f'--sweep_dir={d}', '--parallel=2'] + TINY, timeout=600)
  assert p.returncode == 0, p.stdout + p.stderr
  m = _manifest(d)
  assert len(m) == 8 and all(r['status'] == 'done' for r in m.values())
  for r in m.values():
    with open(d / r['workdir'] / 'config.json') as f:
      cfg = json.load(f)
    assert cfg['seed'] == r['seed'] and cfg['client']['optimizer'] == r['overrides']['client.optimizer']


@pytest.mark.slow
def test_killed_run_resumes_on_next_invocation(tmp_path):
  d = tmp_path / 'k'
  args = [f'--config={QS}', '--grid=client.lr=0.05', '--seeds=0', f'--sweep_dir={d}', '--set=rounds=40',
          '--set=eval_every=5', '--set=summary_last_k=1', '--set=checkpoint_every=2']
  proc = subprocess.Popen([sys.executable, SWEEP] + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  ckpt = d / 'base' / 'seed=0' / 'checkpoints'     # one cell, nothing varies: named 'base'
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None and not (
      ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir())):
    time.sleep(0.5)
  assert proc.poll() is None, 'the run finished before a checkpoint was seen'
  pid = _manifest(d)['base/seed=0']['pid']
  os.kill(pid, signal.SIGKILL)             # the training process itself, mid-run
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 1 and 'FAILED base/seed=0 (exit -9)' in out, out + err
  assert status_lib.run_status(grid_lib.expand(dict(config=QS, fixed={'rounds': 40, 'eval_every': 5,
      'summary_last_k': 1, 'checkpoint_every': 2}, grid={'client.lr': [0.05]}), str(d))[0]) == 'partial'
  p = _sweep(args, timeout=300)
  assert p.returncode == 0 and '1 runs done' in p.stdout, p.stdout + p.stderr
  log = (d / 'base' / 'seed=0' / 'sweep.log').read_text()
  assert 'resumed from round' in log
  with open(d / 'base' / 'seed=0' / 'summary.json') as f:
    assert json.load(f)['rounds_completed'] == 40


def test_checked_in_sweep_files_expand(tmp_path):
  """The reproduction sweeps (benchmarks/studies/reproduce_digits.sh): every cell x 3 seeds, named, with references."""
  fm = grid_lib.expand(grid_lib.load_sweep_file(os.path.join(ROOT, 'configs/sweeps/flat_minima_digits.py')), 'D')
  assert len(fm) == 16 * 3 and fm[0].key == 'fedavg/seed=0' and fm[-1].key == 'fedasam_man/seed=2'
  assert fm[0].reference == {'source': 'benchmarks/studies/README.flat_minima.md (earlier run, 150 rounds, seeds 0-2)',
                             'accuracy': 89.35, 'accuracy_std': 0.19}
  gloss = next(r for r in fm if r.cell == 'naive_fedgloss_sam_release')
  assert gloss.config == 'configs/quickstart_fedgloss.py' and gloss.overrides['algorithm'] == 'naive_fedgloss'
  assert gloss.overrides['rounds'] == 150 and gloss.overrides['algo.dual_variant'] == 'release'
  short = grid_lib.expand(grid_lib.load_sweep_file(
      os.path.join(ROOT, 'configs/sweeps/flat_minima_digits.py') + ':rounds=60'), 'D')
  assert short[0].overrides['rounds'] == 60 and short[0].reference is None   # 150-round reference not comparable
  bl = grid_lib.expand(grid_lib.load_sweep_file(os.path.join(ROOT, 'configs/sweeps/baselines_digits.py')), 'D')
  assert len(bl) == 21 * 3 and len({r.cell for r in bl}) == 21
  speed = next(r for r in bl if r.cell == 'fedspeed_population')
  assert speed.config == 'configs/baselines_digits.py:algo=fedspeed' and speed.reference['accuracy'] == 96.32
  assert speed.argv('PY')[2:4] == ['--config=configs/baselines_digits.py:algo=fedspeed', '--config.data.alpha=0.0']


# ------------------------------------------------------------------------------------------------ hardening II

@pytest.mark.parametrize('grid, needle', [
    ({'client.lr': [0.05, -1]}, 'client.lr=-1'),
    ({'algorithm': ['fedavg', 'fedfoo']}, 'fedfoo'),
    ({'client.lr': [0.05, 'abc']}, 'abc'),
])
def test_every_grid_point_is_validated_before_launch(tmp_path, grid, needle):
  runs = grid_lib.expand(dict(config=QS, grid=grid, seeds=[0, 1]), str(tmp_path))
  with pytest.raises(grid_lib.SweepError, match=needle) as e:
    grid_lib.run_configs(runs)
  assert '/seed=0' in str(e.value)           # names the run
  assert not os.listdir(tmp_path)            # nothing launched, nothing written


def test_bad_seeds_and_sweep_shapes_are_sweep_errors():
  for text in ('-1', '0,0', '1,-2'):
    with pytest.raises(grid_lib.SweepError, match='--seeds'):
      grid_lib.parse_seeds(text)
  for spec, needle in ((dict(config=QS, seeds=[-1]), 'seeds'), (dict(config=QS, seeds='0'), 'seeds'),
                       (dict(config=QS, grid={'client.lr': 0.1}), 'non-empty list'),
                       (dict(config=QS, grid=[1, 2]), 'list of cells'), (dict(config=QS, fixed=[1]), 'fixed'),
                       (dict(config=3), 'config=3')):
    with pytest.raises(grid_lib.SweepError, match=needle):
      grid_lib.expand(spec, 'D')


def test_sweep_file_errors_are_one_sweep_error(tmp_path):
  bad = tmp_path / 'bad.py'
  bad.write_text('def get_sweep(:\n')
  with pytest.raises(grid_lib.SweepError, match='syntax error'):
    grid_lib.load_sweep_file(str(bad))
  bad.write_text('def get_sweep():\n  return 1 / 0\n')
  with pytest.raises(grid_lib.SweepError, match=r'ZeroDivisionError.*bad.py:2|bad.py:2.*ZeroDivisionError'):
    grid_lib.load_sweep_file(str(bad))


def test_one_driver_per_sweep_directory(tmp_path):
  fd = status_lib.lock_sweep_dir(str(tmp_path))
  try:
    with pytest.raises(grid_lib.SweepError, match=f'in use by another sweep driver \\(process {os.getpid()}'):
      status_lib.lock_sweep_dir(str(tmp_path))
  finally:
    os.close(fd)
  os.close(status_lib.lock_sweep_dir(str(tmp_path)))      # free again once the first driver is gone


def test_manifest_write_failure_is_one_operation_error(tmp_path, monkeypatch):
  import errno
  from fedjax_flat.errors import OperationError
  runs = grid_lib.expand(dict(config=QS, grid={'client.lr': [0.1]}), str(tmp_path))

  def full(*a, **k):
    raise OSError(errno.ENOSPC, 'No space left on device')
  monkeypatch.setattr(status_lib.os, 'replace', full)
  with pytest.raises(OperationError, match='could not write .*sweep.json: No space left on device'):
    status_lib.write_manifest(str(tmp_path), runs, {}, {})
  assert not [f for f in os.listdir(tmp_path) if f.endswith('.tmp')]


def _fake_python(tmp_path, name, body):
  """An executable standing in for the interpreter: run_local starts `<python> train.py <args>`."""
  p = tmp_path / name
  p.write_text('#!/bin/sh\n' + body + '\n')
  p.chmod(0o755)
  return str(p)


def test_failure_reason_is_the_last_error_line_of_the_attempt(tmp_path):
  runs = grid_lib.expand(dict(config=QS, grid={'client.lr': [0.1, 0.2, 0.3]}), str(tmp_path / 's'))
  # a log from an earlier attempt holds an old error: never reported for this attempt
  os.makedirs(runs[0].workdir)
  with open(os.path.join(runs[0].workdir, 'sweep.log'), 'w') as f:
    f.write('error: an old failure\n')
  outs = {}
  for r, py in zip(runs, [_fake_python(tmp_path, 'killed', 'kill -9 $$'),
                          _fake_python(tmp_path, 'errs', 'echo "warning: x"; echo "error: boom (the fix)"; exit 2'),
                          _fake_python(tmp_path, 'tb', 'echo "Traceback (most recent call last):"; '
                                                       'echo "ValueError: bad thing"; exit 1')]):
    outs[r.key] = local_lib.run_local([r], str(tmp_path / 's'), {}, python=py, poll_s=0.05,
                                      stream=open(os.devnull, 'w'), env=dict(os.environ))[r.key]
  k = [r.key for r in runs]
  assert outs[k[0]]['error'] == 'killed by SIGKILL (no error line in the log)'
  assert outs[k[1]]['error'] == 'error: boom (the fix)' and outs[k[1]]['returncode'] == 2
  assert outs[k[2]]['error'] == 'ValueError: bad thing'


def test_rerun_waits_for_a_live_process_holding_a_workdir(tmp_path):
  """A run whose workdir is locked by a live process (e.g. a child of a killed driver, still checkpointing)
  is waited for and then launched, not reported as failed ('workdir in use')."""
  import io
  import threading
  from fedjax_flat.training.workdir import WorkdirLock
  runs = grid_lib.expand(dict(config=QS, grid={'client.lr': [0.1]}), str(tmp_path / 's'))
  lock = WorkdirLock(runs[0].workdir).acquire()
  assert status_lib.workdir_holder(runs[0].workdir) == str(os.getpid())
  threading.Timer(1.5, lock.release).start()
  stream = io.StringIO()
  t = time.time()
  st = local_lib.run_local(runs, str(tmp_path / 's'), {}, python=_fake_python(tmp_path, 'ok', 'exit 0'),
                           poll_s=0.05, stream=stream, env=dict(os.environ))[runs[0].key]
  assert time.time() - t >= 1.4
  assert f'in use by process {os.getpid()}' in stream.getvalue() and 'waiting for it to end' in stream.getvalue()
  assert st['status'] == 'failed' and st['error'] == 'exit 0 (no error line in the log)'   # it did launch
  assert status_lib.workdir_holder(runs[0].workdir) is None


@pytest.mark.slow
def test_killed_driver_takes_its_children_down(tmp_path):
  """SIGKILL to the driver alone: the kernel sends its train.py children SIGTERM (they checkpoint and stop);
  a rerun finishes the sweep."""
  d = tmp_path / 'k'
  args = [f'--config={QS}', '--grid=client.lr=0.05', '--seeds=0', f'--sweep_dir={d}', '--set=rounds=100000',
          '--set=eval_every=1', '--set=checkpoint_every=1']
  p = subprocess.Popen([sys.executable, SWEEP] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
  log = d / 'base' / 'seed=0' / 'metrics.jsonl'      # one cell: named 'base' (nothing varies)
  deadline = time.time() + 180
  while not (log.exists() and log.read_text().strip()) and time.time() < deadline:
    time.sleep(0.2)
  child = int(_manifest(d)['base/seed=0']['pid'])
  os.kill(p.pid, signal.SIGKILL)
  p.wait(timeout=30)
  def alive(pid):
    try:
      with open(f'/proc/{pid}/stat') as f:
        return f.read().rsplit(')', 1)[1].split()[0] != 'Z'      # a zombie waiting to be reaped has ended
    except OSError:
      return False
  deadline = time.time() + 120
  while alive(child) and time.time() < deadline:
    time.sleep(0.2)
  assert not alive(child), f'child {child} outlived its driver'
  assert os.path.isdir(d / 'base' / 'seed=0' / 'checkpoints')


def _fake_run_batch(calls, results):
  """Stands in for training/batched.run_batch: records the runs it was given; `results` pops one status list."""
  from fedjax_flat.training import batched

  def run_batch(specs, **kw):
    calls.append([s.name for s in specs])
    statuses = results.pop(0) if results else ['done'] * len(specs)
    return {k: batched.RunResult(st, error='busy' if st == 'busy' else None) for k, st in enumerate(statuses)}
  return run_batch


def _batched_runs(tmp_path, lrs=(0.1,)):
  from configs import quickstart
  runs = grid_lib.expand(dict(config=QS, grid={'client.lr': list(lrs)}), str(tmp_path / 's'))
  configs = []
  for r in runs:
    c = quickstart.get_config()
    c.client.lr = r.overrides['client.lr']
    configs.append(c)
  return runs, configs


def test_batched_sweep_waits_for_a_workdir_held_by_a_live_process(tmp_path, monkeypatch):
  """--batch_runs: a run whose workdir is locked by a live process (a train.py started by hand, a child of
  another driver) is waited for, then trained; never marked failed ('workdir in use')."""
  import io
  import threading
  from fedjax_flat.training import batched
  from fedjax_flat.training.workdir import WorkdirLock
  runs, configs = _batched_runs(tmp_path)
  calls = []
  monkeypatch.setattr(batched, 'run_batch', _fake_run_batch(calls, []))
  lock = WorkdirLock(runs[0].workdir).acquire()
  seen = []
  timer = threading.Timer(1.0, lambda: (seen.append(_manifest(tmp_path / 's')[runs[0].key]['status']),
                                        lock.release()))
  timer.start()
  stream = io.StringIO()
  t = time.time()
  states = sweep_lib.run_batched(runs, configs, str(tmp_path / 's'), {}, batch_runs=2, stream=stream, poll_s=0.05)
  assert time.time() - t >= 0.9 and calls == [[runs[0].key]]        # launched once, after the holder ended
  assert seen == ['waiting']                                         # sweep.json said so meanwhile
  assert f'in use by process {os.getpid()}' in stream.getvalue() and 'waiting for it to end' in stream.getvalue()
  assert states[runs[0].key]['status'] == 'done'


def test_batched_sweep_retries_a_run_taken_between_the_check_and_the_lock(tmp_path, monkeypatch):
  from fedjax_flat.training import batched
  runs, configs = _batched_runs(tmp_path, lrs=(0.1, 0.2))
  calls = []
  monkeypatch.setattr(batched, 'run_batch', _fake_run_batch(calls, [['done', 'busy']]))
  states = sweep_lib.run_batched(runs, configs, str(tmp_path / 's'), {}, batch_runs=2,
                                 stream=open(os.devnull, 'w'), poll_s=0.01)
  assert calls == [[runs[0].key, runs[1].key], [runs[1].key]]
  assert [states[r.key]['status'] for r in runs] == ['done', 'done']


def test_batched_sweep_stopped_while_waiting_leaves_the_run_not_started(tmp_path, monkeypatch):
  from fedjax_flat.training import batched
  from fedjax_flat.training.workdir import WorkdirLock
  runs, configs = _batched_runs(tmp_path)
  calls = []
  monkeypatch.setattr(batched, 'run_batch', _fake_run_batch(calls, []))
  t_stop = time.time() + 0.5
  with WorkdirLock(runs[0].workdir):
    states = sweep_lib.run_batched(runs, configs, str(tmp_path / 's'), {}, batch_runs=2,
                                   stop_requested=lambda: time.time() > t_stop, stream=open(os.devnull, 'w'),
                                   poll_s=0.05)
  assert calls == [] and states[runs[0].key] == {'status': 'not started'}
  assert _manifest(tmp_path / 's')[runs[0].key]['status'] == 'not started'


def test_disk_full_mid_sweep_runs_go_on_and_the_end_is_one_error(tmp_path, monkeypatch):
  """sweep.json cannot be written (ENOSPC) while runs go: one warning, every run still launched and recorded by
  its own workdir; the driver's last write is its one error (experiments/sweep.py: exit 1, one line)."""
  import errno
  import io
  runs = grid_lib.expand(dict(config=QS, grid={'client.lr': [0.1, 0.2]}), str(tmp_path / 's'))
  real_open = open

  def full_open(file, mode='r', *a, **k):
    if 'w' in mode and os.path.basename(str(file)).startswith('sweep.json'):
      raise OSError(errno.ENOSPC, 'No space left on device', str(file))
    return real_open(file, mode, *a, **k)
  monkeypatch.setattr('builtins.open', full_open)
  stream = io.StringIO()
  py = _fake_python(tmp_path, 'ok', 'for a in "$@"; do case $a in --workdir=*) touch "${a#--workdir=}/ran";; '
                                    'esac; done')
  with pytest.raises(status_lib.ManifestWriteError, match='sweep.json: No space left on device.*rerun the same'):
    local_lib.run_local(runs, str(tmp_path / 's'), {}, python=py, poll_s=0.05, stream=stream, env=dict(os.environ))
  assert all(os.path.exists(os.path.join(r.workdir, 'ran')) for r in runs)
  warnings = [ln for ln in stream.getvalue().splitlines() if ln.startswith('warning:')]
  assert len(warnings) == 1 and 'No space left on device' in warnings[0]
  assert not [f for f in os.listdir(tmp_path / 's') if f.startswith('sweep.json')]


def test_a_child_ended_by_the_forwarded_sigterm_while_starting_is_stopped_not_failed(tmp_path):
  """Ctrl-C / SIGTERM to the driver is forwarded to its runs; one still starting (no handler yet) ends with
  -SIGTERM: stopped (the rerun resumes it), not FAILED 'killed by SIGTERM'."""
  import threading
  runs = grid_lib.expand(dict(config=QS, grid={'client.lr': [0.1]}), str(tmp_path / 's'))
  threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
  st = local_lib.run_local(runs, str(tmp_path / 's'), {}, python=_fake_python(tmp_path, 'slow', 'exec sleep 30'),
                           poll_s=0.05, stream=open(os.devnull, 'w'), env=dict(os.environ))[runs[0].key]
  assert st['status'] == 'stopped' and st['returncode'] == -signal.SIGTERM


def test_batched_sweep_compiles_the_next_program_on_a_thread_while_one_trains(tmp_path, monkeypatch):
  """Two program structures (SGD and SAM clients): while the first pack trains, the second is opened and its
  program compiled on a thread; its runs then train from that executable. The numbers are those of the same
  sweep without compiling ahead (the same program either way: bitwise)."""
  import io
  import threading
  from configs import quickstart
  from fedjax_flat.training import batched_trainer
  where = []
  real = batched_trainer.BatchedTrainer.compile
  monkeypatch.setattr(batched_trainer.BatchedTrainer, 'compile',
                      lambda self: (where.append((self.trainers[0].config.client.optimizer,
                                                  threading.current_thread().name, self.compiled is None)),
                                    real(self))[1])

  def sweep(d, ahead):
    runs = grid_lib.expand(dict(config=QS, fixed={'rounds': 1, 'eval_every': 1, 'summary_last_k': 1},
                                 grid={'client.optimizer': ['sgd', 'sam']}), str(d))
    configs = []
    for r in runs:
      c = quickstart.get_config()
      c.rounds, c.eval_every, c.summary_last_k = 1, 1, 1
      c.client.optimizer = r.overrides['client.optimizer']
      configs.append(c)
    stream = io.StringIO()
    states = sweep_lib.run_batched(runs, configs, str(d), {}, batch_runs=2, stream=stream, compile_ahead=ahead)
    assert [states[r.key]['status'] for r in runs] == ['done', 'done'], states
    return runs, stream.getvalue()

  runs, log = sweep(tmp_path / 'ahead', True)
  assert 'program 2/2: 1 runs (1 lanes), ' in log and log.count('compiled ahead') == 1, log
  # SAM's program: compiled on the thread (it was not compiled before), then used as it is by the main thread.
  sam = [w for w in where if w[0] == 'sam']
  assert sam[0][1] == 'compile-ahead' and sam[0][2] and all(not w[2] for w in sam[1:]), where
  runs_b, _ = sweep(tmp_path / 'plain', False)
  read = lambda r: pathlib.Path(r.workdir, 'metrics.jsonl').read_text().splitlines()
  for a, b in zip(runs, runs_b, strict=True):
    ja, jb = [json.loads(x) for x in read(a)], [json.loads(x) for x in read(b)]
    assert [{k: v for k, v in x.items() if not k.endswith('_s') and 'time' not in k} for x in ja] == \
        [{k: v for k, v in x.items() if not k.endswith('_s') and 'time' not in k} for x in jb]


# ----------------------------------------------------------------------------------------------- stages

def _ladd_pipeline(cells=('synthetic,ladd_cls', 'synthetic,fedavg_st', 'synthetic,source_only')):
  """configs/ladd.py's pipeline for the synthetic stand-in, tiny: 4 source steps, 2 federated rounds."""
  import importlib.util
  spec = importlib.util.spec_from_file_location('ladd_family', os.path.join(ROOT, 'configs', 'ladd.py'))
  ladd = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(ladd)
  source, fed = ladd.pipeline(list(cells))
  source['fixed'] = {'source_pretrain.steps': 4, 'source_pretrain.checkpoint_every': 2,
                     'source_pretrain.log_every': 2}
  fed['fixed'] = {'rounds': 2, 'eval_every': 1, 'eval_every_last': 1}
  return dict(name='ladd_tiny', stages=[source, fed], seeds=[0])


def test_stages_expand_with_declared_outputs_and_validate_before_they_exist(tmp_path):
  d = str(tmp_path / 'sw')
  runs = grid_lib.expand(_ladd_pipeline(), d)
  assert [(r.stage, r.cell) for r in runs] == [
      ('source', 'source/synthetic,source_fda'), ('source', 'source/synthetic,source_only'),
      ('federated', 'federated/synthetic,ladd_cls'), ('federated', 'federated/synthetic,fedavg_st')]
  assert runs[0].binary.endswith('experiments/pretrain_source.py') and runs[2].binary == grid_lib.TRAIN
  assert runs[0].workdir == os.path.join(d, 'source', 'synthetic,source_fda', 'seed=0')
  model = os.path.join(runs[0].workdir, 'source_model.npz')
  for r in runs[2:]:      # the federated cells start from the stage-1 model: its path, declared before it exists
    assert r.overrides['init.pretrained'] == model and r.inputs == {model: 'source/synthetic,source_fda/seed=0'}
    assert f'--config.init.pretrained={model}' in r.argv()
  configs = grid_lib.run_configs(runs)       # validated although the file is not there yet
  assert configs[2].init.pretrained == model and not os.path.exists(model)
  assert [sweep_lib.stages_of(runs)[i][0] for i in (0, 1)] == ['source', 'federated']
  # a run alone (train.py's check) still requires the file
  with pytest.raises(grid_lib.SweepError, match='no such file'):
    grid_lib.config_from_argv(runs[2].argv('python')[1:])


def test_stage_outputs_pair_seeds_and_refuse_what_is_not_an_earlier_stage(tmp_path):
  def spec(src_seeds, fed_seeds, ref='a/x'):
    return dict(config='configs/quickstart.py', stages=[
        dict(name='a', grid=[{'name': 'x'}], seeds=src_seeds),
        dict(name='b', grid=[{'name': 'y', 'init.pretrained': {'output_of': ref, 'file': 'm.npz'}}],
             seeds=fed_seeds)])
  runs = grid_lib.expand(spec([0, 1], [0, 1]), 'D')
  assert [r.overrides['init.pretrained'] for r in runs[2:]] == ['D/a/x/seed=0/m.npz', 'D/a/x/seed=1/m.npz']
  runs = grid_lib.expand(spec([0], [0, 1, 2]), 'D')     # one producer: every seed starts from it
  assert {r.overrides['init.pretrained'] for r in runs[1:]} == {'D/a/x/seed=0/m.npz'}
  with pytest.raises(grid_lib.SweepError, match='no run of seed 2'):
    grid_lib.expand(spec([0, 1], [2]), 'D')
  with pytest.raises(grid_lib.SweepError, match="'a/z', which is not a cell of an earlier stage; cells: a/x"):
    grid_lib.expand(spec([0], [0], ref='a/z'), 'D')
  with pytest.raises(grid_lib.SweepError, match='not a cell of an earlier stage'):
    grid_lib.expand(spec([0], [0], ref='b/y'), 'D')
  with pytest.raises(grid_lib.SweepError, match='instead of a grid, not both'):
    grid_lib.expand(dict(spec([0], [0]), grid={'rounds': [1]}), 'D')
  with pytest.raises(grid_lib.SweepError, match='binary='):
    grid_lib.expand(dict(config='c', stages=[dict(name='a', grid=[{}], binary='experiments/hessian.py')]), 'D')


def test_a_stage_whose_input_is_absent_is_not_started_naming_its_producer(tmp_path):
  d = str(tmp_path / 'sw')
  runs = grid_lib.expand(_ladd_pipeline(('synthetic,ladd_cls',)), d)
  fed = [r for r in runs if r.stage == 'federated']
  states = sweep_lib.run_stages(fed, [None] * len(fed), d, {'name': 'x'}, stream=open(os.devnull, 'w'))
  st = states['federated/synthetic,ladd_cls/seed=0']
  assert st['status'] == 'not started' and 'source/synthetic,source_fda/seed=0 did not finish' in st['error']
  assert not os.path.exists(fed[0].workdir)
  assert _manifest(d)['federated/synthetic,ladd_cls/seed=0']['stage'] == 'federated'


@pytest.mark.slow   # three processes (~90 s on 2 cores)
def test_ladd_pipeline_is_one_sweep_pretraining_then_federated_and_resumes(tmp_path):
  """The LADD table's pipeline on the synthetic stand-in: the source pre-training, then the federated cells from
  its source_model.npz; a rerun skips every finished run of both stages; the report covers both stages."""
  d = tmp_path / 'sw'
  sweep_file = tmp_path / 'ladd_tiny.py'
  sweep_file.write_text(f"def get_sweep(arg=''):\n  return {_ladd_pipeline(('synthetic,ladd_cls',))!r}\n")
  p = _sweep([f'--sweep={sweep_file}', f'--sweep_dir={d}', '--dry_run'])
  assert p.returncode == 0, p.stderr
  assert 'stage source: 1 runs of experiments/pretrain_source.py' in p.stdout
  assert 'stage federated: 1 runs of experiments/train.py' in p.stdout and 'needs ' in p.stdout
  p = _sweep([f'--sweep={sweep_file}', f'--sweep_dir={d}'], timeout=600)
  assert p.returncode == 0, p.stdout + p.stderr
  assert p.stderr.index('stage source') < p.stderr.index('stage federated')
  m = _manifest(d)
  assert {k: v['status'] for k, v in m.items()} == {'source/synthetic,source_fda/seed=0': 'done',
                                                    'federated/synthetic,ladd_cls/seed=0': 'done'}
  model = str(d / 'source' / 'synthetic,source_fda' / 'seed=0' / 'source_model.npz')
  with open(d / 'federated' / 'synthetic,ladd_cls' / 'seed=0' / 'config.json') as f:
    assert json.load(f)['init']['pretrained'] == model and os.path.isfile(model)
  p = _sweep([f'--sweep={sweep_file}', f'--sweep_dir={d}'])
  assert p.returncode == 0 and '0 runs done, 2 skipped (finished earlier)' in p.stdout, p.stdout + p.stderr
  from fedjax_flat.sweeps import report
  rows = report.aggregate(report.collect([str(d)]), ['cell'])
  assert [(r['cell'], r['finished']) for r in rows] == [('source/synthetic,source_fda', 1),
                                                        ('federated/synthetic,ladd_cls', 1)]
  assert all(0 < r['miou_mean'] < 100 for r in rows)


def test_a_finished_workdir_of_another_config_file_is_not_skipped(tmp_path):
  # Two single-cell sweeps in one --sweep_dir both name their cell 'base': config.json cannot tell which config
  # file a run came from, so the sweep's mark beside it does (run_status).
  d = str(tmp_path)
  (run,) = grid_lib.expand(dict(config=QS, fixed={'rounds': 2}), d)
  (other,) = grid_lib.expand(dict(config='configs/quickstart_fedgloss.py', fixed={'rounds': 2}), d)
  assert run.workdir == other.workdir and run.cell == 'base'
  os.makedirs(run.workdir)
  with open(os.path.join(run.workdir, 'config.json'), 'w') as f:
    json.dump({'seed': 0, 'rounds': 2}, f)
  with open(os.path.join(run.workdir, 'summary.json'), 'w') as f:
    json.dump({'rounds_completed': 2}, f)
  assert status_lib.run_status(run) == status_lib.run_status(other) == 'finished'    # no mark: as before
  status_lib.mark_config(run)
  assert status_lib.run_status(run) == 'finished' and status_lib.run_status(other) == 'mismatch'


def test_set_of_an_unknown_published_field_lists_the_fields_published_may_have(tmp_path):
  # Issue 48: --set=published.x said "its fields:" and listed nothing (the quickstart publishes no number).
  res = _sweep([f'--config={QS}', f'--sweep_dir={tmp_path / "s"}', '--set=published.x=1', '--dry_run'])
  assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr[-2000:]
  (line,) = [x for x in res.stderr.splitlines() if x.startswith('error:')]
  assert "config.published has no field 'x'; its fields: none (this config publishes no number)" in line
  assert 'the fields a published number may have: source, accuracy, model, target_accuracy' in line


def test_published_fields_cover_what_the_report_compares():
  from fedjax_flat.config import schema as config_schema
  from fedjax_flat.sweeps import report as report_lib
  compared = ({f for f, _, _ in report_lib.METRICS} | {f for f, _, _ in report_lib.HESSIAN}
              | {'source', 'accuracy', 'model', 'target_accuracy', 'rounds_to_target', 'bits_to_target_B'})
  assert compared <= set(config_schema.PUBLISHED_FIELDS), compared - set(config_schema.PUBLISHED_FIELDS)


def _tracked_sweep_args(tmp_path):
  d, uri = tmp_path / 'sw', f'sqlite:///{tmp_path}/mlflow.db'
  return uri, [f'--config={QS}', '--grid=client.lr=0.05,0.1', '--seeds=0', f'--sweep_dir={d}', '--batch_runs=2',
               '--tracker=mlflow', f'--tracking_uri={uri}', '--set=model=mlp'] + TINY


def test_tracked_sweep_commands_carry_the_tracking_flags(tmp_path):
  """--dry_run: each train.py command gets the sweep's tracking flags, grouped by the sweep, named by its key; the
  store is not touched."""
  uri, args = _tracked_sweep_args(tmp_path)
  p = _sweep(args + ['--dry_run'])
  assert p.returncode == 0 and f'--tracking_uri={uri} --tracking_group=sw --tracking_name=client.lr=0.05/seed=0' \
      in p.stdout, p.stdout + p.stderr
  assert not (tmp_path / 'mlflow.db').exists()


@pytest.mark.slow   # about 40 s on 2 cores: two batched runs and the MLflow store
def test_tracked_sweep_one_mlflow_run_per_cell_under_the_sweeps_parent(tmp_path):
  """--tracker=mlflow: the sweep is a parent run (named after the sweep) and each cell's run nests under it."""
  from mlflow.tracking import MlflowClient
  uri, args = _tracked_sweep_args(tmp_path)
  p = _sweep(args)
  assert p.returncode == 0, p.stdout + p.stderr
  client = MlflowClient(uri)
  exp = client.get_experiment_by_name('fedjax_flat')
  runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
  assert set(runs) == {'sw', 'client.lr=0.05/seed=0', 'client.lr=0.1/seed=0'}
  parent = runs['sw']
  assert parent.info.status == 'FINISHED'
  for key in ('client.lr=0.05/seed=0', 'client.lr=0.1/seed=0'):
    r = runs[key]
    assert r.data.tags['mlflow.parentRunId'] == parent.info.run_id and r.data.tags['fedjax_flat.sweep'] == 'sw'
    assert r.info.status == 'FINISHED' and r.data.params['client.lr'] == key.split('=')[1].split('/')[0]
    assert [m.step for m in client.get_metric_history(r.info.run_id, 'test_accuracy')] == [1, 2]


# paper_table.py takes a family (its cells are checked by tests/config/test_families.py); the stand-in study's
# full method set is an argument.
_SWEEP_FILES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, 'configs', 'sweeps', '*.py'))
                      if not os.path.basename(p).startswith('_') and not p.endswith('paper_table.py'))


@pytest.mark.parametrize('spec', _SWEEP_FILES + [
    'standin_flat:seeds=3,cells=fedavg+fedsam+fedlesam+fedasam+fedgloss',
    'standin_flat:alphas=0.5,cells=fedlesam_s+fedlesam_d+fednsam+fedgf+fedswa+fedmoswa+fedwmsam',
    'security_digits:part=standin', 'security_digits:part=standin_asam,seeds=0+1+2',
    'security_digits:part=standin_ten,methods=fedasam,defences=mean+cc+dp'])
def test_every_shipped_sweep_file_expands_and_every_run_validates(spec, tmp_path):
  """A study's sweep file is what its README tells a user to run: each run's config must build and validate
  exactly as train.py would build it (no data is loaded)."""
  name, _, arg = spec.partition(':')
  path = os.path.join(ROOT, 'configs', 'sweeps', f'{name}.py')
  runs = grid_lib.expand(grid_lib.load_sweep_file(path + (f':{arg}' if arg else '')), str(tmp_path))
  assert runs
  assert len(grid_lib.run_configs(runs)) == len(runs)
