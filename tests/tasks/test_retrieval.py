"""The retrieval task (tasks/retrieval.py): the triplet loss with in-step mining against its formula written in
numpy, the valid-triplet count, the blocked exact nearest neighbours and Recall@K against a brute-force numpy
computation, and the test loss (nearest true match vs nearest wrong one); the two-pass training (mining from a
gradient-free pass, the loss on the mined slots) against the one-pass loss and gradient."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import local
from fedjax_flat.models import registry as models
from fedjax_flat.models.base import from_flax
from fedjax_flat.tasks import base as tasks
from fedjax_flat.tasks import retrieval as ret

Q, P, N, E = ret.QUERY, ret.POSITIVE, ret.NEGATIVE, ret.EMPTY


def _unit(rng, shape):
  v = rng.normal(size=shape).astype(np.float32)
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _np_triplet(desc, kinds, mask, margin, n_neg):
  """The formula, one query at a time: nearest positive, the n_neg nearest negatives, hinge of the distances."""
  total, count = 0.0, 0
  for b in range(desc.shape[0]):
    if not mask[b]:
      continue
    q = desc[b, 0]
    d = np.linalg.norm(desc[b] - q, axis=-1)
    pos = np.flatnonzero(kinds[b] == P)
    neg = np.flatnonzero(kinds[b] == N)
    if not len(pos):
      continue
    dp = d[pos].min()
    for j in neg[np.argsort(d[neg], kind='stable')][:n_neg]:
      total += max(dp - d[j] + margin, 0.0)
      count += 1
  return total, count


def test_registered_and_named():
  t = tasks.get_task('retrieval')
  assert isinstance(t, ret.Retrieval) and t.margin == 0.1 and t.threshold == 25.0


def test_triplet_loss_equals_formula_with_hardest_negatives():
  rng = np.random.default_rng(0)
  b, t, d = 6, 9, 8
  # Descriptors on a small sphere so that many hinges are active (d(q,p) - d(q,n) + 0.1 > 0).
  desc = _unit(rng, (b, t, d))
  kinds = np.array([[Q, P, P, N, N, N, N, N, N],
                    [Q, P, E, N, N, N, E, E, E],        # one positive, three negatives (< num_negatives)
                    [Q, P, P, N, N, N, N, N, E],
                    [Q, E, E, N, N, N, N, N, N],        # no positive: no triplet
                    [Q, P, P, N, N, N, N, N, N],
                    [Q, P, P, N, N, N, N, N, N]], np.int32)
  mask = np.array([1, 1, 1, 1, 1, 0], np.float32)       # the last one is padding
  task = ret.Retrieval(margin=0.3, num_negatives=4)
  s, c = task.loss_sums(jnp.asarray(desc), jnp.asarray(kinds), jnp.asarray(mask))
  ref_s, ref_c = _np_triplet(desc, kinds, mask, 0.3, 4)
  assert ref_s > 0 and ref_c == 4 + 3 + 4 + 4
  np.testing.assert_allclose(float(s), ref_s, rtol=1e-5)
  assert float(c) == ref_c
  assert float(task.unit_count(jnp.asarray(kinds), jnp.asarray(mask))) == ref_c


def test_mining_is_hardest_and_gradient_flows_only_through_the_chosen_slots():
  q = np.array([1.0, 0.0], np.float32)
  slots = np.array([q, [0.0, 1.0], [0.6, 0.8], [0.8, 0.6], [-1.0, 0.0], [0.0, -1.0]], np.float32)
  kinds = np.array([[Q, P, P, N, N, N]], np.int32)
  task = ret.Retrieval(margin=0.1, num_negatives=1)
  pos, neg, ok = task.mine(jnp.asarray(slots[None]), jnp.asarray(kinds))
  assert int(pos[0]) == 2                  # the nearer of the two positives
  assert neg.tolist() == [[3]] and bool(ok[0, 0])   # the nearest negative
  g = jax.grad(lambda x: task.loss_sums(x, jnp.asarray(kinds), jnp.ones(1))[0])(jnp.asarray(slots[None]))
  g = np.asarray(g)[0]
  assert np.all(g[[1, 4, 5]] == 0) and np.any(g[2] != 0) and np.any(g[3] != 0)


def test_identical_positive_has_a_finite_gradient():
  d = np.zeros((1, 3, 4), np.float32)
  d[0, :, 0] = 1.0
  d[0, 2] = [0.0, 1.0, 0.0, 0.0]
  kinds = np.array([[Q, P, N]], np.int32)
  g = jax.grad(lambda x: ret.Retrieval().loss_sums(x, jnp.asarray(kinds), jnp.ones(1))[0])(jnp.asarray(d))
  assert np.all(np.isfinite(np.asarray(g)))


def test_eval_sums_on_tuples_count_ordered_triplets():
  q = [1.0, 0.0]
  desc = np.array([[q, [0.9, 0.1], [0.0, 1.0], [0.95, 0.0]]], np.float32)   # d(q,p)=.14 > d(q,n2)=.05
  kinds = np.array([[Q, P, N, N]], np.int32)
  sums = ret.Retrieval(num_negatives=2).eval_sums(jnp.asarray(desc), jnp.asarray(kinds), jnp.ones(1))
  assert float(sums['count']) == 2 and float(sums['correct']) == 1


def _np_recall(qd, qp, dd, dp, ks, thr):
  dist = np.linalg.norm(qd[:, None] - dd[None], axis=-1)
  order = np.argsort(dist, axis=1, kind='stable')
  gps = np.linalg.norm(qp[:, None] - dp[None], axis=-1)
  close = np.take_along_axis(gps, order, axis=1) <= thr
  return {k: int(np.sum(np.any(close[:, :k], axis=1))) for k in ks}


@pytest.mark.parametrize('block', [4, 8, 32])
def test_recall_at_k_equals_brute_force(block):
  rng = np.random.default_rng(1)
  nq, nd, dim = 13, 29, 6
  qd, dd = _unit(rng, (nq, dim)), _unit(rng, (nd, dim))
  qp, dp = rng.uniform(0, 100, (nq, 2)).astype(np.float32), rng.uniform(0, 100, (nd, 2)).astype(np.float32)
  pad = -nd % block
  dd_p = np.concatenate([dd, np.zeros((pad, dim), np.float32)])       # padding rows must never be retrieved
  dp_p = np.concatenate([dp, np.tile(qp[:1], (pad, 1))])               # ... even sitting on a query
  dv = np.concatenate([np.ones(nd), np.zeros(pad)]).astype(np.float32)
  qv = np.ones(nq, np.float32)
  qv[-1] = 0                                                           # a padding query counts nowhere
  task = ret.Retrieval(threshold=20.0)
  sums = task.recall_sums(jnp.asarray(qd), jnp.asarray(qp), jnp.asarray(qv), jnp.asarray(dd_p), jnp.asarray(dp_p),
                          jnp.asarray(dv), block=block)
  ref = _np_recall(qd[:-1], qp[:-1], dd, dp, (1, 5, 10), 20.0)
  assert int(sums['queries']) == nq - 1
  for k in (1, 5, 10):
    assert int(sums[f'hits@{k}']) == ref[k]
  assert 0 < ref[1] < ref[10]                          # the case is not trivial
  m = task.recall_metrics(jax.device_get(sums))
  np.testing.assert_allclose(float(m['recall@5']), ref[5] / (nq - 1), rtol=1e-6)
  assert float(m['accuracy']) == float(m['recall@1'])
  # The test loss: the nearest database image within 20 m vs the nearest beyond, hinge with the margin.
  dist = np.linalg.norm(qd[:-1, None] - dd[None], axis=-1)
  gps = np.linalg.norm(qp[:-1, None] - dp[None], axis=-1)
  near = np.where(gps <= 20, dist, np.inf).min(1)
  far = np.where(gps > 20, dist, np.inf).min(1)
  both = np.isfinite(near) & np.isfinite(far)
  ref_loss = np.maximum(near - far + 0.1, 0)[both]
  assert int(sums['loss_count']) == both.sum() > 0
  np.testing.assert_allclose(float(sums['loss_sum']), ref_loss.sum(), rtol=1e-5)


def test_nearest_returns_the_exact_neighbours_in_order():
  rng = np.random.default_rng(2)
  qd, dd = _unit(rng, (5, 4)), _unit(rng, (24, 4))
  dist, idx = ret.Retrieval().nearest(jnp.asarray(qd), jnp.asarray(dd), jnp.ones(24), 7, block=6)
  ref = np.linalg.norm(qd[:, None] - dd[None], axis=-1)
  np.testing.assert_array_equal(np.asarray(idx), np.argsort(ref, axis=1)[:, :7])
  np.testing.assert_allclose(np.asarray(dist), np.sort(ref, axis=1)[:, :7], atol=1e-5)
  with pytest.raises(ValueError, match='multiple of block'):
    ret.Retrieval().nearest(jnp.asarray(qd), jnp.asarray(dd), jnp.ones(24), 7, block=5)


def test_select_picks_the_mined_slots_and_their_tuple_mines_them_again():
  rng = np.random.default_rng(3)
  desc = _unit(rng, (4, 7, 5))
  kinds = np.array([[Q, P, P, N, N, N, N], [Q, P, E, N, N, E, E], [Q, E, E, N, N, N, N], [Q, P, P, N, E, E, E]])
  task = ret.Retrieval(num_negatives=2)
  slots, k = task.select(jnp.asarray(desc), jnp.asarray(kinds))
  pos, neg, ok = task.mine(jnp.asarray(desc), jnp.asarray(kinds))
  np.testing.assert_array_equal(np.asarray(slots), np.concatenate([np.zeros((4, 1)), pos[:, None], neg], 1))
  np.testing.assert_array_equal(np.asarray(k), [[Q, P, N, N], [Q, P, N, N], [Q, E, N, N], [Q, P, N, E]])
  small = np.take_along_axis(desc, np.asarray(slots)[..., None], axis=1)
  mask = jnp.ones(4)
  for a, b in zip(task.loss_sums(jnp.asarray(small), k, mask), task.loss_sums(jnp.asarray(desc), kinds, mask)):
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
  assert float(task.unit_count(k, mask)) == float(task.unit_count(jnp.asarray(kinds), mask))


class _TinyDescriptor(nn.Module):
  """A descriptor network of any leading axes, small enough to compile at once: [..., H, W, 3] -> L2(Dense)."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    lead = x.shape[:-3]
    d = nn.Dense(6)(jnp.tanh(nn.Dense(16)(x.reshape((-1,) + (int(np.prod(x.shape[-3:])),)))))
    d = d / jnp.sqrt(jnp.sum(d * d, -1, keepdims=True))
    return d.reshape(lead + (6,))


