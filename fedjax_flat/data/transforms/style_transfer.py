"""Style-transfer domain generalization for federated segmentation: CFSI and LAB (FedDrive, thesis §6.2.2).

Both methods restyle **half of each client's data** with the statistics of *other* clients' images, drawn
from a bank that the clients share once before training (a side-channel message beyond model weights; its
size is `StyleBank.upload_bytes` per client and `StyleBank.nbytes` in total, for the communication
accounting).

CFSI (Continuous Frequency Space Interpolation, FedDG, Liu et al. 2021). Bank: the FFT amplitude spectrum of
every training image. For an image x with spectrum F = A e^{iP} (per channel, over H x W), draw one bank
amplitude A_n and lambda ~ U[0, 1], and interpolate the *low-frequency window* of the centred amplitude:

    A'[win] = (1 - lambda) A[win] + lambda A_n[win],   x' = |IFFT(A' e^{iP})|,  clipped to the value range.

The window is the FedDrive release's (src/dataset/{cityscapes,idda}.py): centred at (floor(H/2), floor(W/2))
of the fftshift-ed spectrum, rows [c_h - h_l, c_h + h_l] with h_l = floor(window * H) (likewise columns),
window = 0.05. Outside the window the amplitude is the image's own, so the bank stores only the window
((2 h_l + 1) x (2 w_l + 1) x 3 floats per image): the result is identical to storing whole spectra, and
the message size counts what a client really needs to send. Differences from the release: images are in
[0, 1] here (the FFT is linear, so the result is the release's / 255), and the output is clipped to [0, 1]
where the release casts to uint8 (which wraps values above 255).

LAB (LAB-based image translation, thesis eq. 6.1). Bank: the per-image, per-channel mean and std in CIE
L*a*b*. An image is converted to LAB, x_hat = (x - mu_S) / sigma_S * sigma_T + mu_T with (mu_T, sigma_T)
one random bank entry, clipped to the LAB box the release's 8-bit OpenCV images can hold (L in [0, 100],
a, b in [-128, 127]), and converted back to RGB (clipped to [0, 1]). The release works on OpenCV's 8-bit LAB
(L * 255 / 100, a + 128, b + 128): the transfer is invariant to that per-channel affine map, so only the
8-bit rounding differs. sigma_S is floored at 1e-6 (a flat channel becomes mu_T instead of NaN).

RGB <-> LAB here: sRGB (IEC 61966-2-1 transfer curve) -> linear RGB -> XYZ (sRGB primaries, D65) ->
CIE 1976 L*a*b* with the D65 white (0.95047, 1, 1.08883), as OpenCV's float conversion. Tested against an
independent numpy implementation (tests/data/transforms/test_style_transfer.py).

Resolution: statistics and transfers are computed on the images as loaded (after `image_size`), i.e. the
images the augmentation sees before scale/crop; the release computes them at the native resolution (IDDA:
1080 x 1920, resized to 1024 x 1856 after the transfer), a difference in the CFSI window of a few rows.

Bank size: LAB 24 bytes per image; CFSI (2 h_l + 1)(2 w_l + 1) x 3 x 4 bytes per image, e.g. 253 KB at
1024 x 2048 (Cityscapes: 0.75 GB for 2,975 images; `max_per_client` caps it). The bank is a constant of the
round program: for large banks run with JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS=True so XLA receives it as an
argument instead of embedding it in the HLO (data/transforms/pipeline.py warns above 64 MB).

Which images: each step restyles exactly round(fraction * n_valid) of the batch's valid examples, a random
subset (keyed by the step key). Batches are reshuffled every epoch, so over training every image is
restyled about half of the time; the release restyles the images at even positions of each client's list
every time they are loaded. Bank entries are drawn uniformly; when the batch carries its client id
(`batch['client']`, a scalar) the client's own entries are excluded. The training loop's batches carry it
whenever a bank is used (the transform's `needs_client` -> data/batching.BatchPlan.with_client; host, device,
streamed and chain paths), so in training a client never receives its own style. The release keeps the own client's
entries on Cityscapes and excludes the entries of the same town and weather on IDDA.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

STYLES = ('none', 'cfsi', 'lab')
CFSI_WINDOW = 0.05          # FedDrive release: alpha = 0.05 of H and W

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------- RGB <-> LAB

# sRGB primaries with the D65 white point (IEC 61966-2-1), and the D65 reference white.
_RGB2XYZ = np.array([[0.4124564, 0.3575761, 0.1804375],
                     [0.2126729, 0.7151522, 0.0721750],
                     [0.0193339, 0.1191920, 0.9503041]], np.float64)
_XYZ2RGB = np.linalg.inv(_RGB2XYZ)
D65_WHITE = (0.95047, 1.0, 1.08883)
_DELTA = 6.0 / 29.0
LAB_MIN = (0.0, -128.0, -128.0)     # what an 8-bit OpenCV LAB image can hold
LAB_MAX = (100.0, 127.0, 127.0)


def _srgb_to_linear(c):
  return jnp.where(c <= 0.04045, c / 12.92, ((jnp.maximum(c, 0.04045) + 0.055) / 1.055) ** 2.4)


def _linear_to_srgb(c):
  return jnp.where(c <= 0.0031308, 12.92 * c, 1.055 * jnp.maximum(c, 0.0031308) ** (1 / 2.4) - 0.055)


def rgb_to_lab(rgb):
  """sRGB in [0, 1] (..., 3) -> CIE L*a*b* (..., 3): L in [0, 100], a and b about [-128, 127]."""
  lin = _srgb_to_linear(jnp.clip(rgb, 0.0, 1.0))
  xyz = lin @ jnp.asarray(_RGB2XYZ.T, lin.dtype) / jnp.asarray(D65_WHITE, lin.dtype)
  f = jnp.where(xyz > _DELTA ** 3, jnp.cbrt(jnp.maximum(xyz, _DELTA ** 3)), xyz / (3 * _DELTA ** 2) + 4 / 29)
  fx, fy, fz = f[..., 0], f[..., 1], f[..., 2]
  return jnp.stack([116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)], axis=-1)


def lab_to_rgb(lab):
  """CIE L*a*b* (..., 3) -> sRGB clipped to [0, 1] (out-of-gamut colours are clipped per channel)."""
  fy = (lab[..., 0] + 16) / 116
  f = jnp.stack([fy + lab[..., 1] / 500, fy, fy - lab[..., 2] / 200], axis=-1)
  xyz = jnp.where(f > _DELTA, f ** 3, 3 * _DELTA ** 2 * (f - 4 / 29)) * jnp.asarray(D65_WHITE, lab.dtype)
  lin = xyz @ jnp.asarray(_XYZ2RGB.T, lab.dtype)
  return jnp.clip(_linear_to_srgb(jnp.clip(lin, 0.0, 1.0)), 0.0, 1.0)


# ------------------------------------------------------------------------------------------ statistics

def lab_moments(x):
  """Per-image, per-channel LAB mean and std: x [B, H, W, 3] in [0, 1] -> [B, 2, 3] (mean row, std row)."""
  lab = rgb_to_lab(x)
  return jnp.stack([jnp.mean(lab, axis=(1, 2)), jnp.std(lab, axis=(1, 2))], axis=1)


def cfsi_window(height: int, width: int, window: float = CFSI_WINDOW) -> Tuple[slice, slice]:
  """The low-frequency window of the fftshift-ed spectrum (rows, cols), as the FedDrive release."""
  hl, wl = int(math.floor(height * window)), int(math.floor(width * window))
  ch, cw = height // 2, width // 2
  return slice(ch - hl, ch + hl + 1), slice(cw - wl, cw + wl + 1)


def amplitude_window(x, window: float = CFSI_WINDOW):
  """Centred FFT amplitude inside the CFSI window: x [B, H, W, C] -> [B, 2h_l+1, 2w_l+1, C]."""
  rows, cols = cfsi_window(x.shape[1], x.shape[2], window)
  amp = jnp.abs(jnp.fft.fft2(x.astype(jnp.float32), axes=(1, 2)))
  return jnp.fft.fftshift(amp, axes=(1, 2))[:, rows, cols, :]


# ------------------------------------------------------------------------------------------ transfers

def cfsi(x, amp_target, lam, window: float = CFSI_WINDOW):
  """CFSI of one image: x [H, W, C] in [0, 1], amp_target [2h_l+1, 2w_l+1, C], lam scalar -> [H, W, C]."""
  rows, cols = cfsi_window(x.shape[0], x.shape[1], window)
  spec = jnp.fft.fft2(x.astype(jnp.float32), axes=(0, 1))
  amp, phase = jnp.abs(spec), jnp.angle(spec)
  amp = jnp.fft.fftshift(amp, axes=(0, 1))
  amp = amp.at[rows, cols, :].set((1 - lam) * amp[rows, cols, :] + lam * amp_target)
  amp = jnp.fft.ifftshift(amp, axes=(0, 1))
  out = jnp.abs(jnp.fft.ifft2(amp * jnp.exp(1j * phase), axes=(0, 1)))
  return jnp.clip(out, 0.0, 1.0).astype(x.dtype)


def lab_transfer(x, moments_target, eps: float = 1e-6):
  """LAB transfer of one image: x [H, W, 3] in [0, 1], moments_target [2, 3] (mu_T, sigma_T) -> [H, W, 3]."""
  lab = rgb_to_lab(x)
  mu_s, sd_s = jnp.mean(lab, axis=(0, 1)), jnp.std(lab, axis=(0, 1))
  out = (lab - mu_s) / jnp.maximum(sd_s, eps) * moments_target[1] + moments_target[0]
  out = jnp.clip(out, jnp.asarray(LAB_MIN, out.dtype), jnp.asarray(LAB_MAX, out.dtype))
  return lab_to_rgb(out).astype(x.dtype)


# ------------------------------------------------------------------------------------------ the bank

@dataclasses.dataclass(frozen=True)
class StyleBank:
  """Per-image style statistics of the training clients, shared once before training.

  entries: [M, ...] float32 (cfsi: amplitude windows [M, 2h_l+1, 2w_l+1, C]; lab: moments [M, 2, 3]).
  owners: [M] int32, the training client each entry came from.
  image_shape: (H, W) the statistics were computed at (CFSI windows depend on it).
  """
  kind: str
  entries: np.ndarray
  owners: np.ndarray
  num_clients: int
  image_shape: Tuple[int, int]
  window: float = CFSI_WINDOW

  def __post_init__(self):
    if self.kind not in ('cfsi', 'lab'):
      raise ValueError(f'style bank kind={self.kind!r}; allowed: cfsi, lab')
    if len(self.entries) != len(self.owners) or len(self.entries) == 0:
      raise ValueError(f'style bank has {len(self.entries)} entries for {len(self.owners)} owners')
    if self.owners.min() < 0 or self.owners.max() >= self.num_clients:
      raise ValueError('style bank owners outside [0, num_clients)')

  @property
  def entry_bytes(self) -> int:
    return int(np.prod(self.entries.shape[1:])) * self.entries.dtype.itemsize

  @property
  def upload_bytes(self) -> np.ndarray:
    """Bytes each training client sends to build the bank, [num_clients] int64 (its entries)."""
    return np.bincount(self.owners, minlength=self.num_clients).astype(np.int64) * self.entry_bytes

  @property
  def nbytes(self) -> int:
    """Bytes of the whole bank: what each client receives when the bank is broadcast."""
    return int(len(self.entries)) * self.entry_bytes

  def summary(self) -> dict:
    up = self.upload_bytes
    return {'kind': self.kind, 'entries': int(len(self.entries)), 'entry_bytes': self.entry_bytes,
            'total_bytes': self.nbytes, 'upload_bytes_mean': float(up.mean()), 'upload_bytes_max': int(up.max()),
            'image_shape': list(self.image_shape), 'window': self.window if self.kind == 'cfsi' else None}


def _stat_fn(kind: str, window: float):
  if kind == 'cfsi':
    return jax.jit(lambda x: amplitude_window(_to_unit(x), window))
  return jax.jit(lambda x: lab_moments(_to_unit(x)))


def _to_unit(x):
  return x.astype(jnp.float32) / 255.0 if jnp.issubdtype(x.dtype, jnp.integer) else x.astype(jnp.float32)


def build_style_bank(kind: str, data, *, window: float = CFSI_WINDOW, max_per_client: Optional[int] = None,
                     batch_size: int = 8, seed: int = 0, progress_every: int = 25) -> StyleBank:
  """Computes the bank from every training client's images (`data.client_examples(k)`).

  max_per_client: keep at most this many images per client (a random subset keyed by (seed, client)),
  bounding the message size; None keeps every image, as the release. Uses `data.prefetch_clients` when the
  source has it (decoding overlaps the statistics).
  """
  if kind not in ('cfsi', 'lab'):
    raise ValueError(f'style={kind!r}; allowed: cfsi, lab')
  fn = _stat_fn(kind, window)
  ids = range(data.num_clients)
  it = data.prefetch_clients(ids) if hasattr(data, 'prefetch_clients') else ((k, data.client_examples(k)) for k in ids)
  entries, owners = [], []
  shape = tuple(data.input_shape[:2])
  for n, (k, (x, _)) in enumerate(it, 1):
    if max_per_client is not None and len(x) > max_per_client:
      keep = np.sort(np.random.default_rng([seed, k]).permutation(len(x))[:max_per_client])
      x = x[keep]
    for lo in range(0, len(x), batch_size):
      chunk = np.asarray(x[lo:lo + batch_size])
      pad = batch_size - len(chunk)
      if pad:   # one compiled shape for every chunk
        chunk = np.concatenate([chunk, np.zeros((pad,) + chunk.shape[1:], chunk.dtype)])
      stats = np.asarray(fn(chunk))[:batch_size - pad]
      entries.append(stats.astype(np.float32))
      owners.append(np.full(len(stats), k, np.int32))
    if progress_every and n % progress_every == 0:
      log.info('style bank (%s): %d/%d clients', kind, n, data.num_clients)
  return StyleBank(kind=kind, entries=np.concatenate(entries), owners=np.concatenate(owners),
                   num_clients=int(data.num_clients), image_shape=shape, window=float(window))


def _subset_rank(rng, mask, fraction: float):
  """(rank [B], count): valid examples ranked first in random order; the first `count` are chosen."""
  valid = mask > 0
  count = jnp.floor(fraction * jnp.sum(valid) + 0.5).astype(jnp.int32)
  keys = jnp.where(valid, jax.random.uniform(rng, valid.shape), 2.0)
  return jnp.argsort(jnp.argsort(keys)), count


def select_subset(rng, mask, fraction: float):
  """Exactly round(fraction * n_valid) of the valid examples of a masked batch, a random subset: bool [B]."""
  rank, count = _subset_rank(rng, mask, fraction)
  return rank < count


def sample_entries(rng, bank_owners, batch_size: int, client=None):
  """Uniform bank entries [B] (int32), avoiding the client's own entries when `client` is given."""
  owners = jnp.asarray(bank_owners)
  g = jax.random.gumbel(rng, (batch_size, owners.shape[0]))
  if client is not None:
    own = owners[None, :] == jnp.asarray(client, owners.dtype)
    # A bank made of this client alone: fall back to every entry rather than to nothing.
    g = jnp.where(own & ~jnp.all(own, axis=1, keepdims=True), -jnp.inf, g)
  return jnp.argmax(g, axis=1).astype(jnp.int32)


