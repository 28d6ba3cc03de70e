"""Many runs in one program (core/runs.py, training/batched.py): each run of a batched program equals the same
run alone (fp32 tolerance: the vmapped program sums in another order) for FedAvg, FedSAM, SCAFFOLD (client
states), SWA and central DP (per-run clip and noise multiplier, adaptive clip); every run writes the workdir
files a run alone writes; a stopped batched program resumes bit-identical to an uninterrupted one;
compatibility keys, packing and the memory split."""
import json
import os

import jax
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.core import runs as runs_lib
from fedjax_flat.data import attacks
from fedjax_flat.data import sampling
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.training import batched
from fedjax_flat.training import batched_trainer
from fedjax_flat.training import packing
from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import run as run_lib

from tests.fixtures.configs import small_config

SIZES = [7, 3, 12, 0, 5, 9, 1, 4, 10, 6]          # quantity skew, an empty client, a 1-example client


def _data():
  return synthetic(len(SIZES), SIZES, input_shape=(3, 3, 1), num_classes=4, seed=0)


CASES = {
    'fedavg': {},
    'fedsam': {'client.optimizer': 'sam', 'client.rho': 0.05},
    'scaffold': {'algorithm': 'scaffold'},
    'swa': {'swa.enabled': True, 'swa.start_fraction': 0.3, 'swa.cycle': 2, 'swa.lr1': 0.1, 'swa.lr2': 0.01},
    # cheaper SAM clients: the every-k period and LookSAM's alpha per run
    'looksam': {'client.optimizer': 'looksam', 'client.rho': 0.05},
    'sam_every': {'client.optimizer': 'sam_every', 'client.rho': 0.05},
    # a WiMA window grid in one program: the window per run, the buffer the largest window
    'wima': {'wima.enabled': True, 'wima.buffer': 4},
    # a WiMA subset grid in one program: every parameter buffered, the subset a per-run mask when read
    'wima_subset': {'wima.enabled': True, 'wima.window': 3, 'wima.buffer_all': True},
    # builders that once froze a per-run value with float(): FedNova's momentum, Mime's weight decay
    'fednova': {'algorithm': 'fednova'},
    'mime': {'algorithm': 'mime'},
    # central DP with adaptive clipping: clip and noise multiplier per run, each run its own noise and clip state
    'dp': {'dp.mode': 'central', 'dp.adaptive': True, 'dp.delta': 1e-3, 'server.weighting': 'uniform'},
    # an epsilon grid: each run's noise multiplier calibrated on the host to its own target epsilon
    'dp_eps': {'dp.mode': 'central', 'dp.delta': 1e-3, 'dp.clip': 0.5, 'server.weighting': 'uniform'},
    # compressed uploads: top-k's fraction and QSGD's bits are per-run values (k, s traced), with error feedback
    'topk': {'upload.compress': 'topk', 'upload.error_feedback': True},
    'qsgd': {'upload.compress': 'qsgd'},
    # K-SAM's subset ascent: the fraction of each batch is a per-run value (a mask over the fixed batch)
    'ksam': {'client.optimizer': 'ksam'},
    # attacks as client roles: attack.fraction (the roles: each run's own store rows) and attack.scale (traced)
    # per run; gaussian draws each lane's noise from its own run's key; ALIE's colluders under the median
    'attack_gaussian': {'attack.kind': 'gaussian'},
    'attack_alie': {'attack.kind': 'alie', 'server.aggregator': 'median'},
    # the backdoor poisons each run's own attackers' examples: the data are per-lane inputs
    'attack_backdoor': {'attack.kind': 'backdoor', 'attack.trigger_size': 1, 'attack.trigger_row': 0,
                        'attack.trigger_col': 0, 'attack.target_label': 1},
    # label flipping: its fractions and classes (per-run inputs) poison each run's own labels (per-lane data)
    'label_flip': {'attack.kind': 'label_flip'},
}
# Per-run values of the three runs of a case: seeds and every traced field the case uses.
VALUES = [{'seed': 0, 'client.lr': 0.1, 'client.momentum': 0.9, 'client.weight_decay': 1e-3, 'server.lr': 1.0},
          {'seed': 1, 'client.lr': 0.05, 'client.momentum': 0.5, 'client.weight_decay': 4e-4, 'server.lr': 0.7},
          {'seed': 2, 'client.lr': 0.2, 'client.momentum': 0.8, 'client.weight_decay': 1e-2, 'server.lr': 1.2}]
