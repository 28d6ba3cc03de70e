"""Effective rank of each layer's features (Roy & Vetterli 2007): how many directions a layer's representation
of a batch of inputs really uses.

For a feature matrix F [n, d] (n inputs, each layer output flattened), with singular values s_i and
p_i = s_i / sum_j s_j, erank(F) = exp(-sum_i p_i log p_i), between 1 (rank one) and min(n, d) (all singular
values equal); uncentred, as in the paper. The layers are the hidden activations a model marks
(`self.sow('intermediates', 'act', y)`, models/base.py: `apply(..., with_activations=True)`), named act0, act1, ...
in forward order; the features are those of evaluation mode (no dropout, BatchNorm running statistics).
"""
from __future__ import annotations

import functools
from typing import Dict

import jax
import numpy as np

from fedjax_flat.models.base import float32_model


def effective_rank(features) -> float:
  """exp of the entropy of the normalised singular values of `features` [n, ...] (flattened to [n, d]); 0 for an
  all-zero matrix. The singular values are the square roots of the eigenvalues of the smaller Gram matrix, in
  float64 on the host: an SVD of a [500, 2048] conv feature map took seconds on a loaded CPU, the Gram route a
  fraction of it, and float64 keeps the squared small values accurate."""
  f = np.asarray(features, np.float64)
  f = f.reshape(f.shape[0], -1)
  gram = f @ f.T if f.shape[0] <= f.shape[1] else f.T @ f
  s = np.sqrt(np.clip(np.linalg.eigvalsh(gram), 0.0, None))
  total = s.sum()
  if total <= 0:
    return 0.0
  p = s[s > 0] / total
  return float(np.exp(-np.sum(p * np.log(p))))


@functools.lru_cache(maxsize=None)
def _features_impl(apply):
  # one compiled program per model, reused by every call (a lab logs every k rounds)
  return jax.jit(lambda p, xb: apply(p, xb, train=False, with_activations=True)[1])


def layer_features(model, params, x, *, batch_size: int = 256) -> list:
  """The hidden activations of `x` [n, ...] (numpy arrays [n, ...], forward order), in batches of `batch_size`."""
  apply = _features_impl(float32_model(model).apply)
  x = np.asarray(x)
  parts = [jax.device_get(apply(params, x[i:i + batch_size])) for i in range(0, len(x), batch_size)]
  return [np.concatenate([p[j] for p in parts]) for j in range(len(parts[0]))]


def layer_feature_ranks(model, params, x, *, batch_size: int = 256) -> Dict[str, float]:
  """{'act<i>': effective rank of layer i's features of the inputs `x`}; empty for a model that marks no layer."""
  return {f'act{i}': effective_rank(f) for i, f in enumerate(layer_features(model, params, x,
                                                                                  batch_size=batch_size))}
