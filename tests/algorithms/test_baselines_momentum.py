"""Mime, MimeLite (against FedJAX's mime.py / mime_lite.py, written in FedJAX's structure), FedCM, FedACG:
engine rounds vs reference rounds (see test_baselines_harness)."""
import pytest

from tests.fixtures.baselines import (LR, PARAMS0, SCHEDULE, SIZES, WD, add, assert_tree_close, client_batches,
                                    config, full_batch, grad, mean, run_engine, scale, sgd, sub, zeros)


def _reg_grad(w, batch):
  """FedJAX's models.grad(per_example_loss, regularizer) with the L2 regularizer (wd/2)||w||^2."""
  return add(grad(w, batch), scale(w, WD))


def _server_grads(x, ids):
  """FedJAX create_grads_for_each_client: sum_k sum_batches grad * num / sum num (full client data)."""
  sums = [scale(grad(x, full_batch(k)), SIZES[k]) for k in ids]
  return scale(add(*sums), 1.0 / sum(SIZES[k] for k in ids))


@pytest.mark.parametrize('lite', [False, True])
def test_mime_and_mimelite_follow_fedjax(lite):
  beta, eta_g = 0.9, 0.8
  cfg = config('mimelite' if lite else 'mime', beta=beta)
  cfg.server.lr = eta_g
  state, _, alg = run_engine(cfg)
  assert alg.num_phases == (1 if lite else 2)
  x, trace = PARAMS0, zeros()                                   # base optimizer: sgd(lr, momentum=beta)
  for r, ids in enumerate(SCHEDULE):
    c = _server_grads(x, ids)                                   # grads at server params, data gradient
    c_reg = add(c, scale(x, WD))                                # + the regularizer's gradient at x
    deltas = []
    for k in ids:
      y = x
      for b in client_batches(r, k):
        g = _reg_grad(y, b)
        if not lite:                                           # g - cc + c with cc the client cv at x
          g = add(sub(g, _reg_grad(x, b)), c_reg)
        y = sub(y, scale(add(g, scale(trace, beta)), LR))       # base_optimizer.apply, opt_state not updated
      deltas.append(sub(x, y))
    delta = mean(deltas, [SIZES[k] for k in ids])
    trace = add(c_reg, scale(trace, beta))                      # base_optimizer.apply(server_grads, ...)
    x = sub(x, scale(delta, eta_g))                             # p - server_learning_rate * delta
  assert_tree_close(state['params'], x, rtol=5e-5, atol=5e-6)
  assert_tree_close(state['m'], trace, rtol=5e-5, atol=5e-6)


def test_fedcm():
  alpha = 0.3
  state, _, alg = run_engine(config('fedcm', alpha=alpha))
  assert (alg.comm_down, alg.comm_up) == (2.0, 1.0)
  x, d = PARAMS0, zeros()
  for r, ids in enumerate(SCHEDULE):
    deltas, ds = [], []
    for k in ids:
      y, steps = x, 0
      for b in client_batches(r, k):
        v = add(scale(grad(y, b), alpha), scale(d, 1 - alpha))
        y = sgd(y, v)
        steps += 1
      deltas.append(sub(x, y))
      ds.append(scale(sub(x, y), 1.0 / (LR * steps)))
    w = [SIZES[k] for k in ids]
    x, d = sub(x, mean(deltas, w)), mean(ds, w)
  assert_tree_close(state['params'], x)
  assert_tree_close(state['d'], d)


def test_fedacg():
  beta, lam = 0.2, 0.85
  state, _, _ = run_engine(config('fedacg', beta=beta, lam=lam))
  theta, m = PARAMS0, zeros()
  for r, ids in enumerate(SCHEDULE):
    sent = add(theta, scale(m, lam))                            # lookahead
    dys = []
    for k in ids:
      y = sent
      for b in client_batches(r, k):
        y = sgd(y, add(grad(y, b), scale(sub(y, sent), beta)))
      dys.append(sub(y, sent))
    m = add(scale(m, lam), mean(dys))
    theta = add(theta, m)
  assert_tree_close(state['params'], theta)
  assert_tree_close(state['m'], m)
