"""LADD (algorithms/ladd.py): pseudo-label selection against the release's rule written with numpy loops, the
self-training + KD loss against its formula, one client step against a hand SGD step, clustered aggregation leaf
by leaf (two clusters, one round through the engine), the teacher schedule (refresh, then SWA: eq. 5.9), the
target labels never read, and the cluster-layer selections on the segmentation model."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_flat.algorithms import ladd as L
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config, segmentation_data
from fedjax_flat.errors import ConfigError
from fedjax_flat.grouping import style_clusters
from fedjax_flat.core import engine
from fedjax_flat.evaluation import routed
from fedjax_flat.core.client_state import store_for
from fedjax_flat.models import base
from fedjax_flat.models.registry import get_model
from fedjax_flat.optimizers.client import client_optimizer
from fedjax_flat.training import trainers
from tests.fixtures.configs import set_fields

tmap = jax.tree_util.tree_map
C = 3


class Tiny(nn.Module):
  """enc (1x1 conv) -> relu -> head (1x1 conv): a per-pixel classifier with a body and a classifier."""

  @nn.compact
  def __call__(self, x, train=False):
    h = nn.relu(nn.Conv(4, (1, 1), name='enc')(x))
    return nn.Conv(C, (1, 1), name='head')(h)


MODEL = base.from_flax(Tiny(), 'tiny', C, (4, 4, 3))


def _params(seed):
  return MODEL.init(jax.random.PRNGKey(seed), jnp.zeros((1, 4, 4, 3)))


def _client_cfg(lr=0.1):
  cfg = default_config().client
  cfg.lr, cfg.momentum, cfg.weight_decay = lr, 0.0, 0.0
  return cfg


# --------------------------------------------------------------------------------- pseudo-label selection

def _np_pseudo(probs, conf_th, fraction):
  """The release's get_image_mask with numpy loops: per predicted class, the int(n_c * fraction) most confident."""
  p = probs.reshape(-1, probs.shape[-1])
  maxp, lab = p.max(-1), p.argmax(-1)
  keep = maxp > conf_th if 0 < conf_th < 1 else np.zeros(len(maxp), bool)
  if 0 < fraction < 1:
    for c in np.unique(lab):
      members = np.nonzero(lab == c)[0]
      k = int(len(members) * fraction)
      top = members[np.argsort(-maxp[members], kind='stable')[:k]]
      keep[top] = True
  return lab.reshape(probs.shape[:-1]), keep.reshape(probs.shape[:-1])


@pytest.mark.parametrize('conf_th,fraction', [(0.9, 0.66), (0.5, 0.66), (0.9, 0.0), (0.0, 0.66), (0.99, 0.3)])
def test_pseudo_labels_keep_exactly_the_intended_pixels(conf_th, fraction):
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 2.5, (6, 7, C)).astype(np.float32)     # distinct confidences: no ties
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), -1))
  lab, keep = L.pseudo_labels(jnp.asarray(probs), conf_th, fraction)
  want_lab, want_keep = _np_pseudo(probs, conf_th, fraction)
  np.testing.assert_array_equal(np.asarray(lab), want_lab)
  np.testing.assert_array_equal(np.asarray(keep), want_keep)
  if conf_th == 0.9 and fraction == 0.66:
    assert 0 < want_keep.sum() < want_keep.size     # the case is not trivial


def test_pseudo_labels_hand_case():
  # 5 pixels, 2 classes: class 0 has confidences .95 .6 .55 (k = int(3 * .66) = 1), class 1 .7 .8 (k = 1).
  probs = np.array([[.95, .05], [.6, .4], [.55, .45], [.3, .7], [.2, .8]], np.float32)
  lab, keep = L.pseudo_labels(jnp.asarray(probs), 0.9, 0.66)
  np.testing.assert_array_equal(np.asarray(lab), [0, 0, 0, 1, 1])
  np.testing.assert_array_equal(np.asarray(keep), [True, False, False, False, True])


# --------------------------------------------------------------------------------- the loss

def test_self_training_sums_formula():
  rng = np.random.default_rng(1)
  s, t, p = (rng.normal(0, 2, (3, 4, 5, C)).astype(np.float32) for _ in range(3))
  mask = np.array([1, 1, 0], np.float32)
  lam, alpha = 7.0, 0.5
  got, n = L.self_training_sums(jnp.asarray(s), jnp.asarray(t), jnp.asarray(p), jnp.asarray(mask),
                                lambda_kd=lam, alpha_kd=alpha)
  want = 0.0
  logp = np.log(np.exp(s) / np.exp(s).sum(-1, keepdims=True))
  soft = lambda z: np.exp(z) / np.exp(z).sum(-1, keepdims=True)  # noqa: E731
  for i in range(2):                                              # the padding example counts nowhere
    lab, keep = _np_pseudo(soft(t[i]), 0.9, 0.66)
    ce = -np.take_along_axis(logp[i], lab[..., None], -1)[..., 0]
    want += np.sum(ce * keep)
    _, keep_pre = _np_pseudo(soft(p[i]), 0.9, 0.66)
    q = soft(alpha * p[i])
    want += lam * np.sum(-np.mean(logp[i] * q, -1) * keep_pre)
  assert float(n) == 2 * 4 * 5
  np.testing.assert_allclose(float(got), want, rtol=1e-4)


