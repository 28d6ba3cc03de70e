"""FedGloSS / NaiveFedGloSS (algorithms/fedgloss.py) on quadratic clients, where every round is computable.
The population K_total (algo.population) differs from the 3 clients of the round on purpose, so that the
1 / (beta K_total) normalization of the global dual is checked.

Client k has f_k(w) = 0.5 ||w - c_k||^2 (all its examples equal c_k), so its gradient is w - c_k and an SGD
step from w is w - lr (w - c_k + correction). The engine runs the real round program; the reference below is
Algorithm 5 written as a plain loop in float64.
"""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from absl import logging

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.fedgloss import fedgloss_builder, naive_fedgloss_builder
from fedjax_flat.core import engine
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.config.default_config import default_config
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError
from tests.fixtures.fedgloss_release import release_server_rhos

B = 3   # examples per batch (client k has N_k valid ones)


def quad_loss(params, batch, rng=None):
  mask = batch['mask'].astype(jnp.float32)
  count = jnp.sum(mask)
  per = 0.5 * jnp.sum(jnp.square(params['w'][None, :] - batch['x']), axis=-1)
  loss_sum = jnp.sum(per * mask)
  return loss_sum / jnp.maximum(count, 1.0), (loss_sum, count)


def build(naive=False, lr=0.5, steps=1, optimizer='sgd', rho_l=0.0, rho0=0.0, warmup=0, **algo):
  c = default_config()
  c.algorithm = 'naive_fedgloss' if naive else 'fedgloss'
  c.client.optimizer = optimizer
  c.client.lr = lr
  c.client.weight_decay = 0.0
  c.client.momentum = 0.0
  c.client.rho = rho_l
  c.client.rho0 = rho0
  c.client.rho_warmup_rounds = warmup
  # The reference below defaults to Algorithm 5's dual; the registered default is 'release'.
  c.algo = ml_collections.ConfigDict({**registry.default_hparams(c.algorithm), 'dual_variant': 'thesis', **algo})
  client_tx, hparams_fn = client_parts(c.client)
  ctx = registry.BuildContext(model=None, loss_fn=quad_loss, client_cfg=c.client, server_tx=optax.sgd(1.0),
                              client_tx=client_tx, config=c, name=c.algorithm, hp=registry.spec(c.algorithm).hp(c),
                              hparams_fn=hparams_fn)
  return (naive_fedgloss_builder if naive else fedgloss_builder)(ctx)


def round_inputs(cs, ns, steps):
  cs = np.asarray(cs, np.float32)
  k, d = cs.shape
  mask = np.zeros((k, steps, B), np.float32)
  for i, n in enumerate(ns):
    mask[i, :, :n] = 1.0
  x = np.broadcast_to(cs[:, None, None, :], (k, steps, B, d)).copy()
  batches = {'x': x, 'y': np.zeros((k, steps, B), np.int32), 'mask': mask}
  rngs = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(k))
  return batches, rngs, np.asarray(ns, np.float32), np.ones(k, bool)


def run_engine(alg, w0, cs, ns, rounds, steps):
  params = {'w': jnp.asarray(w0, jnp.float32)}
  state = alg.server_init(params, None)
  k = len(ns)
  cstates = None
  if alg.client_state_init is not None:
    cstates = jax.tree_util.tree_map(lambda a: jnp.stack([a] * k), alg.client_state_init(params))
  fn = engine.make_round_fn(alg, chunk=k)   # donating, as in training (catches aliased state buffers)
  batches, rngs, weights, valid = round_inputs(cs, ns, steps)
  sent = []
  for r in range(rounds):
    sent.append(np.asarray(alg.broadcast(state, jnp.int32(r), 0)['params']['w']))
    state, cstates, _ = fn(state, batches, cstates, rngs, weights, valid, jnp.int32(r))
  return state, cstates, sent


