"""Robust aggregation (algorithms/wrappers/robust.py, engine aggregate='stacked'): FedAvg rounds with every
server.aggregator against rounds computed by hand (each client's delta from its own exact batches, the NumPy
aggregator of tests/test_aggregators.py over the valid clients, the server step), the stacked aggregate the
server sees (client order, weights, padding masked), streamed / device / host paths, 1 vs 2 host devices
(a subprocess: XLA_FLAGS before jax starts), the one-line refusals and the memory budget.

Run as a module from the repository root (`python -m tests.algorithms.wrappers.test_robust --worker OUT`) it is
the 2-device subprocess."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.wrappers import robust
from fedjax_flat.config import validate
from fedjax_flat.core import engine
from fedjax_flat.errors import ConfigError
from tests.fixtures.baselines import (MODEL, PARAMS0, SCHEDULE, SIZES, client_batches, config, grad, local_sgd,
                                    round_batches, run_engine, sgd, sub)
from tests.fixtures.baselines import flat64 as _flat, unflat32 as _unflat
from tests.fixtures.configs import small_config
from tests.fixtures.paths import REPO
from tests import test_aggregators as ref

tmap = jax.tree_util.tree_map
SERVER_LR = 0.8

REFS = {
    'median': ref.np_median,
    'trimmed_mean': lambda x, w: ref.np_trimmed_mean(x, w, 0.34),
    'krum': lambda x, w: ref.np_krum(x, w, 0),
    'multi_krum': lambda x, w: ref.np_multi_krum(x, w, 0, 2),
    'geometric_median': lambda x, w: ref.np_geometric_median(x, w, 8, 1e-6),
    'bulyan': lambda x, w: ref.np_bulyan(x, w, 0),
    'norm_bounding': lambda x, w: ref.np_norm_bounding(x, w, NORM_BOUND),
    # the previous round's aggregate as the center: _reference threads it through the rounds
    'centered_clipping': lambda x, w, center: ref.np_centered_clipping(x, w, center, CC_TAU, 2),
}
# Below the deltas' norms here (round 0: 0.22, 0.87, 0.22), so the clipping binds.
NORM_BOUND, CC_TAU = 0.15, 0.1


def _cfg(aggregator):
  c = config('fedavg')
  c.server.lr = SERVER_LR
  c.server.aggregator = aggregator
  c.server.trim_fraction, c.server.krum_f, c.server.krum_m = 0.34, 0, 2
  c.server.norm_bound, c.server.cc_tau, c.server.cc_iters = NORM_BOUND, CC_TAU, 2
  return c


def _reference(aggregator):
  """Every round by hand: each client's local SGD from w on its own exact batches, delta = w - y, the NumPy
  aggregator over the round's valid clients (example weights N_k), w <- w - server_lr * aggregate."""
  w, center = PARAMS0, np.zeros_like(_flat(PARAMS0))
  for r, ids in enumerate(SCHEDULE):
    deltas = [_flat(sub(w, local_sgd(w, r, k))) for k in ids]
    if aggregator == 'centered_clipping':
      a = center = REFS[aggregator](deltas, [SIZES[k] for k in ids], center)
    else:
      a = REFS[aggregator](deltas, [SIZES[k] for k in ids])
    w = _unflat(_flat(w) - SERVER_LR * a, w)
  return w


@pytest.mark.parametrize('aggregator', sorted(REFS))
def test_fedavg_round_with_each_aggregator_equals_numpy(aggregator):
  state, _, alg = run_engine(_cfg(aggregator))
  assert alg.aggregate == 'stacked'
  got, want = _flat(state['params']), _flat(_reference(aggregator))
  diff = float(np.max(np.abs(got - want)))
  print(f'{aggregator}: max |engine - numpy| = {diff:.3g}')
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_median_differs_from_the_mean_and_mean_stays_streaming():
  """The default is today's streaming mean (no stacking); the median of 3 clients is not their mean."""
  c = config('fedavg')
  assert c.server.aggregator == 'mean'
  mean_state, _, alg = run_engine(c)
  assert alg.aggregate == 'mean'
  med_state, _, _ = run_engine(_cfg('median'))
  assert not np.allclose(_flat(mean_state['params']), _flat(med_state['params']))


