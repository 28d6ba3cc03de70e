"""RetrievalEvaluator (evaluation/retrieval.py): Recall@K of a fixed descriptor function over a padded test set
equals the brute-force numpy computation, whatever the block size; labels must be (easting, northing, role)."""
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.evaluation import retrieval as ev
from fedjax_flat.models.base import Model
from fedjax_flat.tasks import retrieval as ret


def _pixel_model():
  """Descriptor = the L2-normalised flattened image scaled by params['w'] (a stand-in network)."""
  def apply(params, x, train=False, rng=None, with_activations=False):
    v = x.reshape(x.shape[:-3] + (-1,)).astype(jnp.float32) * params['w']
    return v / jnp.linalg.norm(v, axis=-1, keepdims=True)
  return Model(name='pixels', init=lambda rng, x: {'w': jnp.ones(())}, apply=apply, num_classes=1,
               input_shape=(2, 2, 3))


@pytest.mark.parametrize('block', [3, 8, 64])
def test_recall_equals_numpy_brute_force(block):
  rng = np.random.default_rng(0)
  nq, nd = 11, 23
  x = rng.uniform(0.1, 1, (nq + nd, 2, 2, 3)).astype(np.float32)
  pos = rng.uniform(0, 60, (nq + nd, 2)).astype(np.float32)
  role = np.r_[np.ones(nq), np.zeros(nd)].astype(np.float32)
  perm = rng.permutation(nq + nd)                   # queries and database interleaved in the test arrays
  y = np.concatenate([pos, role[:, None]], 1)[perm]
  x = x[perm]
  task = ret.Retrieval(threshold=15.0)
  got = ev.RetrievalEvaluator(_pixel_model(), x, y, batch_size=block, task=task)({'w': jnp.ones(())})
  q, d = y[:, 2] == 1, y[:, 2] == 0
  flat = x.reshape(len(x), -1)
  desc = flat / np.linalg.norm(flat, axis=1, keepdims=True)
  dist = np.linalg.norm(desc[q][:, None] - desc[d][None], axis=-1)
  order = np.argsort(dist, axis=1)
  close = np.linalg.norm(y[q][:, None, :2] - y[d][None, :, :2], axis=-1) <= 15.0
  hits = np.take_along_axis(close, order, axis=1)
  for k in (1, 5, 10):
    assert got[f'recall@{k}'] == pytest.approx(np.mean(np.any(hits[:, :k], axis=1)))
  assert got['accuracy'] == got['recall@1'] and got['count'] == nq
  assert 0 < got['recall@10'] < 1 or got['recall@1'] < got['recall@10']


def test_labels_must_hold_positions_and_roles():
  with pytest.raises(ValueError, match='easting, northing, role'):
    ev.RetrievalEvaluator(_pixel_model(), np.zeros((4, 2, 2, 3)), np.zeros((4, 2)))
  with pytest.raises(ValueError, match='queries and database'):
    ev.RetrievalEvaluator(_pixel_model(), np.zeros((4, 2, 2, 3)), np.zeros((4, 3)))
