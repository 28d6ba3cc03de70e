"""Segmentation figures: class palettes and predictions.png (test images, true and predicted masks).

Palettes: the Cityscapes one for 19 classes (its train-id colours), else the PASCAL VOC bit-interleaving
colour map (also used by FedDrive's `color_map` for other class sets); void (ignore_index) is black.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

CITYSCAPES = np.array([
    (128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156), (190, 153, 153), (153, 153, 153),
    (250, 170, 30), (220, 220, 0), (107, 142, 35), (152, 251, 152), (70, 130, 180), (220, 20, 60),
    (255, 0, 0), (0, 0, 142), (0, 0, 70), (0, 60, 100), (0, 80, 100), (0, 0, 230), (119, 11, 32)], np.uint8)


def voc_palette(n: int) -> np.ndarray:
  out = np.zeros((n, 3), np.uint8)
  for i in range(n):
    c, r, g, b = i + 1, 0, 0, 0       # +1: class 0 is not black (black is void here)
    for j in range(8):
      r |= ((c >> 0) & 1) << (7 - j)
      g |= ((c >> 1) & 1) << (7 - j)
      b |= ((c >> 2) & 1) << (7 - j)
      c >>= 3
    out[i] = (r, g, b)
  return out


def palette(num_classes: int) -> np.ndarray:
  return CITYSCAPES.copy() if num_classes == 19 else voc_palette(num_classes)


def colorize(labels: np.ndarray, num_classes: int) -> np.ndarray:
  """[H, W] class ids -> [H, W, 3] uint8; ids outside [0, num_classes) (void) black."""
  pal = palette(num_classes)
  labels = np.asarray(labels)
  ok = (labels >= 0) & (labels < num_classes)
  out = np.zeros(labels.shape + (3,), np.uint8)
  out[ok] = pal[labels[ok]]
  return out


def _display(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float32)
  if x.max() > 1.5:       # uint8-range pixels
    return np.clip(x / 255.0, 0, 1)
  lo, hi = float(x.min()), float(x.max())
  return (x - lo) / max(hi - lo, 1e-6)


def write_predictions(path: str, samples: Sequence, num_classes: int, title: str = '') -> None:
  """samples: [(group name, image [H, W, 3], true [H, W], predicted [H, W])] -> one row per sample."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  if not samples:
    return
  fig, axes = plt.subplots(len(samples), 3, figsize=(9, 2.6 * len(samples)), squeeze=False)
  for row, (name, img, true, pred) in enumerate(samples):
    for col, (arr, label) in enumerate(((_display(img), f'{name}: image'), (colorize(true, num_classes), 'true'),
                                        (colorize(pred, num_classes), 'predicted'))):
      ax = axes[row, col]
      ax.imshow(arr, interpolation='nearest')
      ax.set_title(label, fontsize=9)
      ax.axis('off')
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
