"""Cross-silo feature shift on the embedded digits: a few "hospitals", each seeing the digits through its own
deterministic acquisition transform (FedSoup's setting, digest A1/A4/A5, at quickstart size).

The 1,797 scikit-learn digits are shuffled (stratified by class) into `num_clients` equal sources; source i
applies TRANSFORMS[i] to all of its images (rotation, low contrast, additive noise, blur, inversion, ...; the
noise is drawn once from (seed, source), so the data are a fixed function of `seed`). Per source, stratified
by class:

  global share   round(n_s * test_fraction / K_train) examples (or n_s * global_fraction) -> the held-out
                 GLOBAL test set, equal counts per training source (digest A4: "equal number of images per
                 source, size about that of a local test set"); `test_examples()` returns it (the Trainer's
                 per-round test set)
  local test     round(n_s * test_fraction)   -> `client_test_examples(k)`
  validation     round(n_s * val_fraction)    -> `client_val_examples(k)` (FedSoup's model selection)
  train          the rest                     -> `client_examples(k)` (what rounds train on)

leave_out = j >= 0 (leave-one-client-out, digest A4 "unseen domain"): source j never trains (the dataset has
num_clients - 1 training clients, renumbered 0..K-2 in source order), is not part of the global test set,
and ALL of its examples form the unseen-domain test: `unseen_examples()`.

Names: `client_names[k]` = 'h<source>:<transform>'; `source_of_client[k]` = the source index.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import numpy as np

from fedjax_flat.data.federated import FederatedDataset, _csr
from fedjax_flat.data.sources import builtin
from fedjax_flat.data.registry import register
from fedjax_flat.errors import ConfigError


# --- The per-source transforms (images [n, 8, 8, 1] in [0, 1]; outputs clipped to [0, 1]). ---

def _rotate(angle):
  def f(x, rng):
    del rng
    from scipy import ndimage
    return ndimage.rotate(x, angle, axes=(1, 2), reshape=False, order=1, mode='constant', cval=0.0)
  return f


def _contrast(scale, shift):
  return lambda x, rng: x * scale + shift


def _noise(sigma):
  return lambda x, rng: x + sigma * rng.normal(0.0, 1.0, x.shape).astype(np.float32)


def _blur(sigma):
  def f(x, rng):
    del rng
    from scipy import ndimage
    return ndimage.gaussian_filter(x, sigma=(0, sigma, sigma, 0), mode='constant')
  return f


def _invert(x, rng):
  del rng
  return 1.0 - x


def _compose(*fs):
  def f(x, rng):
    for g in fs:
      x = g(x, rng)
    return x
  return f


TRANSFORMS: List[Tuple[str, object]] = [
    ('identity', lambda x, rng: x),
    ('rotate30', _rotate(30.0)),
    ('lowcontrast', _contrast(0.4, 0.3)),
    ('noise0.3', _noise(0.3)),
    ('blur1', _blur(1.0)),
    ('invert', _invert),
    ('rotate-30+noise0.2', _compose(_rotate(-30.0), _noise(0.2))),
    ('invert+blur0.7', _compose(_invert, _blur(0.7))),
]


def apply_transform(source: int, x: np.ndarray, seed: int) -> np.ndarray:
  """Source `source`'s transform of images x (deterministic in (seed, source))."""
  _, fn = TRANSFORMS[source]
  rng = np.random.default_rng([int(seed), int(source), 0xFE5])
  return np.clip(fn(x.astype(np.float32), rng), 0.0, 1.0).astype(np.float32)


@dataclasses.dataclass
class FeatureShiftDataset(FederatedDataset):
  """FederatedDataset + per-client validation splits, a global test slice and an optional unseen domain.

  Layout: x/y hold every client's train AND validation examples (client_index points at the training ones,
  client_val_index at the validation ones); test_x/test_y hold the global test set first
  (`global_test_index`) and then the clients' local test splits (client_test_index).
  """
  client_val_index: Optional[np.ndarray] = None
  client_val_offsets: Optional[np.ndarray] = None
  global_test_index: Optional[np.ndarray] = None
  unseen_x: Optional[np.ndarray] = None
  unseen_y: Optional[np.ndarray] = None
  source_of_client: Optional[Sequence[int]] = None
  leave_out: int = -1

  def test_examples(self):
    return self.test_x[self.global_test_index], self.test_y[self.global_test_index]

  def client_val_examples(self, k: int):
    i = self.client_val_index[self.client_val_offsets[k]:self.client_val_offsets[k + 1]]
    return self.x[i], self.y[i]

  def client_val_sizes(self) -> np.ndarray:
    return np.diff(self.client_val_offsets)

  def unseen_examples(self):
    if self.unseen_x is None:
      raise ValueError(f'dataset {self.name!r} has no left-out client (leave_out=-1)')
    return self.unseen_x, self.unseen_y


