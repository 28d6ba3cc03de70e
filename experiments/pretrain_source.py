"""Pre-trains LADD's source model on the labelled source (GTA5), streamed from its files, and evaluates it on the
target's test set (thesis §5.3 step 2; the release's fda_inv / centralized source-only runs).

  python experiments/pretrain_source.py --config=configs/ladd.py:cityscapes,source_fda --workdir=runs/gta5_fda \
      --config.data.data_dir=/path/to/data --config.source_pretrain.data.data_dir=/path/to/data
  python experiments/train.py --config=configs/ladd.py:cityscapes,ladd_cls --workdir=runs/ladd_cls \
      --config.data.data_dir=/path/to/data --config.init.pretrained=runs/gta5_fda/source_model.npz

`source_fda`: every GTA5 image restyled with a random target-client FDA style (the styles of the target's
training clients, computed from its split one client at a time); `source_only`: no style transfer (its result is
the source-only cell: WORKDIR/summary.json's final_test_miou beside the published number). Training streams the
source images (config.source_pretrain: epochs or steps, batch, SGD momentum, poly lr; the source's
config.source_pretrain.data: image size at load, random scale / crop, flip, colour jitter), decoding each step's
images on a thread pool ahead of the device; never the whole set in memory.

Writes WORKDIR/config.json, pretrain_checkpoint.npz (every config.source_pretrain.checkpoint_every steps: rerunning
the same command resumes bit-identically; --fresh starts over), metrics.jsonl (training loss every log_every
steps, the final evaluation), source_model.npz (the params file config.init.pretrained reads), summary.json and
summary.md (target test mIoU, per-class IoU, config.published compared). Progress lines: steps/s, ETA, loss.

Exit status (fedjax_flat/training/cli.py), each error one `error:` line without a traceback: 0 done, 1 a failed
operation (divergence, a file that cannot be written), 2 bad input (config, flags, a config without a
source_pretrain section, missing or malformed dataset files, a checkpoint of another run, a workdir in use).
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
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for the checkpoint, source_model.npz and the results.')
_FRESH = flags.DEFINE_bool('fresh', False, 'Start over: discard the checkpoint and results in --workdir.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  from fedjax_flat.errors import BadInputError, ConfigError
  if len(argv) > 1:
    raise BadInputError(f'unexpected arguments {argv[1:]}; config overrides are --config.<field>=<value>')
  if not _WORKDIR.value.strip():
    raise BadInputError("--workdir='' is empty: give the directory for source_model.npz")
  config = _CONFIG.value
  if config.get('source_pretrain') is None:       # before jax, data or the workdir are touched
    raise ConfigError('source_pretrain', None, 'this config has no source pre-training section: use '
                      'configs/ladd.py:<target>,source_fda or <target>,source_only')
  from fedjax_flat.training import source_pretrain
  s = source_pretrain.run(config, _WORKDIR.value, fresh=_FRESH.value)
  wd = os.path.abspath(_WORKDIR.value)
  pub = ''
  if 'published_miou' in s:
    std = s.get('published_miou_std')
    pub = f"; published {s['published_miou']:.2f}{'' if std is None else f' +- {std:.2f}'}"
  resumed = '' if s['resumed_from_step'] is None else f" (resumed from step {s['resumed_from_step']})"
  print(f"done: {s['steps']} steps{resumed}, target test mIoU {100 * s['final_test_miou']:.2f}% (pixel accuracy "
        f"{s['final_test_accuracy']:.4f}{pub})")
  print(f'model:   {s["source_model"]}  (LADD runs: --config.init.pretrained={s["source_model"]})')
  print(f'results: {wd}/summary.json  {wd}/summary.md  {wd}/metrics.jsonl')


if __name__ == '__main__':
  from fedjax_flat.training import cli as _cli
  _cli.run_main(main, config_preflight=True)   # every error one line and its exit status
