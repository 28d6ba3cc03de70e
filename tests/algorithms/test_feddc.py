"""FedDC (algorithms/feddc.py): engine rounds vs rounds computed by hand from the release's update rules, on 3
unequal clients with partial participation and padding (tests/fixtures/baselines.py)."""
import jax
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.config import validate
from fedjax_flat.errors import ConfigError
from tests.fixtures.baselines import (LR, PARAMS0, SCHEDULE, add, assert_tree_close, client_batches, config, grad,
                                      mean, run_engine, sam_grad, scale, sgd, sub, zeros)


def _clip(g, c):
  n = np.sqrt(sum(float(np.sum(np.square(a))) for a in jax.tree_util.tree_leaves(g)))
  return g if c is None or n < c else scale(g, c / n)


def _reference(alpha, n_pop, *, rho=None, clip=None, eta_g=1.0):
  """theta_g, c, hbar and the client states after the schedule, written from the rules with no algorithm code."""
  theta, c, hbar = PARAMS0, zeros(), zeros()
  h = {k: zeros() for k in range(3)}
  ck = {k: zeros() for k in range(3)}
  for r, ids in enumerate(SCHEDULE):
    thetas, ds, dcs = [], [], []
    for k in ids:
      y, steps = theta, client_batches(r, k)
      for b in steps:
        g = grad(y, b) if rho is None else sam_grad(y, b, rho)
        v = add(g, scale(add(sub(y, theta), h[k]), alpha), sub(c, ck[k]))   # grad f + alpha(y - theta + h_k) + c - c_k
        y = sgd(y, _clip(v, clip))
      d = sub(y, theta)
      h[k] = add(h[k], d)
      c_new = sub(sub(ck[k], c), scale(d, 1.0 / (len(steps) * LR)))
      dcs.append(sub(c_new, ck[k]))
      ck[k] = c_new
      thetas.append(y)
      ds.append(d)
    frac = len(ids) / n_pop
    hbar = add(hbar, scale(mean(ds), frac))
    c = add(c, scale(mean(dcs), frac))
    target = add(mean(thetas), hbar)
    theta = sub(theta, scale(sub(theta, target), eta_g))
  return theta, c, hbar, h, ck


@pytest.mark.parametrize('optimizer,clip', [('sgd', None), ('sam', 0.8)])
def test_feddc_matches_hand_computed_rounds(optimizer, clip):
  alpha, n_pop, rho = 0.1, 4, 0.05
  cfg = config('feddc', optimizer=optimizer, rho=rho, alpha=alpha, population=n_pop)
  if clip is not None:
    cfg.client.grad_clip = clip
  state, store, alg = run_engine(cfg)
  theta, c, hbar, h, ck = _reference(alpha, n_pop, rho=rho if optimizer == 'sam' else None, clip=clip)
  assert (alg.comm_down, alg.comm_up) == (2.0, 2.0)
  assert_tree_close(state['params'], theta)
  assert_tree_close(state['c'], c)
  assert_tree_close(state['hbar'], hbar)
  for k in (1, 2):
    got = jax.tree_util.tree_map(lambda a: a[0], store.gather([k]))
    assert_tree_close(got['h'], h[k])
    assert_tree_close(got['c'], ck[k])


def test_server_lr_scales_the_step_to_the_target():
  cfg = config('feddc', alpha=0.1, population=4)
  cfg.server.lr = 0.5
  state, _, _ = run_engine(cfg)
  assert_tree_close(state['params'], _reference(0.1, 4, eta_g=0.5)[0])


def test_first_round_without_drift_is_fedprox_plus_drift_mean():
  """Round 0 (h = c = 0): each client runs FedProx with mu = alpha; theta_1 = mean_S theta_k + (|S|/N) mean_S d_k."""
  alpha, n_pop = 0.3, 3
  state, _, _ = run_engine(config('feddc', alpha=alpha, population=n_pop), rounds=1)
  theta = PARAMS0
  ys = []
  for k in SCHEDULE[0]:
    y = theta
    for b in client_batches(0, k):
      y = sgd(y, add(grad(y, b), scale(sub(y, theta), alpha)))
    ys.append(y)
  want = add(mean(ys), scale(sub(mean(ys), theta), len(SCHEDULE[0]) / n_pop))
  assert_tree_close(state['params'], want)


@pytest.mark.parametrize('bad', [{'alpha': 0.0}, {'alpha': -1.0}, {'control_lr': 'decayed'}])
def test_bad_hparams_are_config_errors(bad):
  cfg = config('feddc', population=3, **bad)
  with pytest.raises(ConfigError, match='|'.join(bad)):
    validate.validate_config(cfg)


def test_registered_with_client_state():
  assert {'client_state', 'population'} <= registry.needs('feddc')
  assert 'feddc' in registry.with_need('client_state')