def _stratified_parts(y, counts_fn, rng):
  """Splits indices 0..n-1 into len(fractions) parts per class; counts_fn(n_class) -> list of part sizes."""
  parts = None
  for c in np.unique(y):
    idx = rng.permutation(np.flatnonzero(y == c))
    sizes = counts_fn(len(idx))
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    chunks = [idx[bounds[i]:bounds[i + 1]] for i in range(len(sizes))] + [idx[bounds[-1]:]]
    parts = chunks if parts is None else [np.concatenate([a, b]) for a, b in zip(parts, chunks)]
  return [np.sort(p) for p in parts]


def load_digits_feature_shift(num_clients: int = 5, *, seed: int = 0, val_fraction: float = 0.1,
                              test_fraction: float = 0.15, leave_out: int = -1,
                              global_fraction: Optional[float] = None) -> FeatureShiftDataset:
  """global_fraction: share of each training source for the global test set (None: test_fraction / K_train,
  so the global set is about one local test set, as in the paper; larger values give a less noisy number)."""
  if not 2 <= num_clients <= len(TRANSFORMS):
    raise ValueError(f'digits_feature_shift: num_clients={num_clients} must be in [2, {len(TRANSFORMS)}] '
                     f'(one distinct transform per client)')
  if not -1 <= leave_out < num_clients:
    raise ValueError(f'digits_feature_shift: leave_out={leave_out} must be -1 or a client in [0, {num_clients})')
  g_frac = test_fraction / max(num_clients - (leave_out >= 0), 1) if global_fraction is None else global_fraction
  if not (0 <= val_fraction and 0 < test_fraction and 0 < g_frac and val_fraction + test_fraction + g_frac < 0.8):
    raise ValueError(f'digits_feature_shift: val_fraction={val_fraction}, test_fraction={test_fraction} leave '
                     f'too little training data')
  images, target = builtin.digits_arrays()
  x_all = (images.astype(np.float32) / 16.0)[..., None]
  y_all = target.astype(np.int32)
  rng = np.random.default_rng([int(seed), 0x5F7])
  # Equal-size, class-stratified sources: deal each class's shuffled examples round-robin.
  source = np.empty(len(y_all), np.int64)
  for c in range(10):
    idx = rng.permutation(np.flatnonzero(y_all == c))
    source[idx] = (np.arange(len(idx)) + rng.integers(num_clients)) % num_clients

  train_sources = [s for s in range(num_clients) if s != leave_out]
  k_train = len(train_sources)
  xs, ys = [], []                    # x/y: train + val
  tx, ty = [], []                    # test_x/test_y: global test + local tests
  train_idx, val_idx, ltest_idx, gtest = [], [], [], []
  unseen_x = unseen_y = None
  n_x = 0
  global_parts = []
  local_parts = []
  for s in range(num_clients):
    members = np.flatnonzero(source == s)
    xsrc = apply_transform(s, x_all[members], seed)
    ysrc = y_all[members]
    if s == leave_out:
      unseen_x, unseen_y = xsrc, ysrc
      continue
    n_s = len(members)
    g_frac = test_fraction / k_train if global_fraction is None else float(global_fraction)
    n_g = max(1, int(round(n_s * g_frac)))
    n_t = int(round(n_s * test_fraction))
    n_v = int(round(n_s * val_fraction))
    # Class-stratified: each part gets its share of each class (largest-remainder rounding per class).
    fr = np.array([n_g, n_t, n_v], np.float64) / n_s

    def counts(m, fr=fr):
      return [int(np.floor(f * m + 0.5)) for f in fr]
    g, t, v, tr = _stratified_parts(ysrc, counts, rng)
    xs.append(xsrc[tr]); ys.append(ysrc[tr]); train_idx.append(n_x + np.arange(len(tr))); n_x += len(tr)
    xs.append(xsrc[v]); ys.append(ysrc[v]); val_idx.append(n_x + np.arange(len(v))); n_x += len(v)
    global_parts.append((xsrc[g], ysrc[g]))
    local_parts.append((xsrc[t], ysrc[t]))
  # Balance the global test set exactly: the same count from every training source.
  n_g_min = min(len(gy) for _, gy in global_parts)
  n_t = 0
  for gx, gy in global_parts:
    tx.append(gx[:n_g_min]); ty.append(gy[:n_g_min]); n_t += n_g_min
  gtest = np.arange(n_t)
  for lx, ly in local_parts:
    tx.append(lx); ty.append(ly); ltest_idx.append(n_t + np.arange(len(ly))); n_t += len(ly)

  x = np.concatenate(xs); y = np.concatenate(ys)
  test_x = np.concatenate(tx); test_y = np.concatenate(ty)
  idx, off = _csr(train_idx)
  t_idx, t_off = _csr(ltest_idx)
  v_idx, v_off = _csr(val_idx)
  names = [f'h{s}:{TRANSFORMS[s][0]}' for s in train_sources]
  lo = f', leave_out={leave_out}' if leave_out >= 0 else ''
  return FeatureShiftDataset(
      x=x, y=y, client_index=idx, client_offsets=off, test_x=test_x, test_y=test_y, num_classes=10,
      name=f'digits_feature_shift(K={num_clients}{lo})', client_test_index=t_idx, client_test_offsets=t_off,
      client_names=names, client_val_index=v_idx, client_val_offsets=v_off, global_test_index=gtest,
      unseen_x=unseen_x, unseen_y=unseen_y, source_of_client=train_sources, leave_out=int(leave_out))


