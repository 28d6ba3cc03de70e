"""FedNova (algorithms/fednova.py): engine rounds vs reference rounds computed by hand from the paper's update
rule, on 3 unequal clients (2, 6 and 2 local steps in round 0), partial participation and padding
(see tests/fixtures/baselines.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.fednova import normalizer
from fedjax_flat.config import algo_flags, validate
from fedjax_flat.core import engine
from fedjax_flat.data import batching
from fedjax_flat.errors import ConfigError
from tests.fixtures.baselines import (B, DATA, E, LR, MODEL, PARAMS0, S, SCHEDULE, SIZES, WD, add, assert_tree_close,
                                    client_batches, config, grad, mean, run_engine, scale, sub)

tmap = jax.tree_util.tree_map


@pytest.mark.parametrize('tau', [1, 2, 5, 12])
def test_normalizer_closed_forms(tau):
  assert normalizer(tau) == tau                                                   # plain SGD: tau
  for rho in (0.5, 0.9):                                                          # momentum (paper, App. C)
    want = (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)
    np.testing.assert_allclose(normalizer(tau, rho=rho), want, rtol=1e-12)
  eta_mu = 0.03                                                                   # proximal (FedProx's vector)
  np.testing.assert_allclose(normalizer(tau, eta_mu=eta_mu), (1 - (1 - eta_mu) ** tau) / eta_mu, rtol=1e-12)


def _reference(rho, mu, eta_g, a_of, release=False):
  """Rounds by hand: momentum SGD with coupled weight decay and the proximal term, then normalized averaging."""
  w = PARAMS0
  for r, ids in enumerate(SCHEDULE):
    ds, a_s = [], []
    for k in ids:
      y, m = w, tmap(jnp.zeros_like, w)
      steps = client_batches(r, k)
      for b in steps:
        g = add(grad(y, b), scale(y, WD), scale(sub(y, w), mu))
        m = add(scale(m, rho), g)
        y = sub(y, scale(m, LR))
      a = a_of(len(steps))
      ds.append(scale(sub(w, y), 1.0 / a))
      a_s.append(len(steps) if release and mu else a)     # the release: sum_k p_k tau_k with a proximal term
    p = [SIZES[k] for k in ids]
    tau_eff = float(np.dot(np.asarray(p, np.float64) / sum(p), a_s))
    w = sub(w, scale(mean(ds, p), eta_g * tau_eff))
  return w


@pytest.mark.parametrize('rho,mu,release', [(0.0, 0.0, False), (0.5, 0.0, False), (0.0, 0.4, False),
                                            (0.0, 0.4, True)])
def test_fednova_matches_hand_computed_rounds(rho, mu, release):
  eta_g = 0.7
  if mu:        # FedProx's vector: sum_{j < tau} (1 - eta mu)^j
    a_of = lambda tau: (1 - (1 - LR * mu) ** tau) / (LR * mu)  # noqa: E731
  else:         # momentum: [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho)
    a_of = lambda tau: (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)  # noqa: E731
  cfg = config('fednova', mu=mu, tau_eff='release' if release else 'paper')
  cfg.client.momentum = rho
  cfg.server.lr = eta_g
  state, _, _ = run_engine(cfg)
  assert [len(client_batches(0, k)) for k in SCHEDULE[0]] == [2, 6, 2]      # unequal tau_k
  assert_tree_close(state['params'], _reference(rho, mu, eta_g, a_of, release))
  if release:       # the two rules differ with a proximal term: the switch is not a no-op
    paper = _reference(rho, mu, eta_g, a_of)
    assert not all(np.allclose(a, b) for a, b in zip(jax.tree_util.tree_leaves(state['params']),
                                                      jax.tree_util.tree_leaves(paper)))


def _run(cfg, schedule):
  alg = registry.build_algorithm(cfg, MODEL)
  fn = engine.make_round_fn(alg, chunk=3)
  state = alg.server_init(tmap(jnp.copy, PARAMS0), jax.random.key(1))
  for r, ids in enumerate(schedule):
    rb = batching.make_round_batches(DATA, ids, round_idx=r, seed=0, batch_size=B, num_steps=S, epochs=E,
                                     pad_clients_to=3)
    rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))
    state, _, _ = fn(state, rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, r)
  return state['params']


def test_equal_steps_without_momentum_is_fedavg():
  equal = [[0, 2], [2, 0], [0, 2]]          # clients 0 and 2: 2 local steps each (sizes 3 and 4, B=4, E=2)
  nova, avg = _run(config('fednova'), equal), _run(config('fedavg'), equal)
  assert_tree_close(nova, avg, rtol=1e-6, atol=1e-7)
  unequal = [[0, 1], [1, 2], [0, 1]]        # client 1 takes 6 steps: normalized averaging differs from FedAvg
  nova, avg = _run(config('fednova'), unequal), _run(config('fedavg'), unequal)
  gap = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree_util.tree_leaves(nova),
                                                           jax.tree_util.tree_leaves(avg)))
  assert gap > 1e-3


def test_declared_rules_and_checks():
  assert registry.default_hparams('fednova') == {'mu': 0.0, 'tau_eff': 'paper'}
  cfg = config('fednova', mu=-0.1)
  with pytest.raises(ConfigError, match=r'algo.mu.*must be a number in \[0, inf\)'):
    validate.validate_config(cfg)
  cfg = config('fednova')
  cfg.client.base_optimizer, cfg.client.momentum = 'adam', 0.0
  with pytest.raises(ConfigError, match='client.base_optimizer.*normalizes SGD'):
    validate.validate_config(cfg)
  cfg = config('fednova')
  cfg.client.lr_schedule, cfg.client.lr_poly_max = 'poly_step', 100
  with pytest.raises(ConfigError, match='client.lr_schedule.*one lr within a round'):
    validate.validate_config(cfg)
  cfg = config('fednova')
  algo_flags.apply(cfg, [('mu', '0.25')])     # --config.algo.mu=0.25 from the declared default's type
  assert cfg.algo.mu == 0.25 and isinstance(cfg.algo.mu, float)
  validate.validate_config(cfg)
