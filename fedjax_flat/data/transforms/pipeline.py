"""Train/eval input transforms from config: on-device augmentation + normalization (jit-compiled).

train runs inside the round program per client and per step, keyed by (seed, round, client, step);
eval normalizes only. Raw uint8 images become float32 in [0, 1] first (data/transforms/augment.py).

config.augment: 'none' | 'cifar' (pad-4 random crop + flip) | 'cifar_cutout' (+ Cutout: 16x16 CIFAR10,
8x8 CIFAR100) | 'cifar_mixup' (crop + flip + Mixup, alpha 1: soft labels) | 'landmarks' (random-resized-crop
to 224 + flip; eval: centre crop) | 'segmentation' (image + label map, parameters in config.data: style
transfer, random scale + crop, flip, jitter; eval: normalize only). config.normalize: the mean/std preset
('cifar10', 'cifar100', 'imagenet', 'feddrive', or 'none').
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.transforms import augment as aug
from fedjax_flat.data.transforms.transform import Transform, on_inputs
from fedjax_flat.data.transforms import style_transfer
from fedjax_flat.schema import Choice, Flag, Number, Pair

# config.data fields of the segmentation augmentation (augment='segmentation': make_seg_augment, style transfer),
# with their defaults; each segmentation dataset declares them with its own defaults (data/registry.py `fields`).
SEG_AUGMENT = dict(
    crop=(512, 1024),          # (h, w) of the training crops; () = keep the loaded size (no scale/crop)
    scale=(0.5, 1.5),          # scale_crop: resize factor range; resized_crop: crop area fraction range
    scale_mode='scale_crop',   # 'scale_crop' (Cityscapes release) | 'resized_crop' (IDDA release)
    flip=True,                 # random horizontal flip (image and label map together)
    jitter=0.0,                # colour jitter strength (brightness/contrast/saturation); 0 = off
    style='none',              # style-transfer DG on half of each batch: 'none' | 'cfsi' | 'lab'
    style_fraction=0.5,        # fraction of each batch's valid examples restyled
    cfsi_window=0.05,          # CFSI low-frequency window (fraction of H and W)
    style_max_per_client=0,    # bank entries per client (0 = every image, as the release)
    shuffle=True,              # data/batching.py: reshuffle every epoch
)
SEG_AUGMENT_FIELDS = tuple(SEG_AUGMENT)   # read here, not by the dataset builders


def number(lo=None, hi=None, lo_open=False, integer=False) -> Number:
  """A `config.data` number of the segmentation datasets (one message per check: type and finiteness, each bound)."""
  return Number(None, lo=lo, hi=hi, lo_open=lo_open, integer=integer, steps=True,
                kind_message=f'must be a finite {"integer" if integer else "number"}')


def pair(allow_empty: bool = False, integer: bool = True) -> Pair:
  """Two positive integers (h, w) (or numbers (lo, hi)); () too when `allow_empty`."""
  what = 'positive integers (h, w)' if integer else 'positive numbers (lo, hi)'
  return Pair(None, integer=integer, allow_empty=allow_empty,
              message=f'must be two {what}' + (' or () for none' if allow_empty else ''))


# The rule of each augmentation field (config/validate.py checks them, then each dataset's own `rules=`).
SEG_AUGMENT_RULES = dict(
    crop=pair(allow_empty=True),
    scale=pair(integer=False),
    scale_mode=Choice(None, ('scale_crop', 'resized_crop'), sort=True),
    flip=Flag(None),
    jitter=number(0, 1),
    style=Choice(None, ('none', 'cfsi', 'lab'), sort=True),
    style_fraction=number(0, 1),
    cfsi_window=number(0, 0.5, lo_open=True),
    style_max_per_client=number(0, integer=True),
    shuffle=Flag(None),
)


def _mixup_valid(rng, batch, num_classes, alpha=1.0):
  """Mixup within the valid examples of a masked batch (padding never becomes a mixing partner).

  lambda ~ Beta(alpha, alpha) per batch; partners form a random cyclic permutation of the valid examples.
  """
  k_lam, k_perm = jax.random.split(rng)
  mask = batch['mask'] > 0
  n_valid = jnp.maximum(jnp.sum(mask), 1)
  keys = jnp.where(mask, jax.random.uniform(k_perm, mask.shape), 2.0)
  order = jnp.argsort(keys)                       # valid examples first, in random order
  rank = jnp.argsort(order)
  partner = jnp.where(mask, order[(rank + 1) % n_valid], jnp.arange(mask.shape[0]))
  lam = jax.random.beta(k_lam, alpha, alpha)
  x = batch['x']
  x = lam * x + (1.0 - lam) * x[partner]
  y1 = jax.nn.one_hot(batch['y'], num_classes)
  y = lam * y1 + (1.0 - lam) * y1[partner]
  return {**batch, 'x': x, 'y': y}


def _segmentation(config, data):
  """augment='segmentation': image + label-map pipeline from config.data (data/transforms/augment.py make_seg_augment);
  with data.style != 'none' the style bank is built here from the training clients (data/transforms/style_transfer.py)
  and held by the Transform (`style_bank`) (its size is a side-channel message for the communication count)."""
  from absl import logging
  declared = data_registry.declared_fields(config.dataset)
  get = lambda k: config.data.get(k, declared[k])  # noqa: E731
  mean, std = ((0.0,) * 3, (1.0,) * 3) if config.normalize == 'none' else aug.STATS[config.normalize]
  bank = None
  if get('style') != 'none':
    if data is None:
      raise ValueError(f"data.style={get('style')!r} needs the training data to build the style bank")
    bank = style_transfer.build_style_bank(get('style'), data, window=get('cfsi_window'),
                                           max_per_client=get('style_max_per_client') or None, seed=config.seed)
    logging.info('style bank: %s', bank.summary())
    if bank.nbytes > 64 * 2**20 and not getattr(jax.config, 'jax_use_simplified_jaxpr_constants', False):
      # The bank is a constant of the round program: without this flag XLA embeds it in the HLO (slow compile,
      # a second copy in memory). Measured: a 50 MB constant, 1.9 s compile and a 100 MB HLO; with it, 0.3 s.
      logging.warning('style bank of %.0f MB: set JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=True (passes it as an '
                      'argument) or cap it with config.data.style_max_per_client', bank.nbytes / 2**20)
  train = aug.make_seg_augment(crop=tuple(get('crop')) or None, scale=tuple(get('scale')), mode=get('scale_mode'),
                               flip=get('flip'), jitter=get('jitter'), mean=mean, std=std, style=bank,
                               style_fraction=get('style_fraction'))
  return train, aug.make_seg_preprocess(mean, std)


def make_transforms(config, num_classes: int, data=None):
  """(train Transform (rng, batch) -> batch (data/transforms/transform.py), eval fn x -> x) from the config."""
  norm = config.normalize
  name = config.augment
  if name == 'segmentation':
    return _segmentation(config, data)
  stats = {} if norm == 'none' else {'dataset': norm}
  if name == 'none' or (name in ('cifar', 'cifar_cutout', 'cifar_mixup') and norm == 'none'):
    if name != 'none':
      raise ValueError(f'augment={name!r} needs config.normalize (cifar10 | cifar100 | imagenet)')
    pre = aug.make_preprocess('cifar', **stats) if stats else aug.to_float
    return on_inputs(lambda rng, x: pre(x)), pre
  if name == 'cifar_mixup':
    base = aug.make_augment('cifar', **stats)

    def mixup(rng, batch):
      k1, k2 = jax.random.split(rng)
      return _mixup_valid(k2, {**batch, 'x': base(k1, batch['x'])}, num_classes)
    return Transform(mixup), aug.make_preprocess('cifar', **stats)
  return on_inputs(aug.make_augment(name, **stats)), aug.make_preprocess(name, **stats)


__all__ = ['make_transforms']
