"""Tasks (fedjax_flat/tasks/base.py): losses and metrics over valid units, dense labels through batching, the
engine, evaluation and the Hessian tools."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.tasks import base as tasks
from fedjax_flat.algorithms import local
from fedjax_flat.analysis import hvp
from fedjax_flat.evaluation.evaluator import make_eval_fn
from fedjax_flat.data import batching
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.models import base as model_base
from fedjax_flat.models import registry as model_registry

T, F, C = 3, 4, 5   # positions per example, features per position, classes
IGNORE = 255


def _np_ce(logits, labels):
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, labels[..., None], -1)[..., 0]


class PerPosition(nn.Module):
  """x [B, T, F] -> logits [B, T, C]: one Dense shared by every position (a 1x1 'segmentation' head)."""
  num_classes: int = C

  @nn.compact
  def __call__(self, x, train: bool = False):
    return nn.Dense(self.num_classes)(jnp.tanh(nn.Dense(8)(x)))


@model_registry.register('_test_per_position')
def _per_position(num_classes, input_shape, conv_impl="auto"):
  del conv_impl
  return model_base.from_flax(PerPosition(num_classes), '_test_per_position', num_classes, input_shape)


def _dense_data(seed=0, n=40, clients=4):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, T, F)).astype(np.float32)
  y = rng.integers(0, C, (n, T)).astype(np.int32)
  y[rng.random((n, T)) < 0.25] = IGNORE        # void positions
  sizes = [7, 13, 9, 11]
  idx = np.split(rng.permutation(n), np.cumsum(sizes)[:-1])
  return FederatedDataset.from_client_indices(x, y, idx, x[:10], y[:10], C, name='dense',
                                              task=tasks.DenseClassification(ignore_index=IGNORE))


def test_classification_loss_is_masked_mean():
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((6, C)).astype(np.float32)
  y = rng.integers(0, C, 6)
  mask = np.array([1, 1, 0, 1, 0, 1], np.float32)
  task = tasks.get_task(None)
  s, n = task.loss_sums(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask))
  np.testing.assert_allclose(float(s), np.sum(_np_ce(logits, y) * mask), rtol=1e-6)
  assert float(n) == 4
  m = task.eval_metrics(task.eval_sums(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask)))
  want_acc = np.sum((logits.argmax(-1) == y) * mask) / 4
  np.testing.assert_allclose(float(m['accuracy']), want_acc)
  np.testing.assert_allclose(float(m['loss']), np.sum(_np_ce(logits, y) * mask) / 4, rtol=1e-6)


def test_dense_loss_ignores_void_positions_and_padding():
  rng = np.random.default_rng(1)
  logits = rng.standard_normal((4, T, C)).astype(np.float32)
  y = rng.integers(0, C, (4, T))
  y[0, 1] = IGNORE
  y[2, :] = IGNORE
  mask = np.array([1, 1, 1, 0], np.float32)
  logits[3] = np.inf      # a padding example's logits must not reach the loss or the metrics
  task = tasks.get_task('dense_classification', ignore_index=IGNORE)
  valid = (y != IGNORE) & (mask[:, None] > 0)
  safe = np.where(valid, y, 0)
  want = np.sum(np.where(valid, _np_ce(np.where(np.isinf(logits), 0, logits), safe), 0))
  s, n = task.loss_sums(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask))
  np.testing.assert_allclose(float(s), want, rtol=1e-6)
  assert float(n) == valid.sum() == float(task.unit_count(jnp.asarray(y), jnp.asarray(mask)))
  m = task.eval_metrics(task.eval_sums(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask)))
  acc = np.sum((logits.argmax(-1) == y) & valid) / valid.sum()
  np.testing.assert_allclose(float(m['accuracy']), acc)
  assert np.isfinite(float(m['loss']))


def test_get_task_errors_and_names():
  with pytest.raises(ValueError, match="task='nope' is unknown"):
    tasks.get_task('nope')
  assert tasks.task_of(object()) == tasks.Classification()
  assert hash(tasks.DenseClassification(ignore_index=255)) == hash(tasks.DenseClassification(ignore_index=255))


def test_dense_labels_through_batching_host_equals_device():
  data = _dense_data()
  plan = batching.batch_plan(data.client_sizes(), batch_size=4, num_steps=4, epochs=1)
  host = batching.make_round_batches(data, [2, 0], round_idx=3, seed=7, batch_size=4, num_steps=4, plan=plan)
  assert host.y.shape == (2, 4, 4, T)
  arrays = batching.device_data(data)
  dev, w = batching.gather_round_device(plan, arrays, batching.sampling.seed_key(7), jnp.int32(3),
                                        jnp.asarray([2, 0], jnp.int32))
  np.testing.assert_array_equal(np.asarray(dev['y']), host.y)
  np.testing.assert_array_equal(np.asarray(dev['x']), host.x)
  np.testing.assert_array_equal(np.asarray(w), host.num_examples)
  eb = batching.make_eval_batches(data.test_x, data.test_y, 4)
  assert eb['y'].shape == (3, 4, T)
  np.testing.assert_array_equal(eb['y'].reshape(-1, T)[:10], data.test_y)


def test_dense_eval_and_train_loss_equal_direct_formula():
  data = _dense_data()
  model = model_registry.get_model('_test_per_position', C, (T, F))
  params = model.init(jax.random.key(0), jnp.zeros((1, T, F)))
  task = tasks.task_of(data)
  eb = batching.make_eval_batches(data.test_x, data.test_y, 4)
  res = make_eval_fn(model, task=task)(params, eb)
  logits = np.asarray(model.apply(params, jnp.asarray(data.test_x)))
  valid = data.test_y != IGNORE
  want_loss = np.sum(np.where(valid, _np_ce(logits, np.where(valid, data.test_y, 0)), 0)) / valid.sum()
  np.testing.assert_allclose(float(res['loss']), want_loss, rtol=1e-5)
  np.testing.assert_allclose(float(res['accuracy']), np.sum((logits.argmax(-1) == data.test_y) & valid)
                             / valid.sum(), rtol=1e-6)
  # The training loss (algorithms/local.py) is the same mean over valid positions.
  loss_fn = local.make_loss(model, task=task)
  batch = {'x': jnp.asarray(data.test_x), 'y': jnp.asarray(data.test_y), 'mask': jnp.ones(10)}
  total, (s, n) = loss_fn(params, batch)
  np.testing.assert_allclose(float(total), want_loss, rtol=1e-5)
  assert float(n) == valid.sum()
  # The analysis tools normalize by the same units: full loss == eval loss; dense Hessian is finite.
  full = hvp.make_full_loss_fn(model, task=task)(params, jax.tree_util.tree_map(jnp.asarray, eb))
  np.testing.assert_allclose(float(full), want_loss, rtol=1e-5)
  loss, acc = hvp.make_eval_fn(model, eb, task=task)(params)
  np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)


def test_trainer_runs_a_dense_task_and_matches_a_python_loop():
  """Two FedAvg rounds on dense labels: engine == plain Python loop of SGD on the masked per-position mean."""
  from tests.fixtures.configs import small_config
  from fedjax_flat.training.trainers import make_trainer as Trainer
  data = _dense_data()
  c = small_config()
  c.model = '_test_per_position'
  c.rounds, c.clients_per_round = 2, 4
  c.client.batch_size, c.client.lr, c.client.weight_decay, c.client.momentum = 4, 0.1, 0.0, 0.0
  c.eval_every = 1
  c.data.num_clients = data.num_clients
  tr = Trainer(c, None, data=data, write_files=False)
  p0 = jax.tree_util.tree_map(np.asarray, tr.algorithm.eval_models(tr.server_state)['global'][0])
  tr.train()
  got = tr.algorithm.eval_models(tr.server_state)['global'][0]
  assert 'test_accuracy' in tr.records[-1] and np.isfinite(tr.records[-1]['test_loss'])

  model = tr.model
  task = tasks.task_of(data)
  params = p0
  plan = batching.batch_plan(data.client_sizes(), batch_size=4, num_steps=tr.plan.num_steps, epochs=1)
  # one compiled step gradient (every batch has the padded shape); op by op it was most of this test's time
  grad = jax.jit(jax.grad(lambda q, b: local.make_loss(model, task=task)(q, b)[0]))
  for r in range(2):
    ids = np.asarray(tr_sampled(tr, r))
    rb = batching.make_round_batches(data, ids, round_idx=r, seed=c.seed, batch_size=4,
                                     num_steps=tr.plan.num_steps, plan=plan)
    new, weights = [], []
    for i in range(len(ids)):
      p = params
      for s in range(tr.plan.num_steps):
        b = {'x': rb.x[i, s], 'y': rb.y[i, s], 'mask': rb.mask[i, s]}
        if b['mask'].sum() == 0:
          continue
        g = grad(p, b)
        p = jax.tree_util.tree_map(lambda a, d: a - 0.1 * d, p, g)
      new.append(p)
      weights.append(rb.num_examples[i])
    wsum = sum(weights)
    params = jax.tree_util.tree_map(lambda *ps: sum(w * q for w, q in zip(weights, ps)) / wsum, *new)
  chex_close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
  jax.tree_util.tree_map(chex_close, got, params)


def tr_sampled(tr, r):
  from fedjax_flat.data.sampling import sample_clients
  return sample_clients(tr.data.num_clients, tr.config.clients_per_round, seed=tr.config.seed, round_idx=r)