def _hand_problem():
  """Two images of 1 x 4 pixels, 2 classes, and a padding image; probabilities chosen so that every kept pixel
  and every loss term can be read off by hand (the docstring of test_self_training_loss_hand_checked_pixels)."""
  p_teacher = np.array([[[.95, .05], [.60, .40], [.55, .45], [.30, .70]],
                        [[.20, .80], [.25, .75], [.97, .03], [.40, .60]],
                        [[.99, .01], [.99, .01], [.99, .01], [.99, .01]]], np.float64)
  p_student = np.array([[[.5, .5], [.5, .5], [.5, .5], [.5, .5]],
                        [[.75, .25], [.5, .5], [.8, .2], [.5, .5]],
                        [[.1, .9], [.1, .9], [.1, .9], [.1, .9]]], np.float64)
  p_pre = np.array([[[16 / 17, 1 / 17], [16 / 17, 1 / 17], [.5, .5], [.5, .5]],
                    [[.30, .70], [.40, .60], [.45, .55], [.35, .65]],
                    [[.99, .01], [.99, .01], [.99, .01], [.99, .01]]], np.float64)
  logits = lambda p: jnp.asarray(np.log(p)[:, None].astype(np.float32))  # noqa: E731  [B, 1, 4, C]
  return logits(p_student), logits(p_teacher), logits(p_pre), jnp.array([1.0, 1.0, 0.0])


def test_self_training_loss_hand_checked_pixels():
  """The release's selftrain_div client loss (src/utils/loss.py SelfTrainingLoss + KnowledgeDistillationLoss as
  src/clients/fda_client.py combines them), pixel by pixel:
    teacher, image 0: class 0 at .95 .60 .55 (k = int(3 * .66) = 1: the .95 pixel, also > .9), class 1 at .70
      (k = int(.66) = 0): kept {0}.  Image 1: class 1 at .80 .75 .60 (k = 1: the .80 pixel), class 0 at .97
      (> .9): kept {0, 2}.  Image 2 is padding: counts nowhere.
    L_pseudo = [CE(.5 .5 | 0) + CE(.75 .25 | 1) + CE(.8 .2 | 0)] / 8 = [ln 2 + ln 4 - ln .8] / 8: the mean over
      ALL 8 pixels (ignored pixels are zeros in the mean), no hard-negative mining (the release's `hnm` flag gives
      this criterion an identity reduction: requires_reduction = False).
    pre-trained, image 0: .941 .941 .5 .5 of class 0 (.941 > .9; k = int(4 * .66) = 2 keeps the same two): mask
      {0, 1}; image 1: class 1 at .70 .60 .55 .65 (none > .9; k = 2: .70 and .65): mask {0, 3}.
    L_kd = sum over masked pixels of -(1/2) sum_c log s_c q_c / 8, q = softmax(0.5 z_pre) = sqrt(p_pre)
      normalised; image 0's q = (.8, .2) against s = (.5, .5): ln 2 / 2 per pixel."""
  s, t, p, mask = _hand_problem()
  lab, keep = L.pseudo_labels(jax.nn.softmax(t[0, 0], -1), 0.9, 0.66)
  np.testing.assert_array_equal(np.asarray(lab), [0, 0, 0, 1])
  np.testing.assert_array_equal(np.asarray(keep), [True, False, False, False])
  lab, keep = L.pseudo_labels(jax.nn.softmax(t[1, 0], -1), 0.9, 0.66)
  np.testing.assert_array_equal(np.asarray(lab), [1, 1, 0, 1])
  np.testing.assert_array_equal(np.asarray(keep), [True, False, True, False])
  _, keep_pre = L.pseudo_labels(jax.nn.softmax(p[0, 0], -1), 0.9, 0.66)
  np.testing.assert_array_equal(np.asarray(keep_pre), [True, True, False, False])
  _, keep_pre = L.pseudo_labels(jax.nn.softmax(p[1, 0], -1), 0.9, 0.66)
  np.testing.assert_array_equal(np.asarray(keep_pre), [True, False, False, True])

  st = np.log(2) + np.log(4) - np.log(.8)
  q10 = np.sqrt([.30, .70]) / np.sqrt([.30, .70]).sum()
  kd = 2 * np.log(2) / 2 + (-(q10[0] * np.log(.75) + q10[1] * np.log(.25)) / 2) + np.log(2) / 2
  lam = 20.0
  got, n = L.self_training_sums(s, t, p, mask, lambda_kd=lam, alpha_kd=0.5)
  assert float(n) == 8.0
  np.testing.assert_allclose(float(got), st + lam * kd, rtol=1e-5)
  np.testing.assert_allclose(float(got) / float(n), (st + lam * kd) / 8, rtol=1e-5)
  got_st, _ = L.self_training_sums(s, t, None, mask, lambda_kd=0.0)
  np.testing.assert_allclose(float(got_st), st, rtol=1e-5)
  # Hard-negative mining (each image's top int(.25 * 4) = 1 pixel loss, mean over the batch) would give
  # (ln 4 + ln 2) / 2 for L_pseudo: not the release's self-training loss.
  assert abs(float(got_st) / 8 - (np.log(4) + np.log(2)) / 2) > 0.1


