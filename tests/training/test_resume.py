"""Preemption and exact resume through experiments/train.py: SIGTERM -> checkpoint + exit 0; SIGKILL at a
random round -> rerun -> parameters bit-identical to an uninterrupted run, every metrics round exactly once."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import run as run_lib

from tests.fixtures import scale_worker
from tests.fixtures.configs import quickstart_with_flags
from tests.fixtures.paths import REPO

_cache = pytest.fixture(scope='module', autouse=True)(scale_worker.persistent_compile_cache)

ROUNDS = 14
BASE = ['--config.model=mlp', f'--config.rounds={ROUNDS}', '--config.eval_every=2', '--config.progress_every_s=0']
STATEFUL = BASE + ['--config.algorithm=scaffold', '--config.server.optimizer=adam', '--config.server.lr=0.01']


def _cmd(wd, flags):
  return [sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
          f'--config={os.path.join(REPO, "configs", "quickstart.py")}', f'--workdir={wd}', *flags]


def _env():
  return {**os.environ, **scale_worker.CACHE_ENV, 'JAX_PLATFORMS': 'cpu'}


def _reference(tmp_path_factory, flags):
  wd = tmp_path_factory.mktemp('reference')
  run_lib.run(quickstart_with_flags([f for f in flags if f.startswith('--config.')]), str(wd))
  return wd


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """The uninterrupted run (in this process; checkpoint_every does not change the computation)."""
  return _reference(tmp_path_factory, BASE)


def _final(wd):
  return ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))


def _metrics(wd):
  return [json.loads(line) for line in (wd / 'metrics.jsonl').read_text().splitlines()]


def _assert_same_as_reference(wd, ref_wd):
  got, ref = _final(wd), _final(ref_wd)
  assert got['step'] == ref['step'] == ROUNDS
  for a, b in zip(got['server_leaves'], ref['server_leaves'], strict=True):
    np.testing.assert_array_equal(a, b)
  if ref['client_leaves'] is not None:
    np.testing.assert_array_equal(got['client_ids'], ref['client_ids'])
    for a, b in zip(got['client_leaves'], ref['client_leaves'], strict=True):
      np.testing.assert_array_equal(a, b)
  recs, ref_recs = _metrics(wd), _metrics(ref_wd)
  assert [r['round'] for r in recs] == [r['round'] for r in ref_recs] == list(range(2, ROUNDS + 1, 2))
  for r, q in zip(recs, ref_recs):
    for k in ('test_accuracy', 'test_loss', 'train_loss', 'comm_bytes'):
      assert r[k] == q[k], (r['round'], k)


def _latest_step(wd):
  d = wd / 'checkpoints'
  steps = [int(p) for p in os.listdir(d) if p.isdigit()] if d.exists() else []
  return max(steps, default=0)


def _kill_at(wd, flags, target, sig):
  """Starts the binary, waits until round `target` is checkpointed (or logged), sends `sig`."""
  proc = subprocess.Popen(_cmd(wd, flags), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while proc.poll() is None and time.time() < deadline:
    if _latest_step(wd) >= target:
      break
    time.sleep(0.01)
  finished_early = proc.poll() is not None
  proc.send_signal(sig)
  out, err = proc.communicate(timeout=300)
  assert not finished_early, f'run ended before round {target} was reached: {err[-2000:]}'
  return proc.returncode, out, err


def _kill_and_resume(tmp_path, ref_wd, flags, seed):
  k = random.Random(seed).randint(1, ROUNDS - 3)
  wd = tmp_path / f'run{seed}'
  code, _, _ = _kill_at(wd, flags + ['--config.checkpoint_every=1'], k, signal.SIGKILL)
  assert code == -signal.SIGKILL
  killed_at = _latest_step(wd)
  mid_write = any('orbax-checkpoint-tmp' in p for p in os.listdir(wd / 'checkpoints'))
  res = subprocess.run(_cmd(wd, flags + ['--config.checkpoint_every=1']), env=_env(), capture_output=True,
                       text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'resumed from round' in res.stdout
  _assert_same_as_reference(wd, ref_wd)
  return k, killed_at, mid_write


def test_sigkill_at_random_round_then_resume_is_bit_identical(tmp_path, reference):
  _kill_and_resume(tmp_path, reference, BASE, seed=int(time.time()) % 1000)


def test_sigterm_finishes_round_checkpoints_exits_zero(tmp_path, reference):
  wd = tmp_path / 'run'
  flags = BASE + ['--config.checkpoint_every=0']     # no periodic checkpoints: the signal must write one
  proc = subprocess.Popen(_cmd(wd, flags), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while proc.poll() is None and time.time() < deadline and not (
      (wd / 'metrics.jsonl').exists() and (wd / 'metrics.jsonl').read_text().strip()):
    time.sleep(0.01)
  assert proc.poll() is None
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  assert 'received SIGTERM: finishing the current round' in err
  stopped = _final(wd)['step']
  assert 2 <= stopped < ROUNDS
  assert f'stopped by SIGTERM after round {stopped} of {ROUNDS}' in out
  assert os.listdir(wd / 'checkpoints') == [str(stopped)]
  assert [r['round'] for r in _metrics(wd)] == list(range(2, stopped + 1, 2))
  # Resuming (here in-process; the SIGKILL test reruns the binary) ends identical to the uninterrupted run.
  s = run_lib.run(quickstart_with_flags([f for f in flags if f.startswith('--config.')]), str(wd))
  assert s['resumed_from_round'] == stopped
  _assert_same_as_reference(wd, reference)


@pytest.mark.slow
def test_sigkill_trials_fedavg(tmp_path, reference):
  """Several kills at random rounds (some land mid-way through an asynchronous checkpoint write)."""
  trials = [_kill_and_resume(tmp_path, reference, BASE, seed) for seed in (2, 3, 5, 7, 9, 17)]
  print('(kill target, newest checkpoint at the kill, killed mid-write):', trials)


@pytest.mark.slow
def test_sigkill_trials_stateful_adam(tmp_path, tmp_path_factory):
  """SCAFFOLD (client-state store) with an Adam server optimizer."""
  ref = _reference(tmp_path_factory, STATEFUL)
  trials = [_kill_and_resume(tmp_path, ref, STATEFUL, seed) for seed in (1, 13, 24)]
  print('(kill target, newest checkpoint at the kill, killed mid-write):', trials)


def _tensorboard_scalars(tb_dir):
  """{tag: [(step, value), ...]} as TensorBoard shows it: every event is kept, except that a SessionLog
  START at step s (written for purge_step) drops the earlier events at steps >= s."""
  import struct
  from tensorboardX.proto import event_pb2
  out = {}
  names = sorted(os.listdir(tb_dir))    # TensorBoard reads a run's event files in name order
  assert len(names) == 2, names          # one per process, the resumed one last
  for name in names:
    data = open(os.path.join(tb_dir, name), 'rb').read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack('<Q', data[pos:pos + 8])
      ev = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      if ev.HasField('session_log') and ev.session_log.status == ev.session_log.START:
        out = {tag: [(s, v) for s, v in pts if s < ev.step] for tag, pts in out.items()}
      for v in ev.summary.value:
        out.setdefault(v.tag, []).append((ev.step, v.simple_value))
  return out


def test_resume_after_crash_shows_each_round_once_in_tensorboard_and_reports_own_speed(tmp_path):
  """Rounds evaluated after the last checkpoint are re-run on resume: metrics.jsonl and TensorBoard must
  each hold them once (with the re-run values), and rounds/s must count this process's rounds only."""
  wd = str(tmp_path / 'run')
  cfg = quickstart_with_flags(['--config.model=mlp', '--config.rounds=8', '--config.eval_every=1',
                     '--config.checkpoint_every=4'])

  class Crash(Exception):
    pass

  rounds_seen = []

  def crash_after_6():
    rounds_seen.append(1)
    if len(rounds_seen) == 6:
      raise Crash()
    return False

  with pytest.raises(Crash):
    run_lib.run(cfg, wd, stop_requested=crash_after_6)
  assert _latest_step(tmp_path / 'run') == 4 and len(_metrics(tmp_path / 'run')) == 6
  summary = run_lib.run(cfg, wd)
  recs = _metrics(tmp_path / 'run')
  assert [r['round'] for r in recs] == list(range(1, 9))
  tb = _tensorboard_scalars(os.path.join(wd, 'tensorboard'))
  assert [s for s, _ in tb['test_accuracy']] == list(range(1, 9))     # each round once, in order
  for (_, v), r in zip(tb['test_accuracy'], recs):
    assert v == pytest.approx(r['test_accuracy'], rel=1e-6)
  assert summary['rounds_completed'] == 8 and summary['rounds_this_process'] == 4
  assert summary['rounds_per_s'] == pytest.approx(4 / summary['wall_time_s'])
  assert summary['wall_time_total_s'] > summary['wall_time_s']
