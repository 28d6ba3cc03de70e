"""BatchNorm in federated training (core/batch_stats.py, models/base.py): the running-statistics update
equals the formula, the server averages statistics whatever its optimizer, FedAvg / SiloBN / FedBN keep
exactly the intended leaves local (two clients, two rounds, leaf by leaf against a hand-run of local_step),
the test-time policies, validation, and Trainer runs on a tiny segmentation fixture (one compiled round
program; seen / unseen mIoU, per-class IoU in summary.json, predictions.png)."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.core import batch_stats
from fedjax_flat.core import engine as engine_lib
from fedjax_flat.algorithms.wrappers import local_norm
from fedjax_flat.evaluation.evaluator import HeldOutEvaluator
from fedjax_flat.models import registry as model_registry
from fedjax_flat.optimizers.client import make_client_tx
from fedjax_flat.training import trainers
from fedjax_flat.config.default_config import default_config
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError

from tests.fixtures.seg_model import seg_data  # noqa: F401  (registers '_test_seg')

tmap = jax.tree_util.tree_map
H = W = 16


def _model(norm='bn'):
  return model_registry.get_model('_test_seg', 3, (H, W, 3), norm=norm)


def _conv1(params, x):
  """TinySeg's first conv (the input of its only BatchNorm), computed outside the model."""
  k, b = params['params']['conv1']['kernel'], params['params']['conv1']['bias']
  return jax.lax.conv_general_dilated(x, k, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')) + b


def test_running_statistics_follow_the_formula_and_ignore_the_optimizer():
  m = _model()
  p = m.init(jax.random.key(0), jnp.zeros((1, H, W, 3)))
  p = {**p, 'batch_stats': {'norm1': {'mean': jnp.full((8,), 0.5), 'var': jnp.full((8,), 2.0)}}}
  rng = np.random.default_rng(0)
  batch = {'x': jnp.asarray(rng.normal(0, 1, (4, H, W, 3)), jnp.float32),
           'y': jnp.asarray(rng.integers(0, 3, (4, H, W))), 'mask': jnp.array([1.0, 1.0, 1.0, 0.0])}
  h = np.asarray(_conv1(p, batch['x']))[:3]          # the padded 4th example is excluded
  mean, var = h.mean((0, 1, 2)), h.var((0, 1, 2))   # Flax: biased batch variance
  loss = local_lib.make_loss(m, task=seg_tasks.Segmentation())
  cfg = default_config().client
  cfg.momentum, cfg.weight_decay = 0.9, 0.1            # neither may touch the statistics
  tx = make_client_tx(cfg, {'lr': jnp.float32(0.5), 'rho': jnp.float32(0.0)})
  st = local_lib.LocalState(p, tx.init(p), p)
  st, _ = jax.jit(lambda s_, b: local_lib.local_step(s_, b, jax.random.key(1), loss_fn=loss, tx=tx))(st, batch)
  np.testing.assert_allclose(st.params['batch_stats']['norm1']['mean'], 0.9 * 0.5 + 0.1 * mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(st.params['batch_stats']['norm1']['var'], 0.9 * 2.0 + 0.1 * var, rtol=1e-5)
  # The gradient w.r.t. the statistics is exactly 0 in training mode; the trainable params moved.
  g = jax.jit(jax.grad(lambda q: loss(q, batch)[0]))(p)
  assert all(float(jnp.abs(v).max()) == 0 for v in jax.tree_util.tree_leaves(g['batch_stats']))
  assert float(jnp.abs(st.params['params']['conv1']['kernel'] - p['params']['conv1']['kernel']).max()) > 0


def test_server_averages_statistics_whatever_the_optimizer():
  inner = __import__('optax').sgd(1.0, momentum=0.9)
  tx = batch_stats.average_batch_stats(inner)
  w = {'params': {'a': jnp.array([1.0, 2.0])}, 'batch_stats': {'m': jnp.array([3.0, 4.0])}}
  state = tx.init(w)
  avg_stats = jnp.array([1.0, 1.0])
  for r in range(3):
    delta = {'params': {'a': jnp.array([0.5, 0.5])}, 'batch_stats': {'m': w['batch_stats']['m'] - avg_stats}}
    u, state = tx.update(delta, state, w)
    w = __import__('optax').apply_updates(w, u)
    np.testing.assert_allclose(w['batch_stats']['m'], avg_stats)          # exactly the clients' average
  np.testing.assert_allclose(w['params']['a'], [1.0 - 0.5 * (1 + 1.9 + 2.71), 2.0 - 0.5 * (1 + 1.9 + 2.71)],
                             rtol=1e-6)                                    # FedAvgM on the params


def _config(algorithm, **client):
  c = default_config()
  c.model, c.algorithm = '_test_seg', algorithm
  c.client.lr, c.client.momentum, c.client.weight_decay, c.client.batch_size = 0.1, 0.0, 0.0, 2
  c.server.momentum = 0.9                           # FedAvgM: statistics must still be the plain average
  for k, v in client.items():
    c.client[k] = v
  return c


def _client_batches(data, ids, steps=2, b=2):
  xs, ys, ms = [], [], []
  for k in ids:
    x, y = data.client_examples(k)
    n = len(y)
    xp = np.zeros((steps * b,) + x.shape[1:], np.float32)
    yp = np.zeros((steps * b,) + y.shape[1:], np.int32)
    mp = np.zeros((steps * b,), np.float32)
    xp[:n], yp[:n], mp[:n] = x[:steps * b], y[:steps * b], 1.0
    xs.append(xp.reshape((steps, b) + x.shape[1:]))
    ys.append(yp.reshape((steps, b) + y.shape[1:]))
    ms.append(mp.reshape(steps, b))
  return {'x': jnp.asarray(np.stack(xs)), 'y': jnp.asarray(np.stack(ys)), 'mask': jnp.asarray(np.stack(ms))}


def _hand_local(m, cfg, task, start, batches_k, rng):
  loss = local_lib.make_loss(m, task=task)
  tx = make_client_tx(cfg.client, {'lr': jnp.float32(cfg.client.lr), 'rho': jnp.float32(cfg.client.rho)})
  st = local_lib.LocalState(start, tx.init(start), start)
  for s in range(batches_k['mask'].shape[0]):
    batch = tmap(lambda a: a[s], batches_k)
    if float(batch['mask'].sum()) == 0:
      continue
    st, _ = local_lib.local_step(st, batch, jax.random.fold_in(rng, s), loss_fn=loss, tx=tx)
  return st.params


LOCAL = {'fedavg': lambda path: False, 'silobn': local_norm.is_batch_stats_path,
         'fedbn': local_norm.is_norm_path}


@pytest.mark.parametrize('algorithm', ['fedavg', 'silobn', 'fedbn'])
def test_bn_policies_keep_exactly_the_intended_leaves_local(algorithm):
  """Two clients (sizes 3 and 4: unequal weights), two rounds, FedAvgM server: every leaf of the server model
  and of each client's stored state against a hand-run of local_step and the weighted average."""
  data = seg_data(sizes=(3, 4))
  m, task = _model(), seg_tasks.Segmentation()
  cfg = _config(algorithm)
  alg = alg_registry.build_algorithm(cfg, m, task=task)
  p0 = m.init(jax.random.key(0), jnp.zeros((1, H, W, 3)))
  state = alg.server_init(p0, jax.random.key(1))
  round_fn = engine_lib.make_round_fn(alg, chunk=1, jit=True, donate=False)
  ids = [0, 1]
  batches = _client_batches(data, ids)
  weights = jnp.array([3.0, 4.0])
  rngs = jax.random.split(jax.random.key(2), 2)
  cs = None
  if alg.client_state_init is not None:
    one = alg.client_state_init(p0)
    cs = tmap(lambda a: jnp.stack([a, a]), one)
  local = LOCAL[algorithm]
  flags = [local(path) for path, _ in jax.tree_util.tree_flatten_with_path(p0)[0]]
  assert any(flags) == (algorithm != 'fedavg')
  # Hand simulation.
  server, mom = p0, tmap(jnp.zeros_like, p0)
  own = [None, None]
  for r in range(2):
    state, cs, _ = round_fn(state, batches, cs, rngs, weights, jnp.array([True, True]), jnp.int32(r))
    finals = []
    for i in range(2):
      start = server
      if own[i] is not None:    # the client's own local leaves from its previous visit
        start = local_norm.with_norm_leaves(server, own[i], local)
      finals.append(_hand_local(m, cfg, task, start, tmap(lambda a: a[i], batches), rngs[i]))
      own[i] = local_norm.norm_leaves(finals[-1], local)
    avg = tmap(lambda a, b: (3 * a + 4 * b) / 7, *finals)
    delta = tmap(lambda s, a: s - a, server, avg)
    mom = tmap(lambda v, d: 0.9 * v + d, mom, delta)
    new = tmap(lambda s, v: s - v, server, mom)                      # FedAvgM (lr 1, momentum 0.9)
    new = {**new, 'batch_stats': avg['batch_stats']}                 # statistics: the plain average
    leaves_new = jax.tree_util.tree_leaves(new)
    leaves_srv = jax.tree_util.tree_leaves(server)
    server = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(server),
                                          [s if f else n for s, n, f in zip(leaves_srv, leaves_new, flags)])
    got = jax.tree_util.tree_leaves(state['params'])
    for (path, _), g, e in zip(jax.tree_util.tree_flatten_with_path(p0)[0], got, jax.tree_util.tree_leaves(server)):
      np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-6, err_msg=f'round {r} server leaf {path}')
    for path, leaf0, g, f in zip(jax.tree_util.tree_flatten_with_path(p0)[0], jax.tree_util.tree_leaves(p0), got,
                                 flags):
      if f:
        np.testing.assert_array_equal(g, leaf0, err_msg=f'{path} is local: the server keeps its initial value')
    if cs is not None:
      for i in range(2):
        for g, e in zip(cs['norm'], own[i]):
          np.testing.assert_allclose(g[i], e, rtol=2e-4, atol=2e-6)
        assert float(cs['seen'][i]) == 1.0