def test_self_training_loss_matches_torch_reductions():
  """The same problem through torch's own reductions, as the release computes it: cross_entropy with
  ignore_index=255, reduction='none', then .mean() (ignored pixels in the denominator); KD = -mean over pixels of
  mean over classes of log_softmax(student) * softmax(alpha * pre) times the pre-trained model's mask."""
  torch = pytest.importorskip('torch')
  s, t, p, mask = _hand_problem()
  nchw = lambda a: torch.from_numpy(np.asarray(a[:2, 0])[:, None].transpose(0, 3, 1, 2).copy())  # noqa: E731
  ts, tt, tp = nchw(s), nchw(t), nchw(p)
  sel = jax.vmap(lambda q: L.pseudo_labels(q, 0.9, 0.66))
  lab, keep = sel(jax.nn.softmax(t[:2], -1))
  lab_torch = torch.softmax(tt, 1).max(1)[1].numpy()          # the release's pseudo-label: teacher argmax
  np.testing.assert_array_equal(lab_torch, np.asarray(lab))
  pseudo = torch.from_numpy(np.where(np.asarray(keep), lab_torch, 255).astype(np.int64))
  st = torch.nn.functional.cross_entropy(ts, pseudo, ignore_index=255, reduction='none').mean()
  _, keep_pre = sel(jax.nn.softmax(p[:2], -1))
  kd_px = (torch.log_softmax(ts, 1) * torch.softmax(0.5 * tp, 1)).mean(1) * torch.from_numpy(
      np.asarray(keep_pre, np.float32))
  want = st + 20.0 * -kd_px.mean()
  got, n = L.self_training_sums(s, t, p, mask, lambda_kd=20.0, alpha_kd=0.5)
  np.testing.assert_allclose(float(got) / float(n), float(want), rtol=1e-5)


