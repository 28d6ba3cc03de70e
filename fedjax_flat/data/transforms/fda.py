"""FDA styles for LADD / FFREEDA (thesis §5.3; Shenaj et al. 2023; FDA: Yang & Soatto 2020).

A client's *style* is the low-frequency window of the centred FFT amplitude spectrum of its images:

    A = fftshift(|FFT2(x)|)  per channel over H x W,   s(x) = A[c_h - b : c_h + b + 1, c_w - b : c_w + b + 1, :]

with (c_h, c_w) = (floor(H/2), floor(W/2)) and b = 1 (LADD's `fda_b`: a 3 x 3 window per channel, 27 numbers
for RGB). The client sends the mean of s over its images (the release: up to `n_images_per_style` = 1000 of
them) once; the server keeps the style bank {s_k} and never forwards it to other clients.

FDA amplitude swap (the server's source pre-training, release `StyleAugment._apply_style`): the window of the
image's own amplitude is REPLACED by a bank style and the image is rebuilt with its own phase,

    A'[win] = s,  x' = Re(IFFT2(ifftshift(A') e^{i P})),  clipped to the value range,

(CFSI in data/transforms/style_transfer.py interpolates a wider window instead). Differences from the release:
images are floats in [0, 1] here (the FFT is linear, so styles are the release's / 255 and the 8-bit rounding
of the restyled image is not applied); the release resizes every image to 1024 x 512 (bicubic) before the
FFT and back after the swap, here styles and swaps are computed at the size the images are loaded at (the
window is defined on the spectrum, so the styles of images of one size are comparable); the release flips
RGB to BGR first, which permutes the channels of the style vector and changes neither k-means nor the swap.

Communication: a style is (2b+1)^2 x C float32 per client (`style_bytes`), sent once (client -> server).
"""
from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

FDA_B = 1      # LADD release: fda_b = 1, a 3 x 3 window


def fda_window(height: int, width: int, b: int = FDA_B) -> Tuple[slice, slice]:
  """Rows and columns of the (2b+1) x (2b+1) window at the centre of the fftshift-ed spectrum."""
  if b < 0 or 2 * b + 1 > min(height, width):
    raise ValueError(f'fda b={b} needs a window of {2 * b + 1} inside the {height} x {width} spectrum')
  ch, cw = height // 2, width // 2
  return slice(ch - b, ch + b + 1), slice(cw - b, cw + b + 1)


def extract_styles(x, b: int = FDA_B):
  """Per-image styles: x [N, H, W, C] (floats) -> [N, 2b+1, 2b+1, C] centred amplitude windows."""
  rows, cols = fda_window(x.shape[1], x.shape[2], b)
  amp = jnp.abs(jnp.fft.fft2(jnp.asarray(x, jnp.float32), axes=(1, 2)))
  return jnp.fft.fftshift(amp, axes=(1, 2))[:, rows, cols, :]


def to_unit(x):
  """uint8 images -> floats in [0, 1]; floats unchanged (as float32)."""
  x = jnp.asarray(x)
  return x.astype(jnp.float32) / 255.0 if jnp.issubdtype(x.dtype, jnp.integer) else x.astype(jnp.float32)


def client_styles(data, b: int = FDA_B, max_images: int = 1000, batch_size: int = 16) -> np.ndarray:
  """Every training client's style (mean over its first `max_images` images): [K, 2b+1, 2b+1, C] float32.

  `data`: anything with `num_clients` and `client_examples(k) -> (x, y)` (FederatedDataset, ClientDataSource);
  y is never read (the clients are unlabelled). The images are taken in stored order, as the release's loader
  (`n_images_per_style`); one client in memory at a time (the next ones decoding ahead when the data have
  `prefetch_clients`)."""
  fn = jax.jit(lambda x: extract_styles(to_unit(x), b))
  out = []
  ids = range(int(data.num_clients))
  # files (SegmentationSource): the next clients decode on its thread pool while this one's styles are computed
  clients = data.prefetch_clients(ids) if hasattr(data, 'prefetch_clients') else (
      (k, data.client_examples(k)) for k in ids)
  for k, (x, _) in clients:
    x = np.asarray(x)[:max_images]
    if len(x) == 0:
      raise ValueError(f'client {k} has no images: it has no style')
    parts = []
    for lo in range(0, len(x), batch_size):
      chunk = x[lo:lo + batch_size]
      pad = batch_size - len(chunk)
      if pad:        # one compiled shape
        chunk = np.concatenate([chunk, np.zeros((pad,) + chunk.shape[1:], chunk.dtype)])
      parts.append(np.asarray(fn(chunk))[:batch_size - pad])
    out.append(np.concatenate(parts).mean(axis=0))
  return np.stack(out).astype(np.float32)


def style_bytes(styles: np.ndarray) -> int:
  """Bytes one client uploads: its style (float32)."""
  return int(np.prod(np.shape(styles)[1:])) * 4


def fda_swap(x, style, b: int = FDA_B, lo: float = 0.0, hi: float = 1.0):
  """One image x [H, W, C] with its amplitude window replaced by `style` [2b+1, 2b+1, C], clipped to [lo, hi]."""
  rows, cols = fda_window(x.shape[0], x.shape[1], b)
  spec = jnp.fft.fft2(x.astype(jnp.float32), axes=(0, 1))
  amp, phase = jnp.abs(spec), jnp.angle(spec)
  amp = jnp.fft.fftshift(amp, axes=(0, 1)).at[rows, cols, :].set(style.astype(jnp.float32))
  amp = jnp.fft.ifftshift(amp, axes=(0, 1))
  out = jnp.real(jnp.fft.ifft2(amp * jnp.exp(1j * phase), axes=(0, 1)))
  return jnp.clip(out, lo, hi).astype(x.dtype)


def restyle_batch(rng, x, styles, b: int = FDA_B):
  """Every image of x [B, H, W, C] in [0, 1] restyled with a uniformly drawn bank style (the release's
  `fda_inv` pre-training restyles every source image it loads). styles: [M, 2b+1, 2b+1, C]."""
  idx = jax.random.randint(rng, (x.shape[0],), 0, styles.shape[0])
  return jax.vmap(lambda a, s: fda_swap(a, s, b))(x, jnp.asarray(styles)[idx])