EXTRA = {'fedsam': [{'client.rho': 0.02}, {'client.rho': 0.05}, {'client.rho': 0.1}],
         'swa': [{'swa.lr1': 0.1, 'swa.lr2': 0.01}, {'swa.lr1': 0.2, 'swa.lr2': 0.02}, {'swa.lr1': 0.05,
                                                                                        'swa.lr2': 0.001}],
         'wima': [{'wima.window': 2}, {'wima.window': 3}, {'wima.window': 4}],
         'wima_subset': [{'wima.subset': 'classifier'}, {'wima.subset': 'features'}, {'wima.subset': 'all'}],
         'looksam': [{'client.looksam_k': 1, 'client.looksam_alpha': 0.5}, {'client.looksam_k': 2,
                      'client.looksam_alpha': 0.7}, {'client.looksam_k': 3, 'client.looksam_alpha': 0.0}],
         'sam_every': [{'client.sam_every': 1}, {'client.sam_every': 2}, {'client.sam_every': 3}],
         'mime': [{'client.momentum': 0.0}] * 3,     # Mime's base-optimizer momentum is algo.beta
         'dp': [{'dp.clip': 0.1, 'dp.noise_multiplier': 0.1}, {'dp.clip': 0.3, 'dp.noise_multiplier': 0.2},
                {'dp.clip': 1.0, 'dp.noise_multiplier': 0.0}],
         'dp_eps': [{'dp.target_epsilon': 8.0}, {'dp.target_epsilon': 4.0}, {'dp.target_epsilon': 2.0}],
         'topk': [{'upload.fraction': 0.05}, {'upload.fraction': 0.2}, {'upload.fraction': 1.0}],
         'qsgd': [{'upload.bits': 1}, {'upload.bits': 2}, {'upload.bits': 4}],
         'ksam': [{'client.ascent_fraction': 0.25}, {'client.ascent_fraction': 0.5}, {'client.ascent_fraction': 1.0}]}
ATTACK_GRID = [{'attack.fraction': 0.1, 'attack.scale': 0.5}, {'attack.fraction': 0.3, 'attack.scale': 2.0},
               {'attack.fraction': 0.5, 'attack.scale': 1.0}]
EXTRA.update({c: ATTACK_GRID for c in CASES if c.startswith('attack_')})
EXTRA['label_flip'] = [{'attack.malicious_superclients': 0.5, 'attack.attackers': 0.5, 'attack.classes': '0,1'},
                       {'attack.malicious_superclients': 1.0, 'attack.attackers': 1.0, 'attack.classes': '0,1'},
                       {'attack.malicious_superclients': 1.0, 'attack.attackers': 0.5, 'attack.classes': '0,2'}]


def _config(case, i, **over):
  c = small_config(**{**CASES[case], **VALUES[i], **EXTRA.get(case, [{}] * 3)[i], **over})
  c.rounds, c.eval_every, c.eval_every_last, c.clients_per_round = 7, 3, 1, 3
  c.checkpoint_every = 3
  c.data.num_clients = len(SIZES)
  c.engine.strategy = 'sequential'
  if c.algorithm != 'fedavg':
    c.algo.update({**registry.default_hparams(c.algorithm), **c.algo.to_dict()})
  return c


def _records(wd):
  with open(os.path.join(wd, 'metrics.jsonl')) as f:
    return [{k: v for k, v in json.loads(l).items() if k not in ('elapsed_s', 'rounds_per_s')} for l in f]


def _ckpt(wd):
  got = ckpt_lib.read_checkpoint(os.path.join(wd, 'checkpoints'))
  return got['server_leaves'] + list(got['client_leaves'] or [])


def _files(wd):
  return sorted(f for f in os.listdir(wd) if not f.startswith('.'))


# fedavg runs in the default suite; the other cases (each trains 3 runs alone and batched: the attack cases ~15 s of
# CPU each, 35 s on 2 shared cores) in `pytest -m slow`.
@pytest.mark.parametrize('case', [c if c == 'fedavg' else pytest.param(c, marks=pytest.mark.slow)
                                  for c in sorted(CASES)])