def test_one_client_step_is_sgd_on_the_formula_loss():
  pre, teacher, w = _params(0), _params(1), _params(2)
  x = jax.random.uniform(jax.random.PRNGKey(3), (2, 4, 4, 3))
  batch = {'x': x, 'y': jnp.zeros((2, 4, 4), jnp.uint8), 'mask': jnp.array([1.0, 1.0])}
  lam, lr = 3.0, 0.1
  loss = L.make_self_training_loss(MODEL, lambda_kd=lam)
  tx = client_optimizer(_client_cfg(lr))
  local = local_lib.LocalState(w, tx.init(w), w)
  new, _ = local_lib.local_step(local, batch, None, loss_fn=lambda p, b, r: loss(p, teacher, pre, b, r), tx=tx,
                                hparams={'lr': jnp.float32(lr), 'rho': jnp.float32(0.0)})
  # By hand: masks from numpy (constants), the loss in jnp from the formula, one SGD step.
  soft = lambda z: np.asarray(jax.nn.softmax(z, -1))  # noqa: E731
  sel = [_np_pseudo(q, 0.9, 0.66) for q in soft(MODEL.apply(teacher, x))]
  sel_pre = [_np_pseudo(q, 0.9, 0.66)[1] for q in soft(MODEL.apply(pre, x))]
  q_pre = jax.nn.softmax(0.5 * MODEL.apply(pre, x), -1)

  def ref(p):
    logp = jax.nn.log_softmax(MODEL.apply(p, x), -1)
    tot = 0.0
    for i in range(2):
      lab, keep = sel[i]
      tot += jnp.sum(-jnp.take_along_axis(logp[i], jnp.asarray(lab)[..., None], -1)[..., 0] * keep)
      tot += lam * jnp.sum(-jnp.mean(logp[i] * q_pre[i], -1) * sel_pre[i])
    return tot / 32.0
  want = tmap(lambda a, g: a - lr * g, w, jax.grad(ref)(w))
  for a, b in zip(jax.tree_util.tree_leaves(new.params), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------- clustered aggregation

SIZES = np.array([2.0, 4.0, 2.0, 6.0])     # examples of the 4 sampled clients
CLUSTER = np.array([0, 1, 1, 0])


def _round_inputs():
  xs = jax.random.uniform(jax.random.PRNGKey(7), (4, 3, 2, 4, 4, 3))     # [C, S, B, ...]
  mask = np.zeros((4, 3, 2), np.float32)
  for k, n in enumerate(SIZES.astype(int)):
    mask[k].reshape(-1)[:n] = 1.0
  batches = {'x': xs, 'y': jnp.zeros((4, 3, 2, 4, 4), jnp.uint8), 'mask': jnp.asarray(mask)}
  return batches


def _alg(layers, g=2, **kw):
  return L.ladd(MODEL, *client_parts(_client_cfg()), optax.sgd(1.0), num_clusters=g, pretrained=_params(0),
                cluster_layers=layers,
                lambda_kd=2.0, **kw)


def _client_params(alg, state, batches, k, cluster=CLUSTER):
  """Client k's trained params, by the algorithm's own client functions step by step."""
  bcast = alg.broadcast(state, 0)
  cs = {'cluster': jnp.int32(cluster[k])}
  local = alg.client_init(bcast, cs, None)
  for s in range(3):
    b = tmap(lambda a: a[k, s], batches)
    if float(jnp.sum(b['mask'])) > 0:
      local, _ = alg.client_step(bcast, local, b, jax.random.fold_in(jax.random.PRNGKey(0), s))
  return local.params


@pytest.mark.parametrize('layers', ['cls', 'all'])
def test_clustered_aggregation_leaf_by_leaf(layers):
  alg = _alg(layers)
  w0 = _params(5)
  state = alg.server_init(w0, None)
  # Start the two clusters from different classifier values, so that the clusters really hold their own.
  state['cluster'] = [x.at[1].add(0.3) for x in state['cluster']]
  batches = _round_inputs()
  trained = [_client_params(alg, state, batches, k) for k in range(4)]
  rngs = jnp.stack([jax.random.PRNGKey(0)] * 4)
  round_fn = engine.make_round_fn(alg, chunk=1, jit=False)
  new, _, _ = round_fn(state, batches, L.initial_client_states(CLUSTER), rngs, jnp.asarray(SIZES),
                       jnp.ones(4, bool), 0)
  flags = L.leaf_flags(w0, L.cluster_layer_select(layers))
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(w0)[0]]
  assert any(flags) and (all(flags) if layers == 'all' else not all(flags))
  leaves = [jax.tree_util.tree_leaves(t) for t in trained]
  ci = 0
  for i, (path, f) in enumerate(zip(paths, flags)):
    if f:                            # cluster-local: each cluster's weighted mean of ITS clients only
      assert ('head' in path) or layers == 'all'
      for c in (0, 1):
        ids = np.nonzero(CLUSTER == c)[0]
        want = sum(SIZES[k] * np.asarray(leaves[k][i]) for k in ids) / SIZES[ids].sum()
        np.testing.assert_allclose(np.asarray(new['cluster'][ci][c]), want, rtol=1e-5, atol=1e-6)
      ci += 1
    else:                            # global: the weighted mean over every client
      want = sum(SIZES[k] * np.asarray(leaves[k][i]) for k in range(4)) / SIZES.sum()
      np.testing.assert_allclose(np.asarray(jax.tree_util.tree_leaves(new['params'])[i]), want, rtol=1e-5,
                                 atol=1e-6)
  # The two cluster models differ exactly on the cluster leaves.
  m0, m1 = (jax.tree_util.tree_leaves(L.cluster_params(new, c, flags)) for c in (0, 1))
  for a, b, f in zip(m0, m1, flags):
    assert (not np.allclose(np.asarray(a), np.asarray(b))) == f


