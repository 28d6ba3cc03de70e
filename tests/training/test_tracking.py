"""training/tracking.py: runs tracked to MLflow (a sqlite store, a real `mlflow server`) and to W&B offline, read
back through MLflow's client and W&B's own run file; a resume continues the same tracked run; a tracker that fails
mid-run warns once and the run goes on; bad input is one line, exit 2."""
import glob
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from fedjax_flat.training import run as run_lib
from fedjax_flat.training import tracking

from tests.fixtures import scale_worker
from tests.fixtures.configs import small_config
from tests.fixtures.entry_cases import QS, QUICK, assert_one_line, run_binary
from tests.fixtures.paths import REPO

_cache = pytest.fixture(scope='module', autouse=True)(scale_worker.persistent_compile_cache)


def _config(**over):
  # 4 rounds, evaluations at 2 and 4, checkpoints at 2 and 4
  return small_config(checkpoint_every=2, **over)


def _client(uri):
  from mlflow.tracking import MlflowClient
  return MlflowClient(uri)


def _steps(client, run_id, name):
  return [(m.step, round(m.value, 6)) for m in client.get_metric_history(run_id, name)]


def _records(wd):
  with open(os.path.join(wd, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def test_mlflow_sqlite_params_metrics_artifacts_and_resume_continue_the_run(tmp_path):
  uri = f'sqlite:///{tmp_path}/mlflow.db'
  spec = tracking.Spec('mlflow', uri=uri)
  wd = str(tmp_path / 'run')
  # Stopped after its first block (round 2, checkpointed): the tracked run is KILLED, to be continued.
  s = run_lib.run(_config(), wd, stop_requested=lambda: True, tracking=spec)
  assert s['rounds_completed'] == 2 and s['stopped_by_signal'] is None
  state = json.load(open(os.path.join(wd, 'tracker.json')))
  assert state['kind'] == 'mlflow' and state['last_step'] == 2 and state['uri'] == uri
  client = _client(uri)
  run = client.get_run(state['run_id'])
  assert run.info.status == 'KILLED' and run.info.run_name == 'run'
  assert run.data.params['rounds'] == '4' and run.data.params['client.lr'] == '0.1'
  assert run.data.params['dataset'] == 'synthetic'
  # The resume: the SAME tracked run, each round's metrics once, with its round as the step.
  s = run_lib.run(_config(), wd, tracking=spec)
  assert s['resumed_from_round'] == 2 and s['rounds_completed'] == 4
  assert json.load(open(os.path.join(wd, 'tracker.json')))['run_id'] == state['run_id']
  assert len(client.search_runs([run.info.experiment_id])) == 1
  run = client.get_run(state['run_id'])
  assert run.info.status == 'FINISHED'
  recs = _records(wd)
  assert _steps(client, state['run_id'], 'test_accuracy') == [(r['round'], round(r['test_accuracy'], 6))
                                                             for r in recs]
  assert [st for st, _ in _steps(client, state['run_id'], 'train_loss')] == [2, 4]
  assert run.data.metrics['summary.final_test_accuracy'] == pytest.approx(s['final_test_accuracy'])
  assert run.data.tags['checkpoint'] == os.path.join(wd, 'checkpoints', '4')
  arts = {a.path for a in client.list_artifacts(state['run_id'])}
  assert {'summary.json', 'summary.md', 'metrics.png', 'config.json', 'metrics.jsonl'} <= arts
  # --fresh starts a new tracked run.
  run_lib.run(_config(rounds=2), wd, fresh=True, tracking=spec)
  assert json.load(open(os.path.join(wd, 'tracker.json')))['run_id'] != state['run_id']


def test_a_tracker_that_fails_mid_run_warns_once_and_a_rerun_catches_up(tmp_path, monkeypatch):
  from absl import logging
  from fedjax_flat.training.trackers import mlflow_tracker
  uri = f'sqlite:///{tmp_path}/mlflow.db'
  spec = tracking.Spec('mlflow', uri=uri)
  real = mlflow_tracker.Run.log_metrics
  calls = []

  def full_disk(self, metrics, step):
    calls.append(step)
    if step >= 4:
      raise OSError(28, 'No space left on device')
    real(self, metrics, step)
  monkeypatch.setattr(mlflow_tracker.Run, 'log_metrics', full_disk)
  warnings = []
  monkeypatch.setattr(logging, 'warning', lambda msg, *a: warnings.append(msg % a))
  wd = str(tmp_path / 'run')
  s = run_lib.run(_config(), wd, tracking=spec)
  assert s['rounds_completed'] == 4 and calls == [2, 4]   # after the failure: no more calls
  assert len([w for w in warnings if 'tracking stopped' in w]) == 1
  assert 'No space left on device' in warnings[0]
  state = json.load(open(os.path.join(wd, 'tracker.json')))
  assert state['last_step'] == 2
  assert [r['round'] for r in _records(wd)] == [2, 4]    # the run's own records are whole
  client = _client(uri)
  assert [st for st, _ in _steps(client, state['run_id'], 'test_accuracy')] == [2]
  # The service is back: rerunning the (finished) run sends round 4 to the same tracked run.
  monkeypatch.setattr(mlflow_tracker.Run, 'log_metrics', real)
  run_lib.run(_config(), wd, tracking=spec)
  assert [st for st, _ in _steps(client, state['run_id'], 'test_accuracy')] == [2, 4]
  assert client.get_run(state['run_id']).info.status == 'FINISHED'


def test_tracking_off_imports_neither_service():
  code = ('import sys; import fedjax_flat.training.run, fedjax_flat.sweeps.sweep, fedjax_flat.training.api; '
          "print(sorted(m for m in ('mlflow', 'wandb') if m in sys.modules))")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, 'PYTHONPATH': REPO})
  assert out.returncode == 0 and out.stdout.strip() == '[]', out.stderr[-2000:]


