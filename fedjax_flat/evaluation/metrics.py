"""Classification metrics of a model's logits on host arrays: accuracy and rank-based AUC.

AUC: binary for 2 classes, micro-averaged one-vs-rest otherwise, rank based (Mann-Whitney, ties averaged), on
softmax scores (or raw logits, as FedSoup's reference code).
"""
from __future__ import annotations

import numpy as np

def _average_ranks(a: np.ndarray) -> np.ndarray:
  """1-based ranks with ties averaged (like scipy.stats.rankdata)."""
  _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
  upper = np.cumsum(counts)
  return (upper - (counts - 1) / 2.0)[inv.reshape(-1)]


def binary_auc(scores, labels) -> float:
  """ROC AUC = P(score_pos > score_neg) + P(tie)/2 (Mann-Whitney U); nan if a class is absent."""
  scores = np.asarray(scores, np.float64).reshape(-1)
  labels = np.asarray(labels).reshape(-1).astype(bool)
  n_pos = int(labels.sum())
  n_neg = len(labels) - n_pos
  if n_pos == 0 or n_neg == 0:
    return float('nan')
  ranks = _average_ranks(scores)
  return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _softmax(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def auc(logits, labels, scores: str = 'softmax') -> float:
  """Binary AUC (2 classes: score of class 1) or micro-averaged one-vs-rest AUC (>2 classes).

  scores='softmax' (probabilities) or 'logits' (the reference code's raw outputs). For 2 classes the two
  give the same AUC (p1 is monotone in logit1 - logit0)."""
  logits = np.asarray(logits)
  labels = np.asarray(labels).astype(np.int64)
  if len(labels) == 0:
    return float('nan')
  c = logits.shape[-1]
  s = _softmax(logits) if scores == 'softmax' else np.asarray(logits, np.float64)
  if c == 2:
    return binary_auc(s[:, 1] - (0.0 if scores == 'softmax' else s[:, 0]), labels == 1)
  onehot = labels[:, None] == np.arange(c)[None, :]
  return binary_auc(s.reshape(-1), onehot.reshape(-1))


def accuracy(logits, labels) -> float:
  labels = np.asarray(labels)
  if len(labels) == 0:
    return float('nan')
  return float(np.mean(np.argmax(logits, -1) == labels))