def _eval_data():
  return seg_data(sizes=(3, 4), n_test=3)


def test_test_time_policies():
  data, m = _eval_data(), _model()
  p = m.init(jax.random.key(0), jnp.zeros((1, H, W, 3)))
  task = seg_tasks.Segmentation()
  # 'client': each test client's pooled statistics (numpy, from the conv outputs of all its images).
  ev = HeldOutEvaluator(m, data, task=task, batch_size=2, bn_policy='client')
  res = ev(p)
  assert {'seen_miou', 'unseen_miou', 'miou', 'iou', 'seen_iou'} <= set(res)
  for j, name in enumerate(('seen', 'unseen')):
    x, y = data.test_client_examples(j)
    h = np.asarray(_conv1(p, jnp.asarray(x)))
    pj = {**p, 'batch_stats': {'norm1': {'mean': jnp.asarray(h.mean((0, 1, 2))), 'var': jnp.asarray(h.var((0, 1, 2)))}}}
    sums = task.eval_sums(m.apply(pj, jnp.asarray(x)), jnp.asarray(y), jnp.ones(len(y)))
    assert res[f'{name}_miou'] == pytest.approx(float(task.eval_metrics(sums)['miou']), abs=1e-5)
    assert res[f'{name}_count'] == float(sums['count'])
  assert res['count'] == res['seen_count'] + res['unseen_count']
  # 'batch': each batch normalized with its own statistics (batch size bn.test_batch_size; padding excluded).
  ev = HeldOutEvaluator(m, data, task=task, batch_size=99, bn_policy='batch', bn_batch_size=2)
  res = ev(p)
  x, y = data.test_client_examples(1)
  tot = None
  for lo in range(0, len(y), 2):
    xb, yb = jnp.asarray(x[lo:lo + 2]), jnp.asarray(y[lo:lo + 2])
    s = task.eval_sums(m.apply(p, xb, batch_norm='batch'), yb, jnp.ones(len(yb)))
    tot = s if tot is None else tmap(jnp.add, tot, s)
  assert res['unseen_miou'] == pytest.approx(float(task.eval_metrics(tot)['miou']), abs=1e-5)
  # 'running': the model's statistics.
  res = HeldOutEvaluator(m, data, task=task, batch_size=2, bn_policy='running')(p)
  x, y = data.test_client_examples(0)
  s = task.eval_sums(m.apply(p, jnp.asarray(x)), jnp.asarray(y), jnp.ones(len(y)))
  assert res['seen_miou'] == pytest.approx(float(task.eval_metrics(s)['miou']), abs=1e-5)
  assert batch_stats.resolve_test_policy('auto', True) == 'batch'      # statistics kept on the clients
  assert batch_stats.resolve_test_policy('auto', False) == 'running'
  assert batch_stats.resolve_test_policy('client', True) == 'client'