def test_batched_run_equals_run_alone(case, tmp_path, monkeypatch):
  data = _data()
  for i in range(3):
    run_lib.run(_config(case, i), str(tmp_path / f'alone{i}'), data=data)
  # Data passed in-process: run_batch loads by config; give it the same object.
  monkeypatch.setattr(batched.data_registry, 'get_dataset', lambda *a, **k: data)
  specs = [batched.RunSpec(f'r{i}', _config(case, i), str(tmp_path / f'batched{i}')) for i in range(3)]
  res = batched.run_batch(specs, lanes=4)                # 3 runs + a padding lane
  assert [res[i].status for i in range(3)] == ['done'] * 3, [res[i].error for i in range(3)]
  assert all(res[i].lanes == 4 for i in range(3)), 'one batched program, not runs alone'
  for i in range(3):
    a, b = str(tmp_path / f'alone{i}'), str(tmp_path / f'batched{i}')
    assert _files(a) == _files(b)
    ra, rb = _records(a), _records(b)
    assert [r['round'] for r in ra] == [r['round'] for r in rb] == [3, 6, 7]
    for x, y in zip(ra, rb, strict=True):
      assert x.keys() == y.keys()
      for k in x:
        if x[k] is None or isinstance(x[k], str):      # the DP records' dp_sampling, dp_accountant, ...
          assert x[k] == y[k], (case, i, k)
          continue
        np.testing.assert_allclose(x[k], y[k], rtol=2e-4, atol=1e-5, err_msg=f'{case} run {i} {k}')
    la, lb = _ckpt(a), _ckpt(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
      np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5, err_msg=f'{case} run {i} checkpoint')
    sa, sb = (json.load(open(os.path.join(d, 'summary.json'))) for d in (a, b))
    assert sa['rounds_completed'] == sb['rounds_completed'] == 7
    if case == 'dp_eps':    # the run's own calibrated z and epsilon, batched or alone
      assert sa['dp_noise_multiplier'] == sb['dp_noise_multiplier'] and sa['dp_epsilon'] == sb['dp_epsilon']
      assert sa['dp_epsilon'] <= (8.0, 4.0, 2.0)[i]
    np.testing.assert_allclose(sa['final_test_accuracy'], sb['final_test_accuracy'], atol=1e-6)
    if case.startswith('attack_'):    # the run's own roles, bit for bit: floor(fraction N) clients of its seed
      got = ckpt_lib.read_checkpoint(os.path.join(b, 'checkpoints'))    # the rows of the clients it sampled
      want = attacks.malicious_clients(len(SIZES), ATTACK_GRID[i]['attack.fraction'], VALUES[i]['seed'])
      np.testing.assert_array_equal(np.asarray(got['client_leaves'][0]), np.isin(got['client_ids'], want))
      assert sa['attack'] == sb['attack'] and sb['attack']['num_attackers'] == len(want)
    if case == 'label_flip':        # the run's own attackers, pairs and flips
      ja, jb = (json.load(open(os.path.join(d, 'attack.json'))) for d in (a, b))
      assert ja == jb and jb['num_attackers'] >= 1 and jb['classes'] == [int(c) for c in
                                                                         EXTRA['label_flip'][i]['attack.classes'].split(',')]
  # the runs really differ (the values are per run, not the first run's)
  assert not np.allclose(_ckpt(str(tmp_path / 'batched0'))[0], _ckpt(str(tmp_path / 'batched1'))[0])


def test_a_builder_freezing_a_per_run_value_is_refused_in_one_line_before_compiling(tmp_path, monkeypatch):
  """The contract's rule for per-run values (core/contract.py): a builder that turns a traced per-run value
  into a Python number (here FedNova's momentum, as it did before algorithms/common.run_value) is refused with
  one line naming the algorithm and the field, before anything compiles or trains."""
  from fedjax_flat.algorithms import fednova
  monkeypatch.setattr(fednova, 'run_value', float)
  data = _data()
  monkeypatch.setattr(batched.data_registry, 'get_dataset', lambda *a, **k: data)
  compiled = []
  monkeypatch.setattr(batched_trainer.BatchedTrainer, 'train', lambda self, **kw: compiled.append(1))
  specs = [batched.RunSpec(f'r{i}', _config('fednova', i), str(tmp_path / f'b{i}')) for i in range(2)]
  res = batched.run_batch(specs, lanes=2)
  assert [res[i].status for i in range(2)] == ['failed'] * 2 and not compiled
  err = res[0].error
  assert '\n' not in err and err.startswith('BatchRefused: fednova cannot run in a batched program')
  assert 'client.momentum' in err and '--batch_runs=1' in err
  assert not os.path.getsize(tmp_path / 'b0' / 'metrics.jsonl')     # no round was trained or written


def _stop_after_first_block():
  """A stop_requested that says stop at its first poll (the end of the first block)."""
  polls = {'n': 0}

  def stop():
    polls['n'] += 1
    return polls['n'] == 1
  return stop


def test_stopped_batched_program_resumes_bit_identical(tmp_path, monkeypatch):
  data = _data()
  monkeypatch.setattr(batched.data_registry, 'get_dataset', lambda *a, **k: data)
  specs = lambda d: [batched.RunSpec(f'r{i}', _config('scaffold', i), str(tmp_path / d / str(i)))
                     for i in range(3)]
  batched.run_batch(specs('ref'), lanes=4)
  first = batched.run_batch(specs('resumed'), lanes=4, stop_requested=_stop_after_first_block())
  assert {first[i].status for i in range(3)} == {'stopped'}
  assert all(first[i].summary['rounds_completed'] == 3 for i in range(3))
  second = batched.run_batch(specs('resumed'), lanes=4)
  assert all(second[i].summary['resumed_from_round'] == 3 for i in range(3))
  for i in range(3):
    for x, y in zip(_ckpt(str(tmp_path / 'resumed' / str(i))), _ckpt(str(tmp_path / 'ref' / str(i))),
                    strict=True):
      np.testing.assert_array_equal(x, y)
    assert _records(str(tmp_path / 'resumed' / str(i))) == _records(str(tmp_path / 'ref' / str(i)))


