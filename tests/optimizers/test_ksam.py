"""K-SAM (optimizers/ksam.py; the paper's 'subset' descent and the 'full' switch) against its formula on a tiny
least-squares problem, through algorithms/local.local_step (the per-example losses and the subset gradient it
passes), and through the engine."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from fedjax_flat.algorithms import local
from fedjax_flat.config import validate
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.errors import ConfigError
from fedjax_flat.optimizers.client import client_optimizer, gradient_passes
from fedjax_flat.optimizers.ksam import top_loss_mask
from fedjax_flat.training import driver as driver_lib
from fedjax_flat.training import trainers
from tests.fixtures.configs import small_config

# l_i(w) = 0.5 (x_i . w - y_i)^2 over 4 valid examples and one padding row (whose huge loss must not be chosen)
X = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [-1.0, 0.5], [10.0, 10.0]])
Y = np.array([1.0, -1.0, 3.0, 0.5, -50.0])
MASK = np.array([1.0, 1.0, 1.0, 1.0, 0.0])
W0 = np.array([0.5, -0.2])
RHO, LR = 0.3, 0.1


def loss_fn(w, batch, rng=None):
  del rng
  m = batch['mask'].astype(jnp.float32)
  r = batch['x'] @ w - batch['y']
  loss_sum, count = jnp.sum(m * 0.5 * r ** 2), jnp.sum(m)
  return loss_sum / jnp.maximum(count, 1.0), (loss_sum, count)


def _client(**kw):
  c = ConfigDict(dict(optimizer='ksam', ascent_fraction=0.5, ksam_descent='subset', weight_decay=0.0, momentum=0.0,
                      lr_schedule='constant', asam_eta=0.0))
  c.update(kw)
  return c


def step(client, w=W0):
  tx = client_optimizer(client)
  w = jnp.asarray(w, jnp.float32)
  state = local.LocalState(params=w, opt_state=tx.init(w), init_params=w)
  batch = {'x': jnp.asarray(X, jnp.float32), 'y': jnp.asarray(Y, jnp.float32), 'mask': jnp.asarray(MASK > 0)}
  new, _ = jax.jit(lambda s: local.local_step(s, batch, None, loss_fn=loss_fn, tx=tx,
                                              hparams={'lr': LR, 'rho': RHO}))(state)
  return np.asarray(new.params)


def hand(subset, descent='subset'):
  """w0 - lr g(w0 + e), e = rho g_S / ||g_S||, g_S the mean gradient over `subset` (float64); g the mean gradient
  over the subset (descent='subset', Ni et al. 2022) or over the batch's valid examples (descent='full')."""
  r = X[subset] @ W0 - Y[subset]
  g_s = (r[:, None] * X[subset]).mean(0)
  w_e = W0 + RHO * g_s / np.linalg.norm(g_s)
  rows = subset if descent == 'subset' else MASK > 0
  g = ((X[rows] @ w_e - Y[rows])[:, None] * X[rows]).mean(0)
  return W0 - LR * g


def test_top_loss_mask_by_hand():
  losses = jnp.array([3.0, 1.0, 5.0, 2.0, 9.0])
  np.testing.assert_array_equal(top_loss_mask(losses, jnp.asarray(MASK), 0.5), [1, 0, 1, 0, 0])   # k = 2 of 4
  np.testing.assert_array_equal(top_loss_mask(losses, jnp.asarray(MASK), 0.01), [0, 0, 1, 0, 0])  # k >= 1
  np.testing.assert_array_equal(top_loss_mask(losses, jnp.asarray(MASK), 1.0), MASK)
  np.testing.assert_array_equal(top_loss_mask(jnp.array([2.0, 2.0, 1.0]), jnp.ones(3), 0.34), [1, 0, 0])   # ties


@pytest.mark.parametrize('descent', ['subset', 'full'])
def test_step_equals_the_formula(descent):
  # losses at w0: 0.125, 0.18, 3.645, 0.605 (the padding row's 2e3 not counted) -> the top half is examples 2, 3
  np.testing.assert_allclose(step(_client(ksam_descent=descent)), hand(np.array([2, 3]), descent), rtol=1e-5)
  np.testing.assert_allclose(step(_client(ascent_fraction=0.25, ksam_descent=descent)), hand(np.array([2]), descent),
                             rtol=1e-5)


