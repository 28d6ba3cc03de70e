"""Server-side SWA (algorithms/wrappers/swa.py): server-driven cyclic lr, averaging timing and counter, ablations."""
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms import registry
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.core import engine
from fedjax_flat.data import batching
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.models.registry import get_model
from fedjax_flat.algorithms.wrappers.swa import planned_averages, swa_start_round, with_swa
from fedjax_flat.config.default_config import default_config

BASE_LR = 0.5


def toy_algorithm(num_phases=1):
  """A 'server' whose update of round i sets the global model to w^{i+1} = (i + 1) * [1, 2]."""
  def server_init(params, rng):
    return {'params': params}

  def broadcast(state, round_idx, phase=0):
    return {'params': state['params'], 'hparams': {'lr': jnp.float32(BASE_LR), 'rho': jnp.float32(0.0)}}

  def server_update(state, agg, round_idx, phase=0):
    if phase != num_phases - 1:   # earlier phases write garbage SWA must not average
      return {'params': {'w': jnp.full((2,), -100.0)}}
    return {'params': {'w': (round_idx + 1).astype(jnp.float32) * jnp.array([1.0, 2.0])}}

  def eval_models(state):
    return {'global': (state['params'], jnp.bool_(True))}

  nope = lambda *a, **k: None
  return FederatedAlgorithm('toy', server_init, broadcast, nope, nope, nope, server_update, eval_models,
                            num_phases=num_phases)


def swa_config(rounds=20, start_fraction=0.5, cycle=3, average=True, cyclic_lr=True, lr1=0.1, lr2=0.001):
  c = default_config()
  c.rounds = rounds
  c.swa.enabled = True
  c.swa.start_fraction = start_fraction
  c.swa.cycle = cycle
  c.swa.average = average
  c.swa.cyclic_lr = cyclic_lr
  c.swa.lr1 = lr1
  c.swa.lr2 = lr2
  return c


def reference_swa(rounds, start, c):
  """The FedSAM reference loop (models/main.py): copy at i == start, average when i > start and
  (i - start) % c == 0 with weight 1 / (swa_n + 1), swa_n counting the averages."""
  w = np.zeros(2)
  swa, swa_n, out = None, 0, []
  for i in range(rounds):
    if i == start:
      swa = w.copy()
    w = (i + 1) * np.array([1.0, 2.0])
    if i > start and (i - start) % c == 0:
      a = 1.0 / (swa_n + 1)
      swa = swa * (1 - a) + w * a
      swa_n += 1
    out.append((None if swa is None else swa.copy(), swa_n))
  return out


def run_toy(cfg, num_phases=1):
  alg = with_swa(toy_algorithm(num_phases), cfg)
  state = alg.server_init({'w': jnp.zeros(2)}, None)
  update = jax.jit(alg.server_update, static_argnums=3)
  bcast = jax.jit(alg.broadcast)
  hist = []
  for i in range(cfg.rounds):
    lr = float(bcast(state, jnp.int32(i))['hparams']['lr'])
    for phase in range(num_phases):
      state = update(state, {}, jnp.int32(i), phase)
    hist.append((lr, state, alg.eval_models(state)))
  assert update._cache_size() == num_phases, 'the traced round index must not recompile'
  assert bcast._cache_size() == 1
  return alg, hist


def test_start_round_is_floor_of_fraction():
  assert swa_start_round(swa_config(rounds=20, start_fraction=0.5)) == 10
  assert swa_start_round(swa_config(rounds=10, start_fraction=0.75)) == 7
  assert swa_start_round(swa_config(rounds=10000, start_fraction=0.75)) == 7500


def test_averaging_timing_and_counter_match_reference_loop():
  cfg = swa_config(rounds=20, start_fraction=0.5, cycle=3)
  _, hist = run_toy(cfg)
  ref = reference_swa(20, 10, 3)
  for i, ((_, state, models), (swa_ref, n_ref)) in enumerate(zip(hist, ref)):
    params, active = models['swa']
    assert bool(active) == (i >= 10), i
    assert int(state['swa']['n']) == n_ref, i
    if swa_ref is not None:
      np.testing.assert_allclose(params['w'], swa_ref, rtol=1e-6, err_msg=f'round {i}')
    np.testing.assert_allclose(models['global'][0]['w'], (i + 1) * np.array([1.0, 2.0]))
  # By hand: copy w^10 at round 10; first average (round 13) overwrites it with w^14; then w^17, w^20.
  np.testing.assert_allclose(hist[10][2]['swa'][0]['w'], [10.0, 20.0])
  np.testing.assert_allclose(hist[13][2]['swa'][0]['w'], [14.0, 28.0])
  np.testing.assert_allclose(hist[16][2]['swa'][0]['w'], [15.5, 31.0])
  np.testing.assert_allclose(hist[19][2]['swa'][0]['w'], [17.0, 34.0])
  assert int(hist[19][1]['swa']['n']) == 3


def test_cycle_one_averages_every_round_after_start():
  _, hist = run_toy(swa_config(rounds=8, start_fraction=0.5, cycle=1))
  # start 4: copy w^4; rounds 5, 6, 7 average w^6, w^7, w^8 (the first one overwrites the copy).
  np.testing.assert_allclose(hist[4][2]['swa'][0]['w'], [4.0, 8.0])
  np.testing.assert_allclose(hist[5][2]['swa'][0]['w'], [6.0, 12.0])
  np.testing.assert_allclose(hist[7][2]['swa'][0]['w'], [7.0, 14.0])
  np.testing.assert_allclose([lr for lr, _, _ in hist[4:]], 0.1, rtol=1e-6)   # c = 1: constant lr1
  assert all(lr == BASE_LR for lr, _, _ in hist[:4])


