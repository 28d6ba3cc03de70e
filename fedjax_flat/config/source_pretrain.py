"""config.source_pretrain: the server's pre-training on a labelled source (LADD's FDA pre-training and the source-only
model; the runner is training/source_pretrain.py, the binary experiments/pretrain_source.py).

The section exists only in the configs that pre-train (configs/ladd.py's source_fda / source_only cells):

  dataset          the source dataset ('gta5'), its config.data in `data` (the gta5 fields: split, target, image
                   size at load, and the augmentation: crop, scale, flip, jitter); '' = the target dataset carries
                   its source in memory (seg_synthetic_da's source_x / source_y)
  style            'fda': every source image restyled with a random target-client style (the release's fda_inv);
                   'none': plain source training (source only)
  fda_b            the style window half-width (3 x 3 for b = 1)
  style_images     images per client averaged into its style (the release: n_images_per_style)
  epochs, steps    steps = `steps`, or (steps = 0) epochs x ceil(N / batch_size) over the N source images
  batch_size, lr, power, momentum: SGD with momentum, lr_t = lr (1 - t / T) ** power
  checkpoint_every steps between checkpoints in the workdir (0 = none before the end)
  log_every        steps between progress lines and metrics.jsonl training records
  prefetch         steps decoded ahead, each on its own thread of the host's pool (the source's images are read
                   by `examples(indices)`; its data.num_workers pool is not used)

`validate(cfg)` checks the scalar fields here (one ConfigError naming the field); config/validate.py checks the
source's data section against its dataset's declared fields.
"""
from __future__ import annotations

import math
import numbers

import ml_collections

from fedjax_flat.errors import ConfigError

STYLES = ('fda', 'none')


def section(**values) -> ml_collections.ConfigDict:
  """A config.source_pretrain with the release's defaults (configs/pretrain_<target>.txt), then `values`."""
  s = ml_collections.ConfigDict()
  s.dataset = 'gta5'
  s.data = ml_collections.ConfigDict()
  s.style = 'fda'
  s.fda_b = 1
  s.style_images = 1000
  s.epochs = 10
  s.steps = 0
  s.batch_size = 16
  s.lr = 5e-3
  s.power = 0.9
  s.momentum = 0.9
  s.checkpoint_every = 500
  s.log_every = 50
  s.prefetch = 4
  for k, v in values.items():
    s[k] = v
  return s


def _finite(v) -> bool:
  return isinstance(v, numbers.Number) and not isinstance(v, bool) and math.isfinite(v)


def validate(cfg) -> None:
  """The scalar fields of config.source_pretrain (called from config/validate.py)."""
  s = cfg.source_pretrain

  def num(name, ok, allowed, integer=False):
    v = s.get(name)
    if not _finite(v) or (integer and not isinstance(v, numbers.Integral)) or not ok(v):
      raise ConfigError(f'source_pretrain.{name}', v, allowed)
  if not isinstance(s.get('dataset'), str):
    raise ConfigError('source_pretrain.dataset', s.get('dataset'), "a dataset name ('' = the target's own source)")
  if s.get('style') not in STYLES:
    raise ConfigError('source_pretrain.style', s.get('style'), f'allowed values: {list(STYLES)}')
  num('fda_b', lambda v: v >= 0, 'an integer >= 0', integer=True)
  num('style_images', lambda v: v >= 1, 'an integer >= 1', integer=True)
  num('epochs', lambda v: v >= 0, 'an integer >= 0 (used when steps = 0)', integer=True)
  num('steps', lambda v: v >= 0, 'an integer >= 0 (0 = epochs x ceil(N / batch_size))', integer=True)
  if not s.steps and not s.epochs:
    raise ConfigError('source_pretrain.epochs', s.epochs, 'must be >= 1 when source_pretrain.steps = 0')
  num('batch_size', lambda v: v >= 1, 'an integer >= 1', integer=True)
  num('lr', lambda v: v > 0, 'a number > 0')
  num('power', lambda v: v >= 0, 'a number >= 0 (the poly schedule exponent)')
  num('momentum', lambda v: 0 <= v < 1, 'a number in [0, 1)')
  num('checkpoint_every', lambda v: v >= 0, 'an integer >= 0 (0 = no checkpoint before the end)', integer=True)
  num('log_every', lambda v: v >= 0, 'an integer >= 0 (0 = no progress lines)', integer=True)
  num('prefetch', lambda v: v >= 1, 'an integer >= 1', integer=True)
