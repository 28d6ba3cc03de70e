"""FedGF (algorithms/fedgf.py): the round engine against the rule written as a plain loop
(tests/fixtures/baselines.py; the threshold is set between two rounds' divergences, so c takes 1, then 1/2), and
the release's client step and server update re-implemented in NumPy float64 (torch is not installed here)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from tests.fixtures.baselines import (LR, MODEL, PARAMS0, SCHEDULE, SIZES, WD, add, assert_tree_close,
                                      client_batches, config, grad, mean, run_engine, scale, sgd, sub)
from tests.fixtures.release_numpy import KEYS, max_rel_err, np_grad, norm as np_norm


def _norm(t):
  return float(np.sqrt(sum(float(jnp.sum(a * a)) for a in jax.tree_util.tree_leaves(t))))


def _reference(rho, rho_g, threshold, width):
  w, wt, has_prev, c, window, divs, cs = PARAMS0, None, False, 0.0, [], [], []
  for r, ids in enumerate(SCHEDULE):
    cs.append(c)
    ys = []
    for k in ids:
      y = w
      for b in client_batches(r, k):
        g = grad(y, b)
        wh = add(y, scale(g, rho / (_norm(g) + 1e-16)))
        p = add(scale(wt, c), scale(wh, 1 - c)) if has_prev else wh
        y = sgd(y, grad(p, b))
      ys.append(y)
    d = float(np.mean([_norm(sub(w, y)) for y in ys]))
    divs.append(d)
    window = (window + [1.0 if d > threshold else 0.0])[-width:]
    c = float(np.mean(window))
    new_w = mean(ys, [SIZES[k] for k in ids])
    pg = sub(w, new_w)
    wt = add(new_w, scale(pg, rho_g / _norm(pg)))
    w, has_prev = new_w, True
  return w, wt, c, divs, cs


def test_rounds_follow_the_rule():
  rho, rho_g, width = 0.1, 0.3, 2
  _, _, _, divs, _ = _reference(rho, rho_g, 0.0, width)
  threshold = (divs[0] + divs[1]) / 2                  # one round above, one below
  assert divs[0] != divs[1]
  want_w, want_wt, want_c, _, cs = _reference(rho, rho_g, threshold, width)
  assert 0.0 < cs[2] < 1.0                             # round 3 interpolates between its two points
  state, _, alg = run_engine(config('fedgf', optimizer='sam', rho=rho, rho_global=rho_g, threshold=threshold,
                                    window=width))
  assert (alg.comm_down, alg.extra_passes) == (2.0, 0.0)
  assert_tree_close(state['params'], want_w)
  assert_tree_close(state['w_tilde'], want_wt)
  np.testing.assert_allclose(float(state['c']), want_c)


def test_requires_a_sam_client():
  with pytest.raises(ValueError, match='client.optimizer'):
    registry.build_algorithm(config('fedgf'), MODEL)


def test_release_rule_matches_numpy():
  """FedGfSerialClientTrainer.train: ascent_step (rho g / (||g|| + 1e-16)), weighted_sum(w~, c), the backward at
  the interpolated point, set_model(w_k), SGD with weight decay; FedGfServerHandler.global_update: calc_c, fedavg,
  calc_perturbation."""
  rho, c_val = 0.1, 0.4
  cfg = config('fedgf', optimizer='sam', rho=rho, window=3, threshold=0.5)
  alg = registry.build_algorithm(cfg, MODEL)
  rng = np.random.default_rng(0)
  wt = {k: np.asarray(PARAMS0['Dense_0'][k], np.float64) + rng.normal(size=PARAMS0['Dense_0'][k].shape) for k in KEYS}
  tree = lambda d: {'Dense_0': {k: jnp.asarray(d[k], jnp.float32) for k in KEYS}}  # noqa: E731
  state = alg.server_init(PARAMS0, jax.random.key(0))
  state = {**state, 'w_tilde': tree(wt), 'has_prev': jnp.bool_(True), 'c': jnp.float32(c_val)}
  bcast = alg.broadcast(state, 0)
  batches = client_batches(0, 1)[:2]
  local = alg.client_init(bcast, None, jax.random.key(1))
  for b in batches:
    local, _ = alg.client_step(bcast, local, b, jax.random.key(2))
  w = {k: np.asarray(PARAMS0['Dense_0'][k], np.float64) for k in KEYS}
  for b in batches:
    g = np_grad(w, b['x'], b['y'])
    wh = {k: w[k] + g[k] * (rho / (np_norm(g) + 1e-16)) for k in KEYS}
    p = {k: wt[k] * c_val + wh[k] * (1 - c_val) for k in KEYS}
    g2 = np_grad(p, b['x'], b['y'])
    w = {k: w[k] - LR * (g2[k] + WD * w[k]) for k in KEYS}
  err_client = max_rel_err(local.params['Dense_0'], w)
  # The server: two clients' models (weights 3 and 5), the divergence window [1, 0] + this round's indicator.
  ys = [{k: np.asarray(PARAMS0['Dense_0'][k], np.float64) + 0.3 * rng.normal(size=w[k].shape) for k in KEYS}
        for _ in range(2)]
  n = np.array([3.0, 5.0])
  w0 = {k: np.asarray(PARAMS0['Dense_0'][k], np.float64) for k in KEYS}
  div = float(np.mean([np_norm({k: w0[k] - y[k] for k in KEYS}) for y in ys]))
  ind = 1.0 if div > 0.5 else 0.0
  new_w = {k: sum(ni * y[k] for ni, y in zip(n, ys)) / n.sum() for k in KEYS}
  pg = {k: w0[k] - new_w[k] for k in KEYS}
  want_wt = {k: new_w[k] + pg[k] * (rho / np_norm(pg)) for k in KEYS}
  agg = {'weighted': {'delta': tree({k: w0[k] - new_w[k] for k in KEYS})},
         'uniform': {'div': jnp.float32(div)}, 'num_clients': 2, 'total_weight': 8.0}
  st = {**alg.server_init(PARAMS0, jax.random.key(0)), 'window': jnp.array([1.0, 0.0, 0.0]),
        'count': jnp.int32(2)}
  new = alg.server_update(st, agg, 0)
  np.testing.assert_allclose(float(new['c']), (1.0 + 0.0 + ind) / 3, rtol=1e-6)
  err_server = max_rel_err(new['w_tilde']['Dense_0'], want_wt)
  print(f'fedgf: max relative error vs the release rule: client step {err_client:.2e}, w~ {err_server:.2e}')
  assert err_client < 1e-5 and err_server < 1e-5
