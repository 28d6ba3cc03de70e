"""Trains the centralized upper bound of a federated config: its model on the union of the clients' data.

  python experiments/centralized.py --config=configs/quickstart.py --workdir=runs/quickstart_central \
      [--config.centralized.epochs=20 --config.centralized.lr=0.05 ...]

Uses the config's dataset, model, augmentation and task; the clients' optimizer chain (client.optimizer
'sgd' | 'sam' | 'asam' with client.rho) with momentum (config.centralized.momentum, 0.9), cosine-annealed lr
(config.centralized.lr, 0 = client.lr), weight decay and batch size (default the client's); with
config.swa.enabled, SWA over epochs (cyclic lr from swa.start_fraction, the end-of-cycle weights averaged; the
SWA model is the reported one). Thesis Table 4.5's centralized column, e.g. its SAM+SWA cell:

  python experiments/centralized.py --config=configs/fedsam_cifar.py:cifar100,fedsam,swa,alpha=0.5,clients=5 \
      --workdir=runs/c100_central_sam_swa --config.swa.cycle=1

(the fedsam / fedasam cells set client.optimizer=sam / asam, the swa cells swa.enabled; SWA's cycle counts
epochs here, so the federated cycle of 20 rounds is overridden, or the run warns that it never averages).
 Writes WORKDIR/centralized.json (final / best test accuracy, per-epoch metrics). A federated run
given --config.centralized.path=WORKDIR reports rounds_to_70pct_centralized / rounds_to_90pct_centralized in
its summary.json (training/centralized.py).

Exit status (fedjax_flat/training/cli.py), each error one `error:` line without a traceback: 0 done, 1 a failed
operation (a result file that cannot be written), 2 bad input (config, flags, dataset files).
"""
from __future__ import annotations

import os

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a config file returning a ConfigDict.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for centralized.json.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  from fedjax_flat.errors import BadInputError
  from fedjax_flat.training import centralized
  if len(argv) > 1:
    raise BadInputError(f'unexpected arguments {argv[1:]}; config overrides are --config.<field>=<value>')
  if not _WORKDIR.value.strip():
    raise BadInputError("--workdir='' is empty: give the directory for centralized.json")
  if _CONFIG.value.get('source_pretrain') is not None:     # a source pre-training cell (configs/ladd.py source_*)
    raise BadInputError('this config pre-trains on the source (config.source_pretrain): run it with '
                        'experiments/pretrain_source.py')
  res = centralized.train(_CONFIG.value, _WORKDIR.value)
  wd = os.path.abspath(_WORKDIR.value)
  print(f"done: {res['hparams']['epochs']} epochs on {res['num_train_examples']} examples, final test accuracy "
        f"{res['final_test_accuracy']:.4f} (best {res['best_test_accuracy']:.4f})")
  print(f'results: {wd}/{centralized.RESULT_FILE}  (federated runs: --config.centralized.path={wd})')


if __name__ == '__main__':
  from fedjax_flat.training import cli as _cli
  _cli.run_main(main, config_preflight=True)   # every error one line and its exit status
