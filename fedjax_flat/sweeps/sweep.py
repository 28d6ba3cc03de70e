"""The sweep driver: a sweep's runs (sweeps/grid.py) as local processes (sweeps/local.py), batched programs in
this process (`run_batched`, training/batched.py) or a SLURM array (`write_slurm`), a pipeline's stages in order
(`run_stages`); experiments/sweep.py is its command line.

A stage starts when the one before it has ended; a run whose input (an earlier stage's output) is absent when its
stage starts is not started, naming its producer. Finished runs of any stage are skipped on a rerun; sweep.json
(sweeps/status.py) lists every run with its state throughout.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import jax

from fedjax_flat.core import runs as runs_lib
from fedjax_flat.sweeps import local
from fedjax_flat.sweeps import status as status_lib
from fedjax_flat.sweeps.grid import TRAIN, Run
from fedjax_flat.training import batched
from fedjax_flat.training import packing

def pack_runs(runs: List[Run], configs: List[Any], batch_runs: int) -> List[List[int]]:
  """Runs (indices) packed into batched programs of at most `batch_runs`: compatible runs (equal config once
  the per-run values are removed: core/runs.compat_key) together, in sweep order; a config that cannot be
  batched at all (training/packing.batch_blocker) alone. Deterministic in the whole sweep, so a resumed
  sweep packs the unfinished runs as the first attempt did."""
  specs = [batched.RunSpec(r.key, c, r.workdir) for r, c in zip(runs, configs)]
  alone = [i for i, c in enumerate(configs) if packing.batch_blocker(c)]
  packable = [i for i in range(len(runs)) if i not in alone]
  packs = [[packable[j] for j in p] for p in packing.pack_groups([specs[i] for i in packable], batch_runs)]
  return sorted(packs + [[i] for i in alone], key=lambda p: p[0])



def run_batched(runs: List[Run], configs: List[Any], sweep_dir: str, info: Dict[str, Any], *, batch_runs: int,
                fresh: bool = False, stop_requested=lambda: False, signal_name=lambda: None,
                stream=sys.stderr, poll_s: float = 2.0, compile_ahead: bool = True,
                manifest_runs: Optional[List[Run]] = None, prior: Optional[Dict[str, Dict]] = None
                ) -> Dict[str, Dict]:
  """Runs the unfinished runs in this process, packed into batched programs (training/batched.py): every run
  still writes its own workdir (and a line in its sweep.log). Returns {run key: state dict} as run_local. A run
  whose workdir is held by a live process is waited for (sweep.json: 'waiting'), never marked failed; a stop
  request while waiting leaves it 'not started'.

  compile_ahead: while pack p trains, pack p+1 is opened and its program compiled on a thread (XLA compiles
  outside the GIL), so a table of several program structures pays for one compilation in its wall time, not
  for each. The packs' numbers do not depend on it (the same executable either way)."""
  states: Dict[str, Dict] = {}
  write_manifest = status_lib.manifest_writer(manifest_runs, prior)
  for r in runs:
    done = status_lib.settled_state(r, fresh)
    if done is not None:
      states[r.key] = done
  packs = pack_runs(runs, configs, batch_runs)
  n_dev = len(jax.local_devices())
  write_manifest(sweep_dir, runs, info, states)
  t0 = time.time()
  data_cache: Dict[str, Any] = {}          # each dataset loaded once for the whole sweep
  ahead: Dict[int, tuple] = {}             # pack index -> (its todo, batched.OpenedBatch), opened ahead

  def open_ahead(q: int):
    """Opens pack q (its runs not finished and not held elsewhere) and compiles its program on a thread."""
    if not compile_ahead or q >= len(packs) or q in ahead or stop_requested():
      return
    todo_q = [i for i in packs[q] if runs[i].key not in states and status_lib.workdir_holder(runs[i].workdir) is None]
    if todo_q:
      specs = [batched.RunSpec(runs[i].key, configs[i], runs[i].workdir, runs[i].tracking) for i in todo_q]
      try:
        ob = batched.open_batch(specs, fresh=fresh, lanes=runs_lib.lanes_for(len(packs[q]), n_dev),
                                data_cache=data_cache, alone=packing.single_run_pack_alone(len(packs[q]), n_dev))
      except Exception as e:  # noqa: BLE001 -- the pack is opened again in its turn, where its error is reported
        stream.write(f'[sweep] program {q + 1}/{len(packs)} could not be opened ahead ({type(e).__name__}: '
                     f'{str(e).splitlines()[0] if str(e) else ""}); it compiles in its turn\n')
        return
      ob.compile_ahead()
      ahead[q] = (todo_q, ob)

  try:
    for p, pack in enumerate(packs):
      lanes = runs_lib.lanes_for(len(pack), n_dev)    # the pack's program shape, kept on resume
      todo = [i for i in pack if runs[i].key not in states]
      prepared = ahead.pop(p, None)
      while todo and not stop_requested():
        # A workdir held by a live process (a run started by hand, a child of another driver) is waited for, as
        # run_local does: it is not a failure. 'busy' results (taken between the check and the lock) go round
        # again. Runs opened ahead are held by this process: nothing to wait for; the pack's other runs (held
        # elsewhere when it was opened) go round again after them.
        if prepared is not None:
          now, rest = prepared[0], [i for i in todo if i not in prepared[0]]
        else:
          _wait_for_workdirs([runs[i] for i in todo], runs, sweep_dir, info, states, stop_requested, stream,
                             poll_s, manifest=write_manifest)
          if stop_requested():
            break
          now, rest = todo, []
        busy = _run_pack(p, len(packs), pack, now, lanes, runs, configs, sweep_dir, info, states, fresh,
                         stop_requested, signal_name, stream, t0, prepared=prepared and prepared[1],
                         before_training=lambda: open_ahead(p + 1), data_cache=data_cache,
                         manifest=write_manifest)
        prepared = None
        todo = busy + rest
        if todo:
          time.sleep(poll_s)
      if prepared is not None:         # opened ahead, then a stop: release its runs untouched
        prepared[1].close()
  finally:
    for _, ob in ahead.values():
      ob.close()
  for r in runs:
    if states.get(r.key, {}).get('status') in (None, 'waiting'):
      states[r.key] = {'status': 'not started'}
  write_manifest(sweep_dir, runs, info, states)
  return states