def test_unsampled_cluster_keeps_its_leaves_and_one_cluster_is_fedavg():
  alg = _alg('cls', g=3)
  state = alg.server_init(_params(5), None)
  state['cluster'] = [x.at[2].add(1.0) for x in state['cluster']]
  batches = _round_inputs()
  rngs = jnp.stack([jax.random.PRNGKey(0)] * 4)
  new, _, _ = engine.make_round_fn(alg, chunk=1, jit=False)(
      state, batches, L.initial_client_states(CLUSTER), rngs, jnp.asarray(SIZES), jnp.ones(4, bool), 0)
  for old, nw in zip(state['cluster'], new['cluster']):
    np.testing.assert_array_equal(np.asarray(old[2]), np.asarray(nw[2]))        # cluster 2 had no client
  # The release (algo.unsampled_clusters='global'): cluster 2 takes the previous global model's leaves, the
  # sampled clusters are the same as above.
  rel = _alg('cls', g=3, unsampled_clusters='global')
  new_rel, _, _ = engine.make_round_fn(rel, chunk=1, jit=False)(
      state, batches, L.initial_client_states(CLUSTER), rngs, jnp.asarray(SIZES), jnp.ones(4, bool), 0)
  flags = L.leaf_flags(state['params'], L.cluster_layer_select('cls'))
  prev = [x for x, f in zip(jax.tree_util.tree_leaves(state['params']), flags) if f]
  for p, nw, kept in zip(prev, new_rel['cluster'], new['cluster']):
    np.testing.assert_array_equal(np.asarray(nw[2]), np.asarray(p))
    np.testing.assert_array_equal(np.asarray(nw[:2]), np.asarray(kept[:2]))
    assert not np.array_equal(np.asarray(nw[2]), np.asarray(kept[2]))
  # One cluster (FedAvg + self-training): the new model is the weighted mean of every client's model.
  alg1 = _alg('cls', g=1)
  s1 = alg1.server_init(_params(5), None)
  trained = [_client_params(alg1, s1, batches, k, np.zeros(4, int)) for k in range(4)]
  new1, _, _ = engine.make_round_fn(alg1, chunk=1, jit=False)(
      s1, batches, L.initial_client_states(np.zeros(4)), rngs, jnp.asarray(SIZES), jnp.ones(4, bool), 0)
  want = tmap(lambda *ps: sum(SIZES[k] * ps[k] for k in range(4)) / SIZES.sum(), *trained)
  for a, b in zip(jax.tree_util.tree_leaves(new1['params']), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_target_labels_are_never_read():
  alg = _alg('cls')
  state = alg.server_init(_params(5), None)
  batches = _round_inputs()
  other = {**batches, 'y': jnp.full(batches['y'].shape, 2, jnp.uint8)}
  rngs = jnp.stack([jax.random.PRNGKey(0)] * 4)
  fn = engine.make_round_fn(alg, chunk=1, jit=False)
  a = fn(state, batches, L.initial_client_states(CLUSTER), rngs, jnp.asarray(SIZES), jnp.ones(4, bool), 0)[0]
  b = fn(state, other, L.initial_client_states(CLUSTER), rngs, jnp.asarray(SIZES), jnp.ones(4, bool), 0)[0]
  for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


# --------------------------------------------------------------------------------- teachers

def test_teacher_refresh_then_swa():
  """omega = 2, t_start = 4: teachers = w_c at rounds 2 (refresh), then the running mean at rounds 4, 6, 8."""
  alg = _alg('all', teacher_step=2, swa_teacher_start=4)
  w0 = _params(5)
  state = alg.server_init(w0, None)
  pre0 = jax.tree_util.tree_leaves(state['teacher'])[0]
  flat0 = [np.asarray(x) for x in state['cluster']]
  zeros = tmap(jnp.zeros_like, w0)
  teacher_ref = [np.asarray(x) for x in jax.tree_util.tree_leaves(state['teacher'])]
  swa_n = 0
  for r in range(8):
    # Every round: cluster c's leaves become flat0 + (r + 1) * (c + 1) (all clients of both clusters sampled).
    vals = [np.stack([f[c] + (r + 1) * (c + 1) for c in range(2)]) for f in flat0]
    agg = {'weighted': {'delta': zeros, 'cluster_sum': [jnp.asarray(v * 0.5) for v in vals],
                        'cluster_w': jnp.array([0.5, 0.5])}}
    state = alg.server_update(state, agg, r)
    nxt = r + 1
    if nxt % 2 == 0:
      if nxt >= 4:
        teacher_ref = [(t * swa_n + v) / (swa_n + 1) for t, v in zip(teacher_ref, vals)]
        swa_n += 1
      else:
        teacher_ref = [v for v in vals]
    for got, want in zip(jax.tree_util.tree_leaves(state['teacher']), teacher_ref):
      np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    if r == 0:      # round 1 is not a refresh round: still the pre-trained model
      np.testing.assert_array_equal(np.asarray(jax.tree_util.tree_leaves(state['teacher'])[0]), np.asarray(pre0))
  assert float(state['swa_n']) == swa_n == 3


def _release_teachers(cluster_models, client_clusters):
  """The release's set_client_teacher loop (no SWA teacher), written out: ONE teacher object; for each training
  client in order, the object is loaded with that client's cluster model and the client's loss keeps a reference
  to it. Returns what each client's loss holds after the loop."""
  teacher = {'state': None}                      # the shared, mutable teacher model
  held = []
  for c in client_clusters:
    teacher['state'] = cluster_models[c]          # model.load_state_dict(clusters_models[c.cluster_id])
    held.append(teacher)                          # c.criterion.set_teacher(model): a reference, not a copy
  return [h['state'] for h in held]


def test_release_teacher_sharing_gives_every_client_the_last_clients_cluster_teacher():
  labels = np.array([1, 0, 1, 0], np.int32)       # the last client (3) is in cluster 0
  clusters = style_clusters.StyleClustering(2, labels, np.zeros((2, 27)), {}, 0.0)
  w0 = _params(5)
  got = {}
  for rule in ('paper', 'release'):
    cfg = _train_config(**{'algo.teacher_sharing': rule})
    alg = alg_registry.build_algorithm(cfg, MODEL, population=4, client_clusters=clusters)
    state = alg.server_init(w0, None)
    # two different teachers, as after a refresh: g_c = w_0 + c + 1
    state['teacher'] = tmap(lambda t: t + jnp.arange(1, 3, dtype=t.dtype).reshape((2,) + (1,) * (t.ndim - 1)),
                            state['teacher'])
    bcast = alg.broadcast(state, 0)
    got[rule] = [alg.client_init(bcast, {'cluster': jnp.int32(c)}, None).extra for c in labels]
    models = [tmap(lambda t: t[c], state['teacher']) for c in range(2)]
  want = {'paper': [models[c] for c in labels], 'release': _release_teachers(models, labels)}
  for rule in ('paper', 'release'):
    for a, b in zip(got[rule], want[rule]):
      jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)
  assert all(float(jax.tree_util.tree_leaves(t)[0].ravel()[0] - jax.tree_util.tree_leaves(w0)[0].ravel()[0]) ==
             pytest.approx(1.0) for t in got['release'])          # cluster 0's teacher for every client


