"""DP wrapper (algorithms/wrappers/dp.py): a central / local DP-FedAvg round against a hand-written numpy round
with the same noise draw, adaptive clipping's state, the algorithms it admits, one-line refusals, exact resume."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.wrappers import dp
from fedjax_flat.config.validate import validate_config
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.errors import ConfigError
from fedjax_flat.training import loop
from tests.fixtures.configs import small_config

DELTAS = [{'w': np.array([3.0, 4.0], np.float32), 'b': np.array([0.0], np.float32)},     # norm 5: clipped
          {'w': np.array([0.1, 0.0], np.float32), 'b': np.array([0.2], np.float32)},     # norm 0.22: kept
          {'w': np.array([-1.0, 1.0], np.float32), 'b': np.array([1.0], np.float32)}]    # norm 1.73: clipped
PARAMS = {'w': np.array([1.0, 2.0], np.float32), 'b': np.array([0.5], np.float32)}


def toy_fedavg():
  """FedAvg with server SGD lr 1 whose client's local state IS its delta (the upload is exactly the delta)."""
  def server_update(state, agg, round_idx, phase=0):
    return {'params': jax.tree_util.tree_map(lambda p, d: p - d, state['params'], agg['weighted']['delta'])}
  return FederatedAlgorithm(
      'toy', lambda p, r: {'params': p}, lambda s, r, phase=0: {'params': s['params'], 'hparams': {}},
      lambda b, cs, rng: None, None, lambda b, local, cs: ({'weighted': {'delta': local}, 'uniform': {}}, cs),
      server_update)


def dp_config(**over):
  c = small_config(**{'dp.mode': 'central', 'dp.clip': 1.0, 'dp.noise_multiplier': 0.8, 'dp.delta': 1e-3,
                      'server.weighting': 'uniform', 'clients_per_round': 4, **over})
  return c


def engine_round(alg, state, deltas, round_idx, client_keys=None):
  """What the engine does with client_final's outputs: plain mean of 'uniform' over the valid clients."""
  bcast = alg.broadcast(state, round_idx)
  outs = []
  for k, d in enumerate(deltas):
    local = d
    if client_keys is not None:
      local = {'inner': d, 'dp_key': jax.random.fold_in(client_keys[k], dp._KEY_TAG)}
    outs.append(alg.client_final(bcast, jax.tree_util.tree_map(jnp.asarray, local), None)[0])
  n = len(deltas)
  uni = jax.tree_util.tree_map(lambda *xs: sum(xs) / n, *[o['uniform'] for o in outs])
  agg = {'weighted': {}, 'uniform': uni, 'num_clients': jnp.float32(n), 'total_weight': jnp.float32(n)}
  return alg.server_update(state, agg, jnp.int32(round_idx)), outs


def np_clip(d, c):
  n = math.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in d.values()))
  return {k: v * min(1.0, c / n) for k, v in d.items()}, n


def noise_like(key, tree, std):
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  ks = jax.random.split(key, len(leaves))
  return jax.tree_util.tree_unflatten(treedef, [std * np.asarray(jax.random.normal(k, x.shape)) for k, x in
                                                zip(ks, leaves)])


def round_key(run_rng, round_idx):
  k = jax.random.key_data(jax.random.fold_in(run_rng, dp._KEY_TAG))
  return jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(k), round_idx))


