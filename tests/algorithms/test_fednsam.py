"""FedNSAM (algorithms/fednsam.py): the round engine against the paper's rule written as a plain loop
(tests/fixtures/baselines.py), the release variant against main_FedNSAM.py's rule, and the release's client step
re-implemented in NumPy float64 (torch is not installed here)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError
from tests.fixtures.baselines import (LR, MODEL, PARAMS0, SCHEDULE, WD, add, assert_tree_close, client_batches,
                                      config, grad, mean, run_engine, sam_grad, scale, sgd, sub, zeros)
from tests.fixtures.release_numpy import np_grad


def test_paper_rule():
  gamma = 0.6
  state, _, alg = run_engine(config('fednsam', gamma=gamma))
  assert (alg.comm_down, alg.extra_passes) == (2.0, 0.0)
  w, m = PARAMS0, zeros()
  for r, ids in enumerate(SCHEDULE):
    dys = []
    for k in ids:
      y = w
      for b in client_batches(r, k):
        y = sgd(y, grad(add(y, scale(m, gamma)), b))       # the gradient at y + gamma m, one pass
      dys.append(sub(y, w))
    m = add(scale(m, gamma), mean(dys))
    w = add(w, m)
  assert_tree_close(state['params'], w)
  assert_tree_close(state['m'], m)


def test_release_rule():
  gamma, rho = 0.85, 0.05
  state, _, alg = run_engine(config('fednsam', optimizer='sam', rho=rho, gamma=gamma, variant='release'))
  assert alg.comm_down == 1.0
  w, m = PARAMS0, None
  for r, ids in enumerate(SCHEDULE):
    start = w if m is None else add(w, scale(m, gamma))     # weights[k] + ps_c[k] * gamma
    dys = []
    for k in ids:
      y = start
      for b in client_batches(r, k):
        y = sgd(y, sam_grad(y, b, rho))
      dys.append(sub(y, start))
    delta = mean(dys)
    m = delta if m is None else scale(delta, 1.0 + gamma)  # momen_m[k] = gamma * v + sum_weights[k], v = Delta
    w = add(w, m)
  assert_tree_close(state['params'], w)


def test_paper_variant_refuses_a_sam_client():
  c = config('fednsam', optimizer='sam')
  with pytest.raises(ConfigError, match="client.optimizer"):
    validate_config(c)


def test_release_step_matches_numpy():
  """update_NSAM: load w + gamma m, then per batch sam.SAM.first_step / backward / clip_grad_norm_(10) /
  second_step (SGD, weight decay), in float64 from reading the code; inputs x 30 so that the clip acts."""
  gamma, rho = 0.85, 0.05
  c = config('fednsam', optimizer='sam', rho=rho, gamma=gamma, variant='release')
  c.client.grad_clip = 10.0
  alg = registry.build_algorithm(c, MODEL)
  rng = np.random.default_rng(0)
  mvec = {'kernel': rng.normal(size=(2, 3)), 'bias': rng.normal(size=3)}
  state = alg.server_init(PARAMS0, jax.random.key(0))
  state = {**state, 'm': {'Dense_0': {k: jnp.asarray(v, jnp.float32) for k, v in mvec.items()}}}
  bcast = alg.broadcast(state, 0)
  local = alg.client_init(bcast, None, jax.random.key(1))
  batches = [{**b, 'x': b['x'] * 30.0} for b in client_batches(0, 1)[:2]]
  for b in batches:
    local, _ = alg.client_step(bcast, local, b, jax.random.key(2))
  keys = ('kernel', 'bias')
  w = {k: np.asarray(PARAMS0['Dense_0'][k], np.float64) + gamma * mvec[k] for k in keys}
  for b in batches:
    g = np_grad(w, b['x'], b['y'])
    n = np.sqrt(sum(np.sum(g[k] ** 2) for k in keys))
    g2 = np_grad({k: w[k] + rho * g[k] / (n + 1e-12) for k in keys}, b['x'], b['y'])
    total = np.sqrt(sum(np.sum(g2[k] ** 2) for k in keys))
    coef = min(1.0, 10.0 / (total + 1e-6))
    w = {k: w[k] - LR * (coef * g2[k] + WD * w[k]) for k in keys}
  got = local.params['Dense_0']
  err = max(float(np.max(np.abs(np.asarray(got[k], np.float64) - w[k]) / np.abs(w[k]))) for k in keys)
  print(f'fednsam (release): max relative error vs the release rule {err:.2e}')
  assert err < 1e-5


def test_batch_stats_are_not_shifted():
  alg = registry.build_algorithm(config('fednsam'), MODEL)
  m = {'params': {'w': jnp.ones(2)}, 'batch_stats': {'mean': jnp.ones(1)}}
  state = {'params': m, 'm': m}
  shift = alg.broadcast(state, 0)['shift']
  np.testing.assert_allclose(shift['params']['w'], [0.85, 0.85], rtol=1e-6)
  assert float(shift['batch_stats']['mean'][0]) == 0.0
