"""Model-poisoning attacks (algorithms/wrappers/attack.py): each rewrite against its formula on tiny tensors
(padding rows NaN, honest rows untouched), the roles drawn from the seed and carried as client state, FedAvg
rounds with attackers against rounds computed by hand (mean and a robust aggregator), the one-line refusals."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.wrappers import attack
from fedjax_flat.config import validate
from fedjax_flat.core import client_state, engine
from fedjax_flat.data import attacks
from fedjax_flat.errors import ConfigError
from tests.fixtures.baselines import (MODEL, PARAMS0, SCHEDULE, SIZES, config, local_sgd, round_batches, sub)
from tests.fixtures.baselines import flat64 as ref_flat, unflat32 as unflat
from tests.fixtures.configs import small_config
from tests import test_aggregators as ref

tmap = jax.tree_util.tree_map


def _rows(seed=0, c=6):
  rng = np.random.default_rng(seed)
  u = {'a': rng.normal(size=(c, 3)).astype(np.float32), 'b': rng.normal(size=(c, 2, 2)).astype(np.float32)}
  valid = np.array([True, True, True, True, True, False][:c])
  malicious = np.array([False, True, False, True, False, True][:c])     # the padding row is flagged too
  for x in u.values():
    x[~valid] = np.nan
  return u, valid, malicious


def _np_forged(kind, x, honest, s):
  """The formulas of the papers on one leaf's valid rows (numpy, float64)."""
  h = x[honest].astype(np.float64)
  return {'sign_flip': lambda r: -s * r, 'scale': lambda r: s * r, 'backdoor': lambda r: s * r,
          'alie': lambda r: h.mean(0) - s * h.std(0),                       # Baruch et al.: mu - z sigma
          'ipm': lambda r: -s * h.mean(0)}[kind]                            # Xie et al.: -eps mean(honest)


@pytest.mark.parametrize('kind', ['sign_flip', 'scale', 'backdoor', 'alie', 'ipm'])
def test_each_rewrite_is_its_formula_and_leaves_the_other_rows(kind):
  u, valid, mal = _rows()
  s = 1.7
  got = jax.jit(lambda u, v, m: attack.poison(u, v, m, kind, s))(u, valid, mal)
  honest, bad = valid & ~mal, valid & mal
  for name, x in u.items():
    g = np.asarray(got[name])
    np.testing.assert_array_equal(g[honest], x[honest])                  # honest rows: bit for bit
    assert np.all(np.isnan(g[~valid]))                                   # padding: untouched (never counted)
    want = _np_forged(kind, x, honest, s)
    for i in np.flatnonzero(bad):
      np.testing.assert_allclose(g[i], want(x[i].astype(np.float64)), rtol=1e-5, atol=1e-6, err_msg=f'{kind} {name}')


def test_gaussian_rows_have_the_configured_std_and_follow_the_key():
  c = 4
  u = {'a': np.zeros((c, 20000), np.float32), 'b': np.zeros((c, 3), np.float32)}
  valid, mal = np.ones(c, bool), np.array([False, True, True, False])
  key = jax.random.key(3)
  got = attack.poison(u, valid, mal, 'gaussian', 0.5, key)
  a = np.asarray(got['a'])
  assert np.all(a[[0, 3]] == 0)
  assert abs(a[1].std() - 0.5) < 0.02 and abs(a[1].mean()) < 0.02
  assert not np.allclose(a[1], a[2])                                     # each attacker draws its own noise
  np.testing.assert_array_equal(a, np.asarray(attack.poison(u, valid, mal, 'gaussian', 0.5, key)['a']))
  assert not np.allclose(a, np.asarray(attack.poison(u, valid, mal, 'gaussian', 0.5, jax.random.key(4))['a']))


def test_colluders_with_no_honest_row_send_zero():
  u = {'a': np.ones((2, 3), np.float32)}
  out = attack.poison(u, np.ones(2, bool), np.ones(2, bool), 'alie', 2.0)
  assert np.all(np.asarray(out['a']) == 0)


def test_roles_are_floor_fraction_n_clients_from_the_seed():
  m = attacks.malicious_clients(100, 0.25, seed=7)
  assert len(m) == 25 and len(set(m)) == 25 and np.all(np.diff(m) > 0)
  np.testing.assert_array_equal(m, attacks.malicious_clients(100, 0.25, seed=7))
  assert not np.array_equal(m, attacks.malicious_clients(100, 0.25, seed=8))
  assert len(attacks.malicious_clients(10, 0.0, seed=0)) == 0
  assert len(attacks.malicious_clients(3, 0.34, seed=0)) == 1