def _one_and_two_pass(model, x, kinds, mask):
  batch = {'x': jnp.asarray(x), 'y': jnp.asarray(kinds), 'mask': jnp.asarray(mask)}
  params = model.init(jax.random.key(0), batch['x'][:1])
  out = {}
  for two in (True, False):
    fn = local.make_loss(model, task=ret.Retrieval(num_negatives=2, margin=0.5, cache_pass=two))
    out[two] = jax.jit(jax.value_and_grad(fn, has_aux=True))(params, batch)
  (v2, aux2), g2 = out[True]
  (v1, aux1), g1 = out[False]
  assert float(v1) > 0 and float(aux2[1]) == float(aux1[1])
  np.testing.assert_allclose(float(v2), float(v1), rtol=1e-5)
  scale = max(float(np.max(np.abs(np.asarray(a)))) for a in jax.tree_util.tree_leaves(g1))
  for a, b in zip(jax.tree_util.tree_leaves(g2), jax.tree_util.tree_leaves(g1)):
    # float32 sums in another order: equal to 1e-4 of the largest gradient entry
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-4 * scale)
  return float(aux1[1])


KINDS7 = np.array([[Q, P, P, N, N, N, N], [Q, P, E, N, N, N, E], [Q, P, P, N, N, N, N]], np.uint8)


