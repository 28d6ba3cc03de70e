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

Exit status (fedjax_flat/training/cli.py), each error as one `error: ...` line without a traceback:
  0  done, or stopped by SIGTERM / Ctrl-C after writing a checkpoint (a SIGTERM after `done:` changes nothing)
  1  the run failed: divergence (naming the round and clients), a checkpoint or result file could not be
     written (disk full, permissions), no checkpoint restores
  2  bad input: an invalid config value (NaN / inf included), a --config.x naming no field, a missing or
     broken config file, a config that does not match the workdir's checkpoint, malformed or unsafe dataset
     files, missing dataset files, a workdir in use by another run (its lock names the holder's pid), an empty
     --workdir, a flag that does not parse (e.g. --config.client.lr=abc), an unknown or missing flag
  An unexpected error is one line and exit 1 too (its traceback with --verbosity). A second Ctrl-C aborts at
  once (killed by SIGINT); the newest complete checkpoint is kept.

Devices (fedjax_flat/devices.py): before jax starts, XLA is given one host CPU device per usable core and the
clients of each round are sharded over them (engine.shard_clients='auto'); the choice is the first line
printed and `host_devices` in WORKDIR/config.json. --host_devices=N (or FEDJAX_FLAT_HOST_DEVICES=N) sets
another count, N=1 one device; a --xla_force_host_platform_device_count in XLA_FLAGS is kept as given.

Logs: warnings, and INFO from fedjax_flat only (progress, resume); --verbosity=0 (or higher) shows every
library's INFO lines as well (jax, orbax, ...), --verbosity=-1 warnings only.
"""
from __future__ import annotations

import os
import sys

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from absl import flags, logging  # noqa: E402
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
# Experiment tracking (training/tracking.py, docs/tracking.md): off unless --tracker is given.
_TRACKER = flags.DEFINE_enum('tracker', None, ['mlflow', 'wandb'], 'Also track the run to MLflow or Weights & '
                             'Biases (pip install \'fedjax_flat[tracking]\'); a resume continues the same tracked run.')
_TRACKING_URI = flags.DEFINE_string('tracking_uri', None, 'MLflow tracking URI: a directory, sqlite:///path.db or '
                                    'http(s)://host:port (default: MLFLOW_TRACKING_URI, else MLflow\'s default).')
_TRACKING_PROJECT = flags.DEFINE_string('tracking_project', 'fedjax_flat', 'MLflow experiment / W&B project.')
_TRACKING_GROUP = flags.DEFINE_string('tracking_group', None, 'The sweep this run belongs to (set by '
                                      'experiments/sweep.py: MLflow parent run, W&B group).')
_TRACKING_NAME = flags.DEFINE_string('tracking_name', None, 'The tracked run\'s name (default: the workdir\'s name).')
_WANDB_MODE = flags.DEFINE_enum('wandb_mode', 'offline', ['offline', 'online'], 'W&B: offline writes '
                                'WORKDIR/wandb (upload later with `wandb sync`), online sends as it runs.')
flags.mark_flags_as_required(['config', 'workdir'])


def tracking_spec():
  """The --tracker flags as a training/tracking.Spec (None without --tracker); bad combinations exit 2."""
  from fedjax_flat.training import tracking
  return tracking.from_flags(_TRACKER.value, _TRACKING_URI.value, _TRACKING_PROJECT.value, _TRACKING_GROUP.value,
                             _TRACKING_NAME.value, _WANDB_MODE.value)


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


def main(argv):
  import signal
  from fedjax_flat.errors import BadInputError
  if len(argv) > 1:
    raise BadInputError(f'unexpected arguments {argv[1:]}; config overrides are --config.<field>=<value>')
  tracking = tracking_spec()                        # flag errors before jax starts
  init_distributed()
  import jax
  if HOST_DEVICES is not None and jax.process_index() == 0:   # the run's header: how many devices and why
    print(f'{HOST_DEVICES.line()}; jax sees {jax.device_count()} {jax.default_backend()} device(s)', flush=True)
  from fedjax_flat.training import api
  from fedjax_flat.training import writers
  from fedjax_flat.config import algo_flags
  # Errors: one line and the exit status of their class (cli.run_main below)
  config = algo_flags.apply(_CONFIG.value, _ALGO_OVERRIDES)
  if config.get('source_pretrain') is not None:     # a source pre-training cell (configs/ladd.py source_*)
    from fedjax_flat.errors import ConfigError
    raise ConfigError('source_pretrain', '<section>', 'this config pre-trains on the source: run it with '
                      'experiments/pretrain_source.py (train.py takes its source_model.npz as config.init.pretrained)')
  # The library's entry (fedjax_flat.train): the algorithm named by the config (registered by its module, or by
  # the config file itself: docs/tutorial_custom_algorithm.py).
  summary = api.train(config.algorithm, config, _WORKDIR.value, fresh=_FRESH.value, handle_signals=True,
                      tracking=tracking).summary
  signal.signal(signal.SIGTERM, signal.SIG_IGN)   # done: a late SIGTERM (e.g. a job ending) is not a failure
  if jax.process_index() != 0:
    return
  wd = os.path.abspath(_WORKDIR.value)
  if summary.get('stopped_by_signal'):
    print(f"stopped by {summary['stopped_by_signal']} after round {summary['rounds_completed']} of "
          f"{summary['rounds_planned']}; checkpoint {summary['checkpoint']}. Rerun the same command to resume.")
    return
  if summary.get('resumed_from_round') is not None:
    print(f"resumed from round {summary['resumed_from_round']} ({wd}/checkpoints)")
  print(writers.final_line(summary))
  print(f'results: {wd}/metrics.jsonl  {wd}/summary.json  {wd}/summary.md')
  print(f'plot:    {wd}/metrics.png   tensorboard: {wd}/tensorboard   checkpoint: {summary["checkpoint"]}')


_ALGO_OVERRIDES = []


if __name__ == '__main__':
  from fedjax_flat.config import algo_flags as _algo_flags
  from fedjax_flat.training import cli as _cli
  from fedjax_flat.errors import ConfigError as _ConfigError
  try:
    # --config.algo.<name>=<value> works for every config and algorithm (config/algo_flags.py).
    sys.argv, _ALGO_OVERRIDES = _algo_flags.split_argv(sys.argv)
  except _ConfigError as _e:
    print(f'error: {_e}', file=sys.stderr)
    sys.exit(2)
  # A missing or broken config file, a bad config string, a --config.x naming no field: one line and exit 2
  # before absl parses the flags (cli.preflight), instead of absl's traceback of ml_collections; then every
  # error of the run is one line and its exit status (cli.run_main).
  _cli.run_main(main, config_preflight=True)