def _wait_for_workdirs(todo: List[Run], runs, sweep_dir, info, states, stop_requested, stream, poll_s,
                       manifest=status_lib.write_manifest) -> None:
  """Returns once no run of `todo` has its workdir held by a live process (or a stop is requested); says so
  once per holder, and sweep.json shows the runs as 'waiting' meanwhile."""
  said: Dict[str, str] = {}
  while not stop_requested():
    busy = {r.key: h for r in todo for h in [status_lib.workdir_holder(r.workdir)] if h is not None}
    if not busy:
      return
    changed = False
    for key, holder in busy.items():
      if said.get(key) != holder:
        stream.write(f'[sweep] {key}: its workdir is in use by process {holder} (a run started elsewhere, or of an '
                     'earlier sweep driver?); waiting for it to end\n')
        stream.flush()
        said[key] = holder
        states[key] = {'status': 'waiting', 'holder_pid': holder}
        changed = True
    if changed:
      manifest(sweep_dir, runs, info, states)
    time.sleep(poll_s)


def _run_pack(p, n_packs, pack, todo, lanes, runs, configs, sweep_dir, info, states, fresh, stop_requested,
              signal_name, stream, t0, prepared=None, before_training=lambda: None, data_cache=None,
              manifest=status_lib.write_manifest) -> List[int]:
  """Trains the runs `todo` of pack p in one batched program (training/batched.py); returns those found
  busy (their workdir taken by a live process before the program could lock it), to be waited for.
  prepared: the pack opened ahead (batched.OpenedBatch of exactly `todo`), its program compiled or compiling."""
  for i in todo:
    status_lib.mark_config(runs[i])
    with open(os.path.join(runs[i].workdir, 'sweep.log'), 'a') as log:
      log.write(f'\n# {time.strftime("%Y-%m-%d %H:%M:%S")} batched program {p + 1}/{n_packs} '
                f'({len(pack)} runs, {lanes} lanes): {shlex.join(runs[i].argv("python", fresh))}\n')
    states[runs[i].key] = {'status': 'running', 'pid': os.getpid(), 'program': p}
  manifest(sweep_dir, runs, info, states)
  alone = packing.single_run_pack_alone(len(pack), len(jax.local_devices()))
  stream.write(f'[sweep] program {p + 1}/{n_packs}: {len(todo)} runs '
               f'({"alone, clients over the devices" if alone else f"{lanes} lanes"}), '
               f'elapsed {local.fmt_s(time.time() - t0)}' + (', compiled ahead' if prepared is not None else '') + '\n')
  stream.flush()
  if prepared is None:
    specs = [batched.RunSpec(runs[i].key, configs[i], runs[i].workdir, runs[i].tracking) for i in todo]
    res = batched.run_batch(specs, fresh=fresh, stop_requested=stop_requested, signal_name=signal_name,
                            lanes=lanes, before_training=before_training, data_cache=data_cache,
                            alone=alone)
  else:
    try:
      before_training()
      res = prepared.train(stop_requested=stop_requested, signal_name=signal_name)
    finally:
      prepared.close()
  busy = []
  for k, i in enumerate(todo):
    rr = res.get(k, batched.RunResult('failed', error='not run'))
    if rr.status == 'busy':
      busy.append(i)
      states[runs[i].key] = {'status': 'waiting'}
      continue
    st = {'status': rr.status, 'returncode': 0 if rr.status != 'failed' else 1, 'wall_s': round(rr.wall_s, 1),
          'program': p, 'lanes': rr.lanes}
    if rr.error:
      st['error'] = rr.error[:300]
      with open(os.path.join(runs[i].workdir, 'sweep.log'), 'a') as log:
        log.write(f'error: {rr.error}\n')
    states[runs[i].key] = st
  manifest(sweep_dir, runs, info, states)
  return busy


