"""The local runner: a sweep's runs as child processes of the driver, `parallel` at a time (`run_local`).

The children die with the driver (Linux: the kernel sends them SIGTERM when it ends, however it ends; train.py
then checkpoints and stops), and a run whose workdir is still locked by a live process (a child of a killed
driver still checkpointing) is waited for, not reported as failed. A failed child's reason is its log's last
`error:` line of that attempt.
"""
from __future__ import annotations

import ctypes
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from fedjax_flat import devices
from fedjax_flat.sweeps import status as status_lib
from fedjax_flat.sweeps.grid import Run

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
  """A preexec_fn for the driver's children: the kernel sends the child SIGTERM when the driver ends, however
  it ends (Linux prctl PR_SET_PDEATHSIG; train.py then checkpoints and stops). None where there is no prctl:
  a rerun then waits for a still-running child (`workdir_holder`). Everything is resolved before the fork;
  the child only makes the call (and ends if the driver died before it)."""
  try:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
  except (OSError, AttributeError):
    return None
  parent, sig = os.getpid(), int(signal.SIGTERM)

  def bind():
    prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:       # the driver ended between the fork and the call
      os._exit(143)
  return bind



def fmt_s(s: float) -> str:
  s = int(max(s, 0))
  return f'{s // 3600}h{s // 60 % 60:02d}m' if s >= 3600 else f'{s // 60}m{s % 60:02d}s'


def _last_error(log_path: str, returncode: Optional[int] = None) -> str:
  """Why a child failed: the last `error:` (or absl `FATAL`) line its log holds after the driver's header of
  this attempt; else the last line of a traceback; else the signal that killed it or its exit status. Never
  the header (the command line) itself."""
  try:
    with open(log_path, 'rb') as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - (1 << 20)))
      lines = [ln.strip() for ln in f.read().decode(errors='replace').splitlines()]
  except OSError:
    lines = []
  heads = [i for i, ln in enumerate(lines) if ln.startswith('# ') and ' --workdir=' in ln]
  lines = [ln for ln in lines[heads[-1] + 1 if heads else 0:] if ln]
  for ln in reversed(lines):
    if ln.startswith(('error:', 'FATAL')):
      return ln[:300]
  for ln in reversed(lines):
    if re.match(r'^[A-Za-z_.]*(Error|Exception)\b', ln):
      return ln[:300]
  if returncode is not None and returncode < 0:
    try:
      name = signal.Signals(-returncode).name
    except ValueError:
      name = f'signal {-returncode}'
    return f'killed by {name} (no error line in the log)'
  return f'exit {returncode} (no error line in the log)' if returncode is not None else ''