def test_server_drives_the_cyclic_client_lr():
  cfg = swa_config(rounds=20, start_fraction=0.5, cycle=3, lr1=0.1, lr2=0.001)
  _, hist = run_toy(cfg)
  for i, (lr, _, _) in enumerate(hist):
    if i < 10:
      want = BASE_LR
    else:
      t = ((i % 3) + 1) / 3
      want = (1 - t) * 0.1 + t * 0.001
    np.testing.assert_allclose(lr, want, rtol=1e-5, err_msg=f'round {i}')


def test_ablation_cyclic_lr_only_has_no_swa_model():
  _, hist = run_toy(swa_config(average=False))
  assert 'swa' not in hist[-1][2] and 'swa' not in hist[-1][1]
  assert hist[-1][0] != BASE_LR


def test_ablation_averaging_only_keeps_client_lr():
  _, hist = run_toy(swa_config(cyclic_lr=False))
  assert all(lr == BASE_LR for lr, _, _ in hist)
  np.testing.assert_allclose(hist[19][2]['swa'][0]['w'], [17.0, 34.0])


def test_multi_phase_base_averages_after_the_last_phase_only():
  _, hist = run_toy(swa_config(rounds=20, start_fraction=0.5, cycle=3), num_phases=2)
  np.testing.assert_allclose(hist[10][2]['swa'][0]['w'], [10.0, 20.0])
  np.testing.assert_allclose(hist[19][2]['swa'][0]['w'], [17.0, 34.0])


def test_fedavg_round_with_swa_equals_fedavg_at_the_cyclic_lr():
  """Through the real engine: a FedAvg round at i >= start trains the clients with gamma(i)."""
  data = synthetic(3, [6, 9, 4], input_shape=(3, 2, 1), num_classes=3, seed=1)
  model = get_model('mlp', 3, (3, 2, 1), hidden=(4,))
  params = model.init(jax.random.key(0), jnp.zeros((1, 3, 2, 1)))
  ids = np.arange(3)
  steps = batching.padded_num_steps(data.client_sizes(), 4, epochs=1)
  rb = batching.make_round_batches(data, ids, round_idx=0, seed=0, batch_size=4, num_steps=steps, epochs=1)
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))

  def round_fn(cfg):
    cfg.model = 'mlp'
    cfg.client.batch_size = 4
    alg = registry.build_algorithm(cfg, model)
    fn = engine.make_round_fn(alg, chunk=3, donate=False)

    def run(r):
      st, _, _ = fn(alg.server_init(params, None), rb.as_dict(), None, rngs, rb.num_examples, ids >= 0, r)
      return alg.eval_models(st)['global'][0]
    return run

  swa = round_fn(swa_config(rounds=10, start_fraction=0.5, cycle=4, lr1=0.3, lr2=0.01))   # start 5
  close = lambda a, b: jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5,
                                                                                      atol=1e-7), a, b)
  gamma = 0.25 * 0.3 + 0.75 * 0.01               # round 6: t = (6 % 4 + 1) / 4 = 3/4
  plain = default_config()
  plain.client.lr = gamma
  close(swa(6), round_fn(plain)(6))
  close(swa(3), round_fn(default_config())(3))   # before the start the clients keep config.client.lr


def test_planned_averages_is_the_reference_loops_final_counter():
  for rounds in (1, 2, 4, 5, 9, 20, 33):
    for frac in (0.0, 0.25, 0.5, 0.75, 0.9):
      for cycle in (1, 2, 3, 5):
        cfg = swa_config(rounds=rounds, start_fraction=frac, cycle=cycle)
        assert planned_averages(cfg) == reference_swa(rounds, swa_start_round(cfg), cycle)[-1][1], \
            (rounds, frac, cycle)


def test_a_run_too_short_to_average_warns_before_and_after(caplog):
  """swa enabled, rounds=4, start 0.75, cycle 2: s = 3, first average would be round 5 > 4: the validator
  warns before the run, the run warns at the end and summary.json says swa_averages=0; a long enough run
  records its averages and does not warn."""
  import logging
  from fedjax_flat.config.validate import validate_config
  from fedjax_flat.training import trainers
  from tests.fixtures.configs import small_config
  data = synthetic(8, [3, 17, 6, 9, 30, 1, 12, 5], input_shape=(4, 4, 1), num_classes=4, seed=3)
  short = small_config(rounds=4, **{'swa.enabled': True, 'swa.start_fraction': 0.75, 'swa.cycle': 2})
  with caplog.at_level(logging.WARNING, logger='absl'):
    validate_config(short)
  assert any('never averaged' in r.getMessage() and 'round 6' in r.getMessage() for r in caplog.records)
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger='absl'):
    summary = trainers.make_trainer(short, data=data).train()
  assert summary['swa_averages'] == 0 and any('never averaged' in r.getMessage() for r in caplog.records)
  caplog.clear()
  long = small_config(rounds=6, **{'swa.enabled': True, 'swa.start_fraction': 0.5, 'swa.cycle': 1})
  with caplog.at_level(logging.WARNING, logger='absl'):
    validate_config(long)
    summary = trainers.make_trainer(long, data=data).train()
  assert summary['swa_averages'] == planned_averages(long) == 2
  assert not any('never averaged' in r.getMessage() for r in caplog.records)
