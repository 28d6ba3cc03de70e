"""Runs a federated training experiment; resumes automatically from WORKDIR/checkpoints.

  python experiments/train.py --config=configs/quickstart.py --workdir=runs/quickstart \
      [--config.rounds=50 --config.client.lr=0.05 ...] [--config.checkpoint_every=10] [--fresh]

Writes WORKDIR/config.json, metrics.jsonl (+ metrics.csv), tensorboard/, metrics.png, summary.json and
summary.md, and orbax checkpoints in WORKDIR/checkpoints every `checkpoint_every` rounds (0 = at the end).
Rerunning the same command continues from the newest valid checkpoint; --fresh starts over. SIGTERM or
Ctrl-C finishes the current round, writes a checkpoint and exits 0.

Several hosts (docs/scaling.md): run the same command on every host with
  --coordinator_address=HOST0:PORT --num_processes=N --process_id=I      (or the JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES, JAX_PROCESS_ID environment variables), or --distributed on TPU pods / SLURM, where JAX
detects the cluster itself. The clients of each round are sharded over every device of every host.

Exit status: 0 done (or stopped by a signal after checkpointing), 2 invalid config or a config that does
not match the workdir's checkpoint (one message naming the field), 1 a checkpoint could not be written or
read.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a config file returning a ConfigDict.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for results (and checkpoints).')
_FRESH = flags.DEFINE_bool('fresh', False, 'Start over: discard the checkpoints and metrics in --workdir.')
_COORD = flags.DEFINE_string('coordinator_address', None,
                             'host:port of process 0 for jax.distributed (multi-host runs).')
_NUM_PROC = flags.DEFINE_integer('num_processes', None, 'Number of processes (hosts) of a multi-host run.')
_PROC_ID = flags.DEFINE_integer('process_id', None, 'This process\'s index in [0, num_processes).')
_DISTRIBUTED = flags.DEFINE_bool('distributed', False,
                                 'Call jax.distributed.initialize() with cluster auto-detection (TPU pods, '
                                 'SLURM, ...), when the explicit flags are not given.')
flags.mark_flags_as_required(['config', 'workdir'])


def init_distributed() -> None:
  """jax.distributed.initialize from the flags or JAX_* environment variables; no-op for one process."""
  import jax
  env = os.environ
  coord = _COORD.value or env.get('JAX_COORDINATOR_ADDRESS')
  nproc = _NUM_PROC.value if _NUM_PROC.value is not None else (
      int(env['JAX_NUM_PROCESSES']) if 'JAX_NUM_PROCESSES' in env else None)
  pid = _PROC_ID.value if _PROC_ID.value is not None else (
      int(env['JAX_PROCESS_ID']) if 'JAX_PROCESS_ID' in env else None)
  if coord or nproc or _DISTRIBUTED.value:
    jax.distributed.initialize(coordinator_address=coord, num_processes=nproc, process_id=pid)
    logging.info('jax.distributed: process %d of %d, %d local / %d global devices', jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count())


class _QuietOrbax:
  """Keeps orbax's per-save INFO chatter out of the progress log (its warnings and errors still show)."""

  def filter(self, record):
    return record.levelno >= 30 or '/orbax/' not in record.pathname.replace(os.sep, '/')


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(_QuietOrbax())
  init_distributed()
  import jax
  from fedjax_flat.training import checkpoint as ckpt_lib
  from fedjax_flat.training import run as run_lib
  from fedjax_flat.training.validate import ConfigError
  from fedjax_flat.training import algo_flags
  try:
    config = algo_flags.apply(_CONFIG.value, _ALGO_OVERRIDES)
    summary = run_lib.run(config, _WORKDIR.value, fresh=_FRESH.value, handle_signals=True)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  except ckpt_lib.CheckpointError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
  if jax.process_index() != 0:
    return
  wd = os.path.abspath(_WORKDIR.value)
  if summary.get('stopped_by_signal'):
    print(f"stopped by {summary['stopped_by_signal']} after round {summary['rounds_completed']} of "
          f"{summary['rounds_planned']}; checkpoint {summary['checkpoint']}. Rerun the same command to resume.")
    return
  if summary.get('resumed_from_round') is not None:
    print(f"resumed from round {summary['resumed_from_round']} ({wd}/checkpoints)")
  print(f"done: {summary['rounds_completed']} rounds, final test accuracy "
        f"{summary.get('final_test_accuracy', float('nan')):.4f} ({summary['reported_model']} model)")
  print(f'results: {wd}/metrics.jsonl  {wd}/summary.json  {wd}/summary.md')
  print(f'plot:    {wd}/metrics.png   tensorboard: {wd}/tensorboard   checkpoint: {summary["checkpoint"]}')


_ALGO_OVERRIDES = []


if __name__ == '__main__':
  # --config.algo.<name>=<value> works for every config and algorithm (training/algo_flags.py).
  from fedjax_flat.training import algo_flags as _algo_flags
  sys.argv, _ALGO_OVERRIDES = _algo_flags.split_argv(sys.argv)
  # A bad config string (--config=configs/<family>.py:<string>) is one line and exit 2, not absl's traceback.
  from fedjax_flat.training import config_strings as _config_strings
  _bad = _config_strings.preflight(sys.argv)
  if _bad:
    print(f'error: {_bad}', file=sys.stderr)
    sys.exit(2)
  app.run(main)