def reference(w0, cs, ns, rounds, steps, lr, beta=10.0, rho_server=0.15, admm=True, dual_variant='thesis',
              population=20, naive=False, rho_l=lambda t: 0.0, rho_s=None):
  """Algorithm 5 (and NaiveFedGloSS, digest 1.6) as a plain float64 loop."""
  cs = np.asarray(cs, np.float64)
  p = np.asarray(ns, np.float64) / np.sum(ns)
  k = len(ns)
  w = np.asarray(w0, np.float64)
  sigma = np.zeros_like(w)
  sig_k = np.zeros((k,) + w.shape)
  prev = None
  sent = []
  rho_s = rho_s or (lambda t: rho_server)

  def train(start, j, with_admm, rho):
    v = start.copy()
    for _ in range(steps):
      g = v - cs[j]
      if rho > 0:                                     # SAM: gradient at v + rho g / ||g||
        g = (v + rho * g / np.linalg.norm(g)) - cs[j]
      if with_admm:
        g = g - sig_k[j] + (v - start) / beta
      v = v - lr * g
    return v

  for t in range(rounds):
    if naive:
      d0 = sum(p[j] * (w - train(w, j, False, rho_l(t))) for j in range(k))
      eps = rho_s(t) * d0 / np.linalg.norm(d0)
      sent.append(w.copy())
    else:
      eps = np.zeros_like(w) if prev is None else rho_s(t) * prev / np.linalg.norm(prev)
      sent.append(w + eps)
    wt = w + eps
    wk = np.stack([train(wt, j, admm, rho_l(t)) for j in range(k)])
    delta = np.sum(p[:, None] * (wt - wk), axis=0)
    if admm:
      sig_k = sig_k - (wk - wt) / beta
      if dual_variant == 'thesis':   # sum over the round's clients / (beta K_total)
        sigma = sigma - np.sum(wk - w, axis=0) / (beta * population)
      else:
        sigma = sigma - np.sum(wk - wt, axis=0) / (beta * population * k)
      w = w - delta - beta * sigma
    else:
      w = w - delta
    prev = delta
  return w, sigma, sig_k, prev, sent


CS = [[1.0, 0.0], [-1.0, 2.0], [3.0, -1.0]]
NS = [1, 3, 2]
W0 = [0.5, -0.5]


def test_first_round_by_hand_one_dimension():
  """w=0, c=(1,-1,3), N=(1,1,2), lr=0.5, beta=2, K_total=6: w_k = c_k/2 = (.5, -.5, 1.5); D~ = -0.75;
  sigma = -sum_k w_k / (beta K_total) = -1.5/12 = -0.125; w' = 0 + 0.75 - 2 (-0.125) = 1.0."""
  alg = build(lr=0.5, beta=2.0, population=6)
  state, cstates, sent = run_engine(alg, [0.0], [[1.0], [-1.0], [3.0]], [1, 1, 2], rounds=1, steps=1)
  np.testing.assert_allclose(sent[0], [0.0])                       # no ascent in the first round
  np.testing.assert_allclose(state['delta_prev']['w'], [-0.75], rtol=1e-6)
  np.testing.assert_allclose(state['sigma']['w'], [-0.125], rtol=1e-6)
  np.testing.assert_allclose(state['params']['w'], [1.0], rtol=1e-6)
  np.testing.assert_allclose(cstates['w'][:, 0], [-0.25, 0.25, -0.75], rtol=1e-6)  # sigma_k = -w_k / beta
  # Round 2's ascent point: w~ = 1.0 + rho_s * sign(D~) = 1.0 - 0.15.
  np.testing.assert_allclose(alg.broadcast(state, jnp.int32(1))['params']['w'], [0.85], rtol=1e-6)
  np.testing.assert_allclose(alg.eval_models(state)['global'][0]['w'], [1.0], rtol=1e-6)


@pytest.mark.parametrize('algo', [
    dict(beta=10.0, rho_server=0.15, population=4),
    dict(beta=3.0, rho_server=0.3, dual_variant='release', population=7),
    dict(beta=3.0, rho_server=0.3, admm=False),
])
def test_two_rounds_match_algorithm_5(algo):
  alg = build(lr=0.3, **algo)
  state, cstates, sent = run_engine(alg, W0, CS, NS, rounds=2, steps=2)
  w, sigma, sig_k, prev, ref_sent = reference(W0, CS, NS, rounds=2, steps=2, lr=0.3, **algo)
  np.testing.assert_allclose(np.stack(sent), np.stack(ref_sent), rtol=1e-5, atol=1e-6)   # ascent points
  np.testing.assert_allclose(state['params']['w'], w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state['delta_prev']['w'], prev, rtol=1e-5, atol=1e-6)
  if algo.get('admm', True):
    np.testing.assert_allclose(state['sigma']['w'], sigma, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cstates['w'], sig_k, rtol=1e-5, atol=1e-6)
  else:
    assert alg.client_state_init is None and cstates is None and 'sigma' not in state


