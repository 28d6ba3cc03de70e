"""FedSWA / FedMoSWA (algorithms/fedswa.py): the round engine against the rule written as a plain loop
(tests/fixtures/baselines.py; algo.cycle_steps=4, so client 1's 6 valid steps run past the cycle), and the local
steps against the release's update_FedSWA / update_FedMoSWA re-implemented in NumPy float64 (torch is not
installed here)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.config.validate import validate_config
from tests.fixtures.baselines import (LR, MODEL, PARAMS0, SCHEDULE, SIZES, WD, add, assert_tree_close,
                                      client_batches, config, grad, mean, run_engine, scale, sub, zeros)
from tests.fixtures.release_numpy import np_grad

K, RATIO = 4, 0.1


def _lr(k):
  f = min(k / K, 1.0)
  return ((1 - f) + f * RATIO) * LR


def _step(w, g, lr):
  return jax.tree_util.tree_map(lambda p, a: p - lr * (a + WD * p), w, g)


def test_fedswa_rule():
  state, _, alg = run_engine(config('fedswa', cycle_steps=K, lr_ratio=RATIO))
  assert (alg.extra_passes, alg.comm_down) == (0.0, 1.0)
  w = PARAMS0
  for r, ids in enumerate(SCHEDULE):
    ys = []
    for k in ids:
      y = w
      for i, b in enumerate(client_batches(r, k)):
        y = _step(y, grad(y, b), _lr(i))
      ys.append(y)
    w = mean(ys, [SIZES[k] for k in ids])
  assert_tree_close(state['params'], w)


@pytest.mark.parametrize('cv_lr', ['steps', 'release'])
def test_fedmoswa_rule(cv_lr):
  beta = 0.3
  state, store, alg = run_engine(config('fedmoswa', cycle_steps=K, lr_ratio=RATIO, beta=beta, cv_lr=cv_lr))
  assert alg.comm_down == 2.0
  w, c = PARAMS0, zeros()
  ck = {k: zeros() for k in range(3)}
  for r, ids in enumerate(SCHEDULE):
    ys, cnews = [], []
    for k in ids:
      y, lr_sum, steps = w, 0.0, 0
      for i, b in enumerate(client_batches(r, k)):
        y = _step(y, add(grad(y, b), sub(c, ck[k])), _lr(i))
        lr_sum += _lr(i)
        steps += 1
      if cv_lr == 'release':     # update_FedMoSWA: K_k (lr + r lr) / 2
        lr_sum = steps * (LR + RATIO * LR) / 2
      ck[k] = add(sub(ck[k], c), scale(sub(w, y), 1.0 / lr_sum))
      ys.append(y)
      cnews.append(ck[k])
    w = mean(ys)
    c = mean(cnews) if r == 0 else add(c, scale(sub(mean(cnews), c), beta))
  assert_tree_close(state['params'], w)
  assert_tree_close(state['c'], c)
  assert_tree_close(jax.tree_util.tree_map(lambda a: a[0], store.gather([2])), ck[2])


def test_cycle_length_defaults():
  from fedjax_flat.algorithms.fedswa import cycle_length
  c = config('fedswa')
  validate_config(c)
  hp = registry.spec('fedswa').hp(c)
  assert cycle_length(c, hp) == 50                 # the epochs mode: the release README's K
  c.client.local_steps = 7
  assert cycle_length(c, hp) == 7                  # a fixed step count: every client's exact K
  assert cycle_length(c, {**hp, 'cycle_steps': 3}) == 3


@pytest.mark.parametrize('name', ['fedswa', 'fedmoswa'])
def test_release_steps_match_numpy(name):
  """update_FedSWA: SGD(lr * 2) rebuilt each step, clip_grad_norm_(10), weight decay, lr = (1 - i/S) lr1 +
  (i/S) lr2 with lr2 = 0 (inputs x 30: the clip acts). update_FedMoSWA: SGD(lr) step, then y - lr (c - c_k), the
  same decay from lr to 0 (no clip in this comparison: the release clips before the correction)."""
  args_lr, steps = 0.05, 3
  batches = client_batches(0, 1)[:steps]
  x_scale = 30.0 if name == 'fedswa' else 1.0
  batches = [{**b, 'x': b['x'] * x_scale} for b in batches]
  c = config(name, cycle_steps=steps, lr_ratio=0.0)
  c.client.lr = 2 * args_lr if name == 'fedswa' else args_lr
  c.client.grad_clip = 10.0 if name == 'fedswa' else 0.0
  alg = registry.build_algorithm(c, MODEL)
  rng = np.random.default_rng(0)
  cvec, ckvec = [{'kernel': rng.normal(size=(2, 3)), 'bias': rng.normal(size=3)} for _ in range(2)]
  tree = lambda d: {'Dense_0': {k: jnp.asarray(v, jnp.float32) for k, v in d.items()}}  # noqa: E731
  state = alg.server_init(PARAMS0, jax.random.key(0))
  cs = None
  if name == 'fedmoswa':
    state, cs = {**state, 'c': tree(cvec)}, tree(ckvec)
  bcast = alg.broadcast(state, 0)
  local = alg.client_init(bcast, cs, jax.random.key(1))
  for b in batches:
    local, _ = alg.client_step(bcast, local, b, jax.random.key(2))
  keys = ('kernel', 'bias')
  w = {k: np.asarray(PARAMS0['Dense_0'][k], np.float64) for k in keys}
  lr = args_lr
  for i, b in enumerate(batches, start=1):
    g = np_grad(w, b['x'], b['y'])
    if name == 'fedswa':
      total = np.sqrt(sum(np.sum(g[k] ** 2) for k in keys))
      coef = min(1.0, 10.0 / (total + 1e-6))
      w = {k: w[k] - 2 * lr * (coef * g[k] + WD * w[k]) for k in keys}
    else:
      w = {k: w[k] - lr * (g[k] + WD * w[k]) for k in keys}
      w = {k: w[k] - (-ckvec[k] + cvec[k]) * lr for k in keys}
    lr = (1 - i / steps) * args_lr + (i / steps) * 0.0
  got = local.params['Dense_0']
  err = max(float(np.max(np.abs(np.asarray(got[k], np.float64) - w[k]) / np.abs(w[k]))) for k in keys)
  print(f'{name}: max relative error vs the release rule {err:.2e}')
  assert err < 1e-5


def test_epochs_mode_warns_when_the_run_takes_other_than_k_steps(monkeypatch):
  from absl import logging
  from fedjax_flat.algorithms import fedswa as fedswa_lib
  from tests.fixtures.baselines import DATA
  said = []
  monkeypatch.setattr(logging, 'warning', lambda msg, *a: said.append(msg % a))
  c = config('fedswa')
  spec = registry.spec('fedswa')
  spec.validate_data(c, DATA)                     # largest client: 3 batches x 2 epochs = 6 steps, K = 50
  assert len(said) == 1 and 'cycle_steps=6' in said[0]
  said.clear()
  c.algo.cycle_steps = 6
  fedswa_lib.check_data(c, spec.hp(c), DATA)
  assert not said