def _check_fractions(data: dict) -> None:
  fracs = [data.get(k) or 0.0 for k in ('val_fraction', 'test_fraction', 'global_fraction')]
  if sum(fracs) >= 0.8:
    raise ConfigError('data.val_fraction', data.get('val_fraction'), 'val_fraction + test_fraction + '
                      'global_fraction must be < 0.8 (each client keeps some training examples)')


@register('digits_feature_shift', limits={'num_clients': (2, 5, 'one distinct transform per client')},
          check=_check_fractions)
def _digits_feature_shift(num_clients=5, seed=0, val_fraction=0.1, test_fraction=0.15, leave_out=-1,
                          global_fraction=0.0, **unused):
  """Registry builder (config.data); global_fraction 0 (or None) = the paper-sized global set."""
  del unused
  return load_digits_feature_shift(int(num_clients), seed=int(seed), val_fraction=float(val_fraction),
                                   test_fraction=float(test_fraction), leave_out=int(leave_out),
                                   global_fraction=float(global_fraction) if global_fraction else None)


# --- Real cross-silo sets (Camelyon17, retinal fundus): each silo's train / local-test split as read. ---

def assemble_silos(silos: Sequence[dict], *, name: str, num_classes: int, seed: int = 0, val_fraction: float = 0.0,
                   global_fraction: Optional[float] = None, leave_out: int = -1,
                   silo_names: Optional[Sequence[str]] = None) -> FeatureShiftDataset:
  """FedSoup's protocol over silos read from files (digest A4): silos[i] = {'train': (x, y), 'test': (x, y)}.

  Per training silo, class-stratified and keyed by `seed`: val_fraction of its training examples become its
  validation split; its local test split gives up round(n_test * global_fraction) examples (default
  1 / K_train: the global set is about one local test set) to the held-out GLOBAL test set, trimmed to the
  same count from every silo. leave_out = j: silo j never trains; its training and test examples together are
  the unseen-domain test (the release's hold-out client: its train + test).
  """
  k = len(silos)
  if not -1 <= leave_out < k:
    raise ConfigError('data.leave_out', leave_out, f'must be -1 or a client in [0, {k})')
  rng = np.random.default_rng([int(seed), 0x5110])
  train_ids = [s for s in range(k) if s != leave_out]
  g_frac = 1.0 / len(train_ids) if not global_fraction else float(global_fraction)
  xs, ys, tx, ty, train_idx, val_idx, ltest_idx, global_parts, local_parts = [], [], [], [], [], [], [], [], []
  unseen_x = unseen_y = None
  n_x = 0
  for s in range(k):
    (trx, tr_y), (tex, te_y) = silos[s]['train'], silos[s]['test']
    if s == leave_out:
      unseen_x, unseen_y = np.concatenate([trx, tex]), np.concatenate([tr_y, te_y])
      continue
    v, tr = _stratified_parts(tr_y, lambda m: [int(np.floor(val_fraction * m + 0.5))], rng)
    g, t = _stratified_parts(te_y, lambda m: [int(np.floor(g_frac * m + 0.5))], rng)
    xs.append(trx[tr]); ys.append(tr_y[tr]); train_idx.append(n_x + np.arange(len(tr))); n_x += len(tr)
    xs.append(trx[v]); ys.append(tr_y[v]); val_idx.append(n_x + np.arange(len(v))); n_x += len(v)
    global_parts.append((tex[g], te_y[g]))
    local_parts.append((tex[t], te_y[t]))
  n_g = min(len(gy) for _, gy in global_parts)
  n_t = 0
  for gx, gy in global_parts:
    keep = np.sort(rng.permutation(len(gy))[:n_g])
    tx.append(gx[keep]); ty.append(gy[keep]); n_t += n_g
  gtest = np.arange(n_t)
  for lx, ly in local_parts:
    tx.append(lx); ty.append(ly); ltest_idx.append(n_t + np.arange(len(ly))); n_t += len(ly)
  idx, off = _csr(train_idx)
  t_idx, t_off = _csr(ltest_idx)
  v_idx, v_off = _csr(val_idx)
  names = list(silo_names) if silo_names is not None else [f'silo{s}' for s in range(k)]
  return FeatureShiftDataset(
      x=np.concatenate(xs), y=np.concatenate(ys).astype(np.int32), client_index=idx, client_offsets=off,
      test_x=np.concatenate(tx), test_y=np.concatenate(ty).astype(np.int32), num_classes=int(num_classes),
      name=name, client_test_index=t_idx, client_test_offsets=t_off, client_names=[names[s] for s in train_ids],
      client_val_index=v_idx, client_val_offsets=v_off, global_test_index=gtest, unseen_x=unseen_x,
      unseen_y=None if unseen_y is None else unseen_y.astype(np.int32), source_of_client=train_ids,
      leave_out=int(leave_out))