def test_compat_key_and_packing():
  base = _config('fedavg', 0)
  same = [_config('fedavg', i) for i in range(3)]            # other seeds and values: one program
  assert len({runs_lib.compat_key(c) for c in same}) == 1
  assert runs_lib.compat_key(_config('fedsam', 0)) != runs_lib.compat_key(base)       # optimizer kind
  assert runs_lib.compat_key(_config('fedavg', 0, **{'client.batch_size': 8})) != runs_lib.compat_key(base)
  # momentum 0 removes an optimizer stage: zero and non-zero momentum are different programs
  assert runs_lib.compat_key(_config('fedavg', 0, **{'client.momentum': 0.0})) != runs_lib.compat_key(base)
  specs = [batched.RunSpec(str(i), c, '') for i, c in enumerate(
      [_config('fedavg', i % 3) for i in range(9)] + [_config('fedsam', 0)])]
  assert packing.pack_groups(specs, 4, 1) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]   # balanced: 9 -> 3 x 3
  assert packing.pack_groups(specs, 16, 1) == [list(range(9)), [9]]
  # two devices: packs of a multiple of 2 (every lane a run), 9 -> 4 + 4 + 1 (8 lanes + a run alone, not 3 x 4)
  assert packing.pack_groups(specs, 4, 2) == [[0, 1, 2, 3], [4, 5, 6, 7], [8], [9]]
  assert packing.pack_groups(specs[:6], 4, 2) == [[0, 1, 2, 3], [4, 5]]
  assert packing.pack_groups(specs[:3], 4, 2) == [[0, 1, 2]] and packing.pack_groups(specs[:3], 2, 2) == [[0, 1], [2]]
  assert packing.pack_groups(specs[:6], 3, 2) == [[0, 1, 2], [3, 4, 5]]    # 4 would exceed 3 a program
  # the host's evaluations at evaluation rounds (every client, the lab) leave the program alone: one key
  assert runs_lib.compat_key(_config('fedavg', 0, **{'client_eval.clients': 'all', 'client_eval.personalize_steps': 2,
                                                     'lab.every': 3})) == runs_lib.compat_key(base)
  assert runs_lib.lanes_for(3, 2) == 4 and runs_lib.lanes_for(8, 2) == 8 and runs_lib.lanes_for(5, 1) == 5


def test_run_value_refuses_python_conversion():
  c = _config('fedavg', 0)

  def f(lr):
    tc = runs_lib.traced_config(c, {'client.lr': lr, 'client.momentum': lr})
    assert bool(tc.client.momentum)                 # static truth (non-zero in every run of the program)
    with pytest.raises(runs_lib.RunValueError, match='client.lr'):
      float(tc.client.lr)
    with pytest.raises(runs_lib.RunValueError, match='client.lr'):
      bool(tc.client.lr)
    return 2.0 * tc.client.lr + tc.client.lr * 1.0 - tc.client.momentum
  np.testing.assert_allclose(jax.vmap(f)(np.array([1.0, 2.0], np.float32)), [2.0, 4.0])


def test_memory_budget_splits_the_batch(tmp_path, monkeypatch):
  data = _data()
  monkeypatch.setattr(batched.data_registry, 'get_dataset', lambda *a, **k: data)
  specs = [batched.RunSpec(f'r{i}', _config('fedavg', i, rounds=3), str(tmp_path / str(i))) for i in range(3)]
  seen = []
  real = batched_trainer.BatchedTrainer

  def spy(trainers, **kw):
    seen.append(len(trainers))
    return real(trainers, **kw)
  monkeypatch.setattr(batched_trainer, 'BatchedTrainer', spy)
  t = run_lib.open_run(specs[0].config, str(tmp_path / 'probe'), data=data)
  per_lane = packing.lane_bytes(t[0])                # pylint: disable=protected-access
  t[1].close()
  res = batched.run_batch(specs, memory_bytes=int(per_lane * 1.5))      # one lane fits
  assert seen == [1, 1, 1] and all(res[i].status == 'done' for i in range(3))


def test_a_workdir_held_by_a_live_process_is_busy_not_failed(tmp_path):
  """run_batch leaves a run whose workdir lock is held untouched and says 'busy' (the sweep waits and retries it;
  tests/sweeps/test_sweep.py), not 'failed'."""
  from fedjax_flat.training.workdir import WorkdirLock
  spec = batched.RunSpec('r0', _config('fedavg', 0), str(tmp_path / 'r0'))
  with WorkdirLock(spec.workdir):
    res = batched.run_batch([spec])
  assert res[0].status == 'busy' and 'in use by process' in res[0].error
  assert not os.path.exists(tmp_path / 'r0' / 'config.json')       # nothing of it touched


def test_auto_runs_per_program_follow_the_backend_measurements(monkeypatch):
  assert packing.auto_batch_runs() == packing.AUTO_BATCH_RUNS == 4        # CPU: lanes keep the cores busy
  monkeypatch.setattr(packing.jax, 'default_backend', lambda: 'gpu')
  assert packing.auto_batch_runs() == 1                                  # H100: R = 8 / 32 gave 0.88x / 0.79x