@pytest.mark.parametrize('field,value', [
    ('algorithm', 'scaffold'), ('bn.test_policy', 'nope'), ('bn.test_batch_size', 0),
    ('segmentation.ohem', 'top'), ('segmentation.ohem_fraction', float('nan')),
    ('segmentation.eval_tile', (512,)), ('client.lr_schedule', 'poly_step'), ('client.lr', float('inf'))])
def test_bad_config_is_one_config_error(field, value):
  c = default_config()
  c.model = 'bisenetv2'
  node = c
  *parents, leaf = field.split('.')
  for part in parents:
    node = node[part]
  node[leaf] = value
  with pytest.raises(ConfigError) as e:
    validate_config(c)
  assert field.split('.')[-1] in str(e.value) or 'algorithm' in str(e.value)


def test_local_statistics_refuse_the_running_test_policy():
  c = default_config()
  c.model, c.algorithm, c.bn.test_policy = 'bisenetv2', 'silobn', 'running'
  with pytest.raises(ConfigError, match='bn.test_policy'):
    validate_config(c)
  c.model_kwargs.norm = 'gn'           # no statistics: any algorithm, any policy
  c.algorithm = 'scaffold'
  validate_config(c)


@pytest.mark.parametrize('algorithm,optimizer,swa,device', [('silobn', 'sgd', False, False),
                                                            pytest.param('fedavg', 'sam', True, True,
                                                                         marks=pytest.mark.slow),
                                                            pytest.param('fedbn', 'asam', False, True,
                                                                         marks=pytest.mark.slow)])