def test_stacked_aggregate_is_in_client_order_with_weights_and_padding_masked():
  """The server sees every upload [C, ...] in the round's client order, N_k weights, the padding client masked
  (its all-padding steps leave a zero delta that a median would otherwise count)."""
  seen = {}
  alg = registry.build_algorithm(_cfg('median'), MODEL)

  def probe(state, agg, round_idx, phase=0):
    seen.update(jax.device_get({k: agg[k] for k in ('uploads', 'weights', 'valid', 'num_clients')}))
    return state
  alg = alg.replace(server_update=probe)
  fn = engine.make_round_fn(alg, chunk=1, jit=False)
  rb = round_batches(1)                                   # clients [2, 0] padded to 3
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))
  state = alg.server_init(PARAMS0, jax.random.key(1))
  fn(state, rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, 1)
  assert list(rb.client_ids) == [2, 0, -1]
  np.testing.assert_array_equal(seen['valid'], [True, True, False])
  np.testing.assert_array_equal(seen['weights'], [SIZES[2], SIZES[0], 0])
  assert float(seen['num_clients']) == 2
  deltas = seen['uploads']['weighted']['delta']
  for i, k in enumerate([2, 0]):
    y = PARAMS0
    for b in client_batches(1, k):
      y = sgd(y, grad(y, b))
    np.testing.assert_allclose(_flat(tmap(lambda a: a[i], deltas)), _flat(sub(PARAMS0, y)), rtol=2e-5, atol=2e-6)
  assert np.all(_flat(tmap(lambda a: a[2], deltas)) == 0)   # the padding row is there, masked


def _train(aggregator='median', **over):
  from fedjax_flat.training import loop
  algorithm = over.pop('algorithm', 'fedavg')
  c = small_config(algorithm=algorithm, rounds=3, **{'server.aggregator': aggregator, 'data.num_clients': 8,
                                                    'clients_per_round': 5, 'engine.strategy': 'sequential', **over})
  t = loop.Trainer(c, write_files=False)
  t.train()
  return t


_BASE = []


def _base_params():
  """The device-rounds median run every path is compared with, trained once per process."""
  if not _BASE:
    _BASE.append(_flat(_train(**{'engine.device_data': True, 'engine.shard_clients': False}).server_state['params']))
  return _BASE[0]


# slow [device_rounds]: the base's own config run twice (determinism); the default suite covers the device rounds
# by the base of [host_rounds] / [streamed], a run's determinism by
# tests/e2e/test_flat_methods.py::test_stateful_run_is_deterministic
@pytest.mark.parametrize('over', [pytest.param({'engine.device_data': True}, marks=pytest.mark.slow),
                                  {'engine.device_data': False},
                                  {'engine.stream_batches': True, 'engine.strategy': 'chunked',
                                   'engine.clients_per_chunk': 2, 'engine.device_data': False}],
                         ids=['device_rounds', 'host_rounds', 'streamed'])
