"""Trains the centralized upper bound of a federated config: its model on the union of the clients' data.

  python experiments/centralized.py --config=configs/quickstart.py --workdir=runs/quickstart_central \
      [--config.centralized.epochs=20 --config.centralized.lr=0.05 ...]

Uses the config's dataset, model, augmentation and task; SGD with momentum (config.centralized.momentum,
0.9), cosine-annealed lr (config.centralized.lr, 0 = client.lr), weight decay and batch size (default the
client's). Writes WORKDIR/centralized.json (final / best test accuracy, per-epoch metrics). A federated run
given --config.centralized.path=WORKDIR reports rounds_to_70pct_centralized / rounds_to_90pct_centralized in
its summary.json (training/centralized.py).

Exit status: 0 done, 2 invalid config (one message naming the field).
"""
from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a config file returning a ConfigDict.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for centralized.json.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  from fedjax_flat.training import centralized
  from fedjax_flat.errors import ConfigError
  try:
    res = centralized.train(_CONFIG.value, _WORKDIR.value)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  wd = os.path.abspath(_WORKDIR.value)
  print(f"done: {res['hparams']['epochs']} epochs on {res['num_train_examples']} examples, final test accuracy "
        f"{res['final_test_accuracy']:.4f} (best {res['best_test_accuracy']:.4f})")
  print(f'results: {wd}/{centralized.RESULT_FILE}  (federated runs: --config.centralized.path={wd})')


if __name__ == '__main__':
  from fedjax_flat.config import families as _config_strings
  _bad = _config_strings.preflight(sys.argv)
  if _bad:
    print(f'error: {_bad}', file=sys.stderr)
    sys.exit(2)
  app.run(main)