def test_trainer_rounds_on_a_segmentation_fixture(tmp_path, algorithm, optimizer, swa, device):
  c = _config(algorithm, optimizer=optimizer, rho=0.05, lr_schedule='poly_step', lr_poly_max=1000)
  c.server.momentum = 0.0
  c.rounds, c.clients_per_round, c.eval_every = 3, 2, 1
  c.eval_batch_size = 2
  c.engine.device_data = device
  c.swa.enabled, c.swa.start_fraction, c.swa.cycle = swa, 0.34, 1
  tr = trainers.make_trainer(c, str(tmp_path), data=seg_data())
  tr.train()
  if not device:     # one compiled round program although client sizes (2..5 examples) differ
    assert tr.driver.round_fn._cache_size() == 1
  else:
    assert tr.driver.block_fn._cache_size() <= 2     # the first block and the rest (eval boundaries cut blocks)
  rec = tr.records[-1]
  for k in ('test_miou', 'test_seen_miou', 'test_unseen_miou', 'test_accuracy'):
    assert 0.0 <= rec[k] <= 1.0, k
  assert len(rec['test_iou']) == 3
  summ = json.load(open(tmp_path / 'summary.json'))
  assert len(summ['models']['global']['final_test_iou']) == 3
  assert 'mean_last_10_test_unseen_miou' in summ
  assert os.path.getsize(tmp_path / 'predictions.png') > 0
  assert 'test_iou' not in open(tmp_path / 'metrics.csv').readline()
  if swa:
    assert 'swa/test_miou' in tr.records[-1]
  if algorithm != 'fedavg':
    assert tr.store is not None