def _grid_config(alpha, data_seed):
  c = small_config(**{'dataset': 'digits', 'data.alpha': alpha, 'data.seed': data_seed, 'rounds': 2,
                      'eval_every': 2, 'engine.strategy': 'sequential', 'client.batch_size': 32})
  c.data.num_clients, c.data.quantity_skew = 8, 1.0   # log-normal client sizes: each partition its own
  return c


def test_align_plans_gives_a_data_grid_one_signature(tmp_path):
  opened = [run_lib.open_run(_grid_config(a, s), str(tmp_path / str(s))) for a, s in [(0.1, 0), (100.0, 1)]]
  trainers = [t for t, *_ in opened]
  before = [t.plan.batch_plan for t in trainers]
  assert before[0] != before[1] and packing.signature(trainers[0]) != packing.signature(trainers[1])
  assert packing.align_plans(trainers) == 1              # the smaller plan grows to the common one
  assert packing.signature(trainers[0]) == packing.signature(trainers[1])
  common = trainers[0].plan.batch_plan
  assert common == packing.common_plan(before) and trainers[0].plan.num_steps == common.num_steps
  for _, ckpt, _ in opened:
    ckpt.close()


@pytest.mark.slow    # trains 2 runs alone and batched (~12 s quiet); the default suite: the two tests around it
def test_a_dirichlet_alpha_grid_is_one_program_and_each_run_equals_its_run_alone(tmp_path, monkeypatch):
  """Runs that differ only in data (data.alpha, data.seed under a quantity skew: other client sizes, so other step
  counts and largest client) share one program with the pack's largest batch plan (packing.align_plans); the
  padding is masked, so each run's records and checkpoint equal the run alone."""
  cfg = _grid_config
  grid = [(0.1, 0), (100.0, 1)]
  alone_plans = []
  for i, (a, s) in enumerate(grid):
    run_lib.run(cfg(a, s), str(tmp_path / f'alone{i}'))
    t, ckpt, _ = run_lib.open_run(cfg(a, s), str(tmp_path / f'probe{i}'))
    alone_plans.append(t.plan.batch_plan)
    ckpt.close()
  assert len({(p.num_steps, p.max_size) for p in alone_plans}) > 1, 'the grid must give other plan shapes'
  built = []
  real_init = batched_trainer.BatchedTrainer.__init__
  monkeypatch.setattr(batched_trainer.BatchedTrainer, '__init__',
                      lambda self, trainers, **kw: (built.append(len(trainers)), real_init(self, trainers, **kw))[1])
  specs = [batched.RunSpec(f'r{i}', cfg(a, s), str(tmp_path / f'batched{i}')) for i, (a, s) in enumerate(grid)]
  res = batched.run_batch(specs, lanes=2)
  assert [res[i].status for i in range(2)] == ['done'] * 2, [res[i].error for i in range(2)]
  assert built == [2], 'one program for the whole alpha grid'
  for i in range(2):
    a, b = str(tmp_path / f'alone{i}'), str(tmp_path / f'batched{i}')
    assert len(_records(a)) == len(_records(b)) == 1
    for x, y in zip(_records(a), _records(b), strict=True):
      for k in x:
        np.testing.assert_allclose(x[k], y[k], rtol=2e-4, atol=1e-5, err_msg=f'alpha run {i} {k}')
    for x, y in zip(_ckpt(a), _ckpt(b), strict=True):
      np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5, err_msg=f'alpha run {i} checkpoint')


def test_common_plan_pads_only_the_shapes():
  from fedjax_flat.data import batching
  p = batching.batch_plan([3, 9], batch_size=4, num_steps=3)
  q = batching.batch_plan([20, 1], batch_size=4, num_steps=5)
  c = packing.common_plan([p, q])
  assert (c.num_steps, c.max_size, c.num_perms, c.batch_size) == (5, 20, 1, 4)
  assert packing.common_plan([p, batching.batch_plan([3, 9], batch_size=8, num_steps=2)]) is None
  assert packing.common_plan([p, batching.batch_plan([3, 9], batch_size=4, num_steps=3, epochs=2)]) is None


def test_a_one_run_pack_on_several_devices_trains_as_train_py_would(tmp_path, monkeypatch):
  # A runs program of one run on two devices would fill its second lane with a copy: the pack trains alone, its
  # clients sharded as train.py shards them, and its files equal the run's trained by run.py (this process has one
  # device, so `alone` is passed as the sweep passes it on two).
  assert packing.single_run_pack_alone(1, 2) and not packing.single_run_pack_alone(1, 1)
  assert not packing.single_run_pack_alone(2, 2) and not packing.single_run_pack_alone(3, 2)
  data = _data()
  run_lib.run(_config('fedavg', 0), str(tmp_path / 'ref'), data=data)
  monkeypatch.setattr(batched.data_registry, 'get_dataset', lambda *a, **k: data)
  res = batched.run_batch([batched.RunSpec('r0', _config('fedavg', 0), str(tmp_path / 'alone'))], lanes=2,
                          alone=True)
  assert res[0].status == 'done' and res[0].lanes == 0, res[0].error
  assert _records(str(tmp_path / 'alone')) == _records(str(tmp_path / 'ref'))
  assert all(np.array_equal(a, b) for a, b in zip(_ckpt(str(tmp_path / 'alone')), _ckpt(str(tmp_path / 'ref'))))