def apply_style(rng, x, mask, bank: StyleBank, fraction: float = 0.5, client=None, entries=None):
  """Restyles a random `fraction` of the valid examples of a batch x [B, H, W, C] in [0, 1].

  `entries` (device copy of bank.entries) may be passed to avoid re-embedding the bank as a constant.
  """
  if tuple(x.shape[1:3]) != tuple(bank.image_shape):
    raise ValueError(f'images are {tuple(x.shape[1:3])} but the style bank was built at {bank.image_shape}; '
                     'build it from the same images the augmentation sees (before cropping)')
  b = x.shape[0]
  # At most k = round(fraction * B) examples are chosen (n_valid <= B): only k slots are transformed.
  k = min(b, int(math.floor(fraction * b + 0.5)))
  if k == 0:
    return x
  k_sel, k_idx, k_lam = jax.random.split(rng, 3)
  rank, count = _subset_rank(k_sel, mask, fraction)
  slots = jnp.argsort(rank)[:k]                 # the k lowest ranks hold every chosen example
  entries = jnp.asarray(bank.entries) if entries is None else entries
  target = entries[sample_entries(k_idx, bank.owners, k, client)]
  xs = x[slots]
  if bank.kind == 'cfsi':
    lam = jax.random.uniform(k_lam, (k,))
    styled = jax.vmap(lambda a, t, l: cfsi(a, t, l, bank.window))(xs, target, lam)
  else:
    styled = jax.vmap(lab_transfer)(xs, target)
  keep = (rank[slots] < count)[:, None, None, None]
  return x.at[slots].set(jnp.where(keep, styled, xs))