def test_round_paths_give_the_same_median_run(over):
  base = _base_params()
  t = _train(**{'engine.shard_clients': False, **over})
  assert t.algorithm.aggregate == 'stacked'
  np.testing.assert_allclose(_flat(t.server_state['params']), base, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('over', [
    {'server.aggregator': 'median', 'upload.compress': 'topk', 'upload.fraction': 0.5},
    {'server.aggregator': 'trimmed_mean', 'swa.enabled': True, 'swa.start_fraction': 0.3},
    {'server.aggregator': 'krum', 'client.optimizer': 'sam', 'client.rho': 0.05},
    {'server.aggregator': 'geometric_median', 'algorithm': 'fedprox', 'algo.mu': 0.1, 'server.weighting': 'uniform'},
    {'server.aggregator': 'multi_krum', 'server.optimizer': 'adam', 'server.lr': 0.01},
    {'server.aggregator': 'bulyan', 'server.momentum': 0.9},
    {'server.aggregator': 'centered_clipping', 'server.momentum': 0.9, 'server.cc_tau': 0.05},
    {'server.aggregator': 'centered_clipping', 'server.optimizer': 'adam', 'server.lr': 0.01, 'swa.enabled': True,
     'swa.start_fraction': 0.3},
    {'server.aggregator': 'norm_bounding', 'server.optimizer': 'adam', 'server.lr': 0.01, 'server.norm_bound': 0.1},
    {'server.aggregator': 'bulyan', 'client.optimizer': 'sam', 'client.rho': 0.05},
    {'server.aggregator': 'centered_clipping', 'client.optimizer': 'sam', 'client.rho': 0.05},
], ids=['compress', 'swa', 'fedsam_krum', 'fedprox_gm', 'fedadam_multikrum', 'fedavgm_bulyan', 'fedavgm_cc',
        'fedadam_cc_swa', 'fedadam_normbound', 'fedsam_bulyan', 'fedsam_cc'])
def test_aggregators_compose_with_the_other_wrappers_and_optimizers(over):
  t = _train(**{'engine.shard_clients': False, **over})
  assert t.algorithm.aggregate == 'stacked'
  assert np.all(np.isfinite(_flat(t.server_state['params'])))
  assert t.records and np.isfinite(t.records[-1]['train_loss'])


def test_batched_runs_of_a_stacked_aggregation_equal_the_runs_alone(tmp_path, monkeypatch):
  from fedjax_flat.data.sources import builtin
  from fedjax_flat.training import batched, run as run_lib
  data = builtin.synthetic(8, [5, 9, 6, 7, 4, 8, 6, 5], seed=0)

  def cfg(lr):
    return small_config(algorithm='fedavg', rounds=3, **{'server.aggregator': 'median', 'data.num_clients': 8,
                                                         'clients_per_round': 5, 'client.lr': lr,
                                                         'engine.shard_clients': False})
  alone = []
  for i, lr in enumerate((0.1, 0.05)):
    run_lib.run(cfg(lr), str(tmp_path / f'a{i}'), data=data)
    alone.append(json.load(open(tmp_path / f'a{i}' / 'summary.json')))
  monkeypatch.setattr(batched.data_registry, 'get_dataset', lambda *a, **k: data)
  specs = [batched.RunSpec(f'r{i}', cfg(lr), str(tmp_path / f'b{i}')) for i, lr in enumerate((0.1, 0.05))]
  res = batched.run_batch(specs, lanes=2)
  assert [res[i].status for i in range(2)] == ['done'] * 2, [res[i].error for i in range(2)]
  assert all(res[i].lanes == 2 for i in range(2)), 'one batched program'
  for i in range(2):
    got = json.load(open(tmp_path / f'b{i}' / 'summary.json'))
    keys = [k for k, v in alone[i].items() if isinstance(v, float) and ('acc' in k or 'loss' in k)]
    assert keys
    for k in keys:
      np.testing.assert_allclose(got[k], alone[i][k], rtol=2e-4, atol=1e-5, err_msg=k)


# ---- refusals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('over,match', [
    ({'server.aggregator': 'bogus'}, r"server\.aggregator='bogus'"),
    ({'server.aggregator': 'trimmed_mean', 'server.trim_fraction': 0.5}, r'server\.trim_fraction=0\.5'),
    ({'server.aggregator': 'trimmed_mean', 'server.trim_fraction': -0.1}, r'server\.trim_fraction'),
    ({'server.aggregator': 'krum', 'server.krum_f': 1, 'clients_per_round': 4}, r'server\.krum_f=1.*> 2 krum_f'),
    ({'server.aggregator': 'multi_krum', 'server.krum_m': 9, 'clients_per_round': 5}, r'server\.krum_m=9'),
    ({'server.aggregator': 'geometric_median', 'server.gm_iters': 0}, r'server\.gm_iters=0'),
    ({'server.aggregator': 'bulyan', 'server.krum_f': 1, 'clients_per_round': 6}, r'server\.krum_f=1.*4 krum_f \+ 3'),
    ({'server.aggregator': 'bulyan', 'server.krum_f': 0, 'clients_per_round': 2}, r'server\.krum_f=0.*at least 3'),
    ({'server.aggregator': 'centered_clipping', 'server.cc_tau': 0}, r'server\.cc_tau=0'),
    ({'server.aggregator': 'centered_clipping', 'server.cc_iters': 0}, r'server\.cc_iters=0'),
    ({'server.aggregator': 'norm_bounding', 'server.norm_bound': -1.0}, r'server\.norm_bound=-1'),
    ({'server.aggregator': 'median', 'algorithm': 'scaffold'}, r"server\.aggregator='median'.*scaffold"),
    ({'server.aggregator': 'median', 'dp.mode': 'central', 'server.weighting': 'uniform'},
     r"server\.aggregator='median'.*dp\.mode"),
    ({'engine.stacked_max_mb': -1}, r'engine\.stacked_max_mb'),
])
def test_bad_values_are_refused_in_one_line(over, match):
  c = small_config(**over)
  with pytest.raises(ConfigError, match=match) as e:
    validate.validate_config(c)
  assert '\n' not in str(e.value)