def _count_config(k, seed=0, **over):
  """SCAFFOLD on the digits split into k clients: a client-count grid (client states [K], |S|/N per run)."""
  c = small_config(**{'dataset': 'digits', 'algorithm': 'scaffold', 'data.alpha': 0.5, 'data.num_clients': k,
                      'seed': seed, 'rounds': 4, 'eval_every': 2, 'checkpoint_every': 2,
                      'engine.strategy': 'sequential', 'client.batch_size': 32, **over})
  c.algo.update({**registry.default_hparams('scaffold'), **c.algo.to_dict()})
  return c


COUNTS = (10, 16, 20)


def test_pack_key_leaves_out_the_population_unless_it_sizes_arrays():
  """data.num_clients is a per-run input (core/runs.INPUT_FIELDS): a client-count grid packs into one program;
  FedFomo's per-client slots are [N, ...] arrays, so its runs pack only with runs of the same N."""
  assert len({packing.pack_key(_count_config(k)) for k in COUNTS}) == 1
  fomo = [_count_config(k, algorithm='fedfomo') for k in COUNTS]
  for c in fomo:
    c.algo = registry.default_hparams('fedfomo')
  assert len({packing.pack_key(c) for c in fomo}) == 3
  assert packing.pack_groups([batched.RunSpec(str(k), _count_config(k), '') for k in COUNTS], 4) == [[0, 1, 2]]


def _spy_programs(monkeypatch):
  built = []
  real_init = batched_trainer.BatchedTrainer.__init__

  def init(self, trainers, **kw):
    real_init(self, trainers, **kw)
    built.append((len(trainers), self.population_size))
  monkeypatch.setattr(batched_trainer.BatchedTrainer, '__init__', init)
  return built


def test_a_client_count_grid_is_one_program_whose_lanes_sample_their_own_clients(tmp_path, monkeypatch):
  """The default suite's check (the slow test below compares each run with the run alone): runs of 10, 16 and 20
  clients train in one program and each run's checkpointed client states are those of exactly the clients the
  host sampler draws from its own K (sampling.sample_clients), all below K."""
  built = _spy_programs(monkeypatch)
  specs = [batched.RunSpec(f'r{i}', _count_config(k, seed=i, rounds=2, model='mlp'), str(tmp_path / f'batched{i}'))
           for i, k in enumerate(COUNTS)]
  res = batched.run_batch(specs, lanes=4)
  assert [res[i].status for i in range(3)] == ['done'] * 3, [res[i].error for i in range(3)]
  assert built == [(3, 20)], 'one program for the whole client-count grid'
  for i, k in enumerate(COUNTS):
    want = np.unique(np.concatenate([sampling.sample_clients(k, 3, seed=i, round_idx=r) for r in range(2)]))
    got = ckpt_lib.read_checkpoint(str(tmp_path / f'batched{i}' / 'checkpoints'))
    np.testing.assert_array_equal(np.sort(np.asarray(got['client_ids'])), want)
    assert want.max() < k and all(np.all(np.isfinite(x)) for x in got['server_leaves'])


@pytest.mark.slow    # 3 runs alone + the grid batched (~23 s)
def test_a_client_count_grid_is_one_program_and_each_run_equals_its_run_alone(tmp_path, monkeypatch):
  """Runs of 10, 16 and 20 clients share one program: per-client arrays padded to 20 rows, each lane draws its
  cohort from its own K and SCAFFOLD's |S|/N uses its own N; each run's records and checkpoint (its own K
  client states) equal the run alone."""
  for i, k in enumerate(COUNTS):
    run_lib.run(_count_config(k, seed=i, rounds=2), str(tmp_path / f'alone{i}'))
  built = _spy_programs(monkeypatch)
  specs = [batched.RunSpec(f'r{i}', _count_config(k, seed=i, rounds=2), str(tmp_path / f'batched{i}'))
           for i, k in enumerate(COUNTS)]
  res = batched.run_batch(specs, lanes=4)
  assert [res[i].status for i in range(3)] == ['done'] * 3, [res[i].error for i in range(3)]
  assert built == [(3, 20)], 'one program for the whole client-count grid'
  for i, k in enumerate(COUNTS):
    a, b = str(tmp_path / f'alone{i}'), str(tmp_path / f'batched{i}')
    ra, rb = _records(a), _records(b)
    assert [r['round'] for r in ra] == [r['round'] for r in rb] == [2]
    for x, y in zip(ra, rb, strict=True):
      for key in x:
        np.testing.assert_allclose(x[key], y[key], rtol=2e-4, atol=1e-5, err_msg=f'K={k} {key}')
    ids_a, ids_b = (ckpt_lib.read_checkpoint(os.path.join(d, 'checkpoints'))['client_ids'] for d in (a, b))
    np.testing.assert_array_equal(ids_b, ids_a)          # the clients it sampled: its own, all below its K
    assert int(np.max(ids_b)) < k
    for x, y in zip(_ckpt(a), _ckpt(b), strict=True):
      assert x.shape == y.shape
      np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5, err_msg=f'K={k} checkpoint')


