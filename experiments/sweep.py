r"""Runs a sweep: a base config x a grid of overrides x seeds, N local processes at a time, or writes a SLURM array.

  # from a sweep file (configs/sweeps/<name>.py, get_sweep() -> dict; see fedjax_flat/sweeps/sweep.py)
  python experiments/sweep.py --sweep=configs/sweeps/flat_minima_digits.py --sweep_dir=runs/fm --parallel=2
  # or on the command line
  python experiments/sweep.py --config=configs/quickstart.py --grid=client.optimizer=sgd,sam \
      --grid=client.rho=0.05,0.1 --set=rounds=50 --seeds=0,1,2 --sweep_dir=runs/sam_grid --parallel=2
  # a SLURM job array instead (writes sweep_dir/sweep.sbatch + commands.txt; runs nothing)
  python experiments/sweep.py ... --launcher=slurm [--slurm_nodes=4] [--sbatch=--gpus-per-task=8]

Each run is one experiments/train.py process writing to sweep_dir/<cell>/seed=<s> (cell: the cell's name or
`key=value,...` over the keys that vary); its output goes to that workdir's sweep.log. Finished runs
(summary.json complete, config.json holding the run's values) are skipped; interrupted ones resume from their
checkpoints (train.py's workdir resume). sweep_dir/sweep.json is the manifest (experiments/report.py reads it).
Progress (done / running / failed, ETA) goes to stderr; failures are listed at the end.
Ctrl-C / SIGTERM: running trainings checkpoint and stop; rerun the same command to continue.

Many runs in one program (`--batch_runs=R` or `auto`): instead of one process per run, this process packs
compatible runs (same config once seeds, learning rates, momentum, weight decay, rho, SWA's lrs, the data
partition and the virtual clock's numbers (config.system: deadline, speeds' spread, availability rate, dropout,
bandwidths) are set aside: fedjax_flat/core/runs.py) into batched programs of up to R runs, vmapped over the
runs and sharded over one host device per core on CPU; each run still writes its own workdir exactly as
alone, so experiments/report.py and resuming work unchanged (training/batched.py; measured:
benchmarks/speed/README.runs.md). Every run's config is validated before anything launches.

A sweep file's `stages` (configs/sweeps/paper_table.py:ladd: the source pre-training, then the federated cells
from its source_model.npz) run in order, each a set of runs as above; --dry_run lists them, stage by stage, with
the files each run needs from an earlier stage.

Every grid point and seed is validated as train.py validates it (sweeps/sweep.run_config) before anything
launches. One driver per sweep directory (a second is refused while the first runs); the runs of a local sweep
end with their driver (SIGTERM from the kernel, however the driver ends: they checkpoint and stop), and a rerun
(process-parallel or --batch_runs) waits for a run whose workdir is still held by a live process (a train.py
started by hand, a child of an earlier driver) instead of marking it failed. A failed run's reason is its log's last
`error:` line.

Exit status (fedjax_flat/training/cli.py), each error one `error:` line without a traceback: 0 all runs
finished, 1 some run failed or was interrupted, or sweep.json cannot be written (disk full), 2 bad input
(flags, the sweep file, any grid value or seed that train.py would refuse, a sweep directory in use).
"""
from __future__ import annotations

import dataclasses
import os
import sys

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py); batched runs shard
# their runs axis over them, process-parallel sweeps give each child its share (devices.child_env).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from absl import flags  # noqa: E402

from fedjax_flat.sweeps import grid as grid_lib  # noqa: E402
from fedjax_flat.sweeps import local as local_lib  # noqa: E402
from fedjax_flat.sweeps import status as status_lib  # noqa: E402
from fedjax_flat.sweeps import sweep as sweep_lib  # noqa: E402
from fedjax_flat.training import packing  # noqa: E402
from fedjax_flat.training import cli  # noqa: E402
from fedjax_flat.training import run as run_lib  # noqa: E402
from fedjax_flat.training import tracking  # noqa: E402

_SWEEP = flags.DEFINE_string('sweep', None, 'Sweep file path[:arg] with get_sweep() (configs/sweeps/*.py).')
_CONFIG = flags.DEFINE_string('config', None, 'Base config path[:arg] (passed to train.py unchanged); '
                              'overrides the sweep file\'s.')
_GRID = flags.DEFINE_multi_string('grid', [], 'KEY=V1,V2,... (config key without "config."); repeat for a '
                                  'cartesian product; replaces the sweep file\'s grid.')
_SET = flags.DEFINE_multi_string('set', [], 'KEY=VALUE fixed override for every run (added to the file\'s).')
_SEEDS = flags.DEFINE_string('seeds', None, 'Comma-separated seeds, e.g. 0,1,2 (default: the file\'s, or 0).')
_DIR = flags.DEFINE_string('sweep_dir', None, 'Directory of the sweep\'s workdirs and sweep.json.')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Local processes at a time (SLURM: max array tasks at a time, '
                                 '0 = no limit).')
