"""Fixed evaluation batches for Hessian / landscape analysis: stacked, padded and masked.

All analysis functions take a *stacked* batch dict

  {'x': [nb, B, ...], 'y': [nb, B] int32, 'mask': [nb, B] float32}

(mask = 0 marks padding) and compute exact example-weighted quantities over all valid examples: the loss is
sum(ce * mask) / sum(mask) over every batch, never a mean of batch means.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from fedjax_flat.data.batching import make_eval_batches


def make_fixed_batches(x, y, batch_size: int, *, max_examples: int | None = None) -> dict:
  """Splits (x, y) in order into `ceil(n / batch_size)` batches of `batch_size`; the last one is padded.

  Args:
    x: [n, ...] inputs (numpy or array-like).
    y: [n] integer labels.
    batch_size: examples per batch B.
    max_examples: keep only the first `max_examples` examples (a fixed subset; shuffle beforehand if the
      order is meaningful).

  Returns:
    {'x': [nb, B, ...] (x's dtype), 'y': [nb, B] int32, 'mask': [nb, B] float32}, numpy arrays. Padding
    examples are zeros with label 0 and mask 0.
  """
  x = np.asarray(x)
  y = np.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f'x has {x.shape[0]} examples but y has {y.shape[0]}')
  if batch_size <= 0:
    raise ValueError(f'batch_size={batch_size} must be positive')
  if max_examples is not None:
    x, y = x[:max_examples], y[:max_examples]
  if x.shape[0] == 0:
    raise ValueError('no examples')
  return make_eval_batches(x, y, batch_size)


def stack_batches(batches: Sequence[Mapping[str, np.ndarray]], batch_size: int | None = None) -> dict:
  """Stacks a list of (possibly unequal, possibly already masked) batches into one padded [nb, B, ...] dict.

  Each batch is {'x': [b, ...], 'y': [b]} with an optional 'mask': [b]; it is padded to `batch_size`
  (default: the largest b) with mask 0.
  """
  if not batches:
    raise ValueError('no batches')
  size = batch_size or max(int(np.shape(b['y'])[0]) for b in batches)
  xs, ys, ms = [], [], []
  for b in batches:
    bx, by = np.asarray(b['x']), np.asarray(b['y'])
    bm = np.asarray(b['mask'], np.float32) if 'mask' in b else np.ones(by.shape[0], np.float32)
    k = by.shape[0]
    if k > size:
      raise ValueError(f'a batch has {k} examples > batch_size={size}')
    px = np.zeros((size,) + bx.shape[1:], bx.dtype)
    py = np.zeros((size,) + by.shape[1:], np.int32)
    pm = np.zeros((size,), np.float32)
    px[:k], py[:k], pm[:k] = bx, by, bm
    xs.append(px), ys.append(py), ms.append(pm)
  return {'x': np.stack(xs), 'y': np.stack(ys), 'mask': np.stack(ms)}


def num_valid(batches: Mapping[str, np.ndarray]) -> int:
  """Number of valid (unmasked) examples in a stacked batch dict."""
  return int(round(float(np.sum(np.asarray(batches['mask'])))))
