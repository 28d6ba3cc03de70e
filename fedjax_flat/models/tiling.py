"""Evaluating a dense-prediction model on test images larger than its training crops.

`for_evaluation(model, mode, ...)` returns the same `Model` with an `apply` for evaluation
(config.segmentation.eval_mode):

  full       the whole image at once (FedDrive on Cityscapes: 1024x2048 test images, batch 1, on a GPU)
  downscale  the image resized by `scale` (bilinear; each side rounded to a multiple of `multiple`, 32 for
             BiSeNetV2), the logits then bilinearly upsampled to the label map by the task
             (tasks.resize_to_labels): FedDrive's `use_test_resize` on IDDA (inputs 512x928, logits x2)
  tiles      sliding windows of `tile` (default: the model's input size, i.e. the training crop) with
             `overlap` (fraction of a window shared with the next one; the last window of a row or column
             is aligned to the image border), the windows' softmax probabilities averaged per pixel
             (CoinCheung/BiSeNet's sliding evaluation) and returned as log-probabilities. The windows run
             through one `lax.map` (one compiled window program), so memory follows one window batch.
Training-mode calls pass through unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence, Tuple

import jax
import jax.numpy as jnp

EVAL_MODES = ('full', 'downscale', 'tiles')


def window_starts(size: int, window: int, overlap: float) -> Tuple[int, ...]:
  """Start offsets covering [0, size) with windows of `window`, stride window * (1 - overlap) (>= 1)."""
  if window >= size:
    return (0,)
  stride = max(1, int(window * (1.0 - overlap)))
  starts = list(range(0, size - window, stride)) + [size - window]
  return tuple(sorted(set(starts)))


def scaled_size(size: int, scale: float, multiple: int) -> int:
  return max(multiple, int(round(size * scale / multiple)) * multiple)


def for_evaluation(model, mode: str = 'full', *, scale: float = 0.5, tile: Sequence[int] = (0, 0),
                   overlap: float = 1 / 3, multiple: int = 32):
  if mode not in EVAL_MODES:
    raise ValueError(f'eval_mode={mode!r}; allowed: {EVAL_MODES}')
  if mode == 'full':
    return model
  inner = model.apply

  if mode == 'downscale':
    def apply(params, x, *, train=False, **kw):
      if train:
        return inner(params, x, train=train, **kw)
      b, h, w, c = x.shape
      hs, ws = scaled_size(h, scale, multiple), scaled_size(w, scale, multiple)
      return inner(params, jax.image.resize(x, (b, hs, ws, c), 'bilinear'), train=False, **kw)
    return dataclasses.replace(model, apply=apply)

  th, tw = (tuple(tile) if tile and tile[0] > 0 and tile[1] > 0 else tuple(model.input_shape[:2]))

  def apply(params, x, *, train=False, **kw):
    if train:
      return inner(params, x, train=train, **kw)
    h, w = x.shape[1], x.shape[2]
    if h <= th and w <= tw:
      return inner(params, x, train=False, **kw)
    ys, xs = window_starts(h, th, overlap), window_starts(w, tw, overlap)
    pos = [(i, j) for i in ys for j in xs]
    wins = jnp.stack([x[:, i:i + th, j:j + tw] for i, j in pos])          # [n, B, th, tw, C]
    probs = jax.lax.map(lambda xw: jax.nn.softmax(inner(params, xw, train=False, **kw).astype(jnp.float32)),
                        wins)
    total = jnp.zeros(x.shape[:3] + (probs.shape[-1],), jnp.float32)
    count = jnp.zeros((1, h, w, 1), jnp.float32)
    for n, (i, j) in enumerate(pos):
      total = total.at[:, i:i + th, j:j + tw].add(probs[n])
      count = count.at[:, i:i + th, j:j + tw].add(1.0)
    return jnp.log(jnp.maximum(total / count, 1e-12))

  return dataclasses.replace(model, apply=apply)