def test_the_default_is_the_papers_subset_descent():
  # Ni et al. 2022: both gradients on the top-k examples; the two rules differ here (the subset's descent
  # gradient is not the batch's)
  default = _client()
  del default['ksam_descent']
  np.testing.assert_allclose(step(default), hand(np.array([2, 3]), 'subset'), rtol=1e-5)
  assert not np.allclose(hand(np.array([2, 3]), 'subset'), hand(np.array([2, 3]), 'full'), rtol=1e-3)
  assert small_config(**{'client.optimizer': 'ksam'}).client.ksam_descent == 'subset'


@pytest.mark.parametrize('descent', ['subset', 'full'])
def test_whole_batch_is_sam(descent):
  c = _client(ascent_fraction=1.0, ksam_descent=descent)
  np.testing.assert_allclose(step(c), step(_client(optimizer='sam')), rtol=1e-6)
  np.testing.assert_allclose(step(c), hand(np.array([0, 1, 2, 3])), rtol=1e-5)


def test_declared_passes_and_one_line_refusals():
  # 'full': the batch's descent pass + the ascent over a quarter; 'subset': the ranking forward (1/3 of a pass),
  # the ascent's backward (2/3 of a quarter) and the descent's pass over the quarter; both SAM's 2 at fraction 1
  assert gradient_passes(_client(ascent_fraction=0.25, ksam_descent='full')) == 1.25
  assert gradient_passes(_client(ascent_fraction=0.25)) == pytest.approx(1 / 3 + 2 / 3 * 0.25 + 0.25)
  assert gradient_passes(_client(ascent_fraction=1.0)) == gradient_passes(_client(ascent_fraction=1.0,
                                                                                  ksam_descent='full')) == 2
  clock = {'system.speed': 'lognormal', 'client.optimizer': 'ksam', 'client.ascent_fraction': 0.25,
           'client.ksam_descent': 'full'}
  data = synthetic(8, [3, 17, 6, 9, 30, 1, 12, 5], input_shape=(4, 4, 1), num_classes=4, seed=3)
  assert trainers.make_trainer(small_config(**clock), data=data).plan.clock.passes == 1.25    # a step's cost
  for bad in (0.0, 1.5):
    with pytest.raises(ConfigError, match='client.ascent_fraction') as e:
      validate.validate_config(small_config(**{'client.optimizer': 'ksam', 'client.ascent_fraction': bad}))
    assert '\n' not in str(e.value)
  with pytest.raises(ConfigError, match='client.ksam_descent') as e:
    validate.validate_config(small_config(**{'client.optimizer': 'ksam', 'client.ksam_descent': 'half'}))
  assert '\n' not in str(e.value) and 'subset' in str(e.value)


@pytest.mark.slow   # a synthetic run of 2 rounds (about 10 s); the default suite keeps
# tests/algorithms/test_sam_variants_round.py's FedAvg round against the formula
def test_a_fedavg_round_through_the_engine_is_one_program():
  data = synthetic(8, [3, 17, 6, 9, 30, 1, 12, 5], input_shape=(4, 4, 1), num_classes=4, seed=3)
  t = trainers.make_trainer(small_config(rounds=2, **{'client.optimizer': 'ksam', 'client.ascent_fraction': 0.3,
                                                      'client.rho': 0.1}), data=data)
  host = driver_lib.HostDriver(t.plan)
  before = t.server_state['params']
  for r in range(2):       # the clients' batches differ in their padding round to round
    t.server_state, _ = host.run_round(t.server_state, t.store, r, host.prepare_round(r))
  assert host.round_fn._cache_size() == 1
  leaves = jax.tree_util.tree_leaves
  assert all(np.all(np.isfinite(x)) for x in leaves(t.server_state['params']))
  assert not all(np.array_equal(a, b) for a, b in zip(leaves(before), leaves(t.server_state['params'])))