def run_local(runs: List[Run], sweep_dir: str, info: Dict[str, Any], *, parallel: int = 1, fresh: bool = False,
              python: str = sys.executable, poll_s: float = 0.5, stream=sys.stderr,
              env: Optional[Dict[str, str]] = None, manifest_runs: Optional[List[Run]] = None,
              prior: Optional[Dict[str, Dict]] = None) -> Dict[str, Dict]:
  """Runs the unfinished runs `parallel` at a time; returns {run key: state dict}. One failure stops nothing.

  env: the runs' environment (default: fedjax_flat/devices.child_env, i.e. usable cores // parallel host
  devices per run unless the user chose a count). manifest_runs / prior: a stage's call (run_stages): sweep.json
  lists every run of the sweep, those of other stages with their states `prior`."""
  env = devices.child_env(parallel) if env is None else env
  states: Dict[str, Dict] = {}
  write_manifest = status_lib.manifest_writer(manifest_runs, prior)
  todo = []
  for r in runs:
    done = status_lib.settled_state(r, fresh)
    if done is not None:
      states[r.key] = done
    else:
      todo.append(r)
  n_skip = sum(s['status'].startswith('skipped') for s in states.values())
  total, t0 = len(todo), time.time()
  running: Dict[str, tuple] = {}
  durations: List[float] = []
  stop = {'sig': None}
  tty = hasattr(stream, 'isatty') and stream.isatty()
  last = {'line': '', 't': 0.0}

  def show(force=False):
    done = sum(s['status'] == 'done' for s in states.values())
    failed = sum(s['status'] == 'failed' for s in states.values())
    pending = len(queue)
    eta = ''
    if durations:
      waves = math.ceil((pending + len(running)) / max(parallel, 1))
      eta = f', ETA {fmt_s(waves * sum(durations) / len(durations))}'
    line = (f'[sweep] {done}/{total} done, {len(running)} running, {failed} failed, {pending} pending'
            f' ({n_skip} finished earlier), elapsed {fmt_s(time.time() - t0)}{eta}')
    now = time.time()
    if tty:
      stream.write('\r' + line.ljust(len(last['line'])))
    elif force or now - last['t'] > 60:      # a log file: state changes and a heartbeat, not a line a second
      stream.write(line + '\n')
    else:
      return
    stream.flush()
    last.update(line=line, t=now)

  def on_signal(signum, frame):
    stop['sig'] = signum
    for _, (proc, _, _, _) in list(running.items()):
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)    # train.py checkpoints and exits 0; the next sweep resumes it

  old = {}
  for s in (signal.SIGINT, signal.SIGTERM):
    try:
      old[s] = signal.signal(s, on_signal)
    except ValueError:                       # not the main thread (tests): no forwarding
      pass
  queue = list(todo)
  bind_child = _die_with_parent()
  waiting: Dict[str, str] = {}      # run key -> pid of the live process holding its workdir
  manifest_failed = {'msg': None}

  def manifest():
    """sweep.json now; while runs are going, a failed write is one warning (the runs go on and the final write
    says it again), not the driver's end."""
    try:
      write_manifest(sweep_dir, runs, info, states)
      manifest_failed['msg'] = None
    except status_lib.ManifestWriteError as e:
      if manifest_failed['msg'] is None:
        stream.write(f'warning: {e}\n')
        stream.flush()
      manifest_failed['msg'] = str(e)

  try:
    def launch():
      for r in list(queue):
        if len(running) >= parallel or stop['sig'] is not None:
          break
        holder = status_lib.workdir_holder(r.workdir)
        if holder is not None:       # e.g. a child of a killed driver, still checkpointing: wait for it
          if waiting.get(r.key) != holder:
            stream.write(f'[sweep] {r.key}: its workdir is in use by process {holder} (a run of an earlier '
                         'sweep driver?); waiting for it to end\n')
            stream.flush()
          waiting[r.key] = holder
          states[r.key] = {'status': 'waiting', 'holder_pid': holder}
          continue
        waiting.pop(r.key, None)
        queue.remove(r)
        status_lib.mark_config(r)
        log_path = os.path.join(r.workdir, 'sweep.log')
        log = open(log_path, 'a')
        log.write(f'\n# {time.strftime("%Y-%m-%d %H:%M:%S")} {shlex.join(r.argv(python, fresh))}\n')
        log.flush()
        # its own session (a terminal's Ctrl-C reaches the driver only, which forwards SIGTERM), and the
        # kernel's SIGTERM when the driver ends however it ends (killed included): no orphaned runs
        proc = subprocess.Popen(r.argv(python, fresh), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                preexec_fn=bind_child)
        running[r.key] = (proc, log, time.time(), log_path)
        states[r.key] = {'status': 'running', 'pid': proc.pid}

    launch()
    manifest()
    show(force=True)
    while queue or running:
      if stop['sig'] is not None and not running:
        break
      time.sleep(poll_s if not waiting or running else max(poll_s, 2.0))
      changed = False
      for key in list(running):
        proc, log, start, log_path = running[key]
        rc = proc.poll()
        if rc is None:
          continue
        log.close()
        del running[key]
        changed = True
        wall = time.time() - start
        run = next(r for r in todo if r.key == key)
        if rc == 0 and status_lib.run_status(run) == 'finished':
          durations.append(wall)
          states[key] = {'status': 'done', 'returncode': 0, 'wall_s': round(wall, 1)}
        elif stop['sig'] is not None and rc in (0, -signal.SIGTERM):
          # stopped by the driver's forwarded SIGTERM: checkpointed (0), or ended by it before train.py had
          # installed its handler (still starting): nothing to report as a failure, the rerun resumes it
          states[key] = {'status': 'stopped', 'returncode': rc, 'wall_s': round(wall, 1)}
        else:
          states[key] = {'status': 'failed', 'returncode': rc, 'wall_s': round(wall, 1),
                         'error': _last_error(log_path, rc), 'log': log_path}
      n_wait = len(waiting)
      launch()      # before the display, so it shows the slots refilled
      if changed or len(waiting) != n_wait:
        manifest()
      show(force=changed)
    for r in queue:
      if states.get(r.key, {}).get('status') in (None, 'waiting'):
        states[r.key] = {'status': 'not started'}
  finally:
    for s, h in old.items():
      signal.signal(s, h)
    if tty:
      stream.write('\n')
  write_manifest(sweep_dir, runs, info, states)     # the last word: a failure here is the driver's error
  return states
