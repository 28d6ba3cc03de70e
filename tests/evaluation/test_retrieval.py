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


def _brute_force_recall(desc, y, groups, threshold, ks=(1, 5, 10)):
  """Recall@K by numpy: every query ranked against the database images of its own group only."""
  hits = {k: 0 for k in ks}
  nq = 0
  for g in np.unique(groups):
    q = (y[:, 2] == 1) & (groups == g)
    d = (y[:, 2] == 0) & (groups == g)
    nq += int(q.sum())
    if not d.any():
      continue
    order = np.argsort(np.linalg.norm(desc[q][:, None] - desc[d][None], axis=-1), axis=1, kind='stable')
    close = np.linalg.norm(y[q][:, None, :2] - y[d][None, :, :2], axis=-1) <= threshold
    ranked = np.take_along_axis(close, order, axis=1)
    for k in ks:
      hits[k] += int(np.sum(np.any(ranked[:, :k], axis=1)))
  return {k: hits[k] / nq for k in ks}


@pytest.mark.parametrize('block', [2, 5, 64])
def test_groups_match_each_query_against_its_own_database_only(block):
  """With `groups` (the validation clients), a query retrieves only from its group's database: the counts equal
  numpy's per-group ranking, pooled over every query, and differ from the pooled (one group) evaluation when a
  nearer image of another group would be retrieved. A group whose database is empty counts its queries as misses."""
  rng = np.random.default_rng(1)
  n = 40
  x = rng.uniform(0.1, 1, (n, 2, 2, 3)).astype(np.float32)
  pos = rng.uniform(0, 40, (n, 2)).astype(np.float32)        # the groups overlap in space: pooling would differ
  role = (rng.uniform(size=n) < 0.35).astype(np.float32)
  groups = rng.integers(0, 3, n)
  groups[(groups == 2) & (role == 0)] = 1                      # group 2: queries without a database
  role[:2], groups[:2] = 1, 2
  y = np.concatenate([pos, role[:, None]], 1)
  task = ret.Retrieval(threshold=12.0)
  got = ev.RetrievalEvaluator(_pixel_model(), x, y, batch_size=block, task=task, groups=groups)({'w': jnp.ones(())})
  flat = x.reshape(n, -1)
  desc = flat / np.linalg.norm(flat, axis=1, keepdims=True)
  want = _brute_force_recall(desc, y, groups, 12.0)
  for k in (1, 5, 10):
    assert got[f'recall@{k}'] == pytest.approx(want[k])
  assert got['count'] == int(role.sum())
  pooled = _brute_force_recall(desc, y, np.zeros(n, int), 12.0)
  assert any(pooled[k] != pytest.approx(want[k]) for k in (1, 5, 10))     # the test tells the two apart
  with pytest.raises(ValueError, match='one group id per image'):
    ev.RetrievalEvaluator(_pixel_model(), x, y, groups=groups[:-1])
