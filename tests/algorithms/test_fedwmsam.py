"""FedWMSAM (algorithms/fedwmsam.py): the round engine against the rule written as a plain loop
(tests/fixtures/baselines.py: the momentum, the control variates and the cosine weight across 3 rounds of partial
participation), and the release's local steps re-implemented in NumPy float64 (torch is not installed here)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from tests.fixtures.baselines import (LR, MODEL, PARAMS0, SCHEDULE, WD, add, assert_tree_close, client_batches,
                                      config, grad, mean, run_engine, scale, sgd, sub, zeros)
from tests.fixtures.release_numpy import KEYS, clip, max_rel_err, np_grad


def _leaves(t):
  return [np.asarray(a, np.float64) for a in jax.tree_util.tree_leaves(t)]


def _norm(t):
  return float(np.sqrt(sum(np.sum(a * a) for a in _leaves(t))))


def _layers(t):
  return sum(float(np.sqrt(np.sum(a * a))) for a in _leaves(t))


@pytest.mark.parametrize('norm', ['global', 'layers'])
def test_rounds_follow_the_rule(norm):
  rho, a, n_pop = 0.2, 0.3, 3
  state, store, alg = run_engine(config('fedwmsam', rho=rho, alpha=a, norm=norm, population=n_pop))
  assert (alg.comm_down, alg.comm_up, alg.extra_passes) == (2.0, 2.0, 0.0)
  w, big_m, c = PARAMS0, zeros(), zeros()
  ck = {k: zeros() for k in range(n_pop)}
  nrm = _norm if norm == 'global' else _layers
  for r, ids in enumerate(SCHEDULE):
    ups, dcs, grads, coss = [], [], [], []
    for k in ids:
      m = add(big_m, scale(sub(c, ck[k]), a / (1 - a)))
      y, z, n = w, w, 0
      for b in client_batches(r, k):
        d = sub(z, y)
        e = scale(d, -rho / (nrm(d) + 1e-7))
        y = sgd(y, add(scale(grad(add(y, e), b), a), scale(m, 1 - a)))
        z = add(z, m)
        n += 1
      u = sub(y, w)
      new = sub(sub(ck[k], c), scale(u, 1.0 / (n * LR)))
      dcs.append(sub(new, ck[k]))
      ck[k] = new
      ups.append(u)
      grads.append(scale(u, -1.0 / (n * LR)))
      den = _norm(u) * _norm(big_m)
      dot = sum(np.sum(p * q) for p, q in zip(_leaves(u), _leaves(big_m)))
      coss.append(dot / den + 1.0 if den > 0 else 0.0)
    w = add(w, mean(ups))
    c = add(c, scale(mean(dcs), len(ids) / n_pop))
    big_m = mean(grads)
    a = 0.99 * a + 0.01 * min(max(float(np.mean(coss)), 0.1), 0.9)
  assert_tree_close(state['params'], w)
  assert_tree_close(state['c'], c)
  assert_tree_close(state['M'], big_m, rtol=5e-5, atol=5e-6)
  np.testing.assert_allclose(float(state['a']), a, rtol=1e-6)
  assert_tree_close(jax.tree_util.tree_map(lambda x: x[0], store.gather([2])), ck[2], rtol=5e-5, atol=5e-6)


def test_release_rule_matches_numpy():
  """fedwmsam.train: differ = target - w; WMSAM.first_step (-rho differ / (sum of per-tensor norms + 1e-7));
  loss_gamma = a CE + (1 - a) <w, m> backward at w + e; second_step; clip_grad_norm_(10); SGD (weight decay);
  target += m. Inputs x 30 so that the clip acts."""
  rho, a = 0.2, 0.4
  cfg = config('fedwmsam', rho=rho, alpha=a, norm='layers', population=3)
  cfg.client.grad_clip = 10.0
  alg = registry.build_algorithm(cfg, MODEL)
  rng = np.random.default_rng(0)
  rand = lambda: {k: rng.normal(size=PARAMS0['Dense_0'][k].shape) for k in KEYS}  # noqa: E731
  big_m, cvec, ckvec = rand(), rand(), rand()
  tree = lambda d: {'Dense_0': {k: jnp.asarray(d[k], jnp.float32) for k in KEYS}}  # noqa: E731
  state = {**alg.server_init(PARAMS0, jax.random.key(0)), 'M': tree(big_m), 'c': tree(cvec)}
  bcast = alg.broadcast(state, 0)
  batches = [{**b, 'x': b['x'] * 30.0} for b in client_batches(0, 1)[:3]]
  local = alg.client_init(bcast, tree(ckvec), jax.random.key(1))
  for b in batches:
    local, _ = alg.client_step(bcast, local, b, jax.random.key(2))
  m = {k: big_m[k] + (cvec[k] - ckvec[k]) * a / (1 - a) for k in KEYS}     # Client_momentum
  w = {k: np.asarray(PARAMS0['Dense_0'][k], np.float64) for k in KEYS}
  target = dict(w)
  for b in batches:
    differ = {k: target[k] - w[k] for k in KEYS}
    gn = sum(np.linalg.norm(differ[k]) for k in KEYS)
    e = {k: -differ[k] * (rho / (gn + 1e-7)) for k in KEYS}
    g = np_grad({k: w[k] + e[k] for k in KEYS}, b['x'], b['y'])
    g = clip({k: a * g[k] + (1 - a) * m[k] for k in KEYS}, 10.0)
    w = {k: w[k] - LR * (g[k] + WD * w[k]) for k in KEYS}
    target = {k: target[k] + m[k] for k in KEYS}
  err = max_rel_err(local.params['Dense_0'], w)
  print(f'fedwmsam: max relative error vs the release rule {err:.2e}')
  assert err < 1e-5