@pytest.mark.slow    # 3 runs batched twice and resumed (~20 s quiet)
def test_a_client_count_pack_resumes_bit_identical_and_a_run_of_it_resumes_alone(tmp_path, monkeypatch):
  """A stopped client-count pack resumes bit-identical to the uninterrupted one (each run checkpointed its own
  K rows); its 10-client run resumed alone (train.py) ends as the same run trained alone throughout."""
  specs = lambda d, idx=range(3): [batched.RunSpec(f'r{i}', _count_config(COUNTS[i], seed=i),
                                                   str(tmp_path / d / str(i))) for i in idx]
  batched.run_batch(specs('ref'), lanes=4)
  first = batched.run_batch(specs('resumed'), lanes=4, stop_requested=_stop_after_first_block())
  assert {first[i].summary['rounds_completed'] for i in range(3)} == {2}
  run_lib.run(_count_config(COUNTS[0], seed=0), str(tmp_path / 'resumed' / '0'))     # alone, from round 2
  second = batched.run_batch(specs('resumed', (1, 2)), lanes=4)
  assert all(second[i].summary['resumed_from_round'] == 2 for i in range(2))
  for i in (1, 2):
    for x, y in zip(_ckpt(str(tmp_path / 'resumed' / str(i))), _ckpt(str(tmp_path / 'ref' / str(i))),
                    strict=True):
      np.testing.assert_array_equal(x, y)
    assert _records(str(tmp_path / 'resumed' / str(i))) == _records(str(tmp_path / 'ref' / str(i)))
  run_lib.run(_count_config(COUNTS[0], seed=0), str(tmp_path / 'alone'))
  for x, y in zip(_ckpt(str(tmp_path / 'resumed' / '0')), _ckpt(str(tmp_path / 'alone')), strict=True):
    np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5)


def test_incompatible_specs_are_one_line_naming_the_run_and_the_key(tmp_path):
  # Issue 48: ff.run_batch with runs that cannot share a program ended in a ValueError naming neither.
  import fedjax_flat as ff
  from fedjax_flat.errors import BadInputError
  a, b, c = small_config(rounds=2), small_config(rounds=2), small_config(rounds=2)
  c.client.optimizer = 'sam'
  specs = [ff.RunSpec(n, cfg, str(tmp_path / n)) for n, cfg in (('a', a), ('b', b), ('sam', c))]
  with pytest.raises(BadInputError) as e:
    ff.run_batch(specs)
  assert str(e.value) == ("run 2 ('sam') cannot share a batched program with run 0 ('a'): config key "
                          "client.optimizer differs ('sgd' vs 'sam'); give them to separate run_batch calls, or let "
                          "a sweep pack them (packing.pack_groups)")
  assert isinstance(e.value, packing.BatchIncompatible) and not os.listdir(tmp_path)    # nothing opened


def test_a_run_that_trains_alone_and_diverges_fails_alone(tmp_path):
  """A pack's run that cannot batch trains alone in the pack's process: its divergence is that run's failure (as a
  diverged lane's), and the run after it still trains (a sweep with --batch_runs went on to no further run)."""
  def cfg(lr):
    c = small_config(**{'client.lr': lr, 'rounds': 2, 'eval_every': 1})
    c.engine.device_data = False        # a batch blocker: each run trains alone
    return c
  specs = [batched.RunSpec(f'r{i}', cfg(lr), str(tmp_path / f'r{i}')) for i, lr in enumerate((1e30, 0.1))]
  res = batched.run_batch(specs)
  assert res[0].status == 'failed' and 'Divergence' in res[0].error, res[0]
  assert res[1].status == 'done' and res[1].lanes == 0, res[1]


def test_attack_grids_pack_into_one_program_and_an_attack_that_is_off_traces_nothing():
  """attack.fraction / attack.scale are per-run (an input and a traced value): a grid over them has one
  compatibility key; with attack.kind='none' (or a label flip) attack.scale is not read, so it is not traced and
  the batched program is the one without the attack section; a label-flip grid (its fractions and classes poison
  each run's own labels) packs too."""
  grid = [_config('attack_gaussian', i) for i in range(3)]
  assert len({packing.pack_key(c) for c in grid}) == 1 and all(packing.batch_blocker(c) is None for c in grid)
  assert 'attack.scale' in runs_lib.present_value_fields(grid[0])
  for kind in ('none', 'label_flip'):
    c = _config('fedavg', 0, **{'attack.kind': kind})
    bare = _config('fedavg', 0)
    del bare['attack']
    assert runs_lib.present_value_fields(c) == runs_lib.present_value_fields(bare)
    assert 'attack.scale' not in runs_lib.present_value_fields(c)
  flips = [_config('label_flip', i) for i in range(3)]
  assert len({packing.pack_key(c) for c in flips}) == 1 and all(packing.batch_blocker(c) is None for c in flips)