def test_flag_combinations_and_a_missing_package_are_one_line(monkeypatch):
  with pytest.raises(tracking.TrackingError, match='--tracker is not'):
    tracking.from_flags(None, uri='sqlite:///x.db')
  with pytest.raises(tracking.TrackingError, match='is for --tracker=mlflow'):
    tracking.from_flags('wandb', uri='sqlite:///x.db')
  assert tracking.from_flags(None) is None
  monkeypatch.setitem(sys.modules, 'wandb', None)     # as if not installed
  with pytest.raises(tracking.TrackingError, match=r"pip install 'fedjax_flat\[tracking\]'"):
    tracking.check(tracking.Spec('wandb'))


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def test_unreachable_uri_and_missing_package_exit_2_before_training(tmp_path):
  port = _free_port()      # nothing listens there
  wd = tmp_path / 'run'
  t = time.time()
  res = run_binary('train', f'--config={QS}', f'--workdir={wd}', *QUICK, '--tracker=mlflow',
                   f'--tracking_uri=http://127.0.0.1:{port}')
  line = assert_one_line(res, 2, f'http://127.0.0.1:{port}', 'does not answer', 'mlflow server')
  assert time.time() - t < 60, line
  assert not (wd / 'checkpoints').exists()       # refused before training: the workdir as it was
  res = run_binary('train', f'--config={QS}', f'--workdir={wd}', *QUICK, '--tracker=mlflow',
                   f'--tracking_uri=sqlite:///{tmp_path}/no/such/dir/m.db')
  assert_one_line(res, 2, 'no directory')
  # A missing package: a stand-in `wandb` that does not import, first on the path.
  fake = tmp_path / 'fake'
  (fake / 'wandb').mkdir(parents=True)
  (fake / 'wandb' / '__init__.py').write_text('raise ImportError("no wandb here")\n')
  res = subprocess.run([sys.executable, os.path.join(REPO, 'experiments', 'train.py'), f'--config={QS}',
                        f'--workdir={wd}', *QUICK, '--tracker=wandb'], capture_output=True, text=True, timeout=300,
                       cwd=REPO, env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': f'{fake}:{REPO}'})
  assert_one_line(res, 2, '--tracker=wandb needs the wandb package', "pip install 'fedjax_flat[tracking]'")


# W&B's run file (run-<id>.wandb): W&B's record log (LevelDB log blocks of 32 KiB after a 7-byte header), each
# record a wandb_internal_pb2.Record. Read with W&B's own protobuf messages.
def _wandb_records(path):
  from wandb.proto import wandb_internal_pb2 as pb
  data = open(path, 'rb').read()
  assert data[:4] == b':W&B'
  pos, buf, out = 7, b'', []
  while pos + 7 <= len(data):
    left = 32768 - pos % 32768
    if left < 7:
      pos += left
      continue
    _, n, kind = struct.unpack('<IHB', data[pos:pos + 7])
    if n == 0 and kind == 0:
      pos += left
      continue
    buf += data[pos + 7:pos + 7 + n]
    pos += 7 + n
    if kind in (1, 4):        # FULL, LAST
      r = pb.Record()
      r.ParseFromString(buf)
      out.append(r)
      buf = b''
  return out


def _key(item):
  return item.key or '/'.join(item.nested_key)


def _wandb_read(run_dir):
  (path,) = glob.glob(os.path.join(run_dir, 'run-*.wandb'))
  out = {'history': [], 'files': set(), 'summary': {}}
  for r in _wandb_records(path):
    kind = r.WhichOneof('record_type')
    if kind == 'run':
      out['run'] = r.run
      out['config'] = {_key(i): json.loads(i.value_json) for i in r.run.config.update}
    elif kind == 'history':
      out['history'].append({**{_key(i): json.loads(i.value_json) for i in r.history.item},
                             '_step': r.history.step.num})
    elif kind == 'files':
      out['files'] |= {f.path for f in r.files.files}
    elif kind == 'summary':
      out['summary'].update({_key(i): json.loads(i.value_json) for i in r.summary.update})
  return out


def test_wandb_offline_run_is_read_back_and_a_resume_keeps_its_id(tmp_path, monkeypatch):
  monkeypatch.delenv('WANDB_DIR', raising=False)
  spec = tracking.Spec('wandb', group='my_sweep', name='cell/seed=0')
  wd = str(tmp_path / 'run')
  run_lib.run(_config(), wd, stop_requested=lambda: True, tracking=spec)
  state = json.load(open(os.path.join(wd, 'tracker.json')))
  assert state['kind'] == 'wandb' and state['last_step'] == 2
  s = run_lib.run(_config(), wd, tracking=spec)
  dirs = sorted(glob.glob(os.path.join(wd, 'wandb', 'offline-run-*')))
  assert len(dirs) == 2 and all(d.endswith(state['run_id']) or f"{state['run_id']}-" in d for d in dirs)
  first, second = _wandb_read(dirs[0]), _wandb_read(dirs[1])
  for part in (first, second):
    assert part['run'].run_id == state['run_id'] and part['run'].run_group == 'my_sweep'
    assert part['run'].display_name == 'cell/seed=0' and part['run'].project == 'fedjax_flat'
  assert first['config']['rounds'] == 4 and first['config']['client.lr'] == 0.1
  recs = _records(wd)
  assert [h['_step'] for h in first['history']] == [2] and [h['_step'] for h in second['history']] == [4]
  assert [h['test_accuracy'] for h in first['history'] + second['history']] == pytest.approx(
      [r['test_accuracy'] for r in recs])
  assert {'summary.json', 'metrics.png', 'metrics.jsonl'} <= second['files']
  assert second['summary']['final_test_accuracy'] == pytest.approx(s['final_test_accuracy'])
  assert second['summary']['checkpoint'] == os.path.join(wd, 'checkpoints', '4')


@pytest.mark.slow   # a real MLflow server (start-up about 5-15 s on 2 cores) and two train.py processes
def test_real_mlflow_server_then_server_gone_mid_run(tmp_path):
  port = _free_port()
  server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), 'mlflow'), 'server',
                             '--backend-store-uri', f'sqlite:///{tmp_path}/server.db',
                             '--artifacts-destination', str(tmp_path / 'artifacts'),
                             '--host', '127.0.0.1', '--port', str(port), '--workers', '1'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
  uri = f'http://127.0.0.1:{port}'
  try:
    deadline = time.time() + 90
    while tracking.backend('mlflow').unreachable(tracking.Spec('mlflow', uri=uri)):
      assert time.time() < deadline and server.poll() is None, 'mlflow server did not start'
      time.sleep(0.5)
    wd = tmp_path / 'run'
    args = [f'--config={QS}', f'--workdir={wd}', *QUICK, '--config.rounds=2', '--config.eval_every=1',
            '--tracker=mlflow', f'--tracking_uri={uri}', '--tracking_project=served']
    res = run_binary('train', *args)
    assert res.returncode == 0, res.stderr[-3000:]
    state = json.load(open(wd / 'tracker.json'))
    client = _client(uri)
    run = client.get_run(state['run_id'])
    assert run.info.status == 'FINISHED' and run.data.params['rounds'] == '2'
    assert [st for st, _ in _steps(client, state['run_id'], 'test_accuracy')] == [1, 2]
    assert 'metrics.png' in {a.path for a in client.list_artifacts(state['run_id'])}
    # The server goes away during a longer run: one warning, exit 0, its files whole.
    wd = tmp_path / 'long'
    args[1], args[4] = f'--workdir={wd}', '--config.rounds=30'
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, 'experiments', 'train.py'), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': REPO})
    deadline = time.time() + 120
    while not (wd / 'tracker.json').exists() or json.load(open(wd / 'tracker.json'))['last_step'] < 4:
      assert time.time() < deadline and proc.poll() is None
      time.sleep(0.2)
    server.terminate()
    server.wait(30)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert err.count('tracking stopped') == 1, err[-3000:]
    assert [r['round'] for r in _records(wd)] == list(range(1, 31))
  finally:
    if server.poll() is None:
      server.terminate()
      server.wait(30)