def test_release_swa_teacher_averages_the_global_model():
  """omega = 1, t_start = 2, 2 clusters ('cls'): the release's SWA update, swa <- (1 - a) swa + a w with
  a = 1 / (n + 1) and w the round's global model (Phi with the clusters' mean), for every cluster's teacher;
  before t_start the teachers are the cluster models w_c (the paper's rule, unchanged)."""
  alg = _alg('cls', teacher_step=1, swa_teacher_start=2, swa_teacher_model='release')
  paper = _alg('cls', teacher_step=1, swa_teacher_start=2)
  w0 = _params(5)
  state = ps = alg.server_init(w0, None)
  flags = L.leaf_flags(w0, L.cluster_layer_select('cls'))
  flat0 = [np.asarray(x) for x in state['cluster']]
  zeros = tmap(jnp.zeros_like, w0)
  swa, n = None, 0
  for r in range(5):
    vals = [np.stack([f[c] + (r + 1) * (c + 1) for c in range(2)]) for f in flat0]
    agg = {'weighted': {'delta': zeros, 'cluster_sum': [jnp.asarray(v * 0.5) for v in vals],
                        'cluster_w': jnp.array([0.5, 0.5])}}
    state, ps = alg.server_update(state, agg, r), paper.server_update(ps, agg, r)
    it = iter(vals)
    glob = [np.asarray(x) if not f else next(it).mean(0) for x, f in zip(jax.tree_util.tree_leaves(w0), flags)]
    it = iter(vals)
    cluster_w = [np.broadcast_to(x, (2,) + x.shape) if not f else next(it)
                 for x, f in zip(jax.tree_util.tree_leaves(w0), flags)]
    got = [np.asarray(x) for x in jax.tree_util.tree_leaves(state['teacher'])]
    if r + 1 >= 2:
      a = 1.0 / (n + 1)
      swa = [g.copy() for g in glob] if swa is None else [(1 - a) * s + a * g for s, g in zip(swa, glob)]
      n += 1
      for t, s in zip(got, swa):
        for c in range(2):
          np.testing.assert_allclose(t[c], s, rtol=1e-5, atol=1e-5)
      if r + 1 > 2:     # the paper's SWA teachers (of each w_c) differ on the cluster leaves
        assert any(not np.allclose(a, b) for a, b in zip(got, jax.tree_util.tree_leaves(ps['teacher'])))
    else:
      for t, w, p in zip(got, cluster_w, jax.tree_util.tree_leaves(ps['teacher'])):
        np.testing.assert_allclose(t, w, rtol=1e-6)
        np.testing.assert_array_equal(t, np.asarray(p))
  assert n == 4
  cfg = _train_config(**{'algo.swa_teacher_model': 'bogus'})
  with pytest.raises(ConfigError, match='swa_teacher_model'):
    validate.validate_config(cfg)


# --------------------------------------------------------------------------------- layer selections

@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_cluster_layer_selections_on_the_segmentation_model():
  model = get_model('seg_cnn', num_classes=4, input_shape=(16, 16, 3), width=4)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 3)))
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]

  def picked(which):
    return [p for p, f in zip(paths, L.leaf_flags(params, L.cluster_layer_select(which))) if f]
  cls = picked('cls')
  assert cls and all(("'head'" in p or "'aux'" in p) and 'batch_stats' not in p for p in cls)
  dec = picked('decoder')
  assert set(cls) <= set(dec) and any("'dec1_conv'" in p for p in dec)
  assert all('norm' not in p and 'batch_stats' not in p and "'enc" not in p for p in dec)
  bn = picked('bn')
  assert bn and all('norm' in p for p in bn) and any('batch_stats' in p for p in bn)
  assert picked('all') == paths and picked('none') == []
  with pytest.raises(ValueError, match='cluster_layers'):
    L.cluster_layer_select('encoder')


# --------------------------------------------------------------------------------- FedSAM / FedASAM clients

