"""Compressed uploads (`config.upload`): the transforms a client applies to its model delta before it is sent, as
pure functions of (vector, key, k or s), and the bytes each really sends (applied by
algorithms/wrappers/compress.py; bytes on the clock: training/plan.py).

The delta is flattened to ONE vector v of d float32 values (the whole model, as the papers compress the whole
update: Stich et al. 2018's top-k with memory and Alistarh et al. 2017's QSGD both act on the model's gradient
vector; QSGD's norms are per bucket of that vector, below):

    topk   C(v) = v on the k = max(1, round(fraction d)) largest |v_i| (ties: the lower index), 0 elsewhere.
                  Biased; error feedback (below) is its fix (Stich et al. 2018, "sparsified SGD with memory").
           sends k values x 4 bytes + their positions: min(4 k, ceil(d / 8)) bytes (k int32 indices, or a
           d-bit bitmap when that is smaller, i.e. k > d / 32)
    randk  C(v) = (d / k) v on k coordinates drawn uniformly without replacement (key: seed, round, client).
                  Unbiased: E C(v) = v (Stich et al. 2018; Wangni et al. 2018). With error feedback: v on the k
                  coordinates, UNSCALED (below).
           sends k values x 4 bytes + the 4-byte seed the server regenerates the coordinates from
    qsgd   buckets of n = QSGD_BUCKET consecutive coordinates (the last one shorter), each with its norm ||v_b||
           (Alistarh et al. 2017, section 3.1 and their experiments' bucket size 512): s = 2^bits - 1 levels,
                  C(v)_i = ||v_b|| sign(v_i) l_i / s,  l_i = floor(s |v_i| / ||v_b|| + u_i),  u_i ~ U[0, 1)
           (stochastic rounding between the two levels around s |v_i| / ||v_b||): unbiased, and per bucket
           E ||C(v_b) - v_b||^2 <= min(n / s^2, sqrt(n) / s) ||v_b||^2 (their Lemma 3.1).
           sends one float32 norm per bucket (4 bytes) + d x (bits + 1 sign) bits, packed: ceil(d (bits+1) / 8)

Error feedback (`upload.error_feedback`; Stich et al. 2018, Karimireddy et al. 2019): the client keeps the residual
e_k of what it did not send, p = Delta_k + e_k, sends C(p) and keeps e_k <- p - C(p). Over any number of rounds,
sum of what was sent + the last residual = sum of the deltas (nothing is lost, only delayed). The residual stays
bounded only if C is a contraction, E ||x - C(x)||^2 <= (1 - delta) ||x||^2 with delta > 0 (Stich et al. 2018,
"Sparsified SGD with memory", Definition 2.1): top-k (delta = k / d) and unscaled rand-k (E ||x - C(x)||^2 =
(1 - k / d) ||x||^2 exactly) are; the unbiased d / k rand-k is not (its E ||x - C(x)||^2 = (d / k - 1) ||x||^2,
each kept coordinate leaves (1 - d / k) x_i behind): with it the residual grew geometrically (issue 48: ~1,400
from deltas of norm ~0.9, NaN at round 17). So rand-k with error feedback sends v on the k coordinates unscaled.
QSGD is unbiased, not a contraction (its bound min(n / s^2, sqrt(n) / s) exceeds 1 at few bits): its residual is
bounded only where that bound is below 1.

k = round(fraction d) and s = 2^bits - 1 are traced values here (a mask over the full-size ranking, never a
shape), so the same compiled program serves any fraction / bits.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import RESULT, VALUE, Choice, Field, Flag, Int, Num, Section

METHODS = ('none', 'topk', 'randk', 'qsgd')
QSGD_BUCKET = 512          # Alistarh et al. 2017's bucket size in their experiments
BYTES_PER_VALUE = 4        # float32 values, norms and int32 indices / seeds
# QSGD's largest bits: bits + 1 sign bits a coordinate (+ a float32 norm a bucket) is less than float32's 32 bits up
# to 30; at 31 it is 1.002x, at 33 1.06x, at 64 2.03x the uncompressed upload: refused, it compresses nothing.
MAX_BITS = 30


def enabled(cfg) -> bool:
  return cfg.get('upload') is not None and cfg.upload.compress != 'none'


def _check(cfg) -> None:
  """The section's own rules (across sections: algorithms/wrappers/compress.check)."""
  u = cfg.upload
  if u.compress == 'none' and u.error_feedback:
    raise ConfigError('upload.error_feedback', True, "keeps what compression left out: set upload.compress to "
                      "'topk', 'randk' or 'qsgd'")


def _bits(cfg) -> None:
  b = cfg.upload.bits
  if b > MAX_BITS:
    raise ConfigError('upload.bits', b, f'must be <= {MAX_BITS}: {b} bits a level + a sign bit a coordinate send '
                      f'{(b + 1) / 32 + 1 / QSGD_BUCKET:.3g}x the float32 upload, no compression; use 1 .. {MAX_BITS} '
                      "(or upload.compress='none')")


