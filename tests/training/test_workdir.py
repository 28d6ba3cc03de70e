"""The run's hold on its workdir (training/workdir.py): exclusive lock, cleanup before the writability probe,
no leaked probe, per-process temporary names, --fresh deleting nothing for a rejected config."""
import builtins
import json
import os
import subprocess
import sys

import pytest

from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import run as run_lib
from fedjax_flat.errors import ConfigError

from tests.fixtures import scale_worker
from tests.fixtures.configs import small_config
from tests.fixtures.fault_inject import FullFile
from tests.fixtures.scale_worker import small_data

_cache = pytest.fixture(scope='module', autouse=True)(scale_worker.persistent_compile_cache)


def tiny_config(**over):
  return small_config(**{'data.num_clients': 8, 'checkpoint_every': 1, 'keep_checkpoints': 3, **over})


def test_lock_is_exclusive_names_the_holder_and_dies_with_it(tmp_path):
  from fedjax_flat.training import workdir as workdir_lib
  wd = str(tmp_path / 'w')
  with workdir_lib.WorkdirLock(wd):
    with pytest.raises(workdir_lib.WorkdirBusyError, match=rf'in use by process {os.getpid()}\b'):
      workdir_lib.WorkdirLock(wd).acquire()          # another open file description: flock conflicts
    with pytest.raises(workdir_lib.WorkdirBusyError):
      run_lib.run(tiny_config(), wd, data=small_data())
  # A process that dies holding the lock (here: exits without releasing it) leaves the workdir free.
  code = ('import sys, os; from fedjax_flat.training import workdir; '
          'workdir.WorkdirLock(sys.argv[1]).acquire(); os._exit(0)')
  subprocess.run([sys.executable, '-c', code, wd, os.getcwd()], check=True, timeout=120)
  assert open(os.path.join(wd, workdir_lib.LOCK_NAME)).read().strip()     # its pid is still in the file ...
  workdir_lib.WorkdirLock(wd).acquire().release()                          # ... but the lock is free


def _disk_full(monkeypatch, root, full):
  """Writes under `root` fail with ENOSPC while full() holds (open() itself succeeds, as on a full disk)."""
  real = builtins.open

  def fake_open(file, mode='r', *args, **kwargs):
    f = real(file, mode, *args, **kwargs)
    if any(c in mode for c in 'wax+') and os.path.abspath(os.fspath(file)).startswith(str(root)) and full():
      return FullFile(f)
    return f
  monkeypatch.setattr(builtins, 'open', fake_open)


def test_full_disk_interrupted_checkpoint_is_removed_before_the_probe(tmp_path, monkeypatch):
  """A killed run's half-written checkpoint fills the disk: the rerun removes it first, so it can run."""
  data = small_data()
  wd = tmp_path / 'run'
  run_lib.run(tiny_config(rounds=2), str(wd), data=data)
  junk = wd / 'checkpoints' / '3.orbax-checkpoint-tmp-1700000000'
  (junk / 'server').mkdir(parents=True)
  (junk / 'server' / 'blob').write_bytes(b'\0' * 4096)
  _disk_full(monkeypatch, tmp_path, full=junk.exists)
  s = run_lib.run(tiny_config(rounds=3), str(wd), data=data)
  assert s['resumed_from_round'] == 2 and s['rounds_completed'] == 3 and not junk.exists()


def test_failed_probe_leaves_no_file(tmp_path, monkeypatch):
  wd = tmp_path / 'run'
  wd.mkdir()
  _disk_full(monkeypatch, tmp_path, full=lambda: True)
  with pytest.raises(ConfigError, match=r'workdir.*is not writable \(No space left on device\)'):
    run_lib.run(tiny_config(), str(wd), data=small_data())
  assert not [p for p in os.listdir(wd) if p.startswith('.write_test')]


def test_temporary_names_are_per_process(tmp_path):
  """Another process's temporary file (here a directory in its place) does not collide with this run's."""
  wd = tmp_path / 'run'
  wd.mkdir()
  for name in ('metrics.jsonl.tmp', 'metrics.csv.tmp', 'summary.json.tmp'):
    (wd / name).mkdir()
  s = run_lib.run(tiny_config(rounds=2, checkpoint_every=0), str(wd), data=small_data())
  assert s['rounds_completed'] == 2
  assert [json.loads(ln)['round'] for ln in (wd / 'metrics.jsonl').read_text().splitlines()] == [2]
  assert not [p for p in os.listdir(wd) if p.endswith('.tmp') and not (wd / p).is_dir()]


def test_fresh_deletes_nothing_when_the_config_is_rejected(tmp_path):
  """clients_per_round > population is known only once the data are loaded: --fresh must not have deleted the
  checkpoints and metrics by then."""
  data = small_data()
  wd = tmp_path / 'run'
  run_lib.run(tiny_config(rounds=2), str(wd), data=data)
  before = sorted(os.listdir(wd / 'checkpoints')), (wd / 'metrics.jsonl').read_text()
  with pytest.raises(ConfigError, match='clients_per_round'):
    run_lib.run(tiny_config(rounds=2, clients_per_round=50), str(wd), data=data, fresh=True)
  assert (sorted(os.listdir(wd / 'checkpoints')), (wd / 'metrics.jsonl').read_text()) == before
  assert ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))['step'] == 2


REFUSED_AGAINST_DATA = {'system.speed': 'lognormal', 'system.deadline_s': 1e-9}     # no client can meet it


def test_a_run_refused_before_training_leaves_the_workdir_as_it_was(tmp_path):
  """Issue 48: a refusal that needs the data (a deadline no client meets) exited 2 but left .run.lock and an
  empty checkpoints/ behind. A new workdir (and the parents the run made) is removed; an existing one keeps
  exactly what it held, its own lock file included."""
  wd = tmp_path / 'new' / 'deeper' / 'w'
  with pytest.raises(ConfigError, match='no client can meet it'):
    run_lib.run(tiny_config(**REFUSED_AGAINST_DATA), str(wd), data=small_data())
  assert os.listdir(tmp_path) == []
  old = tmp_path / 'old'
  (old / 'checkpoints').mkdir(parents=True)
  (old / 'notes.txt').write_text('mine')
  (old / '.run.lock').write_text('')
  before = sorted(os.path.relpath(os.path.join(r, f), old) for r, ds, fs in os.walk(old) for f in ds + fs)
  with pytest.raises(ConfigError, match='no client can meet it'):
    run_lib.run(tiny_config(**REFUSED_AGAINST_DATA), str(old), data=small_data())
  after = sorted(os.path.relpath(os.path.join(r, f), old) for r, ds, fs in os.walk(old) for f in ds + fs)
  assert after == before and (old / 'notes.txt').read_text() == 'mine'
  run_lib.run(tiny_config(rounds=1), str(old), data=small_data())        # the workdir is free and usable
  assert (old / 'summary.json').exists() and (old / 'notes.txt').exists()