def test_cache_pass_gives_the_one_pass_loss_and_gradient():
  """Mining from a gradient-free pass, then the loss's pass on the 2 + n mined slots only, equals the loss and
  gradient of mining inside one pass with gradient over all T slots (algorithms/local.make_loss)."""
  model = from_flax(_TinyDescriptor(), 'tiny', 1, (7, 4, 4, 3))
  x = np.random.default_rng(0).uniform(0, 1, (3, 7, 4, 4, 3)).astype(np.float32)
  assert _one_and_two_pass(model, x, KINDS7, [1.0, 1.0, 0.0]) == 4.0


@pytest.mark.slow   # two compilations of the ResNet gradient (~40 s under load); the test above: tiny size
def test_cache_pass_gives_the_one_pass_loss_and_gradient_of_vpr_resnet18():
  model = models.get_model('vpr_resnet18', 1, (7, 16, 16, 3), base_width=4, gn_groups=2)
  x = np.random.default_rng(0).uniform(0, 1, (3, 7, 16, 16, 3)).astype(np.float32)
  assert _one_and_two_pass(model, x, KINDS7, [1.0, 1.0, 0.0]) == 4.0


class _TinyBNDescriptor(nn.Module):
  """_TinyDescriptor with a BatchNorm layer (masked per tuple, as models/vpr.py's)."""
  bn_momentum: float = 0.9

  @nn.compact
  def __call__(self, x, train: bool = False, *, use_running_average=None, mask=None):
    lead = x.shape[:-3]
    h = nn.Dense(16)(x.reshape((-1,) + (int(np.prod(x.shape[-3:])),)))
    if mask is not None:
      m = jnp.reshape(mask, (-1,))
      mask = jnp.broadcast_to(m.reshape(m.shape[:1] + (1,) * (len(lead) - 1)), lead).reshape((-1, 1))
    ura = (not train) if use_running_average is None else use_running_average
    h = nn.BatchNorm(momentum=self.bn_momentum)(h, use_running_average=ura, mask=mask)
    d = nn.Dense(6)(jnp.tanh(h))
    return (d / jnp.sqrt(jnp.sum(d * d, -1, keepdims=True))).reshape(lead + (6,))