_LAUNCHER = flags.DEFINE_enum('launcher', 'local', ['local', 'slurm'], 'local: run here; slurm: write a job '
                              'array script and the per-task commands, run nothing.')
_NODES = flags.DEFINE_integer('slurm_nodes', 1, 'Hosts per run (>1: multi-host runs, docs/scaling.md).')
_SBATCH = flags.DEFINE_multi_string('sbatch', [], 'Extra #SBATCH line(s), e.g. --sbatch=--gpus-per-task=1.')
_FRESH = flags.DEFINE_bool('fresh', False, 'Start unfinished or mismatching runs over (train.py --fresh); '
                           'finished runs with matching configs are still skipped.')
_DRY = flags.DEFINE_bool('dry_run', False, 'Print each run\'s status and command; run nothing.')
_BATCH = flags.DEFINE_string('batch_runs', '0', 'Runs per batched program in this process (an integer >= 1, '
                             f'or auto = {packing.AUTO_BATCH_RUNS} on a CPU, '
                             f'{packing.AUTO_BATCH_RUNS_ACCELERATOR} on an accelerator, both measured); '
                             '0 = one train.py process per run (--parallel at a time).')
_AHEAD = flags.DEFINE_bool('compile_ahead', True, 'With --batch_runs: open the next program\'s runs and compile it '
                           'on a thread while the current one trains (no effect on any number).')
_PYTHON = flags.DEFINE_string('python', sys.executable, 'Python interpreter for the runs.')
# Experiment tracking (training/tracking.py, docs/tracking.md): one tracked run per cell, grouped by the sweep.
_TRACKER = flags.DEFINE_enum('tracker', None, ['mlflow', 'wandb'], 'Track every train.py run to MLflow (under a '
                             'parent run named after the sweep) or W&B (group= the sweep).')
_TRACKING_URI = flags.DEFINE_string('tracking_uri', None, 'MLflow tracking URI (default: MLFLOW_TRACKING_URI).')
_TRACKING_PROJECT = flags.DEFINE_string('tracking_project', 'fedjax_flat', 'MLflow experiment / W&B project.')
_WANDB_MODE = flags.DEFINE_enum('wandb_mode', 'offline', ['offline', 'online'], 'W&B mode of the runs.')
flags.mark_flag_as_required('sweep_dir')


def _fail(msg: str):
  raise grid_lib.SweepError(msg)


def build_runs():
  spec = {}
  if _SWEEP.value:
    spec = grid_lib.load_sweep_file(_SWEEP.value)
  elif not _CONFIG.value:
    _fail('give --sweep=configs/sweeps/<name>.py or --config=<path[:arg]> with --grid=KEY=V1,V2')
  if _CONFIG.value:
    spec['config'] = _CONFIG.value
  if spec.get('config') and not os.path.isfile(spec['config'].split(':')[0]):
    _fail(f"config {spec['config']!r}: no such file; give --config=configs/<name>.py[:arg]")
  if _GRID.value:
    spec['grid'] = grid_lib.parse_grid_flags(_GRID.value)
  if _SET.value:
    fixed = dict(spec.get('fixed') or {})
    for item in _SET.value:
      k, sep, v = item.partition('=')
      if not sep or not k:
        _fail(f'--set={item!r} is not KEY=VALUE; e.g. --set=rounds=50')
      fixed[k[len('config.'):] if k.startswith('config.') else k] = grid_lib.parse_value(v)
    spec['fixed'] = fixed
  if _SEEDS.value is not None:
    spec['seeds'] = grid_lib.parse_seeds(_SEEDS.value)
  runs = grid_lib.expand(spec, _DIR.value)
  for r in runs:
    if not os.path.isfile(r.config.split(':')[0]):
      _fail(f'cell {r.cell}: config {r.config!r} is not a file; fix the sweep\'s config paths')
  return spec, runs


