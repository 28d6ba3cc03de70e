"""FedProx, SCAFFOLD, FedDyn, AdaBest: engine rounds vs reference rounds written from the papers' update rules
(3 unequal clients, partial participation, padding steps and padding clients; see tests/fixtures/baselines.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.fixtures.baselines import (LR, MODEL, PARAMS0, SCHEDULE, SIZES, S, add, assert_tree_close, client_batches,
                                      config, grad, mean, run_engine, sam_grad, scale, sgd, sub, zeros)


def test_harness_shapes():
  """The shared harness (tests/fixtures/baselines.py): padded steps per round and each client's steps in round 0."""
  assert S == 6 and [len(client_batches(0, k)) for k in range(3)] == [2, 6, 2]


@jax.jit
def _fedjax_prox_grad(w, w0, batch, mu):
  """FedJAX fed_prox: grad of mean(per_example_loss + 0.5 mu ||w0 - w||^2)."""
  def loss(p):
    logits = MODEL.apply(p, batch['x'])
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch['y'][:, None], axis=-1)[:, 0]
    prox = 0.5 * mu * sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree_util.tree_leaves(w0),
                                                                jax.tree_util.tree_leaves(p)))
    return jnp.mean(ce + prox)
  return jax.grad(loss)(w)


@pytest.mark.parametrize('optimizer', ['sgd', pytest.param('sam', marks=pytest.mark.slow)])
def test_fedprox_matches_fedjax_formula(optimizer):
  mu, rho = 0.3, 0.05
  state, _, _ = run_engine(config('fedprox', optimizer=optimizer, rho=rho, mu=mu))
  w = PARAMS0
  for r, ids in enumerate(SCHEDULE):
    deltas = []
    for k in ids:
      y = w
      for b in client_batches(r, k):
        if optimizer == 'sgd':
          g = _fedjax_prox_grad(y, w, b, mu)
        else:   # SAM gradient of the data loss, the proximal gradient at the unperturbed weights
          g = add(sam_grad(y, b, rho), scale(sub(y, w), mu))
        y = sgd(y, g)
      deltas.append(sub(w, y))
    w = sub(w, mean(deltas, [SIZES[k] for k in ids]))     # FedJAX: example-weighted mean, server SGD lr 1
  assert_tree_close(state['params'], w)


def test_scaffold_option2():
  eta_g, n_pop = 0.7, 5            # population larger than the 3 clients that exist: c moves by |S|/N
  cfg = config('scaffold', population=n_pop)
  cfg.server.lr = eta_g
  state, store, alg = run_engine(cfg)
  assert (alg.comm_down, alg.comm_up) == (2.0, 2.0)
  x, c = PARAMS0, zeros()
  ck = {k: zeros() for k in range(3)}
  for r, ids in enumerate(SCHEDULE):
    dys, dcs = [], []
    for k in ids:
      y, steps = x, 0
      for b in client_batches(r, k):
        y = sgd(y, add(grad(y, b), sub(c, ck[k])))
        steps += 1
      new = add(sub(ck[k], c), scale(sub(x, y), 1.0 / (steps * LR)))
      dys.append(sub(y, x))
      dcs.append(sub(new, ck[k]))
      ck[k] = new
    x = add(x, scale(mean(dys), eta_g))
    c = add(c, scale(mean(dcs), len(ids) / n_pop))
  assert_tree_close(state['params'], x)
  assert_tree_close(state['c'], c)
  for k in range(3):
    assert_tree_close(jax.tree_util.tree_map(lambda a: a[0], store.gather([k])), ck[k])


def _clip(g, c):
  n = np.sqrt(sum(float(jnp.sum(a * a)) for a in jax.tree_util.tree_leaves(g)))
  return g if n < c else scale(g, c / n)


def test_feddyn_with_sam_and_gradient_clipping():
  alpha, rho, clip, n_pop = 0.1, 0.05, 0.8, 4
  cfg = config('feddyn', optimizer='sam', rho=rho, alpha=alpha, population=n_pop)
  cfg.client.grad_clip = clip
  state, store, _ = run_engine(cfg)
  theta, h = PARAMS0, zeros()
  g = {k: zeros() for k in range(3)}
  for r, ids in enumerate(SCHEDULE):
    thetas, drifts = [], []
    for k in ids:
      y = theta
      for b in client_batches(r, k):
        v = add(sam_grad(y, b, rho), scale(g[k], -1.0), scale(sub(y, theta), alpha))
        y = sgd(y, _clip(v, clip))
      g[k] = sub(g[k], scale(sub(y, theta), alpha))
      thetas.append(y)
      drifts.append(sub(y, theta))
    h = sub(h, scale(add(*drifts), alpha / n_pop))            # h - alpha (1/N) sum_S (theta_k - theta)
    theta = sub(mean(thetas), scale(h, 1.0 / alpha))          # mean_S theta_k - h / alpha
  assert_tree_close(state['params'], theta)
  assert_tree_close(state['h'], h)
  assert_tree_close(jax.tree_util.tree_map(lambda a: a[0], store.gather([1])), g[1])


def test_adabest_fedsim_rule():
  mu, beta = 0.5, 0.6
  state, store, _ = run_engine(config('adabest', mu=mu, beta=beta))
  theta = avg_prev = PARAMS0
  h = {k: zeros() for k in range(3)}
  last = {k: -1 for k in range(3)}
  n_seen = []                                                  # sizes of the clients of previous rounds
  for t, ids in enumerate(SCHEDULE):
    n_bar = np.mean(n_seen) if n_seen else 0.0
    locals_ = []
    for k in ids:
      mu_k = mu * n_bar / SIZES[k]                             # fedsim: mu / |D_k| * average_sample
      y = theta
      for b in client_batches(t, k):
        y = sgd(y, add(grad(y, b), scale(h[k], -mu_k)))
      h[k] = add(scale(h[k], 1.0 / (t - last[k])), sub(theta, y))
      last[k] = t
      locals_.append(y)
    n_seen += [SIZES[k] for k in ids]
    avg = mean(locals_)
    theta = sub(avg, scale(sub(avg_prev, avg), beta))          # theta_bar - beta (theta_bar_prev - theta_bar)
    avg_prev = avg
  assert_tree_close(state['params'], theta)
  cs = store.gather([1])
  assert_tree_close(jax.tree_util.tree_map(lambda a: a[0], cs['h']), h[1])
  assert float(cs['last'][0]) == 3.0 and float(cs['n'][0]) == SIZES[1]