def test_cache_pass_with_batch_norm_mines_with_running_statistics_and_trains_on_the_mined_slots():
  """A BatchNorm model: the cache pass is in evaluation mode (running statistics, as the reference's cache under
  model.eval()); the loss and the new running statistics are those of the training pass over the mined slots."""
  model = from_flax(_TinyBNDescriptor(), 'tiny_bn', 1, (7, 4, 4, 3), batch_stats=True)
  x = jnp.asarray(np.random.default_rng(1).uniform(0, 1, (3, 7, 4, 4, 3)).astype(np.float32))
  kinds, mask = jnp.asarray(KINDS7), jnp.asarray([1.0, 1.0, 0.0])
  params = model.init(jax.random.key(0), x[:1])
  params['batch_stats'] = jax.tree_util.tree_map(lambda v: v + 0.3, params['batch_stats'])  # not the batch's
  task = ret.Retrieval(num_negatives=2, margin=0.5)
  total, (loss_sum, count, stats) = jax.jit(local.make_loss(model, task=task))(
      params, {'x': x, 'y': kinds, 'mask': mask})
  slots, k = task.select(model.apply(params, x, train=False), kinds)             # running statistics
  xs = jnp.take_along_axis(x, slots[:, :, None, None, None], axis=1)
  desc, want_stats = model.apply(params, xs, train=True, mask=mask, with_batch_stats=True)
  want_sum, want_count = task.loss_sums(desc, k, mask)
  assert float(count) == float(want_count) == 4.0 and float(loss_sum) > 0
  np.testing.assert_allclose(float(loss_sum), float(want_sum), rtol=1e-5)
  np.testing.assert_allclose(float(total), float(want_sum) / 4.0, rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(stats), jax.tree_util.tree_leaves(want_stats)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