@pytest.mark.parametrize('noise_cohort', [0, 40])
def test_central_round_equals_the_numpy_round_with_the_same_noise_draw(noise_cohort):
  cfg = dp_config(**{'dp.noise_cohort': noise_cohort})
  alg = dp.with_dp(toy_fedavg(), cfg, population=100)
  rng = jax.random.key(7)
  state = alg.server_init(jax.tree_util.tree_map(jnp.asarray, PARAMS), rng)
  new, _ = engine_round(alg, state, DELTAS[:3], 5)
  m, big_m, c, z = 4, noise_cohort or 4, 1.0, 0.8
  total = {k: sum(np_clip(d, c)[0][k] for d in DELTAS[:3]) for k in PARAMS}
  noise = noise_like(round_key(rng, 5)[0], total, z * c * m / big_m)
  want = {k: PARAMS[k] - (total[k] + noise[k]) / m for k in PARAMS}   # fixed denominator m (3 clients came)
  for k in PARAMS:
    np.testing.assert_allclose(np.asarray(new['params'][k]), want[k], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(new['dp']['key'], state['dp']['key'])   # the run's key; rounds fold in


def test_central_round_without_noise_is_the_uniform_mean_of_clipped_deltas_ignoring_example_counts():
  cfg = dp_config(**{'dp.noise_multiplier': 0.0, 'clients_per_round': 3})
  alg = dp.with_dp(toy_fedavg(), cfg, population=100)
  state = alg.server_init(jax.tree_util.tree_map(jnp.asarray, PARAMS), jax.random.key(0))
  new, outs = engine_round(alg, state, DELTAS, 0)
  assert all(o['weighted'] == {} for o in outs)      # nothing is example-weighted: every client counts 1 / m
  clipped = [np_clip(d, 1.0)[0] for d in DELTAS]
  for k in PARAMS:
    np.testing.assert_allclose(np.asarray(new['params'][k]), PARAMS[k] - sum(x[k] for x in clipped) / 3, rtol=1e-6)


def capped_engine_round(alg, state, deltas, sizes, cap, round_idx):
  """The engine with client_weighting='capped': 'weighted' averaged with weights min(N_k, cap)."""
  bcast = alg.broadcast(state, round_idx)
  outs = [alg.client_final(bcast, jax.tree_util.tree_map(jnp.asarray, d), None)[0] for d in deltas]
  w = [min(float(n), cap) for n in sizes]
  tw = sum(w)
  wmean = jax.tree_util.tree_map(lambda *xs: sum(wk * x for wk, x in zip(w, xs)) / tw, *[o['weighted'] for o in outs])
  agg = {'weighted': wmean, 'uniform': {}, 'num_clients': jnp.float32(len(deltas)), 'total_weight': jnp.float32(tw)}
  return alg.server_update(state, agg, jnp.int32(round_idx)), outs


@pytest.mark.parametrize('noise', [0.0, 0.8])
def test_capped_weights_are_mcmahans_fixed_denominator_estimate(noise):
  """f_f = (sum_k w_k clip(Delta_k) + N(0, (z C)^2)) / (q W), w_k = min(N_k / w_hat, 1), q W = m w_bar."""
  sizes_population = [5, 20, 40, 10, 100, 3, 60, 30]       # w_hat = 20: capped weights .25 1 1 .5 1 .15 1 1
  cap, m = 20.0, 4
  cfg = dp_config(**{'server.weighting': 'capped', 'server.weight_cap': cap, 'dp.noise_multiplier': noise,
                     'clients_per_round': m})
  alg = dp.with_dp(toy_fedavg(), cfg, population=8, client_sizes=sizes_population)
  rng = jax.random.key(3)
  state = alg.server_init(jax.tree_util.tree_map(jnp.asarray, PARAMS), rng)
  sizes = [5, 20, 40]                                       # this round's three clients
  new, outs = capped_engine_round(alg, state, DELTAS, sizes, cap, 4)
  assert all(o['uniform'] == {} for o in outs)              # the delta travels example-weighted, capped
  w_bar = np.mean(np.minimum(np.asarray(sizes_population) / cap, 1.0))
  np.testing.assert_allclose(dp.mean_capped_weight(sizes_population, cap), w_bar)
  w = [min(n / cap, 1.0) for n in sizes]
  total = {k: sum(wk * np_clip(d, 1.0)[0][k] for wk, d in zip(w, DELTAS)) for k in PARAMS}
  noise_tree = noise_like(round_key(rng, 4)[0], total, noise * 1.0 * cap)   # drawn on the w_hat-scaled sum
  for k in PARAMS:
    want = PARAMS[k] - (total[k] + noise_tree[k] / cap) / (m * w_bar)
    np.testing.assert_allclose(np.asarray(new['params'][k]), want, rtol=1e-5, atol=1e-6)


def test_local_mode_each_client_noises_its_own_clipped_upload_with_its_own_key():
  cfg = dp_config(**{'dp.mode': 'local', 'clients_per_round': 3})
  alg = dp.with_dp(toy_fedavg(), cfg, population=100)
  state = alg.server_init(jax.tree_util.tree_map(jnp.asarray, PARAMS), jax.random.key(0))
  client_keys = [jax.random.key(100 + k) for k in range(3)]
  new, outs = engine_round(alg, state, DELTAS, 0, client_keys=client_keys)
  ups = []
  for k, d in enumerate(DELTAS):
    cl = np_clip(d, 1.0)[0]
    noise = noise_like(jax.random.fold_in(client_keys[k], dp._KEY_TAG), cl, 0.8 * 1.0)
    ups.append({n: cl[n] + noise[n] for n in cl})
    for n in cl:
      np.testing.assert_allclose(np.asarray(outs[k]['uniform']['delta'][n]), ups[-1][n], rtol=1e-5, atol=1e-6)
  for n in PARAMS:
    np.testing.assert_allclose(np.asarray(new['params'][n]), PARAMS[n] - sum(u[n] for u in ups) / 3, rtol=1e-5)


@pytest.mark.parametrize('per_tensor', [False, True])
def test_distributed_mode_each_client_adds_its_share_of_the_central_noise(per_tensor):
  # DP-FedSAM's release: client k adds N(0, (z C sqrt(m) / M)^2) to its clipped upload; the server takes the plain
  # mean, whose sum then carries N(0, (z C m / M)^2), the central mode's noise.
  m, big_m = 3, 6
  cfg = dp_config(**{'dp.mode': 'distributed', 'clients_per_round': m, 'dp.noise_cohort': big_m,
                     'dp.per_tensor': per_tensor})
  alg = dp.with_dp(toy_fedavg(), cfg, population=100, num_leaves=2)
  state = alg.server_init(jax.tree_util.tree_map(jnp.asarray, PARAMS), jax.random.key(0))
  client_keys = [jax.random.key(200 + k) for k in range(m)]
  new, outs = engine_round(alg, state, DELTAS, 0, client_keys=client_keys)
  std = 0.8 * 1.0 * math.sqrt(m) / big_m
  ups = []
  for k, d in enumerate(DELTAS):
    if per_tensor:       # each array to C on its own
      cl = {n: v * min(1.0, 1.0 / max(float(np.linalg.norm(v)), 1e-30)) for n, v in d.items()}
    else:
      cl = np_clip(d, 1.0)[0]
    noise = noise_like(jax.random.fold_in(client_keys[k], dp._KEY_TAG), cl, std)
    ups.append({n: cl[n] + noise[n] for n in cl})
    for n in cl:
      np.testing.assert_allclose(np.asarray(outs[k]['uniform']['delta'][n]), ups[-1][n], rtol=1e-5, atol=1e-6)
  for n in PARAMS:
    np.testing.assert_allclose(np.asarray(new['params'][n]), PARAMS[n] - sum(u[n] for u in ups) / m, rtol=1e-5)


def test_distributed_noise_summed_over_the_cohort_has_the_central_std():
  m, big_m, z, c = 4, 8, 1.3, 0.7
  cfg = dp_config(**{'dp.mode': 'distributed', 'clients_per_round': m, 'dp.noise_cohort': big_m,
                     'dp.noise_multiplier': z, 'dp.clip': c})
  alg = dp.with_dp(toy_fedavg(), cfg, population=100)
  state = alg.server_init({'w': jnp.zeros((20000,)), 'b': jnp.zeros((1,))}, jax.random.key(0))
  bcast = alg.broadcast(state, 0)
  zero = {'w': jnp.zeros((20000,)), 'b': jnp.zeros((1,))}
  total = sum(np.asarray(alg.client_final(bcast, {'inner': zero, 'dp_key': jax.random.key(k)}, None)[0]
                         ['uniform']['delta']['w'], np.float64) for k in range(m))
  assert np.std(total) == pytest.approx(z * c * m / big_m, rel=0.02)    # central mode's std on the sum


def test_per_tensor_clipping_is_accounted_with_the_bound_c_sqrt_l():
  cfg = dp_config(**{'dp.per_tensor': True, 'data.num_clients': 100})
  a = dp.mech.accounting(cfg, 100, num_leaves=4)
  assert a['norm_bound'] == 2.0 and a['sensitivity'] == 4.0 and a['adjacency'] == 'replace_one'
  assert dp.epsilon(cfg, 10, 100, num_leaves=4) == dp.accounting.epsilon(
      4 / 100, 0.8, 10, 1e-3, sampling='fixed', num_clients=100, norm_bound=2.0)
  with pytest.raises(ValueError, match='num_leaves'):
    dp.mech.accounting(cfg, 100)


def test_adaptive_clip_lives_in_the_server_state_and_follows_the_noisy_count():
  cfg = dp_config(**{'dp.adaptive': True, 'dp.clip': 1.0, 'dp.noise_multiplier': 0.1, 'clients_per_round': 3})
  alg = dp.with_dp(toy_fedavg(), cfg, population=100)
  rng = jax.random.key(1)
  state = alg.server_init(jax.tree_util.tree_map(jnp.asarray, PARAMS), rng)
  np.testing.assert_allclose(float(state['dp']['clip']), 1.0)
  new, outs = engine_round(alg, state, DELTAS, 2)
  np.testing.assert_array_equal([float(o['uniform']['below']) for o in outs], [0.0, 1.0, 0.0])
  sigma_b = 3 / 20                                               # the paper's count noise, m / 20
  count_noise = float(jax.random.normal(round_key(rng, 2)[1], ()))
  b_bar = (1.0 + sigma_b * count_noise) / 3
  np.testing.assert_allclose(float(new['dp']['clip']), math.exp(-0.2 * (b_bar - 0.5)), rtol=1e-5)
  # the model noise uses z_v = (z^-2 - (2 sigma_b)^-2)^-1/2 with the clip of the round (1.0)
  zv = (0.1 ** -2 - (2 * sigma_b) ** -2) ** -0.5
  total = {k: sum(np_clip(d, 1.0)[0][k] for d in DELTAS) for k in PARAMS}
  noise = noise_like(round_key(rng, 2)[0], total, zv * 1.0)
  for k in PARAMS:
    np.testing.assert_allclose(np.asarray(new['params'][k]), PARAMS[k] - (total[k] + noise[k]) / 3, rtol=1e-5)


def test_an_upload_that_is_not_a_delta_alone_is_refused_when_traced():
  alg = toy_fedavg().replace(client_final=lambda b, local, cs: ({'weighted': {}, 'uniform': {'dc': local}}, cs))
  wrapped = dp.with_dp(alg, dp_config(), population=100)
  state = wrapped.server_init(jax.tree_util.tree_map(jnp.asarray, PARAMS), jax.random.key(0))
  with pytest.raises(ConfigError, match='not a model delta alone'):
    wrapped.client_final(wrapped.broadcast(state, 0), jax.tree_util.tree_map(jnp.asarray, PARAMS), None)


BAD = [
    ({'dp.noise_multiplier': -1.0}, 'config.dp.noise_multiplier=-1.0 is invalid: must be >= 0'),
    ({'dp.clip': 0.0}, 'config.dp.clip=0.0 is invalid: must be > 0'),
    ({'dp.delta': 0.5}, 'config.dp.delta=0.5 is invalid: must be below 1 / population'),
    ({'server.weighting': 'examples'}, "config.server.weighting='examples' is invalid: example weighting"),
    ({'server.weighting': 'capped'}, 'config.server.weight_cap=0.0 is invalid: must be > 0 with'),
    ({'server.weight_cap': 5.0}, "config.server.weight_cap=5.0 is invalid: is read with server.weighting='capped'"),
    ({'algorithm': 'scaffold'}, "config.dp.mode='central' is invalid: algorithm 'scaffold' declares upload='other'"),
    ({'dp.accountant': 'pld'}, "config.dp.accountant='pld' is invalid: the engine samples a fixed-size cohort"),
    ({'dp.mode': 'local', 'dp.target_epsilon': 1e-4, 'rounds': 50},
     'config.dp.target_epsilon=0.0001 is invalid: unreachable'),
    ({'dp.mode': 'local', 'dp.adaptive': True}, 'config.dp.adaptive=True is invalid: adaptive clipping needs'),
    ({'dp.adaptive': True, 'dp.noise_multiplier': 1.0}, 'config.dp.noise_multiplier=1.0 is invalid: with adaptive'),
    ({'dp.noise_cohort': 1000}, 'config.dp.noise_cohort=1000 is invalid: must be <= the population of 10'),
    ({'dp.mode': 'secret'}, "config.dp.mode='secret' is invalid"),
    ({'dp.mode': 'distributed', 'server.weighting': 'capped', 'server.weight_cap': 5.0},
     "config.server.weighting='capped' is invalid: distributed DP's clients each add an equal share"),
    ({'dp.mode': 'distributed', 'dp.adaptive': True, 'dp.noise_multiplier': 0.1},
     'config.dp.adaptive=True is invalid: adaptive clipping needs the server'),
    ({'dp.mode': 'distributed', 'dp.accountant': 'pld'}, "config.dp.accountant='pld' is invalid"),
    ({'dp.per_layer': True, 'dp.per_tensor': True}, 'config.dp.per_tensor=True is invalid: and dp.per_layer'),
    ({'dp.noise_multiplier': 1e300}, 'config.dp.noise_multiplier=1e+300 is invalid: must be <= 1e+06'),
    ({'dp.target_epsilon': 1e300}, 'config.dp.target_epsilon=1e+300 is invalid: is met with almost no noise'),
]


@pytest.mark.parametrize('over,msg', BAD, ids=[m.split(' is')[0] for _, m in BAD])
def test_bad_dp_configs_are_one_line_config_errors_before_anything_is_built(over, msg):
  cfg = dp_config(**{'data.num_clients': 10, **over})
  with pytest.raises(ConfigError) as e:
    validate_config(cfg)
  assert str(e.value).startswith(msg), str(e.value)
  assert '\n' not in str(e.value)


def test_calibrated_noise_multiplier_meets_the_target_and_is_computed_once():
  cfg = dp_config(**{'dp.mode': 'local', 'dp.target_epsilon': 8.0, 'data.num_clients': 100, 'rounds': 20})
  validate_config(cfg)
  z = dp.noise_multiplier(cfg, 100)
  assert 0 < z < 10
  assert dp.epsilon(cfg, 20, 100) <= 8.0
  assert dp.epsilon(cfg, 20, 100) > 7.9     # the smallest such z (bisection tolerance 1e-4)
  assert dp.mech._calibrate.cache_info().hits >= 1


def _upload_structure(name):
  """client_final's upload keys for `name` on the synthetic harness (traced, not run), or None when it exchanges
  more than one message a round (DP wraps one), takes server steps on arrivals (FedBuff, FedAsync: the accountant
  counts sampled rounds, so DP does not admit them) or does not fit the harness."""
  spec = registry.spec(name)
  if 'chains' in spec.needs or name in ('hfl', 'ladd', 'fedsoup', 'fedfomo'):   # not on this harness
    return None
  c = small_config(algorithm=name, model={'fedcg': 'fedcg_net'}.get(name, 'mlp'), **{'data.num_clients': 6})
  if spec.client_optimizers is not None:
    c.client.optimizer = spec.client_optimizers[0]
  c.algo.update({**registry.default_hparams(name), **c.algo.to_dict()})
  data = synthetic(6, [6, 3, 8, 5, 7, 4], input_shape=(3, 3, 1), num_classes=4, seed=0)
  t = loop.Trainer(c, data=data, write_files=False, shard_clients=False)
  alg = t.algorithm
  if alg.num_phases != 1 or alg.asynchronous is not None:
    return None
  bcast = alg.broadcast(t.server_state, 0)
  cs = None if alg.client_state_init is None else alg.client_state_init(alg.eval_models(t.server_state)['global'][0])
  local = jax.eval_shape(alg.client_init, bcast, cs, jax.random.PRNGKey(0))
  out = jax.eval_shape(alg.client_final, bcast, local, cs)[0]
  return {k: tuple(sorted(v)) for k, v in out.items()}


def _declared_delta():
  return sorted(n for n in registry.names() if registry.spec(n).upload == 'delta')


@pytest.mark.slow    # builds every registered algorithm (about a minute)
def test_upload_delta_is_declared_by_exactly_the_algorithms_whose_upload_is_the_delta_alone():
  delta_alone = {'weighted': ('delta',), 'uniform': ()}
  found = sorted(n for n in registry.names() if _upload_structure(n) == delta_alone)
  assert found == _declared_delta()


@pytest.mark.parametrize('name,admitted', [('fedavg', True), ('fedprox', True), ('scaffold', False),
                                           ('feddyn', False)])
def test_admitted_algorithms_upload_the_delta_alone(name, admitted):
  assert (_upload_structure(name) == {'weighted': ('delta',), 'uniform': ()}) == admitted
  assert (registry.spec(name).upload == 'delta') == admitted
  assert (name in _declared_delta()) == admitted