def test_centered_clipping_keeps_the_previous_aggregate_in_the_server_state():
  """The center is the last round's clipped aggregate (zero before round 0); the inner algorithm's state, its eval
  models and its broadcast are those of FedAvg with server momentum (the center never reaches them)."""
  c = _cfg('centered_clipping')
  c.server.momentum = 0.9
  state, _, alg = run_engine(c)
  assert set(state) == {'params', 'opt_state', 'robust'}
  w, center = PARAMS0, np.zeros_like(_flat(PARAMS0))
  mom = np.zeros_like(center)
  for r, ids in enumerate(SCHEDULE):
    deltas = [_flat(sub(w, local_sgd(w, r, k))) for k in ids]
    center = ref.np_centered_clipping(deltas, None, center, CC_TAU, 2)
    mom = 0.9 * mom + center                          # FedAvgM on the clipped aggregate
    w = _unflat(_flat(w) - SERVER_LR * mom, w)
  np.testing.assert_allclose(_flat(state['robust']['center']), center, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(_flat(state['params']), _flat(w), rtol=2e-5, atol=2e-6)
  assert set(alg.eval_models(state)) == {'global'}


def test_bulyan_accepts_n_of_4f_plus_3():
  validate.validate_config(small_config(**{'server.aggregator': 'bulyan', 'server.krum_f': 1,
                                           'clients_per_round': 7}))


def test_krum_accepts_n_above_2f_plus_2():
  validate.validate_config(small_config(**{'server.aggregator': 'krum', 'server.krum_f': 1, 'clients_per_round': 5}))


def test_stacking_that_cannot_fit_is_refused_before_compiling():
  shapes = jax.eval_shape(lambda: PARAMS0)
  per = robust.stacked_bytes(1, shapes)
  assert per == sum(a.size * 4 for a in jax.tree_util.tree_leaves(PARAMS0))
  assert robust.stacked_bytes(10, shapes) == 10 * per
  c = small_config(**{'server.aggregator': 'median'})
  need = robust.check_memory(c, 10, shapes, budget=10 * per * robust.STACK_COPIES)   # fits exactly
  assert need == 10 * per * robust.STACK_COPIES
  with pytest.raises(ConfigError, match=r"server\.aggregator='median'.*stacked_max_mb") as e:
    robust.check_memory(c, 10, shapes, budget=need - 1)
  assert '\n' not in str(e.value)
  assert robust.check_memory(small_config(), 10, shapes, budget=1) == 0      # the streaming mean: nothing stacked
  from fedjax_flat.training import plan as plan_lib
  c = small_config(**{'server.aggregator': 'median', 'engine.stacked_max_mb': 1e-4})
  with pytest.raises(ConfigError, match='engine.stacked_max_mb'):
    plan_lib.RunPlan(c)           # refused while planning: nothing compiled yet


def test_binary_exits_2_with_one_line(tmp_path):
  cmd = [sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
         f'--config={os.path.join(REPO, "configs", "quickstart.py")}', f'--workdir={tmp_path / "w"}',
         '--config.server.aggregator=krum', '--config.server.krum_f=9']
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
  assert res.returncode == 2, res.stderr[-2000:]
  lines = [x for x in res.stderr.splitlines() if 'error: config.' in x]
  assert len(lines) == 1 and 'server.krum_f=9' in lines[0] and 'Traceback' not in res.stderr


# ---- 1 vs 2 host devices -------------------------------------------------------------------------------------

DEVICE_CASES = {'median': {}, 'krum': {'server.krum_f': 1}, 'geometric_median': {}}


def _device_run(name, shard):
  t = _train(name, **{'engine.shard_clients': shard, **DEVICE_CASES[name]})
  out = {f'p{i}': np.asarray(a) for i, a in enumerate(jax.tree_util.tree_leaves(jax.device_get(
      t.server_state['params'])))}
  out.update(devices=np.asarray(jax.device_count()), sharded=np.asarray(t.plan.mesh is not None),
             cohort=np.asarray(t.plan.cohort))
  return out


@pytest.mark.slow   # ~30 s: a 2-device subprocess beside the one-device runs
def test_two_host_devices_give_the_one_device_stacked_aggregation(tmp_path):
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=2', 'JAX_PLATFORMS': 'cpu'}
  proc = subprocess.Popen([sys.executable, '-m', 'tests.algorithms.wrappers.test_robust', '--worker', str(tmp_path)],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    refs = {n: _device_run(n, False) for n in DEVICE_CASES}
    _, err = proc.communicate(timeout=600)
  finally:
    proc.kill()
  assert proc.returncode == 0, err[-3000:]
  for n, want in refs.items():
    got = np.load(tmp_path / f'{n}.npz')
    assert int(got['devices']) == 2 and bool(got['sharded']) and not bool(want['sharded'])
    assert int(got['cohort']) == 6 and int(want['cohort']) == 5          # 5 clients padded to 2 x 3: one masked
    keys = [k for k in got.files if k.startswith('p')]
    diff = max(float(np.max(np.abs(got[k] - want[k]))) for k in keys)
    print(f'{n}: max |2 devices - 1 device| = {diff:.3g}')
    assert diff == 0.0, f'{n}: the stacked aggregation depends on the device count ({diff})'


if __name__ == '__main__' and sys.argv[1:2] == ['--worker']:
  for case in DEVICE_CASES:
    np.savez(os.path.join(sys.argv[2], f'{case}.npz'), **_device_run(case, True))
