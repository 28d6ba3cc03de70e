"""SAM-based FL methods of thesis Tables 4.14/4.15: FedSpeed (paper Algorithm 1), FedSMOO (written in the
release code's parametrization: FedDyn-style h_k sums with lambda = 1/beta), FedGamma (SCAFFOLD + SAM)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.fixtures.baselines import (LR, PARAMS0, SCHEDULE, add, assert_tree_close, client_batches, config, grad,
                                    mean, run_engine, sam_grad, scale, sgd, sub, zeros)
from fedjax_flat.algorithms import registry
from tests.fixtures.baselines import MODEL


def _norm(t):
  return float(np.sqrt(sum(float(jnp.sum(a * a)) for a in jax.tree_util.tree_leaves(t))))


@pytest.mark.parametrize('dual_mean', ['active', 'population'])
def test_fedspeed_algorithm_1(dual_mean):
  rho, alpha, lam, n_pop = 0.1, 0.9, 5.0, 4
  state, store, alg = run_engine(config('fedspeed', optimizer='sam', rho=rho, alpha=alpha, lam=lam,
                                        dual_mean=dual_mean, population=n_pop))
  assert (alg.comm_down, alg.comm_up) == (1.0, 1.0)
  x = PARAMS0
  g_hat = {k: zeros() for k in range(n_pop)}
  for r, ids in enumerate(SCHEDULE):
    x_hats, x_ks = [], []
    for k in ids:
      y = x
      for b in client_batches(r, k):
        g1 = grad(y, b)
        g2 = grad(add(y, scale(g1, rho / (_norm(g1) + 1e-12))), b)
        g = add(scale(g1, 1 - alpha), scale(g2, alpha))
        y = sgd(y, add(g, scale(g_hat[k], -1.0), scale(sub(y, x), 1.0 / lam)))
      g_hat[k] = sub(g_hat[k], scale(sub(y, x), 1.0 / lam))
      x_hats.append(sub(y, scale(g_hat[k], lam)))
      x_ks.append(y)
    if dual_mean == 'active':      # Algorithm 1: x^{t+1} = mean_S x^_k
      x = mean(x_hats)
    else:                          # release code: mean_S x_{k,K} + mean over all N clients of h_k = -lam g^_k
      x = sub(mean(x_ks), scale(mean([g_hat[k] for k in range(n_pop)]), lam))
  assert_tree_close(state['params'], x)
  assert_tree_close(jax.tree_util.tree_map(lambda a: a[0], store.gather([0])), g_hat[0])


def test_fedsmoo_release_code():
  rho, beta, n_pop = 0.05, 4.0, 4
  lamb = 1.0 / beta
  state, store, alg = run_engine(config('fedsmoo', optimizer='sam', rho=rho, beta=beta, population=n_pop))
  assert (alg.comm_down, alg.comm_up) == (2.0, 2.0)
  # Release code (FL-Simulator): h_i = sum of local updates; grad = g2 + lamb (h_i - w0) + (wd + lamb) w.
  w = PARAMS0
  h = {k: zeros() for k in range(n_pop)}
  mu = {k: zeros() for k in range(3)}
  s = zeros()
  for r, ids in enumerate(SCHEDULE):
    models, mus = [], []
    for k in ids:
      y = w
      for b in client_batches(r, k):
        g = sub(sub(grad(y, b), mu[k]), s)                       # DRegSAM.first_step: g - (mu + global_mu)
        e = scale(g, rho / (_norm(g) + 1e-12))
        mu[k] = add(mu[k], sub(e, s))                           # mu += e_w - global_mu
        g2 = grad(add(y, e), b)
        v = add(g2, scale(sub(h[k], w), lamb), scale(y, lamb))  # loss_correct + the lamb part of weight decay
        y = sgd(y, v)                                           # (+ wd y inside sgd)
      h[k] = add(h[k], sub(y, w))                               # postprocess: h += local update
      models.append(y)
      mus.append(mu[k])
    avg_mu = mean(mus)
    s = scale(avg_mu, rho / (_norm(avg_mu) + 1e-12))
    w = add(mean(models), mean([h[k] for k in range(n_pop)]))   # Averaged_model + mean over all clients of h
  assert_tree_close(state['params'], w, rtol=5e-5, atol=5e-6)
  assert_tree_close(state['s'], s, rtol=5e-5, atol=5e-6)
  cs = store.gather([2])
  assert_tree_close(jax.tree_util.tree_map(lambda a: a[0], cs['mu']), mu[2], rtol=5e-5, atol=5e-6)
  assert_tree_close(jax.tree_util.tree_map(lambda a: a[0], cs['sigma']), scale(h[2], -1.0 / beta),
                    rtol=5e-5, atol=5e-6)


@pytest.mark.parametrize('perturb_corrected', [False, pytest.param(True, marks=pytest.mark.slow)])
def test_fedgamma_is_scaffold_with_sam(perturb_corrected):
  rho, n_pop = 0.05, 3
  state, _, alg = run_engine(config('fedgamma', optimizer='sam', rho=rho, population=n_pop,
                                    perturb_corrected=perturb_corrected))
  assert (alg.comm_down, alg.comm_up) == (2.0, 2.0)
  x, c = PARAMS0, zeros()
  ck = {k: zeros() for k in range(3)}
  for r, ids in enumerate(SCHEDULE):
    dys, dcs = [], []
    for k in ids:
      y, steps = x, 0
      corr = sub(c, ck[k])
      for b in client_batches(r, k):
        if perturb_corrected:
          d = add(grad(y, b), corr)
          g = grad(add(y, scale(d, rho / (_norm(d) + 1e-12))), b)
        else:
          g = sam_grad(y, b, rho)
        y = sgd(y, add(g, corr))
        steps += 1
      new = add(sub(ck[k], c), scale(sub(x, y), 1.0 / (steps * LR)))
      dys.append(sub(y, x))
      dcs.append(sub(new, ck[k]))
      ck[k] = new
    x = add(x, mean(dys))
    c = add(c, scale(mean(dcs), len(ids) / n_pop))
  assert_tree_close(state['params'], x)
  assert_tree_close(state['c'], c)


@pytest.mark.parametrize('name,optimizer', [('fedspeed', 'sgd'), ('fedsmoo', 'asam'), ('fedgamma', 'sgd')])
def test_sam_methods_require_their_client_optimizer(name, optimizer):
  with pytest.raises(ValueError, match='client.optimizer'):
    registry.build_algorithm(config(name, optimizer=optimizer), MODEL)