SECTION = Section('upload', (
    Field('compress', Choice('none', METHODS), "the client's delta before it is sent: 'none' | 'topk' (the k "
          "largest |v_i|) | 'randk' (k random coordinates x d / k, unbiased; unscaled with error_feedback: a "
          "contraction) | 'qsgd' (stochastic quantization)"),
    Field('fraction', Num(0.01, lo=0, hi=1, lo_open=True), "topk / randk: k = max(1, round(fraction d)) of the d "
          'coordinates kept', {VALUE}, when=lambda cfg: cfg.upload.compress in ('topk', 'randk'),
          needs="upload.compress='topk' or 'randk'"),
    Field('bits', Int(2, lo=1), f'qsgd: bits a level, s = 2^bits - 1 levels of |v_i| / ||v_bucket|| (+ a sign bit); '
          f'at most {MAX_BITS} (more sends more than float32)', {VALUE}, after=_bits,
          when=lambda cfg: cfg.upload.compress == 'qsgd', needs="upload.compress='qsgd'"),
    Field('error_feedback', Flag(False), 'keep each client\'s residual (what was not sent) and add it to its next '
          'delta (client state, checkpointed); randk then sends the k coordinates unscaled (Stich et al. 2018: '
          'error feedback needs a contraction, d / k scaling is not one)'),
), check=_check, tags={RESULT}, doc='compressed uploads (systems/compress.py; algorithms/wrappers/compress.py)')


# ---- host-side numbers

def num_kept(fraction, d: int):
  """k = max(1, round(fraction d)) (jnp when fraction is traced)."""
  if isinstance(fraction, (int, float)):
    return max(1, int(round(float(fraction) * d)))
  return jnp.maximum(1, jnp.round(jnp.asarray(fraction, jnp.float32) * d)).astype(jnp.int32)


def levels(bits):
  """s = 2^bits - 1 (jnp when bits is traced)."""
  if isinstance(bits, int) and not isinstance(bits, bool):
    return 2 ** bits - 1
  return (2.0 ** jnp.asarray(bits, jnp.float32)) - 1.0


def upload_bytes(upload_cfg, d: int) -> float:
  """Bytes of one client's compressed upload of a d-value delta (see the module docstring)."""
  kind = upload_cfg.compress
  if kind == 'none':
    return float(BYTES_PER_VALUE * d)
  if kind in ('topk', 'randk'):
    k = num_kept(upload_cfg.fraction, d)
    where = min(BYTES_PER_VALUE * k, math.ceil(d / 8)) if kind == 'topk' else BYTES_PER_VALUE
    return float(BYTES_PER_VALUE * k + where)
  if kind == 'qsgd':
    return float(BYTES_PER_VALUE * math.ceil(d / QSGD_BUCKET) + math.ceil(d * (int(upload_cfg.bits) + 1) / 8))
  raise ValueError(f'upload.compress={kind!r}; allowed: {METHODS}')


# ---- the transforms (traced; v a float32 vector)

def topk(v, k):
  """v on its k largest |v_i| (ties: lower index first), zero elsewhere; k may be traced."""
  order = jnp.argsort(-jnp.abs(v), stable=True)
  rank = jnp.zeros(v.shape, jnp.int32).at[order].set(jnp.arange(v.shape[0], dtype=jnp.int32))
  return jnp.where(rank < k, v, jnp.zeros_like(v))


def randk(v, key, k, scaled: bool = True):
  """(d / k) v on k coordinates drawn uniformly without replacement, zero elsewhere (unbiased); scaled=False: v
  on them unscaled, the contraction E ||v - C(v)||^2 = (1 - k / d) ||v||^2 that error feedback needs."""
  d = v.shape[0]
  keep = jax.random.permutation(key, d) < k       # a uniform k-subset (positions of 0 .. k-1 in a permutation)
  kept = v * (d / jnp.asarray(k, v.dtype)) if scaled else v
  return jnp.where(keep, kept, jnp.zeros_like(v))


def qsgd(v, key, s, bucket: int = QSGD_BUCKET):
  """QSGD with s levels over buckets of `bucket` consecutive coordinates (the last zero-padded): unbiased."""
  d = v.shape[0]
  nb = -(-d // bucket)
  x = jnp.pad(v, (0, nb * bucket - d)).reshape(nb, bucket)
  norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=1, keepdims=True))
  s = jnp.asarray(s, v.dtype)
  r = jnp.where(norm > 0, jnp.abs(x) / jnp.where(norm > 0, norm, 1.0), 0.0) * s
  u = jax.random.uniform(key, x.shape, v.dtype)
  lev = jnp.floor(r + u)
  q = norm * jnp.sign(x) * lev / s
  return q.reshape(-1)[:d]


def compress(kind: str, v, key, fraction=None, bits=None, error_feedback: bool = False):
  """C(v) of `kind` (see the module docstring); v a flat float32 vector. error_feedback: rand-k unscaled."""
  d = v.shape[0]
  if kind == 'topk':
    return topk(v, num_kept(fraction, d))
  if kind == 'randk':
    return randk(v, key, num_kept(fraction, d), scaled=not error_feedback)
  if kind == 'qsgd':
    return qsgd(v, key, levels(bits))
  if kind == 'none':
    return v
  raise ValueError(f'upload.compress={kind!r}; allowed: {METHODS}')
