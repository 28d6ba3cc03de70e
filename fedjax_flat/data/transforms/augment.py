"""On-device data augmentation: pure, jit-compatible functions on image batches, random per example.

Every function takes a batch `x` of shape [B, H, W, C] (float32, values in [0, 1] before `normalize`; integer
images are converted by `to_float`) and, when random, an explicit PRNG key; example b gets its own draw.
All shapes are static (no data-dependent shapes), so the functions run under `jax.jit`, inside `lax.scan`
loops over local steps, and under `jax.vmap` over a client axis (one key per client).

Pipelines (digest sections 2.4, 2.5 and 3.1):
  'cifar'         RandomCrop 32 with zero padding 4, horizontal flip p=0.5, normalize with the dataset's
                  mean/std (FedSAM code constants below). Evaluation: normalize only.
  'cifar_cutout'  'cifar' then Cutout (DeVries & Taylor 2017; applied after normalization, as their code, so
                  the square holds zeros = the dataset mean). Size: 16 for CIFAR10, 8 for CIFAR100 (thesis,
                  Table A.1 notes; the FedSAM code hard-codes 16 for both, [U]); override with size=.
  'landmarks'     ImageNet-style random-resized-crop to 224 (scale (0.08, 1), ratio (3/4, 4/3)), horizontal
                  flip, normalize with the ImageNet mean/std. Evaluation: centre crop with crop_padding 32
                  (the Flax ImageNet pipeline's 224/256 crop) resized to 224, normalize.
  'none'          no augmentation (integer images are still scaled to [0, 1]).
  segmentation    `make_seg_augment` (image + label-map pairs: style transfer, random scale + crop, flip,
                  jitter, normalize; FedDrive) and `make_seg_preprocess`: see the section at the end.
The CIFAR pipelines need the dataset's statistics: pass dataset='cifar10'|'cifar100' (or mean=, std=), or use
the aliases 'cifar10', 'cifar100', 'cifar10_cutout', 'cifar100_cutout'.

MixUp (Zhang et al. 2018; thesis: alpha = 1, so lambda ~ U(0, 1)) changes the labels too, so it is not an
input transform: `make_label_augment('mixup', alpha=1.0)` returns fn(rng, x, y) -> (x_mixed, y_soft), to be
applied after `make_augment(...)` (mixing the augmented, normalized batch, as the usual MixUp code).
Train with the soft-label cross-entropy, -sum(y_soft * log_softmax(logits)), which equals the reference's
lam * CE(y_a) + (1 - lam) * CE(y_b). One lambda per batch, a random permutation within the batch, as the
reference implementation.

Random-resized-crop follows torchvision's `RandomResizedCrop.get_params` (10 attempts of area/log-ratio
sampling with integer-rounded boxes, else a centre crop clamped to the ratio range), vectorized: the first
valid attempt is selected with argmax instead of a Python loop. The Flax pipeline the thesis used samples with
`tf.image.sample_distorted_bounding_box` (same ranges, 10 attempts, min_object_covered 0.1, fallback to the
centre crop); the box distributions differ only in these edge rules. The crop is resized with
`jax.image.scale_and_translate` (bilinear, antialiased when shrinking, as `jax.image.resize`); the Flax
pipeline uses bicubic (pass method='cubic').
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from fedjax_flat.data.transforms import style_transfer
from fedjax_flat.data.transforms.transform import Transform

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FEDDRIVE_MEAN = (0.5, 0.5, 0.5)   # FedDrive release (Cityscapes and IDDA): x / 255, then (x - 0.5) / 0.5
FEDDRIVE_STD = (0.5, 0.5, 0.5)

STATS = {
    'cifar10': (CIFAR10_MEAN, CIFAR10_STD),
    'cifar100': (CIFAR100_MEAN, CIFAR100_STD),
    'imagenet': (IMAGENET_MEAN, IMAGENET_STD),
    'landmarks': (IMAGENET_MEAN, IMAGENET_STD),
    'feddrive': (FEDDRIVE_MEAN, FEDDRIVE_STD),
}

# Cutout side per dataset (thesis Table A.1 notes).
CUTOUT_SIZE = {'cifar10': 16, 'cifar100': 8}


def _check_batch(x):
  if x.ndim != 4:
    raise ValueError(f'expected a batch [B, H, W, C], got shape {x.shape}; vmap for more leading axes')


def to_float(x):
  """8-bit images (uint8 0..255) -> float32 in [0, 1]; anything else unchanged (float images; int16/int32
  token ids of the language datasets must reach the model as ids)."""
  if x.dtype == jnp.uint8:
    return x.astype(jnp.float32) / 255.0
  return x


def normalize(x, mean: Sequence[float], std: Sequence[float]):
  """(x - mean) / std per channel."""
  mean = jnp.asarray(mean, x.dtype)
  std = jnp.asarray(std, x.dtype)
  return (x - mean) / std


# ------------------------------------------------------------------------------------------------ crop / flip

def sample_crop_offsets(rng, batch_size: int, padding: int):
  """The per-example (row, col) offsets of `random_crop`, int32 [B, 2], uniform in [0, 2 * padding]."""
  return jax.random.randint(rng, (batch_size, 2), 0, 2 * padding + 1)


def random_crop(rng, x, padding: int = 4):
  """Zero-pads H and W by `padding` and crops back to H x W at a random offset per example."""
  _check_batch(x)
  b, h, w, c = x.shape
  if padding == 0:
    return x
  offsets = sample_crop_offsets(rng, b, padding)
  xp = jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  zero = jnp.zeros((), offsets.dtype)

  def crop(img, off):
    return jax.lax.dynamic_slice(img, (off[0], off[1], zero), (h, w, c))
  return jax.vmap(crop)(xp, offsets)


def random_flip(rng, x):
  """Horizontal flip (along W) of each example with probability 0.5."""
  _check_batch(x)
  flip = jax.random.bernoulli(rng, 0.5, (x.shape[0],))
  return jnp.where(flip[:, None, None, None], x[:, :, ::-1, :], x)


# ------------------------------------------------------------------------------------------------ cutout

def sample_cutout_centers(rng, batch_size: int, height: int, width: int):
  """Cutout centres, int32 [B, 2]: row uniform in [0, H), column uniform in [0, W)."""
  ky, kx = jax.random.split(rng)
  cy = jax.random.randint(ky, (batch_size,), 0, height)
  cx = jax.random.randint(kx, (batch_size,), 0, width)
  return jnp.stack([cy, cx], axis=1)


def cutout(rng, x, size: int):
  """Zeroes one size x size square per example (all channels); centre uniform over the image.

  Rows [cy - size//2, cy - size//2 + size) and likewise for columns, clipped at the borders (DeVries & Taylor:
  the square may be partly outside the image). For even sizes this is exactly their box.
  """
  _check_batch(x)
  b, h, w, _ = x.shape
  centers = sample_cutout_centers(rng, b, h, w)
  y0 = centers[:, 0] - size // 2
  x0 = centers[:, 1] - size // 2
  rows = jnp.arange(h)
  cols = jnp.arange(w)
  in_y = (rows[None, :] >= y0[:, None]) & (rows[None, :] < (y0 + size)[:, None])   # [B, H]
  in_x = (cols[None, :] >= x0[:, None]) & (cols[None, :] < (x0 + size)[:, None])   # [B, W]
  hole = in_y[:, :, None] & in_x[:, None, :]                                        # [B, H, W]
  return jnp.where(hole[..., None], jnp.zeros((), x.dtype), x)


# ------------------------------------------------------------------------------------------------ mixup

def sample_mixup_params(rng, batch_size: int, alpha: float = 1.0):
  """(lam, perm) of `mixup`: lam ~ Beta(alpha, alpha) (1 if alpha <= 0), perm a permutation of the batch."""
  kl, kp = jax.random.split(rng)
  if alpha == 1.0:
    lam = jax.random.uniform(kl)          # Beta(1, 1) is U(0, 1); skips the gamma sampler's compile
  elif alpha > 0:
    lam = jax.random.beta(kl, alpha, alpha)
  else:
    lam = jnp.ones((), jnp.float32)
  perm = jax.random.permutation(kp, batch_size)
  return lam, perm


def mixup(rng, x, y_onehot, alpha: float = 1.0):
  """MixUp: x_mix = lam x + (1 - lam) x[perm], y_mix = lam y + (1 - lam) y[perm]. Returns (x_mix, y_mix)."""
  lam, perm = sample_mixup_params(rng, x.shape[0], alpha)
  lx = lam.astype(x.dtype)
  ly = lam.astype(y_onehot.dtype)
  return lx * x + (1 - lx) * x[perm], ly * y_onehot + (1 - ly) * y_onehot[perm]


# -------------------------------------------------------------------------------------------- resized crop

def sample_resized_crop_boxes(rng, batch_size: int, height: int, width: int,
                              scale: Tuple[float, float] = (0.08, 1.0),
                              ratio: Tuple[float, float] = (3 / 4, 4 / 3), attempts: int = 10):
  """Boxes (top, left, h, w), int32 [B, 4], drawn as torchvision's `RandomResizedCrop.get_params`."""
  k_area, k_ratio, k_pos = jax.random.split(rng, 3)
  area = height * width
  target = area * jax.random.uniform(k_area, (batch_size, attempts), minval=scale[0], maxval=scale[1])
  log_r = jax.random.uniform(k_ratio, (batch_size, attempts), minval=math.log(ratio[0]),
                             maxval=math.log(ratio[1]))
  aspect = jnp.exp(log_r)
  ws = jnp.round(jnp.sqrt(target * aspect)).astype(jnp.int32)
  hs = jnp.round(jnp.sqrt(target / aspect)).astype(jnp.int32)
  valid = (ws > 0) & (ws <= width) & (hs > 0) & (hs <= height)
  first = jnp.argmax(valid, axis=1)
  any_valid = jnp.any(valid, axis=1)
  take = lambda a: jnp.take_along_axis(a, first[:, None], axis=1)[:, 0]
  h, w = take(hs), take(ws)
  # Fallback: the whole image, clamped to the ratio range (static: depends only on H, W).
  in_ratio = width / height
  if in_ratio < min(ratio):
    fw, fh = width, int(round(width / min(ratio)))
  elif in_ratio > max(ratio):
    fh, fw = height, int(round(height * max(ratio)))
  else:
    fw, fh = width, height
  h = jnp.where(any_valid, h, fh)
  w = jnp.where(any_valid, w, fw)
  u = jax.random.uniform(k_pos, (batch_size, 2))
  top = jnp.floor(u[:, 0] * (height - h + 1)).astype(jnp.int32)
  left = jnp.floor(u[:, 1] * (width - w + 1)).astype(jnp.int32)
  top = jnp.where(any_valid, jnp.minimum(top, height - h), (height - fh) // 2)
  left = jnp.where(any_valid, jnp.minimum(left, width - w), (width - fw) // 2)
  return jnp.stack([top, left, h, w], axis=1)


def crop_and_resize(x, boxes, out_size, method: str = 'linear', antialias: bool = True):
  """Resamples box b = (top, left, h, w) of example b to out_size (int or (oh, ow)); static output shape."""
  _check_batch(x)
  oh, ow = (out_size, out_size) if isinstance(out_size, int) else tuple(out_size)
  c = x.shape[-1]
  boxes = boxes.astype(jnp.float32)

  def one(img, box):
    top, left, h, w = box[0], box[1], box[2], box[3]
    sy, sx = oh / h, ow / w
    return jax.image.scale_and_translate(
        img, (oh, ow, c), (0, 1), jnp.stack([sy, sx]), jnp.stack([-top * sy, -left * sx]),
        method=method, antialias=antialias)
  return jax.vmap(one)(x, boxes).astype(x.dtype)


def random_resized_crop(rng, x, out_size, scale: Tuple[float, float] = (0.08, 1.0),
                        ratio: Tuple[float, float] = (3 / 4, 4 / 3), method: str = 'linear'):
  """ImageNet-style random-resized-crop of each example to out_size x out_size (see module docstring)."""
  _check_batch(x)
  b, h, w, _ = x.shape
  boxes = sample_resized_crop_boxes(rng, b, h, w, scale, ratio)
  return crop_and_resize(x, boxes, out_size, method)


def center_crop_resize(x, out_size: int, crop_padding: int = 32, method: str = 'linear'):
  """Evaluation crop of the Flax ImageNet pipeline: the central (out/(out+crop_padding)) * min(H, W) square,
  resized to out_size. crop_padding=0 only resizes (a no-op for a square image already at out_size)."""
  _check_batch(x)
  b, h, w, _ = x.shape
  side = int((out_size / (out_size + crop_padding)) * min(h, w))
  top, left = (h - side + 1) // 2, (w - side + 1) // 2
  if side == out_size:
    return x[:, top:top + side, left:left + side, :]
  box = jnp.tile(jnp.array([[top, left, side, side]], jnp.int32), (b, 1))
  return crop_and_resize(x, box, out_size, method)


# ------------------------------------------------------------------------------------------------ factories

AugmentFn = Callable  # fn(rng, x) -> x
PreprocessFn = Callable  # fn(x) -> x

_ALIASES = {
    'cifar10': ('cifar', 'cifar10'), 'cifar100': ('cifar', 'cifar100'),
    'cifar10_cutout': ('cifar_cutout', 'cifar10'), 'cifar100_cutout': ('cifar_cutout', 'cifar100'),
}
NAMES = ('none', 'cifar', 'cifar_cutout', 'landmarks') + tuple(_ALIASES)


def _resolve(name: str, kw: dict) -> Tuple[str, dict]:
  kw = dict(kw)
  if name in _ALIASES:
    name, ds = _ALIASES[name]
    kw.setdefault('dataset', ds)
  if name not in ('none', 'cifar', 'cifar_cutout', 'landmarks'):
    raise ValueError(f'augmentation {name!r} is unknown; allowed: {NAMES}')
  return name, kw


def _stats(name: str, kw: dict) -> Tuple[Sequence[float], Sequence[float]]:
  if 'mean' in kw or 'std' in kw:
    if 'mean' not in kw or 'std' not in kw:
      raise ValueError('pass both mean= and std=')
    return kw['mean'], kw['std']
  dataset = kw.get('dataset', 'imagenet' if name == 'landmarks' else None)
  if dataset is None:
    raise ValueError(f"{name!r} needs dataset='cifar10'|'cifar100' (or mean=, std=) for normalization")
  if dataset not in STATS:
    raise ValueError(f'dataset={dataset!r} has no stored statistics; allowed: {sorted(STATS)}')
  return STATS[dataset]


def _unknown(kw: dict, allowed: Sequence[str]):
  extra = sorted(set(kw) - set(allowed))
  if extra:
    raise ValueError(f'unknown options {extra}; allowed: {sorted(allowed)}')


def make_augment(name: str, **kw) -> AugmentFn:
  """Training-time input augmentation `fn(rng, x) -> x` for a batch [B, H, W, C].

  Options: 'cifar': dataset | mean+std, padding=4. 'cifar_cutout': the same plus size (default by dataset:
  16 CIFAR10, 8 CIFAR100). 'landmarks': out_size=224, scale=(0.08, 1), ratio=(3/4, 4/3), method='linear',
  dataset | mean+std (default ImageNet). 'none': no options.
  """
  name, kw = _resolve(name, kw)
  if name == 'none':
    _unknown(kw, ())
    return lambda rng, x: to_float(x)

  if name in ('cifar', 'cifar_cutout'):
    allowed = ['dataset', 'mean', 'std', 'padding'] + (['size'] if name == 'cifar_cutout' else [])
    _unknown(kw, allowed)
    mean, std = _stats(name, kw)
    padding = kw.get('padding', 4)
    size = None
    if name == 'cifar_cutout':
      size = kw.get('size', CUTOUT_SIZE.get(kw.get('dataset')))
      if size is None:
        raise ValueError("'cifar_cutout' needs size= when dataset is not 'cifar10'/'cifar100'")

    def cifar(rng, x):
      k_crop, k_flip, k_cut = jax.random.split(rng, 3)
      x = to_float(x)
      x = random_flip(k_flip, random_crop(k_crop, x, padding))
      x = normalize(x, mean, std)
      if size is not None:
        x = cutout(k_cut, x, size)
      return x
    return cifar

  # landmarks
  _unknown(kw, ['dataset', 'mean', 'std', 'out_size', 'scale', 'ratio', 'method'])
  mean, std = _stats(name, kw)
  out_size = kw.get('out_size', 224)
  scale = tuple(kw.get('scale', (0.08, 1.0)))
  ratio = tuple(kw.get('ratio', (3 / 4, 4 / 3)))
  method = kw.get('method', 'linear')

  def landmarks(rng, x):
    k_crop, k_flip = jax.random.split(rng)
    x = random_resized_crop(k_crop, to_float(x), out_size, scale, ratio, method)
    return normalize(random_flip(k_flip, x), mean, std)
  return landmarks


def make_preprocess(name: str, **kw) -> PreprocessFn:
  """Evaluation-time deterministic preprocessing `fn(x) -> x` matching `make_augment(name, **kw)`.

  'none': to_float. 'cifar', 'cifar_cutout' (and aliases): normalize only. 'landmarks': centre crop
  (crop_padding=32) resized to out_size=224, then normalize (crop_padding=0: resize only).
  """
  name, kw = _resolve(name, kw)
  if name == 'none':
    _unknown(kw, ())
    return to_float
  if name in ('cifar', 'cifar_cutout'):
    _unknown(kw, ['dataset', 'mean', 'std', 'padding', 'size'])  # train-only options are accepted
    mean, std = _stats(name, kw)
    return lambda x: normalize(to_float(x), mean, std)
  _unknown(kw, ['dataset', 'mean', 'std', 'out_size', 'scale', 'ratio', 'method', 'crop_padding'])
  mean, std = _stats(name, kw)
  out_size = kw.get('out_size', 224)
  crop_padding = kw.get('crop_padding', 32)
  method = kw.get('method', 'linear')
  return lambda x: normalize(center_crop_resize(to_float(x), out_size, crop_padding, method), mean, std)


def make_label_augment(name: str, *, alpha: float = 1.0,
                       num_classes: Optional[int] = None) -> Callable:
  """Augmentation that changes labels: `fn(rng, x, y) -> (x, y_soft)`.

  'mixup': MixUp with lambda ~ Beta(alpha, alpha) (thesis: alpha = 1). y is one-hot/soft [B, K], or integer
  [B] when num_classes is given. 'none': returns (x, y), one-hot encoded when num_classes is given.
  Apply after `make_augment`, and train with soft-label cross-entropy.
  """
  def onehot(y):
    if jnp.issubdtype(y.dtype, jnp.integer):
      if num_classes is None:
        raise ValueError('integer labels need num_classes= for a label augmentation')
      return jax.nn.one_hot(y, num_classes, dtype=jnp.float32)
    return y

  if name == 'none':
    return lambda rng, x, y: (x, onehot(y) if num_classes is not None else y)
  if name == 'mixup':
    return lambda rng, x, y: mixup(rng, x, onehot(y), alpha)
  raise ValueError(f"label augmentation {name!r} is unknown; allowed: 'none', 'mixup'")


# ------------------------------------------------------------------------------------------ segmentation
#
# Image + label-map pairs (FedDrive, thesis §2.7 / Table A.1). x [B, H, W, 3] in [0, 1], y [B, H, W] integer
# label maps with SEG_IGNORE = 255 for "no label". The geometric transform of each example is one map from
# output pixel (i, j) to a pixel of the *scaled* image, (i + off_y, j + off_x), and from there to the source
# pixel ((u + 0.5) / s - 0.5) (half-pixel centres): the image is sampled bilinearly (no antialiasing, as the
# release's cv2.resize INTER_LINEAR; edges replicated), the label map with nearest neighbour at the same
# centres (PIL's NEAREST; cv2's INTER_NEAREST drops the half-pixel offset, a sub-pixel difference). Output
# pixels outside the scaled image are padding: image 0, label 255. Shapes are static (crop size), so the
# functions run under jit, scan over local steps and vmap over clients.
#
#   'scale_crop'    the release's Cityscapes transform (transform_cv2.RandomResizedCrop): s ~ U[scale]; the
#                   image is resized to (ceil(H s), ceil(W s)); when smaller than the crop it is padded by
#                   (crop - size) // 2 + 1 on both sides; a crop at a uniform offset. Cityscapes: scale
#                   (0.5, 1.5), crop 512 x 1024.
#   'resized_crop'  the release's IDDA transform (torchvision-style RandomResizedCrop with scale = area
#                   fraction, ratio (3/4, 4/3), 10 attempts, then the centre fallback: see
#                   sample_resized_crop_boxes) resized to the crop. IDDA: scale (0.5, 2.0), crop 512 x 928
#                   (on images resized to 1024 x 1856 at load).

SEG_IGNORE = 255


def _check_pair(x, y):
  _check_batch(x)
  if y.shape != x.shape[:3]:
    raise ValueError(f'label maps {y.shape} do not match images {x.shape} ([B, H, W] for [B, H, W, C])')


def _bilinear_rows(img, src):
  """Rows of img [H, W, C] at fractional source rows src [n] (edges replicated) -> [n, W, C]."""
  h = img.shape[0]
  r0 = jnp.floor(src)
  w1 = (src - r0)[:, None, None].astype(img.dtype)
  i0 = jnp.clip(r0.astype(jnp.int32), 0, h - 1)
  i1 = jnp.clip(r0.astype(jnp.int32) + 1, 0, h - 1)
  return img[i0] * (1 - w1) + img[i1] * w1


def resample_pair(x, y, scale, offset, extent, out_size, ignore: int = SEG_IGNORE):
  """One example: x [H, W, C], y [H, W]; scale, offset, extent: (row, col) of the scaled image.

  Output pixel (i, j) takes scaled-image pixel (i + offset[0], j + offset[1]); pixels outside
  [0, extent) are padding (x 0, y `ignore`). Returns (x [oh, ow, C], y [oh, ow]).
  """
  oh, ow = out_size
  h, w = y.shape
  u = jnp.arange(oh, dtype=jnp.float32) + offset[0]
  v = jnp.arange(ow, dtype=jnp.float32) + offset[1]
  xr = _bilinear_rows(x, (u + 0.5) / scale[0] - 0.5)                                       # [oh, W, C]
  xo = jnp.swapaxes(_bilinear_rows(jnp.swapaxes(xr, 0, 1), (v + 0.5) / scale[1] - 0.5), 0, 1)  # [oh, ow, C]
  rows = jnp.clip(jnp.floor((u + 0.5) / scale[0]).astype(jnp.int32), 0, h - 1)
  cols = jnp.clip(jnp.floor((v + 0.5) / scale[1]).astype(jnp.int32), 0, w - 1)
  yo = y[rows][:, cols]
  inside = (((u >= 0) & (u < extent[0]))[:, None]) & (((v >= 0) & (v < extent[1]))[None, :])
  return (jnp.where(inside[..., None], xo, jnp.zeros((), xo.dtype)),
          jnp.where(inside, yo, jnp.asarray(ignore, y.dtype)))


def sample_scale_crop(rng, batch_size: int, height: int, width: int, crop: Tuple[int, int],
                      scale: Tuple[float, float]):
  """Per-example parameters of 'scale_crop': dict of scale, offset, extent ([B, 2] each, (row, col))."""
  k_s, k_off = jax.random.split(rng)
  s = jax.random.uniform(k_s, (batch_size,), minval=scale[0], maxval=scale[1])
  size_in = jnp.array([height, width], jnp.float32)
  crop_a = jnp.array(crop, jnp.float32)
  scaled = jnp.ceil(size_in[None, :] * s[:, None])                     # [B, 2] resized (H, W)
  pad = jnp.where(scaled < crop_a, jnp.floor((crop_a - scaled) / 2) + 1, 0.0)
  room = scaled + 2 * pad - crop_a                                      # >= 0
  start = jnp.floor(jax.random.uniform(k_off, (batch_size, 2)) * room)
  return {'scale': scaled / size_in[None, :], 'offset': start - pad, 'extent': scaled}


def sample_resized_crop_params(rng, batch_size: int, height: int, width: int, crop: Tuple[int, int],
                               scale: Tuple[float, float], ratio: Tuple[float, float] = (3 / 4, 4 / 3)):
  """Per-example parameters of 'resized_crop' (torchvision box resized to the crop), as sample_scale_crop."""
  boxes = sample_resized_crop_boxes(rng, batch_size, height, width, scale, ratio).astype(jnp.float32)
  s = jnp.array(crop, jnp.float32)[None, :] / boxes[:, 2:4]
  return {'scale': s, 'offset': boxes[:, 0:2] * s, 'extent': jnp.array([height, width], jnp.float32)[None] * s}


def random_scale_crop_pair(rng, x, y, crop: Tuple[int, int], scale: Tuple[float, float] = (0.5, 1.5),
                           mode: str = 'scale_crop', ratio: Tuple[float, float] = (3 / 4, 4 / 3)):
  """Random scale + crop of image/label pairs to `crop` = (h, w): (x [B, h, w, C], y [B, h, w])."""
  _check_pair(x, y)
  b, h, w, _ = x.shape
  if mode == 'scale_crop':
    p = sample_scale_crop(rng, b, h, w, crop, scale)
  elif mode == 'resized_crop':
    p = sample_resized_crop_params(rng, b, h, w, crop, scale, ratio)
  else:
    raise ValueError(f"mode={mode!r}; allowed: 'scale_crop', 'resized_crop'")
  return jax.vmap(lambda a, l, s, o, e: resample_pair(a, l, s, o, e, tuple(crop)))(
      x, y, p['scale'], p['offset'], p['extent'])


def random_flip_pair(rng, x, y):
  """The same horizontal flip (p = 0.5 per example) of images and label maps."""
  _check_pair(x, y)
  flip = jax.random.bernoulli(rng, 0.5, (x.shape[0],))
  return (jnp.where(flip[:, None, None, None], x[:, :, ::-1, :], x),
          jnp.where(flip[:, None, None], y[:, :, ::-1], y))


def color_jitter(rng, x, strength: float):
  """Brightness, contrast, saturation jitter, each factor ~ U[max(0, 1 - s), 1 + s] per example, in that
  order, clipped to [0, 1] after each (the release's cv2 ColorJitter: contrast pivots at 74/255,
  saturation mixes with the pixel's channel mean)."""
  _check_batch(x)
  lo, hi = max(0.0, 1.0 - strength), 1.0 + strength
  kb, kc, ks = jax.random.split(rng, 3)
  draw = lambda k: jax.random.uniform(k, (x.shape[0], 1, 1, 1), minval=lo, maxval=hi).astype(x.dtype)
  x = jnp.clip(x * draw(kb), 0.0, 1.0)
  pivot = jnp.asarray(74.0 / 255.0, x.dtype)
  x = jnp.clip(pivot + (x - pivot) * draw(kc), 0.0, 1.0)
  r = draw(ks)
  return jnp.clip(r * x + (1 - r) * jnp.mean(x, axis=-1, keepdims=True), 0.0, 1.0)


def resize_pair(x, y, size: Tuple[int, int]):
  """Deterministic resize of images (bilinear) and label maps (nearest) to size = (h, w): evaluation at a
  reduced resolution, or resizing predictions' references."""
  _check_pair(x, y)
  b, h, w, _ = x.shape
  s = jnp.array([size[0] / h, size[1] / w], jnp.float32)
  e = jnp.array(size, jnp.float32)
  return jax.vmap(lambda a, l: resample_pair(a, l, s, jnp.zeros(2), e, tuple(size)))(x, y)


def make_seg_augment(*, crop: Tuple[int, int], scale: Tuple[float, float] = (0.5, 1.5), mode: str = 'scale_crop',
                     ratio: Tuple[float, float] = (3 / 4, 4 / 3), flip: bool = True, jitter: float = 0.0,
                     mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5),
                     style=None, style_fraction: float = 0.5) -> Transform:
  """Training transform of a segmentation batch: a `Transform` (data/transforms/transform.py) `(rng, batch) -> batch`.

  Order as the FedDrive release: style transfer (CFSI / LAB on `style_fraction` of the valid examples, at the
  loaded resolution; data/transforms/style_transfer.py; `style` is a StyleBank or None) -> random scale + crop
  (`mode`) -> flip -> colour jitter (strength `jitter`, 0 = off) -> normalize. `batch['x']` uint8 or float in
  [0, 1] `[B, H, W, 3]`, `batch['y']` `[B, H, W]`; returns x float32 `[B, *crop, 3]`, y int32 `[B, *crop]` with 255
  in padded pixels. crop=None keeps the loaded size (no scale/crop).

  With a style bank it declares `needs_client`: the run's batches then carry 'client' (the step's client id,
  data/batching.BatchPlan.with_client) so that a client never receives its own style; the transform consumes
  that entry (the returned batch has none).
  """
  if mode not in ('scale_crop', 'resized_crop'):
    raise ValueError(f"mode={mode!r}; allowed: 'scale_crop', 'resized_crop'")
  entries = None if style is None else jnp.asarray(style.entries)

  def seg(rng, batch):
    k_style, k_geo, k_flip, k_jit = jax.random.split(rng, 4)
    x, y = to_float(batch['x']), batch['y']
    if style is not None:
      x = style_transfer.apply_style(k_style, x, batch['mask'], style, style_fraction,
                                     client=batch.get('client'), entries=entries)
    if crop is not None:
      x, y = random_scale_crop_pair(k_geo, x, y, tuple(crop), tuple(scale), mode, tuple(ratio))
    if flip:
      x, y = random_flip_pair(k_flip, x, y)
    if jitter:
      x = color_jitter(k_jit, x, jitter)
    out = {**batch, 'x': normalize(x, mean, std), 'y': y.astype(jnp.int32)}
    out.pop('client', None)
    return out
  return Transform(seg, needs_client=style is not None, style_bank=style)


def make_seg_preprocess(mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5)):
  """Evaluation transform of segmentation images `fn(x) -> x`: to [0, 1], normalize (labels untouched)."""
  return lambda x: normalize(to_float(x), mean, std)
