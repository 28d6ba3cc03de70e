"""Datasets that need no download: scikit-learn's handwritten digits and a synthetic image dataset."""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

import numpy as np

from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.partition import dirichlet_split, iid_split
from fedjax_flat.data.registry import register


def _stratified_holdout(y, test_fraction, rng):
  test = []
  for c in np.unique(y):
    idx = rng.permutation(np.flatnonzero(y == c))
    test.append(idx[:int(round(len(idx) * test_fraction))])
  test = np.sort(np.concatenate(test))
  train = np.setdiff1d(np.arange(len(y)), test)
  return train, test


def digits_arrays():
  """scikit-learn's digits file read as `sklearn.datasets.load_digits` reads it (64 pixel columns, then the
  label), without importing scikit-learn: its import costs about a second at every start of the quickstart."""
  spec = importlib.util.find_spec('sklearn')
  if spec is None or not spec.submodule_search_locations:
    raise ImportError('the embedded digits come with scikit-learn: pip install scikit-learn')
  path = os.path.join(list(spec.submodule_search_locations)[0], 'datasets', 'data', 'digits.csv.gz')
  data = np.loadtxt(path, delimiter=',')
  return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def load_digits(num_clients: int = 20, alpha: float = 0.0, *, test_fraction: float = 0.2,
                examples_per_client: Optional[int] = None, quantity_skew: Optional[float] = None,
                seed: int = 0) -> FederatedDataset:
  """The embedded default data: 1,797 real 8x8 handwritten digits (UCI optdigits via scikit-learn).

  Pixels are scaled to [0, 1] as [N, 8, 8, 1] float32. A stratified `test_fraction` is held out as the
  global test split; the rest is split across `num_clients` with `dirichlet_split(alpha)`.
  """
  images, target = digits_arrays()
  x = (images.astype(np.float32) / 16.0)[..., None]
  y = target.astype(np.int32)
  rng = np.random.default_rng(seed)
  train, test = _stratified_holdout(y, test_fraction, rng)
  splits = dirichlet_split(y[train], num_clients, alpha, examples_per_client=examples_per_client,
                           quantity_skew=quantity_skew, num_classes=10, seed=seed)
  return FederatedDataset.from_client_indices(
      x[train], y[train], splits, x[test], y[test], num_classes=10, name=f'digits(alpha={alpha})')


def synthetic(num_clients: int = 10, examples_per_client=32, *, input_shape=(8, 8, 1), num_classes: int = 10,
              test_size: int = 200, alpha: Optional[float] = None, noise: float = 1.0, seed: int = 0,
              dtype=np.float32) -> FederatedDataset:
  """Learnable synthetic images of any shape: class means + Gaussian noise.

  examples_per_client: an int (equal sizes) or a sequence of per-client sizes (quantity skew for tests).
  alpha: None = IID clients, else a Dirichlet label split.
  """
  rng = np.random.default_rng(seed)
  sizes = (np.full(num_clients, int(examples_per_client)) if np.isscalar(examples_per_client)
           else np.asarray(examples_per_client, np.int64))
  if len(sizes) != num_clients:
    raise ValueError(f'examples_per_client has {len(sizes)} sizes for num_clients={num_clients}')
  n = int(sizes.sum())
  means = rng.normal(0, 1, (num_classes,) + tuple(input_shape)).astype(dtype)

  def draw(m):
    y = rng.integers(0, num_classes, m).astype(np.int32)
    x = means[y] + noise * rng.normal(0, 1, (m,) + tuple(input_shape)).astype(dtype)
    return x.astype(dtype), y

  x, y = draw(n)
  tx, ty = draw(test_size)
  if alpha is None:    # consecutive clients: the CSR arrays directly (a list of a million splits took seconds)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return FederatedDataset(x=x, y=y, client_index=np.arange(n, dtype=np.int64), client_offsets=offsets,
                            test_x=tx, test_y=ty, num_classes=int(num_classes), name='synthetic')
  splits = dirichlet_split(y, num_clients, alpha, num_classes=num_classes, seed=seed)
  return FederatedDataset.from_client_indices(x, y, splits, tx, ty, num_classes, name='synthetic')


__all__ = ['load_digits', 'synthetic', 'iid_split']


@register('digits')
def _digits(num_clients=20, alpha=0.0, test_fraction=0.2, examples_per_client=None, quantity_skew=None,
            seed=0, **unused):
  del unused
  return load_digits(num_clients, alpha, test_fraction=test_fraction,
                     examples_per_client=examples_per_client, quantity_skew=quantity_skew, seed=seed)


@register('synthetic')
def _synthetic(num_clients=10, examples_per_client=32, input_shape=(8, 8, 1), num_classes=10, test_size=200,
               alpha=None, seed=0, noise=1.0, **unused):
  del unused
  return synthetic(num_clients, examples_per_client, input_shape=tuple(input_shape),
                   num_classes=num_classes, test_size=test_size, alpha=alpha, noise=float(noise), seed=seed)
