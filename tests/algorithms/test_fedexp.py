"""FedExP (algorithms/fedexp.py): engine rounds vs rounds computed by hand from the paper's Algorithm 1, on the
baselines' 3 unequal clients with partial participation and padding (tests/fixtures/baselines.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.fedexp import server_step_size
from fedjax_flat.config import validate
from fedjax_flat.errors import ConfigError
from fedjax_flat.core import engine
from fedjax_flat.data import batching
from fedjax_flat.data.federated import FederatedDataset
from tests.fixtures.baselines import (MODEL, PARAMS0, SCHEDULE, assert_tree_close, client_batches, config, grad,
                                    mean, run_engine, scale, sgd, sub)


def _sq(t):
  return sum(float(jnp.sum(x * x)) for x in jax.tree_util.tree_leaves(t))


def _reference(eps):
  """Local SGD (coupled weight decay) per client, then eta_g from the uniform mean of the deltas."""
  w, previous, etas = PARAMS0, PARAMS0, []
  for r, ids in enumerate(SCHEDULE):
    deltas = []
    for k in ids:
      y = w
      for b in client_batches(r, k):
        y = sgd(y, grad(y, b))
      deltas.append(sub(w, y))
    d = mean(deltas)                                   # uniform: (1/M) sum_i Delta_i
    eta = max(1.0, np.mean([_sq(x) for x in deltas]) / (2 * (_sq(d) + eps)))
    etas.append(eta)
    previous, w = w, sub(w, scale(d, eta))
  return w, previous, etas


@pytest.mark.parametrize('eps', [1e-9, 10.0])
def test_fedexp_matches_hand_computed_rounds(eps):
  state, _, alg = run_engine(config('fedexp', eps=eps))
  w, previous, etas = _reference(eps)
  assert_tree_close(state['params'], w)
  np.testing.assert_allclose(float(state['eta_g']), etas[-1], rtol=2e-5)
  models = alg.eval_models(state)
  assert_tree_close(models['last2'][0], jax.tree_util.tree_map(lambda a, b: 0.5 * (a + b), w, previous))
  if eps > 1:
    assert etas == [1.0] * len(etas)  # a large eps floors eta_g at 1: FedAvg with the uniform mean


def test_clients_that_disagree_make_the_server_extrapolate():
  """One class per client: the three deltas pull the bias three ways, their mean is short, eta_g > 1."""
  x = np.random.default_rng(0).normal(size=(12, 2, 1, 1)).astype(np.float32)
  y = np.repeat(np.arange(3), 4)
  data = FederatedDataset.from_client_indices(x, y, [np.arange(4 * k, 4 * k + 4) for k in range(3)], x, y, 3)
  cfg = config('fedexp', eps=0.0)
  cfg.client.local_epochs, cfg.client.weight_decay = 1, 0.0
  alg = registry.build_algorithm(cfg, MODEL)
  fn = engine.make_round_fn(alg, chunk=3)
  state = alg.server_init(jax.tree_util.tree_map(jnp.copy, PARAMS0), jax.random.key(1))
  rb = batching.make_round_batches(data, [0, 1, 2], round_idx=0, seed=0, batch_size=4, num_steps=1, epochs=1)
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))
  state, _, _ = fn(state, rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, 0)
  deltas = [sub(PARAMS0, sgd(PARAMS0, grad(PARAMS0, {'x': x[4 * k:4 * k + 4], 'y': y[4 * k:4 * k + 4],
                                                     'mask': np.ones(4, np.float32)}), wd=0.0)) for k in range(3)]
  d = mean(deltas)
  eta = np.mean([_sq(t) for t in deltas]) / (2 * _sq(d))
  assert eta > 1.5
  np.testing.assert_allclose(float(state['eta_g']), eta, rtol=1e-4)
  assert_tree_close(state['params'], sub(PARAMS0, scale(d, eta)), rtol=1e-4, atol=1e-6)


def test_step_size_formula():
  d = {'a': jnp.array([1.0, 0.0])}
  np.testing.assert_allclose(server_step_size(jnp.float32(4.0), d, 0.0), 2.0)         # 4 / (2 * 1)
  assert float(server_step_size(jnp.float32(0.5), d, 0.0)) == 1.0                     # floored at 1


def test_declared_rules():
  assert registry.default_hparams('fedexp') == {'eps': 1e-3}
  with pytest.raises(ConfigError, match='algo.eps'):
    validate.validate_config(config('fedexp', eps=-1.0))