def _sa_step(optimizer, rho, eta=0.0):
  """One LADD client step through the algorithm's own client functions with client.optimizer = optimizer."""
  cfg = _client_cfg(0.1)
  cfg.optimizer, cfg.rho, cfg.asam_eta = optimizer, rho, eta
  alg = L.ladd(MODEL, *client_parts(cfg), optax.sgd(1.0), num_clusters=2, pretrained=_params(0), cluster_layers='cls',
               lambda_kd=2.0)
  state = alg.server_init(_params(5), None)
  state['cluster'] = [x.at[1].add(0.3) for x in state['cluster']]
  bcast = alg.broadcast(state, 0)
  local = alg.client_init(bcast, {'cluster': jnp.int32(1)}, None)
  x = jax.random.uniform(jax.random.PRNGKey(3), (2, 4, 4, 3))
  batch = {'x': x, 'y': jnp.zeros((2, 4, 4), jnp.uint8), 'mask': jnp.array([1.0, 1.0])}
  new, _ = alg.client_step(bcast, local, batch, None)
  return local, new, bcast, batch


@pytest.mark.parametrize('optimizer,eta', [('sam', 0.0), ('asam', 0.2)])
def test_sharpness_aware_clients_compose_with_ladd(optimizer, eta):
  """FedSAM / FedASAM clients of LADD: the step is SGD on the self-training loss's gradient at the ascent point
  w + e (SAM: e = rho g / ||g||; ASAM: e = rho T^2 g / ||T g||, T = |w| + eta on kernels, 1 on biases), with the
  pseudo-labels of the cluster teacher fixed; it differs from the plain SGD step."""
  rho, lr = 0.5, 0.1
  local, new, bcast, batch = _sa_step(optimizer, rho, eta)
  _, sgd, _, _ = _sa_step('sgd', 0.0)
  w = local.params
  teacher = local.extra
  loss = L.make_self_training_loss(MODEL, lambda_kd=2.0)
  f = lambda p: loss(p, teacher, bcast['pretrained'], batch)[0]  # noqa: E731
  g = jax.grad(f)(w)
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(w)[0]]
  gl, wl = jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(w)
  if optimizer == 'sam':
    t = [np.ones_like(np.asarray(a)) for a in wl]
  else:
    t = [np.abs(np.asarray(a)) + eta if 'kernel' in p else np.ones_like(np.asarray(a)) for p, a in zip(paths, wl)]
  tg = [ti * np.asarray(gi) for ti, gi in zip(t, gl)]
  norm = np.sqrt(sum(np.sum(a ** 2) for a in tg))
  eps = [rho * ti * a / norm for ti, a in zip(t, tg)]
  w_adv = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(w),
                                       [np.asarray(a) + e for a, e in zip(wl, eps)])
  g_adv = jax.grad(f)(w_adv)
  want = tmap(lambda a, b: a - lr * b, w, g_adv)
  for a, b in zip(jax.tree_util.tree_leaves(new.params), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  # The ascent happened: the step is not SGD's.
  assert max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree_util.tree_leaves(new.params), jax.tree_util.tree_leaves(sgd.params))) > 1e-5


# --------------------------------------------------------------------------------- registered: train.py's path

def _train_config(**over):
  c = default_config()
  c.dataset = 'seg_synthetic_da'
  c.data = segmentation_data('seg_synthetic_da', num_styles=2, clients_per_style=2, examples_per_client=2,
                             source_examples=4, test_per_style=2, image_size=(16, 16), crop=(16, 16))
  c.model = 'seg_cnn'
  c.model_kwargs = {'norm': 'bn', 'width': 4, 'aux': False, 'conv_impl': 'auto'}
  c.algorithm = 'ladd'
  c.algo = {'force_k': 2, 'cluster_layers': 'all', 'lambda_kd': 1.0, 'random_init': True}
  c.rounds, c.clients_per_round, c.eval_every = 1, 4, 100
  c.client.batch_size, c.client.lr, c.client.momentum, c.client.weight_decay = 2, 0.05, 0.0, 0.0
  c.progress_every_s = 1e9
  return set_fields(c, over)


