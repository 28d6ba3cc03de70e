"""q-FFL / q-FedAvg (algorithms/qffl.py): engine rounds vs rounds computed by hand from the paper's Algorithm 3, and
one round vs the release's arithmetic (litian96/fair_flearn, flearn/trainers/qffedavg.py `train`, fedbase.py
`aggregate2`, tf_utils.py `norm_grad`), on the baselines' 3 unequal clients with partial participation and padding
(tests/fixtures/baselines.py). TensorFlow is not installed here: the release's arithmetic is written in NumPy from
reading it, in float64, on the same tensors the engine sees."""
import jax
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.local import make_loss
from fedjax_flat.algorithms.qffl import qffl_upload
from fedjax_flat.config import validate
from fedjax_flat.errors import ConfigError
from tests.fixtures.baselines import (LR, MODEL, PARAMS0, SCHEDULE, assert_tree_close, client_batches, config,
                                      full_batch, local_sgd, mean, run_engine, sub)
from tests.fixtures.release_numpy import KEYS, np_grad

_EVAL_LOSS = make_loss(MODEL, train=False)


def _loss(w, k):
  """F_k(w): the mean loss over client k's whole training set (what the release's get_loss computes)."""
  return float(_EVAL_LOSS(w, full_batch(k))[0])


def _sq(t):
  return sum(float(np.sum(np.asarray(x, np.float64) ** 2)) for x in jax.tree_util.tree_leaves(t))


def _paper_rounds(q, rounds=len(SCHEDULE)):
  """Algorithm 3 with the library's local solver (SGD with coupled weight decay), L = 1/lr."""
  w, lip = PARAMS0, 1.0 / LR
  for r in range(rounds):
    ds, hs = [], []
    for k in SCHEDULE[r]:
      f = _loss(w, k) + 1e-10
      dw = jax.tree_util.tree_map(lambda a: lip * a, sub(w, local_sgd(w, r, k)))
      ds.append(jax.tree_util.tree_map(lambda a: f ** q * a, dw))
      hs.append(q * f ** (q - 1) * _sq(dw) + lip * f ** q)
    w = sub(w, jax.tree_util.tree_map(lambda a: a / np.mean(hs), mean(ds)))
  return w


@pytest.mark.parametrize('q', [0.0, 1.5])
def test_qffl_matches_hand_computed_rounds(q):
  """F_k at w^t accumulated over the local steps (2 epochs: every example twice) is the whole training set's."""
  state, _, _ = run_engine(config('qffl', q=q))
  assert_tree_close(state['params'], _paper_rounds(q), rtol=5e-5, atol=5e-6)
  if q == 0:   # q = 0: FedAvg with the uniform mean of the clients' models
    w = PARAMS0
    for r, ids in enumerate(SCHEDULE):
      w = mean([local_sgd(w, r, k) for k in ids])
    assert_tree_close(state['params'], w, rtol=5e-5, atol=5e-6)


def _release_round(latest, clients, lr, q):
  """One round of qffedavg.py's `train` on layer lists [kernel, bias] (float64): each client's local solver
  (TF GradientDescentOptimizer: plain SGD over its batches) from latest_model, then aggregate2."""
  deltas, hs = [], []
  for batches, (x, y) in clients:
    weights_before = [latest[k].copy() for k in KEYS]
    loss = _np_loss(latest, x, y)                     # c.get_loss(): the whole training set, at the global model
    w = {k: latest[k].copy() for k in KEYS}
    for b in batches:
      g = np_grad(w, b['x'], b['y'])
      w = {k: w[k] - lr * g[k] for k in KEYS}
    new_weights = [w[k] for k in KEYS]
    grads = [(u - v) * 1.0 / lr for u, v in zip(weights_before, new_weights)]
    deltas.append([np.float_power(loss + 1e-10, q) * gr for gr in grads])
    flat = np.concatenate([gr.ravel() for gr in grads])                       # norm_grad: squared, all layers
    hs.append(q * np.float_power(loss + 1e-10, q - 1) * np.sum(np.square(flat))
              + (1.0 / lr) * np.float_power(loss + 1e-10, q))
  denominator = np.sum(np.asarray(hs))                                        # aggregate2
  updates = [sum(d[i] / denominator for d in deltas) for i in range(len(KEYS))]
  return {k: weights_before[i] - updates[i] for i, k in enumerate(KEYS)}


def _np_loss(w, x, y):
  xf = x.reshape(len(x), -1).astype(np.float64)
  z = xf @ w['kernel'] + w['bias']
  z = z - z.max(1, keepdims=True)
  return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


def test_qffl_round_matches_release_arithmetic():
  q = 2.0
  cfg = config('qffl', q=q)
  cfg.client.weight_decay = 0.0                      # the release's local solver is plain SGD
  state, _, _ = run_engine(cfg, rounds=1)
  w0 = {k: np.asarray(PARAMS0['Dense_0'][k], np.float64) for k in KEYS}
  clients = [(client_batches(0, k), (full_batch(k)['x'], full_batch(k)['y'])) for k in SCHEDULE[0]]
  want = _release_round(w0, clients, LR, q)
  got = state['params']['Dense_0']
  for k in KEYS:
    np.testing.assert_allclose(np.asarray(got[k], np.float64), want[k], rtol=5e-5, atol=5e-6)


def test_loss_weighting_favours_the_worst_client():
  """The point of q: the larger q, the larger the worst client's share of the step (D_k / sum h_k)."""
  w0 = {'a': np.ones(3, np.float32)}
  w_lo, w_hi = {'a': np.full(3, 0.9, np.float32)}, {'a': np.full(3, 0.9, np.float32)}
  for q, bigger in ((0.0, False), (2.0, True)):
    d_lo, _ = qffl_upload(w0, w_lo, 0.1, q, LR)
    d_hi, _ = qffl_upload(w0, w_hi, 1.0, q, LR)
    assert (float(d_hi['a'][0]) > 5 * float(d_lo['a'][0])) == bigger


def test_a_round_without_reports_leaves_the_model():
  """Every client dropped (the virtual clock): the uniform means are 0 and so is the step, not 0/0."""
  alg = registry.build_algorithm(config('qffl'), MODEL)
  state = alg.server_init(PARAMS0, jax.random.key(0))
  zeros = jax.tree_util.tree_map(np.zeros_like, PARAMS0)
  new = alg.server_update(state, {'weighted': {}, 'uniform': {'d': zeros, 'h': np.float32(0.0)},
                                  'num_clients': 0, 'total_weight': 0.0}, 0)
  assert_tree_close(new['params'], PARAMS0, rtol=0, atol=0)


def test_declared_rules():
  assert registry.default_hparams('qffl') == {'q': 1.0}
  with pytest.raises(ConfigError, match=r'algo.q.*-1.*>= 0') as e:
    validate.validate_config(config('qffl', q=-1.0))
  assert '\n' not in str(e.value)
  cfg = config('qffl')
  cfg.client.base_optimizer, cfg.client.momentum = 'adam', 0.0
  with pytest.raises(ConfigError, match='client.base_optimizer.*adam.*use sgd'):
    validate.validate_config(cfg)
  cfg = config('qffl')
  cfg.client.lr_schedule, cfg.client.lr_poly_max = 'poly_step', 100
  with pytest.raises(ConfigError, match='client.lr_schedule.*one lr within a round'):
    validate.validate_config(cfg)