# ---- FedAvg rounds with attackers, by hand --------------------------------------------------------------------


def _cfg(kind, aggregator='mean', scale=2.0):
  c = config('fedavg')
  c.server.lr = 0.8
  c.server.aggregator = aggregator
  c.attack.kind, c.attack.fraction, c.attack.scale = kind, 0.34, scale      # 1 of the 3 clients
  return c


def _run(cfg):
  alg = registry.build_algorithm(cfg, MODEL)
  fn = engine.make_round_fn(alg, chunk=3)
  state = alg.server_init(tmap(jnp.copy, PARAMS0), jax.random.key(1))
  store = client_state.store_for(alg, PARAMS0, len(SIZES), 'host')
  for r in range(len(SCHEDULE)):
    rb = round_batches(r)
    rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))
    state, new_cs, _ = fn(state, rb.as_dict(), store.gather(rb.client_ids), rngs, rb.num_examples,
                          rb.client_ids >= 0, r)
    store.scatter(rb.client_ids, new_cs)
  return state, alg


def _reference(cfg, reduce):
  bad = set(attacks.malicious_clients(len(SIZES), cfg.attack.fraction, cfg.seed).tolist())
  w = PARAMS0
  for r, ids in enumerate(SCHEDULE):
    deltas = [ref_flat(sub(w, local_sgd(w, r, k))) for k in ids]
    honest = np.array([k not in bad for k in ids])
    x = np.stack(deltas)
    forged = _np_forged(cfg.attack.kind, x, honest, cfg.attack.scale)
    rows = [forged(x[i]) if not honest[i] else x[i] for i in range(len(ids))]
    a = reduce(rows, [SIZES[k] for k in ids])
    w = unflat(ref_flat(w) - 0.8 * a, w)
  return w


@pytest.mark.parametrize('kind,aggregator', [('sign_flip', 'mean'), ('ipm', 'mean'), ('alie', 'median'),
                                             ('scale', 'norm_bounding')])
def test_fedavg_with_attackers_equals_the_hand_computed_rounds(kind, aggregator):
  cfg = _cfg(kind, aggregator)
  cfg.server.norm_bound = 0.15
  reduce = {'mean': ref.np_mean, 'median': ref.np_median,
            'norm_bounding': lambda x, w: ref.np_norm_bounding(x, w, 0.15)}[aggregator]
  state, alg = _run(cfg)
  assert alg.aggregate == 'stacked' and alg.label == 'fedavg+attack'
  np.testing.assert_allclose(ref_flat(state['params']), ref_flat(_reference(cfg, reduce)), rtol=2e-5, atol=2e-6)
  (bad,) = attacks.malicious_clients(3, 0.34, cfg.seed)
  assert sum(bad in ids for ids in SCHEDULE) >= 2            # the attacker is sampled: the rewrite mattered


def _clip(x, c):
  return x * min(1.0, c / max(float(np.linalg.norm(x)), 1e-30))


@pytest.mark.parametrize('kind', ['sign_flip', 'alie', 'scale'])
def test_central_dp_as_a_defence_clips_every_row_the_server_receives(kind):
  """Central DP under an attack: honest clients clip their deltas, the attackers rewrite theirs (ALIE from the
  clipped honest rows they see), the server clips every row again, sums and divides by the expected cohort m =
  clients_per_round (DP's fixed denominator; z = 0 here, so the noise drops out and the rounds are the formula's)."""
  cfg = _cfg(kind, scale=3.0)
  cfg.server.weighting = 'uniform'
  cfg.dp.mode, cfg.dp.clip, cfg.dp.noise_multiplier, cfg.dp.delta = 'central', 0.05, 0.0, 1e-3
  state, alg = _run(cfg)
  assert alg.aggregate == 'stacked' and alg.wrappers[-2:] == ('dp', 'attack')
  bad = set(attacks.malicious_clients(len(SIZES), cfg.attack.fraction, cfg.seed).tolist())
  w = PARAMS0
  for r, ids in enumerate(SCHEDULE):
    x = np.stack([_clip(ref_flat(sub(w, local_sgd(w, r, k))), 0.05) for k in ids])
    honest = np.array([k not in bad for k in ids])
    forged = _np_forged(kind, x, honest, 3.0)
    rows = [_clip(forged(x[i]) if not honest[i] else x[i], 0.05) for i in range(len(ids))]
    w = unflat(ref_flat(w) - 0.8 * np.sum(rows, 0) / cfg.clients_per_round, w)
  np.testing.assert_allclose(ref_flat(state['params']), ref_flat(w), rtol=2e-5, atol=2e-6)
  assert any(not h for ids in SCHEDULE for h in [k not in bad for k in ids])   # an attacker was sampled