def test_registered_ladd_starts_each_client_from_its_cluster():
  """The registered builder (fast, on the tiny model): given the trainer's clusters, the store built for it
  (core/client_state.store_for) holds every client's cluster, w_0 is the pre-trained model (teachers, KD), and one
  round of the engine with the store's states moves every sampled cluster, leaf by leaf as the direct call."""
  labels = np.array([1, 0, 1, 0], np.int32)
  clusters = style_clusters.StyleClustering(2, labels, np.zeros((2, 27)), {}, 0.0)
  cfg = _train_config(**{'algo.lambda_kd': 2.0})
  alg = alg_registry.build_algorithm(cfg, MODEL, population=4, client_clusters=clusters)
  w0 = _params(5)
  store = store_for(alg, w0, 4, 'device')
  np.testing.assert_array_equal(np.asarray(store.gather(np.arange(4))['cluster']), labels)
  state = alg.server_init(w0, None)
  for a, b in zip(jax.tree_util.tree_leaves(state['pretrained']), jax.tree_util.tree_leaves(w0)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  batches, rngs = _round_inputs(), jnp.stack([jax.random.PRNGKey(0)] * 4)
  ids = np.array([2, 1, 0, 3])
  new, _, _ = engine.make_round_fn(alg, chunk=1, donate=False)(state, batches, store.gather(ids), rngs,
                                                              jnp.asarray(SIZES), jnp.ones(4, bool), 0)
  direct = L.ladd(MODEL, *client_parts(cfg.client), alg_registry.make_server_tx(cfg.server), num_clusters=2,
                  pretrained=w0,
                  cluster_layers='all', lambda_kd=2.0)
  want, _, _ = engine.make_round_fn(direct, chunk=1, donate=False)(
      direct.server_init(w0, None), batches, L.initial_client_states(labels[ids]), rngs, jnp.asarray(SIZES),
      jnp.ones(4, bool), 0)
  for a, b in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  for c in (0, 1):
    assert all(not np.allclose(np.asarray(a[c]), np.asarray(b[c])) for a, b in zip(state['cluster'], new['cluster']))
  with pytest.raises(ConfigError, match='style clusters'):
    alg_registry.build_algorithm(cfg, MODEL, population=4)


@pytest.mark.slow   # two trainers on seg_cnn (minutes on the shared CPU): the fast test above is the same wiring
def test_registered_ladd_trains_each_client_from_its_cluster():
  """train.py's path: the trainer clusters the styles (force_k=2 on 2 planted styles), every client starts with
  its cluster in its client state (the store's initial rows), and one round of all 4 clients moves BOTH clusters'
  models (with one template for every client only cluster 0 would move); host and device stores agree."""
  out = {}
  for kind in ('host', 'device'):
    t = trainers.make_trainer(_train_config(client_state_store=kind))
    labels = t.algorithm.style_clusters.labels   # the clustering it was built with
    assert style_clusters.agreement(labels, t.data.client_style) == 1.0 and sorted(set(labels)) == [0, 1]
    np.testing.assert_array_equal(np.asarray(t.store.gather(np.arange(4))['cluster']), labels)
    w0 = t.server_state['cluster']
    before = [np.asarray(x).copy() for x in w0]
    t.server_state, _ = t.driver.step(t.server_state, t.store, 0, 1, 1)     # round 0 (host or device driver)
    after = [np.asarray(x) for x in t.server_state['cluster']]
    for c in (0, 1):
      assert any(not np.allclose(a[c], b[c]) for a, b in zip(before, after)), f'cluster {c} did not train'
    assert any(not np.allclose(a[0], a[1]) for a in after)
    np.testing.assert_array_equal(np.asarray(t.store.gather(np.arange(4))['cluster']), labels)
    out[kind] = t.server_state
    if kind == 'host':   # the trainer's evaluation routes each test image to its style's cluster model
      ev, (tx, ty) = t.evaluate(), t.data.test_examples()
      want = routed.routes(tx, t.plan.style_clusters.centroids)
      np.testing.assert_array_equal(t.recorder.plugin_state['routed'].route_ids, want)   # training/evals/routed.py
      models = t.algorithm.eval_models(t.server_state)
      ref = routed.evaluate_routed(t.model, lambda c: models[f'cluster{c}'][0], tx, ty, t.task, want,
                                   prep=t.plan.eval_transform)
      np.testing.assert_allclose(ev['routed/test_miou'], ref['miou'], rtol=1e-5)
  jax.tree_util.tree_map(np.testing.assert_array_equal, out['host'], out['device'])


def test_registered_ladd_checks():
  # no source model and no random init asked for: one line naming the pre-training binary and both fixes
  with pytest.raises(ConfigError, match=r"init\.pretrained=''.*experiments/pretrain_source\.py.*"
                                        r"--config\.init\.pretrained=.*--config\.algo\.random_init=True"):
    validate.validate_config(_train_config(**{'algo.random_init': False}))
  with pytest.raises(ConfigError, match='algo.k_min'):
    validate.validate_config(_train_config(**{'algo.k_min': 5, 'algo.k_max': 4}))
  c = _train_config()
  c.dataset, c.data = 'synthetic', default_config().data
  c.model, c.model_kwargs = 'mlp', {}
  with pytest.raises(ConfigError, match='segmentation dataset'):
    validate.validate_config(c)
  with pytest.raises(ConfigError, match='algo.force_k'):
    trainers.make_trainer(_train_config(**{'algo.force_k': 5}))
  with pytest.raises(ConfigError, match='algo.k_min'):
    trainers.make_trainer(_train_config(**{'algo.force_k': 0}))     # 4 clients: k in 2..3, k_min = 4