def main(argv):
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}; overrides go in --grid=KEY=V1,V2 or --set=KEY=VALUE')
  if _PARALLEL.value < (0 if _LAUNCHER.value == 'slurm' else 1):
    _fail(f'--parallel={_PARALLEL.value}; use a positive number of processes')
  if not _DIR.value.strip():
    _fail("--sweep_dir='' is empty: give the directory of the sweep's runs and sweep.json")
  batch_runs = _batch_runs()
  spec, runs = build_runs()
  name = spec.get('name') or os.path.basename(os.path.abspath(_DIR.value))
  configs = grid_lib.run_configs(runs)      # every run's config, before anything launches (SweepError: exit 2)
  staged = any(r.stage for r in runs)
  tracking_spec = tracking.from_flags(_TRACKER.value, _TRACKING_URI.value, _TRACKING_PROJECT.value,
                                      name if _TRACKER.value else None, wandb_mode=_WANDB_MODE.value)
  if tracking_spec is not None and not _DRY.value:
    tracking_spec = tracking.open_group(tracking_spec, _DIR.value)   # unreachable: one line, exit 2, nothing run
  runs = [dataclasses.replace(r, tracking=tracking_spec) for r in runs]
  if _DRY.value:
    for stage, idx in sweep_lib.stages_of(runs):
      if staged:
        print(f'stage {stage}: {len(idx)} runs of {os.path.relpath(runs[idx[0]].binary)}')
      for r in (runs[i] for i in idx):
        needs = ''.join(f'\n          needs {p} (from {k})' for p, k in r.inputs.items())
        print(f'{status_lib.run_status(r):9s} {r.key}\n          {" ".join(r.argv(_PYTHON.value))}{needs}')
    return
  if staged and _LAUNCHER.value == 'slurm':
    _fail('a sweep with stages runs them in order here (--launcher=local); run each stage\'s commands from '
          '--dry_run as SLURM jobs with dependencies')
  # One driver per sweep directory (sweep.json has one writer): the lock is held until this process ends.
  status_lib.lock_sweep_dir(_DIR.value)
  if _LAUNCHER.value == 'slurm':
    script, cmds, n = sweep_lib.write_slurm(runs, _DIR.value, name=name, python=_PYTHON.value,
                                            # unlimited array concurrency unless --parallel is given
                                            parallel=_PARALLEL.value if flags.FLAGS['parallel'].present else 0,
                                            nodes=_NODES.value,
                                            sbatch_args=_SBATCH.value)
    status_lib.write_manifest(_DIR.value, runs, _info(spec, name), {})
    if n == 0:
      print(f'all {len(runs)} runs are finished; nothing to submit ({script} has an empty array)')
    else:
      print(f'{n} of {len(runs)} runs in {cmds}\nsubmit: sbatch {script}')
    return
  if staged:
    cli.configure_logging(verbosity_given=flags.FLAGS['verbosity'].present > 0)
    stopper = run_lib.StopSignal().install() if batch_runs else None
    try:
      states = sweep_lib.run_stages(runs, configs, _DIR.value, _info(spec, name), batch_runs=batch_runs,
                                    parallel=_PARALLEL.value, fresh=_FRESH.value, python=_PYTHON.value,
                                    stop_requested=stopper or (lambda: False),
                                    signal_name=(lambda: stopper.signal_name) if stopper else (lambda: None),
                                    compile_ahead=_AHEAD.value)
    finally:
      if stopper:
        stopper.uninstall()
  elif batch_runs:
    cli.configure_logging(verbosity_given=flags.FLAGS['verbosity'].present > 0)   # as train.py's
    stopper = run_lib.StopSignal().install()
    try:
      states = sweep_lib.run_batched(runs, configs, _DIR.value, _info(spec, name), batch_runs=batch_runs,
                                     fresh=_FRESH.value, stop_requested=stopper,
                                     signal_name=lambda: stopper.signal_name, compile_ahead=_AHEAD.value)
    finally:
      stopper.uninstall()
  else:
    states = local_lib.run_local(runs, _DIR.value, _info(spec, name), parallel=_PARALLEL.value,
                                 fresh=_FRESH.value, python=_PYTHON.value)
  failed = [(k, s) for k, s in states.items() if s['status'] == 'failed']
  unfinished = [k for k, s in states.items() if s['status'] in ('stopped', 'not started', 'running')]
  tracking.close_group(tracking_spec, 'FAILED' if failed else 'KILLED' if unfinished else 'FINISHED')
  n_done = sum(s['status'] == 'done' for s in states.values())
  n_skip = sum(s['status'].startswith('skipped') for s in states.values())
  print(f'{n_done} runs done, {n_skip} skipped (finished earlier), {len(failed)} failed, '
        f'{len(unfinished)} interrupted; manifest {os.path.join(_DIR.value, "sweep.json")}')
  for k, s in failed:
    print(f'FAILED {k} (exit {s.get("returncode")}): {s.get("error", "")}\n       log: {s.get("log", "")}')
  if unfinished:
    print(f'{len(unfinished)} interrupted or not started (rerun the same command to resume): ' +
          ', '.join(unfinished[:5]) + (', ...' if len(unfinished) > 5 else ''))
  sys.exit(1 if failed or unfinished else 0)


def _batch_runs() -> int:
  text = _BATCH.value.strip()
  if text == 'auto':
    return packing.auto_batch_runs()
  try:
    n = int(text)
  except ValueError:
    n = -1
  if n < 0:
    _fail(f'--batch_runs={text!r}; use an integer >= 1, auto, or 0 (one process per run)')
  if n and _LAUNCHER.value == 'slurm':
    _fail('--batch_runs runs the sweep in this process; with --launcher=slurm leave it out')
  return n


def _info(spec, name):
  return dict(name=name, sweep=_SWEEP.value, config=spec.get('config'), fixed=spec.get('fixed') or {},
              seeds=spec.get('seeds') or [0], description=spec.get('description', ''))


if __name__ == '__main__':
  cli.run_main(main, quiet_logs=False)   # every error one line and its exit status