def test_no_attack_builds_nothing():
  for kind in ('none', 'label_flip'):
    c = config('fedavg')
    c.attack.kind = kind
    alg = registry.build_algorithm(c, MODEL)
    assert alg.aggregate == 'mean' and 'attack' not in alg.wrappers and alg.client_state_init is None


def test_an_algorithm_with_client_state_keeps_it_beside_the_role():
  c = small_config(algorithm='moon', **{'attack.kind': 'sign_flip', 'attack.fraction': 0.5, 'data.num_clients': 4})
  alg = registry.build_algorithm(c, MODEL, population=4)
  rows = alg.initial_client_states(PARAMS0)
  assert set(rows) == {'malicious', 'inner'} and rows['malicious'].shape == (4,) and int(rows['malicious'].sum()) == 2
  for leaf, t in zip(jax.tree_util.tree_leaves(rows['inner']),
                     jax.tree_util.tree_leaves(alg.client_state_init(PARAMS0)['inner'])):
    assert leaf.shape == (4,) + t.shape


@pytest.mark.parametrize('over,match', [
    ({'attack.kind': 'sign_flip', 'attack.fraction': 1.0}, r'attack\.fraction=1\.0.*\[0, 1\)'),
    ({'attack.kind': 'ipm', 'attack.fraction': -0.1}, r'attack\.fraction=-0\.1'),
    ({'attack.kind': 'gaussian', 'attack.scale': 0.0}, r'attack\.scale=0'),
    ({'attack.kind': 'alie', 'algorithm': 'scaffold'}, r"attack\.kind='alie'.*scaffold"),
    ({'attack.kind': 'sign_flip', 'dp.mode': 'local', 'server.weighting': 'uniform'}, r"dp\.mode='local'.*central"),
    ({'attack.kind': 'sign_flip', 'attack.target_label': 3}, r'attack\.target_label'),
    ({'attack.kind': 'label_flip', 'attack.fraction': 0.2}, r'attack\.fraction'),
    ({'attack.kind': 'sign_flip', 'attack.swap': 'random'}, r'attack\.swap'),
])
def test_bad_values_are_refused_in_one_line(over, match):
  with pytest.raises(ConfigError, match=match) as e:
    validate.validate_config(small_config(**over))
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('over,match', [
    ({'attack.trigger_row': 3, 'attack.trigger_size': 3}, r'attack\.trigger_size=3.*leaves the 4x4 image'),
    ({'attack.target_label': 10}, r'attack\.target_label=10.*\[0, 10\)'),
])
def test_backdoor_values_the_data_cannot_take_are_refused_in_one_line(over, match):
  from tests.data.test_attacks import dataset
  c = small_config(**{'attack.kind': 'backdoor', **over})
  with pytest.raises(ConfigError, match=match) as e:
    validate.validate_against_data(c, dataset())
  assert '\n' not in str(e.value)


def test_the_gaussian_key_is_server_state_the_other_kinds_keep_none():
  """The gaussian attackers' key lives in the server state (from the run's seed), so each lane of a batched program
  draws its own run's noise; the other kinds leave the algorithm's state as it is."""
  g = _cfg('gaussian')
  g.seed = 7
  state, _ = _run(g)
  want = jax.random.key_data(jax.random.fold_in(jax.random.key(7), attacks.ATTACK_STREAM))
  np.testing.assert_array_equal(np.asarray(state['attack']['key']), np.asarray(want))
  plain, _ = _run(_cfg('sign_flip'))
  bare = registry.build_algorithm(config('fedavg'), MODEL).server_init(PARAMS0, jax.random.key(1))
  assert 'attack' not in plain and set(plain) == set(bare)