def stages_of(runs: List[Run]) -> List[tuple]:
  """[(stage name, [run indices])] in the sweep's order."""
  out: List[tuple] = []
  for i, r in enumerate(runs):
    if not out or out[-1][0] != r.stage:
      out.append((r.stage, []))
    out[-1][1].append(i)
  return out


def run_stages(runs: List[Run], configs: List[Any], sweep_dir: str, info: Dict[str, Any], *, batch_runs: int = 0,
               parallel: int = 1, fresh: bool = False, python: str = sys.executable, stop_requested=lambda: False,
               signal_name=lambda: None, stream=sys.stderr, compile_ahead: bool = True,
               env: Optional[Dict[str, str]] = None) -> Dict[str, Dict]:
  """A pipeline's stages in order (expand's `stages`): each stage's runs as run_local (or run_batched for train.py
  stages with batch_runs) once the stage before it has ended; a run whose input file (an earlier stage's output)
  is absent when its stage starts is 'not started', naming its producer. A stop (a signal, an interrupted run)
  ends the sweep after the current stage. sweep.json lists every run of every stage throughout."""
  states: Dict[str, Dict] = {}
  stopped = False
  for name, idx in stages_of(runs):
    ready = []
    for i in idx:
      r = runs[i]
      missing = [p for p in r.inputs if not os.path.isfile(p)]
      if stopped:
        states[r.key] = {'status': 'not started'}
      elif missing and status_lib.run_status(r) != 'finished':
        states[r.key] = {'status': 'not started', 'error': f'its input {missing[0]} is absent: {r.inputs[missing[0]]} '
                         'did not finish; rerun the sweep once it has'}
      else:
        ready.append(i)
    if not ready:
      continue
    stream.write(f'[sweep] stage {name}: {len(ready)} runs ({runs[ready[0]].binary.rsplit(os.sep, 1)[-1]})\n')
    stream.flush()
    sub = [runs[i] for i in ready]
    if batch_runs and runs[ready[0]].binary == TRAIN:
      got = run_batched(sub, [configs[i] for i in ready], sweep_dir, info, batch_runs=batch_runs, fresh=fresh,
                        stop_requested=stop_requested, signal_name=signal_name, stream=stream,
                        compile_ahead=compile_ahead, manifest_runs=runs, prior=states)
    else:
      got = local.run_local(sub, sweep_dir, info, parallel=parallel, fresh=fresh, python=python, stream=stream, env=env,
                      manifest_runs=runs, prior=states)
    states.update(got)
    stopped = stop_requested() or any(st['status'] in ('stopped', 'not started', 'running') for st in got.values())
  status_lib.write_manifest(sweep_dir, runs, info, states)
  return states


# --------------------------------------------------------------------------------------------- SLURM

def write_slurm(runs: List[Run], sweep_dir: str, *, name: str, python: str, parallel: int = 0, nodes: int = 1,
                sbatch_args: Sequence[str] = (), include_finished: bool = False) -> tuple:
  """Writes sweep_dir/commands.txt (one train.py command per array task) and sweep_dir/sweep.sbatch.

  nodes > 1: every array task is a multi-host job (docs/scaling.md): srun starts one train.py per node with
  --distributed, and JAX reads the SLURM environment. Returns (script path, commands path, task count).
  """
  todo = [r for r in runs if include_finished or status_lib.run_status(r) != 'finished']
  os.makedirs(os.path.join(sweep_dir, 'slurm_logs'), exist_ok=True)
  cmd_path = os.path.join(sweep_dir, 'commands.txt')
  with open(cmd_path, 'w') as f:
    for r in todo:
      argv = r.argv(python) + (['--distributed'] if nodes > 1 else [])
      f.write(shlex.join(argv) + '\n')
  script = os.path.join(sweep_dir, 'sweep.sbatch')
  lines = ['#!/bin/bash', f'#SBATCH --job-name={name}',
           f'#SBATCH --array=0-{len(todo) - 1}' + (f'%{parallel}' if parallel else ''),
           f'#SBATCH --output={os.path.abspath(sweep_dir)}/slurm_logs/%A_%a.out']
  if nodes > 1:
    lines += [f'#SBATCH --nodes={nodes}', '#SBATCH --ntasks-per-node=1']
  lines += [f'#SBATCH {a}' for a in sbatch_args]
  lines += ['# Generated by experiments/sweep.py --launcher=slurm; submit with: sbatch ' + script,
            '# Task i runs line i+1 of commands.txt. A preempted or requeued task resumes from its workdir.',
            # relative config / workdir paths mean what they meant here
            'set -euo pipefail', f'cd {shlex.quote(os.getcwd())}',
            f'CMD=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(os.path.abspath(cmd_path))})',
            # The line is a shlex-quoted argv written above; bash -c parses it as such (no config is evaluated).
            ('srun --nodes=$SLURM_JOB_NUM_NODES --ntasks-per-node=1 bash -c "$CMD"' if nodes > 1
             else 'bash -c "$CMD"')]
  with open(script, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  os.chmod(script, 0o755)
  return script, cmd_path, len(todo)