def _batch(n=4, seed=0, mask=(1.0, 1.0, 1.0, 0.0)):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 3, (n, H, W))
  y[:, 0] = 255
  return {'x': jnp.asarray(rng.normal(0, 1, (n, H, W, 3)), jnp.float32), 'y': jnp.asarray(y),
          'mask': jnp.asarray(mask, jnp.float32)}


@pytest.mark.parametrize('ohem', ['topk', 'none'])
def test_microbatches_give_the_full_batch_loss_and_gradient(ohem):
  """GroupNorm (no batch statistics): exact, booster heads and per-image OHEM included."""
  m, task = _model('gn'), seg_tasks.Segmentation(ohem=ohem)
  p = m.init(jax.random.key(0), jnp.zeros((1, H, W, 3)))
  batch = _batch()
  # jitted: op by op, the OHEM sort and the microbatch loop dispatched for most of a minute (loaded machine)
  full = jax.jit(jax.value_and_grad(lambda q: local_lib.make_loss(m, task=task)(q, batch)[0]))(p)
  micro_fn = local_lib.make_loss(m, task=task, microbatches=2)
  micro = jax.jit(jax.value_and_grad(lambda q: micro_fn(q, batch)[0]))(p)
  np.testing.assert_allclose(micro[0], full[0], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(micro[1]), jax.tree_util.tree_leaves(full[1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  (_, aux_full), (_, aux_micro) = jax.jit(local_lib.make_loss(m, task=task))(p, batch), jax.jit(micro_fn)(p, batch)
  np.testing.assert_allclose(aux_micro[1], aux_full[1])              # same count of loss units


def test_microbatches_update_running_statistics_from_the_pooled_moments():
  m = _model()
  p = m.init(jax.random.key(0), jnp.zeros((1, H, W, 3)))
  p = {**p, 'batch_stats': {'norm1': {'mean': jnp.full((8,), 0.5), 'var': jnp.full((8,), 2.0)}}}
  batch = _batch(mask=(1.0, 1.0, 1.0, 0.0))
  _, aux = local_lib.make_loss(m, task=seg_tasks.Segmentation(), microbatches=2)(p, batch)
  h = np.asarray(_conv1(p, batch['x']))[:3]            # the full batch's valid examples
  np.testing.assert_allclose(aux[2]['norm1']['mean'], 0.9 * 0.5 + 0.1 * h.mean((0, 1, 2)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aux[2]['norm1']['var'], 0.9 * 2.0 + 0.1 * h.var((0, 1, 2)), rtol=1e-5)


def test_trainable_view_keeps_statistics_out_of_the_hessian():
  from fedjax_flat.analysis import hvp as hvp_lib
  from fedjax_flat.models.base import num_params
  m = _model()
  p = m.init(jax.random.key(0), jnp.zeros((1, H, W, 3)))
  view, trainable = batch_stats.trainable_view(m, p)
  assert num_params(trainable) == num_params(p['params']) and not view.batch_stats
  batches = jax.tree_util.tree_map(lambda a: a[None], _batch())
  h = hvp_lib.make_hvp(view, trainable, batches, task=seg_tasks.Segmentation())
  v = jnp.ones((num_params(trainable),))
  assert h(v).shape == v.shape
  np.testing.assert_allclose(view.apply(trainable, batches['x'][0]), m.apply(p, batches['x'][0]))