def test_without_admm_is_fedavg_from_the_ascent_point():
  """admm=False: w' = w - sum_k p_k (w~ - w_k), w_k plain SGD from w~ (thesis Table 4.17)."""
  alg = build(lr=0.3, admm=False, rho_server=0.3)
  state, _, sent = run_engine(alg, W0, CS, NS, rounds=2, steps=1)
  p = np.asarray(NS) / sum(NS)
  w0, cs = np.asarray(W0), np.asarray(CS)
  d1 = sum(pi * (w0 - (w0 - 0.3 * (w0 - c))) for pi, c in zip(p, cs))   # round 1: no ascent, w~ = w0
  w1 = w0 - d1
  wt = w1 + 0.3 * d1 / np.linalg.norm(d1)                                # round 2's ascent point
  np.testing.assert_allclose(sent[1], wt, rtol=1e-5)
  wk = [wt - 0.3 * (wt - c) for c in cs]
  want = w1 - sum(pi * (wt - wi) for pi, wi in zip(p, wk))
  np.testing.assert_allclose(state['params']['w'], want, rtol=1e-5)


def test_sam_client_with_rho_warmup():
  """The correction is added to the SAM gradient; rho_l(t) = 0.001 + (0.1 - 0.001) t / 2."""
  alg = build(lr=0.3, optimizer='sam', rho_l=0.1, rho0=0.001, warmup=2, beta=5.0, rho_server=0.2, population=5)
  state, cstates, sent = run_engine(alg, W0, CS, NS, rounds=2, steps=2)
  w, sigma, sig_k, _, ref_sent = reference(W0, CS, NS, rounds=2, steps=2, lr=0.3, beta=5.0, rho_server=0.2,
                                           population=5, rho_l=lambda t: 0.001 + (0.1 - 0.001) * t / 2)
  np.testing.assert_allclose(np.stack(sent), np.stack(ref_sent), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state['params']['w'], w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(cstates['w'], sig_k, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('naive', [False, True])
@pytest.mark.parametrize('schedule', ['release', 'linear', 'constant'])
def test_server_rho_schedule_in_the_round(schedule, naive):
  """4 rounds, T_s = 2: the ascent radius of round t is the schedule's rho_s(t) (release: rho_l + ... in
  rounds 1-2, then rho_s)."""
  kw = dict(lr=0.3, optimizer='sam', rho_l=0.2, rho0=0.001, warmup=2, beta=5.0, rho_server=0.01, population=5)
  alg = build(naive=naive, rho_server_schedule=schedule, **kw)
  state, cstates, sent = run_engine(alg, W0, CS, NS, rounds=4, steps=1)
  table = {'release': release_server_rhos(0.01, 0.2, 0.001, 2, 4),
           'linear': [0.001 + (0.01 - 0.001) * min(t, 2) / 2 for t in range(4)],
           'constant': [0.01] * 4}[schedule]
  if schedule == 'release':
    assert table[1] == table[2] == pytest.approx(0.2 + 0.009 / 2) and table[3] == 0.01
  w, sigma, sig_k, _, ref_sent = reference(W0, CS, NS, rounds=4, steps=1, lr=0.3, beta=5.0, population=5,
                                           naive=naive, rho_l=lambda t: 0.001 + (0.2 - 0.001) * min(t, 2) / 2,
                                           rho_s=lambda t: table[t])
  if not naive:
    np.testing.assert_allclose(np.stack(sent), np.stack(ref_sent), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state['params']['w'], w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(cstates['w'], sig_k, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('admm', [True, False])
def test_naive_fedgloss_two_exchanges(admm):
  alg = build(naive=True, lr=0.3, beta=4.0, rho_server=0.25, admm=admm, population=3)
  assert alg.num_phases == 2 and alg.comm_down == 1 and alg.comm_up == 1
  state, cstates, _ = run_engine(alg, W0, CS, NS, rounds=2, steps=2)
  w, sigma, sig_k, _, _ = reference(W0, CS, NS, rounds=2, steps=2, lr=0.3, beta=4.0, rho_server=0.25,
                                    admm=admm, naive=True, population=3)
  np.testing.assert_allclose(state['params']['w'], w, rtol=1e-5, atol=1e-6)
  if admm:
    np.testing.assert_allclose(state['sigma']['w'], sigma, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cstates['w'], sig_k, rtol=1e-5, atol=1e-6)


def test_stable_default_and_thesis_warning(monkeypatch):
  """The registered default is the release dual; the thesis dual at partial participation warns."""
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.config import validate as validate_mod
  assert registry.default_hparams('fedgloss')['dual_variant'] == 'release'
  assert registry.default_hparams('fedgloss')['rho_server_schedule'] == 'constant'
  data = synthetic(8, 4, input_shape=(2, 2, 1), num_classes=2, test_size=4)
  said = []
  monkeypatch.setattr(logging, 'warning', lambda msg, *a: said.append(msg % a))
  for variant, warned in (('release', False), ('thesis', True)):
    said.clear()
    c = default_config()
    c.algorithm = 'fedgloss'
    c.data.num_clients = 8
    c.clients_per_round = 4
    c.algo = ml_collections.ConfigDict({**registry.default_hparams('fedgloss'), 'dual_variant': variant})
    validate_mod.validate_against_data(c, data)
    assert bool([m for m in said if 'dual_variant' in m]) == warned, (variant, said)


def test_hparam_validation():
  c = default_config()
  c.algorithm = 'fedgloss'
  c.algo = ml_collections.ConfigDict(registry.default_hparams('fedgloss'))
  validate_config(c)
  for field, bad in [('beta', 0.0), ('rho_server', -1.0), ('dual_variant', 'code'),
                     ('population', -3), ('rho_server_schedule', 'cosine')]:
    c2 = ml_collections.ConfigDict(c.to_dict())
    c2.algo[field] = bad
    with pytest.raises(ConfigError, match=f'algo.{field}'):
      validate_config(c2)


def test_population_must_match_the_data():
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.config.validate import validate_against_data
  data = synthetic(8, 4, input_shape=(2, 2, 1), num_classes=2, test_size=4)
  c = default_config()
  c.algorithm = 'fedgloss'
  c.algo = ml_collections.ConfigDict(registry.default_hparams('fedgloss'))
  with pytest.raises(ConfigError, match='algo.population=8'):
    validate_against_data(c, data)     # config.data.num_clients = 20, the data has 8
  c.algo.population = 8
  validate_against_data(c, data)
  c.algo.population = 0
  c.data.num_clients = 8
  validate_against_data(c, data)


# slow [naive_fedgloss]: both register the same round_log; the default suite covers it by [fedgloss]
@pytest.mark.parametrize('algorithm', ['fedgloss', pytest.param('naive_fedgloss', marks=pytest.mark.slow)])
def test_server_rho_is_logged_with_every_evaluation(algorithm):
  """metrics records carry rho_s of the evaluated round: the release schedule's table, round by round."""
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.training import trainers
  from tests.fixtures.configs import small_config
  data = synthetic(8, [3, 17, 6, 9, 30, 1, 12, 5], input_shape=(4, 4, 1), num_classes=4, seed=3)
  c = small_config(rounds=4, eval_every=1, algorithm=algorithm, **{
      'client.optimizer': 'sam', 'client.rho': 0.2, 'client.rho0': 0.001, 'client.rho_warmup_rounds': 2})
  c.algo = ml_collections.ConfigDict({**registry.default_hparams(algorithm), 'population': 8, 'rho_server': 0.01,
                                      'rho_server_schedule': 'release'})
  t = trainers.make_trainer(c, data=data)
  t.train()
  table = release_server_rhos(0.01, 0.2, 0.001, 2, 4)
  assert [r['round'] for r in t.records] == [1, 2, 3, 4]
  np.testing.assert_allclose([r['server_rho'] for r in t.records], table, rtol=1e-6)
  assert registry.round_logger(small_config()) is None       # FedAvg declares nothing to log