def _close(x, y, what):
  """Equal JSON values, numbers to float32 rounding (the batched model's), nested lists and dicts alike."""
  if isinstance(x, dict):
    assert x.keys() == y.keys(), what
    for k in x:
      _close(x[k], y[k], f'{what}.{k}')
  elif isinstance(x, list):
    assert len(x) == len(y), what
    for a, b in zip(x, y):
      _close(a, b, what)
  elif isinstance(x, (int, float)) and not isinstance(x, bool):
    np.testing.assert_allclose(x, y, rtol=2e-4, atol=1e-5, err_msg=what)
  else:
    assert x == y, what


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


@pytest.mark.slow    # 3 runs alone + batched, every client evaluated, one with the lab (~50 s on the shared 2 cores)
def test_client_eval_and_the_lab_share_a_program_and_each_runs_rows_equal_its_run_alone(tmp_path, monkeypatch):
  """client_eval and lab are host evaluations at evaluation rounds (LOG: out of the compatibility key, core/runs.py):
  runs with other client_eval / lab settings train in one program, and each run's clients.jsonl and lab.jsonl
  equal its run alone's (the batched model agrees to float32 rounding, as the records do)."""
  data = _data()
  lab = {'lab.every': 3, 'lab.examples': 12, 'lab.measures': 'drift,sparsity,rank,profile', 'lab.bins': 3}
  over = [{'client_eval.clients': 'all'},
          {'client_eval.clients': 'all', 'client_eval.personalize_steps': 1, **lab},
          {'client_eval.clients': 4, 'client_eval.every': 6}]
  for i in range(3):
    run_lib.run(_config('fedavg', i, **over[i]), str(tmp_path / f'alone{i}'), data=data)
  monkeypatch.setattr(batched.data_registry, 'get_dataset', lambda *a, **k: data)
  built = _spy_programs(monkeypatch)
  specs = [batched.RunSpec(f'r{i}', _config('fedavg', i, **over[i]), str(tmp_path / f'batched{i}')) for i in range(3)]
  res = batched.run_batch(specs, lanes=4)
  assert [res[i].status for i in range(3)] == ['done'] * 3, [res[i].error for i in range(3)]
  assert built == [(3, None)], 'one program for runs that differ in client_eval and lab'
  files = {0: ['clients.jsonl'], 1: ['clients.jsonl', 'lab.jsonl'], 2: ['clients.jsonl']}
  for i in range(3):
    a, b = tmp_path / f'alone{i}', tmp_path / f'batched{i}'
    assert _files(str(a)) == _files(str(b))
    for name in files[i]:
      ra, rb = _rows(a / name), _rows(b / name)
      assert len(ra) == len(rb) > 0, (i, name)
      for x, y in zip(ra, rb, strict=True):
        assert x.keys() == y.keys()
        for k in (k for k in x if not k.startswith('seconds')):      # the lab's own timings differ
          _close(x[k], y[k], f'run {i} {name} {k}')
  assert {r['round'] for r in _rows(tmp_path / 'batched2' / 'clients.jsonl')} == {6, 7}     # its own `every`
  assert len(_rows(tmp_path / 'batched0' / 'clients.jsonl')) == 3 * len(SIZES)                # rounds 3, 6, 7


def test_every_client_evaluated_in_a_batched_pack_equals_each_run_alone(tmp_path, monkeypatch):
  """The default suite's check (the slow test above adds the lab and more rounds): two runs that differ in
  client_eval share one program; each one's clients.jsonl equals its run alone's."""
  data = _data()
  over = [{'client_eval.clients': 'all'}, {'client_eval.clients': 5, 'client_eval.personalize_steps': 1}]

  def cfg(i):
    c = _config('fedavg', i, **over[i])
    c.rounds = c.checkpoint_every = 3            # one evaluation (round 3)
    return c
  for i in range(2):
    run_lib.run(cfg(i), str(tmp_path / f'alone{i}'), data=data)
  monkeypatch.setattr(batched.data_registry, 'get_dataset', lambda *a, **k: data)
  built = _spy_programs(monkeypatch)
  res = batched.run_batch([batched.RunSpec(f'r{i}', cfg(i), str(tmp_path / f'batched{i}')) for i in range(2)],
                          lanes=2)
  assert [res[i].status for i in range(2)] == ['done'] * 2, [res[i].error for i in range(2)]
  assert built == [(2, None)]
  for i in range(2):
    ra, rb = (_rows(tmp_path / f'{kind}{i}' / 'clients.jsonl') for kind in ('alone', 'batched'))
    assert len(ra) == len(rb) == (len(SIZES) if i == 0 else 5)
    for x, y in zip(ra, rb, strict=True):
      _close(x, y, f'run {i}')
