"""Effective rank (analysis/feature_rank.py) against NumPy's SVD, and per-layer features of a tiny MLP against its
hidden layer computed by hand."""
import jax
import numpy as np
import pytest

from fedjax_flat.analysis import feature_rank
from fedjax_flat.models.registry import get_model


def _np_erank(f):
  s = np.linalg.svd(f.reshape(len(f), -1).astype(np.float64), compute_uv=False)
  p = s / s.sum()
  p = p[p > 0]
  return float(np.exp(-np.sum(p * np.log(p))))


def test_effective_rank_matches_numpy_and_its_extremes():
  rng = np.random.default_rng(0)
  f = rng.normal(size=(10, 2, 3)).astype(np.float32) * np.array([3.0, 1.0, 0.1], np.float32)
  assert float(feature_rank.effective_rank(f)) == pytest.approx(_np_erank(f), rel=1e-5)
  rank_one = np.outer(rng.normal(size=8), rng.normal(size=5)).astype(np.float32)
  assert float(feature_rank.effective_rank(rank_one)) == pytest.approx(1.0, rel=1e-4)
  assert float(feature_rank.effective_rank(np.eye(6, dtype=np.float32))) == pytest.approx(6.0, rel=1e-5)
  assert float(feature_rank.effective_rank(np.zeros((4, 3), np.float32))) == 0.0


def test_layer_ranks_are_those_of_the_mlp_hidden_layer():
  model = get_model('mlp', 3, (2, 2, 1), hidden=(5,))
  x = np.random.default_rng(1).normal(size=(7, 2, 2, 1)).astype(np.float32)
  params = model.init(jax.random.key(0), x[:1])
  dense = params['Dense_0']
  hidden = np.maximum(x.reshape(7, -1) @ np.asarray(dense['kernel']) + np.asarray(dense['bias']), 0)
  ranks = feature_rank.layer_feature_ranks(model, params, x, batch_size=3)      # 3 batches, the last one short
  assert list(ranks) == ['act0']
  assert ranks['act0'] == pytest.approx(_np_erank(hidden), rel=1e-5)
