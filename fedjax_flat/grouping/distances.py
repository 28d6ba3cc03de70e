"""Distances tau between client representations (FedSeq's grouping criterion; thesis eq. 5.x, ICPR code).

Every function takes a [d] vector `a` (e.g. a superclient's representer) and a [d] or [n, d] array `b`
(one or many clients) and returns a float or [n] floats. Larger means "more different": the greedy grouper
adds the client that MAXIMIZES tau to the superclient's mean representation.

  euclidean          ||a - b||_2                                         (k-means / ICG's metric)
  cosine             1 - a.b / (||a|| ||b||)                            (psi_clf; 1 when a norm is 0)
  normalized_cosine  cosine(a / (a + b + 1e-8), b / (a + b + 1e-8))      (Task2Vec's "Norm-Cosine": each
                     Fisher entry divided by the pair's sum, so layers with large Fisher do not dominate)
  kl                 1 - KL(m || uniform),  m = (a + b) / 2              (the reference's `kullback_div`)
  gini               1 - sum(m^2),          m = (a + b) / 2              (the reference's `gini_diff`: the
                     Gini impurity of the mixture)

`kl` and `gini` are not distances between a and b but *diversity scores of their mixture*: both grow as
the average of two probability vectors gets closer to uniform, which is what a superclient should be.
They are defined for probability vectors only (psi_conf); `config/validate.py` rejects other pairings.
0 log 0 = 0 in `kl` (the reference code returns NaN there; a confidence vector has no exact zeros, but a
data-size-weighted mean of one-hot vectors does).
"""
from __future__ import annotations

import numpy as np

EPS = 1e-8


def _pair(a, b):
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  return np.broadcast_arrays(a, b)


def euclidean(a, b):
  a, b = _pair(a, b)
  return np.sqrt(np.sum(np.square(a - b), axis=-1))


def cosine(a, b):
  a, b = _pair(a, b)
  norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
  dot = np.sum(a * b, axis=-1)
  safe = np.where(norms > 0, norms, 1.0)
  return np.where(norms > 0, 1.0 - dot / safe, 1.0)


def normalized_cosine(a, b):
  a, b = _pair(a, b)
  s = a + b + EPS
  return cosine(a / s, b / s)


def _mixture(a, b):
  a, b = _pair(a, b)
  return (a + b) / 2.0


def kl(a, b):
  m = _mixture(a, b)
  d = m.shape[-1]
  safe = np.where(m > 0, m, 1.0)
  return 1.0 - np.sum(np.where(m > 0, m * np.log(safe * d), 0.0), axis=-1)


def gini(a, b):
  m = _mixture(a, b)
  return 1.0 - np.sum(np.square(m), axis=-1)


DISTANCES = {
    'euclidean': euclidean,
    'cosine': cosine,
    'normalized_cosine': normalized_cosine,
    'kl': kl,
    'gini': gini,
}
# Defined on probability vectors only (the confidence estimator's output).
PROBABILITY_ONLY = ('kl', 'gini')


def get(name: str):
  if name not in DISTANCES:
    raise ValueError(f'distance={name!r} is unknown; allowed: {sorted(DISTANCES)}')
  return DISTANCES[name]
