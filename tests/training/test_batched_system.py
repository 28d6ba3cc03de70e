"""The runs axis carries the virtual clock's numbers (config.system; training/batched.py, core/runs.py): runs that
differ only in the deadline, the speeds' spread, the availability rate, dropout or bandwidths share one runs program,
each lane on its own clock (its own step limits, reporting clients, virtual time and bytes, checkpointed); the
clock's kinds and trace split packs; a batched clock grid equals each run alone (with compressed uploads too) and
resumes bit-identically."""
import json
import math
import os

import numpy as np
import pytest

from fedjax_flat.core import runs as runs_lib
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.training import batched
from fedjax_flat.training import batched_trainer
from fedjax_flat.training import packing
from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import run as run_lib

from tests.fixtures.configs import small_config

SIZES = [7, 3, 12, 0, 5, 9, 1, 4, 10, 6]
# Log-normal speeds at a median of 10 examples/s: the 0.45 s deadline drops clients and cuts steps, 0.7 s cuts
# steps; lane 2 also has its own spread and dropout. Deadline 0 = none (every step runs, the clock still counts).
CLOCK = {'system.speed': 'lognormal', 'system.speed_median': 10.0, 'system.min_steps': 1,
         'system.up_mbps': 100.0, 'system.down_mbps': 100.0}
GRID = [{'system.deadline_s': 0.0},
        {'system.deadline_s': 0.45},
        {'system.deadline_s': 0.7, 'system.speed_sigma': 1.0, 'system.dropout': 0.3, 'system.up_mbps': 50.0}]


def _data():
  return synthetic(len(SIZES), SIZES, input_shape=(3, 3, 1), num_classes=4, seed=0)


def _config(i, **over):
  c = small_config(**{**CLOCK, **GRID[i], 'seed': 1, **over})
  c.rounds, c.eval_every, c.eval_every_last, c.clients_per_round = 4, 2, 1, 3
  c.checkpoint_every = 2
  c.data.num_clients = len(SIZES)
  c.engine.strategy = 'sequential'
  return c


def _records(wd):
  with open(os.path.join(wd, 'metrics.jsonl')) as f:
    return [{k: v for k, v in json.loads(line).items() if k not in ('elapsed_s', 'rounds_per_s')} for line in f]


def _ckpt(wd):
  return ckpt_lib.read_checkpoint(os.path.join(wd, 'checkpoints'))


def _batched(tmp_path, monkeypatch, name, over=lambda i: {}, **kw):
  """Trains the grid batched (lane i's config: _config(i, **over(i))); returns (results, trainers built per
  BatchedTrainer, programs compiled)."""
  data = _data()
  monkeypatch.setattr(batched.data_registry, 'get_dataset', lambda *a, **k: data)
  built, n_compiled = [], len(batched_trainer._COMPILED)
  real_init = batched_trainer.BatchedTrainer.__init__
  monkeypatch.setattr(batched_trainer.BatchedTrainer, '__init__',
                      lambda self, trainers, **k: (built.append(list(trainers)), real_init(self, trainers, **k))[1])
  specs = [batched.RunSpec(f'r{i}', _config(i, **over(i)), str(tmp_path / name / str(i))) for i in range(len(GRID))]
  res = batched.run_batch(specs, lanes=len(GRID), **kw)
  return res, built, len(batched_trainer._COMPILED) - n_compiled


def test_system_numbers_are_run_inputs_and_the_clock_kinds_structure():
  base = _config(0)
  assert packing.batch_blocker(base) is None
  keys = {runs_lib.compat_key(_config(i)) for i in range(len(GRID))}
  assert len(keys) == 1, 'deadline, spread, dropout, bandwidths: one program'
  bern = [small_config(**{'system.availability': 'bernoulli', 'system.availability_rate': p}) for p in (0.5, 0.9)]
  assert runs_lib.compat_key(bern[0]) == runs_lib.compat_key(bern[1])
  for structure in ({'system.speed': 'none', 'system.deadline_s': 0.0},      # the clock on (lognormal) or off
                    {'system.availability': 'bernoulli'}):
    assert runs_lib.compat_key(_config(0, **structure)) != runs_lib.compat_key(base), structure
  # dropout is a number, but with nothing else set it alone turns the clock on: with and without a clock split
  assert (runs_lib.compat_key(small_config(**{'system.dropout': 0.1}))
          != runs_lib.compat_key(small_config(**{'system.dropout': 0.0})))
  configs = [_config(0), _config(1), _config(0, **{'system.availability': 'bernoulli'}), small_config()]
  packs = packing.pack_groups([batched.RunSpec(str(i), c, '') for i, c in enumerate(configs)], 4)
  assert packs == [[0, 1], [2], [3]]


def test_a_deadline_grid_is_one_program_and_each_lane_runs_on_its_own_clock(tmp_path, monkeypatch):
  res, built, compiled = _batched(tmp_path, monkeypatch, 'b')
  assert [res[i].status for i in range(3)] == ['done'] * 3, [res[i].error for i in range(3)]
  assert [len(b) for b in built] == [3] and compiled == 1, 'one BatchedTrainer, one compiled program'
  trainers = built[0]
  cut = False
  for i, t in enumerate(trainers):
    p = t.plan
    assert p.clock.deadline_s == GRID[i]['system.deadline_s']
    scheds = [p.systems.round_schedule(r, p.sample_round(r)) for r in range(4)]
    cut |= any(np.any(s.fit < [len(p.systems.client_step_examples[k]) for k in s.ids]) for s in scheds)
    s = res[i].summary
    # the lane's totals are its own schedule's, recomputed from its plan alone
    assert s['virtual_time_s'] == pytest.approx(sum(x.duration_s for x in scheds))
    assert s['bytes_up'] == pytest.approx(sum(x.bytes_up for x in scheds))
    assert s['bytes_down'] == pytest.approx(sum(x.bytes_down for x in scheds))
    recs = _records(str(tmp_path / 'b' / str(i)))
    assert [r['round'] for r in recs] == [2, 4] and recs[-1]['virtual_time_s'] == pytest.approx(s['virtual_time_s'])
    assert _ckpt(str(tmp_path / 'b' / str(i)))['meta']['system_total']['virtual_time_s'] == pytest.approx(
        s['virtual_time_s'])
  assert cut, 'a deadline of the grid must cut some client'
  times = [res[i].summary['virtual_time_s'] for i in range(3)]
  assert len(set(times)) == 3, times
  # the lanes trained differently: the deadline's masks reached the program
  leaves = [_ckpt(str(tmp_path / 'b' / str(i)))['server_leaves'][0] for i in range(3)]
  assert not np.allclose(leaves[0], leaves[1]) and not np.allclose(leaves[1], leaves[2])


@pytest.mark.slow    # trains the grid alone and batched (~25 s on 2 busy cores)
def test_a_batched_clock_grid_equals_each_run_alone(tmp_path, monkeypatch):
  data = _data()
  for i in range(len(GRID)):
    run_lib.run(_config(i), str(tmp_path / 'alone' / str(i)), data=data)
  res, built, _ = _batched(tmp_path, monkeypatch, 'b')
  assert [res[i].status for i in range(3)] == ['done'] * 3 and [len(b) for b in built] == [3]
  for i in range(len(GRID)):
    a, b = str(tmp_path / 'alone' / str(i)), str(tmp_path / 'b' / str(i))
    ra, rb = _records(a), _records(b)
    assert [r['round'] for r in ra] == [r['round'] for r in rb] == [2, 4]
    for x, y in zip(ra, rb, strict=True):
      assert x.keys() == y.keys() and 'virtual_time_s' in x
      for k in ('virtual_time_s', 'bytes_up', 'bytes_down'):
        assert x[k] == y[k], (i, k)           # host arithmetic of the same schedule: exact
      for k in x:
        np.testing.assert_allclose(x[k], y[k], rtol=2e-4, atol=1e-5, err_msg=f'lane {i} {k}')
    ca, cb = _ckpt(a), _ckpt(b)
    assert ca['meta']['system_total'] == cb['meta']['system_total']
    for x, y in zip(ca['server_leaves'], cb['server_leaves'], strict=True):
      np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5, err_msg=f'lane {i} checkpoint')
    sa, sb = (json.load(open(os.path.join(d, 'summary.json'))) for d in (a, b))
    for k in ('virtual_time_s', 'bytes_up', 'bytes_down', 'system_reports_per_round'):
      assert sa[k] == sb[k], (i, k)


@pytest.mark.slow    # trains the grid batched twice (~20 s on 2 busy cores)
def test_a_stopped_batched_clock_grid_resumes_bit_identical(tmp_path, monkeypatch):
  _batched(tmp_path, monkeypatch, 'ref')
  polls = {'n': 0}

  def stop_after_first_block():
    polls['n'] += 1
    return polls['n'] == 1
  first, _, _ = _batched(tmp_path, monkeypatch, 'resumed', stop_requested=stop_after_first_block)
  assert {first[i].status for i in range(3)} == {'stopped'}
  assert all(first[i].summary['rounds_completed'] == 2 for i in range(3))
  second, _, _ = _batched(tmp_path, monkeypatch, 'resumed')
  assert all(second[i].summary['resumed_from_round'] == 2 for i in range(3))
  for i in range(len(GRID)):
    a, b = str(tmp_path / 'resumed' / str(i)), str(tmp_path / 'ref' / str(i))
    ca, cb = _ckpt(a), _ckpt(b)
    assert ca['meta']['system_total'] == cb['meta']['system_total']
    for x, y in zip(ca['server_leaves'], cb['server_leaves'], strict=True):
      np.testing.assert_array_equal(x, y)
    assert _records(a) == _records(b)


# Compressed uploads on the clock: top-k with error feedback, a fraction per lane (the clock's bytes up per lane too).
COMPRESS = [{'upload.compress': 'topk', 'upload.error_feedback': True, 'upload.fraction': f} for f in (0.05, 0.3, 1.0)]


@pytest.mark.slow    # trains the grid alone and batched (~35 s on 2 busy cores)
def test_a_batched_clock_grid_with_compressed_uploads_equals_each_run_alone(tmp_path, monkeypatch):
  data = _data()
  for i in range(len(GRID)):
    run_lib.run(_config(i, **COMPRESS[i]), str(tmp_path / 'alone' / str(i)), data=data)
  res, built, compiled = _batched(tmp_path, monkeypatch, 'b', over=lambda i: COMPRESS[i])
  assert [res[i].status for i in range(3)] == ['done'] * 3, [res[i].error for i in range(3)]
  assert [len(b) for b in built] == [3] and compiled == 1, 'one BatchedTrainer, one compiled program'
  ups = set()
  for i, t in enumerate(built[0]):
    a, b = str(tmp_path / 'alone' / str(i)), str(tmp_path / 'b' / str(i))
    d, k = t.plan.num_params, max(1, round(COMPRESS[i]['upload.fraction'] * t.plan.num_params))
    up = 4 * k + min(4 * k, math.ceil(d / 8))          # k values + their indices or a d-bit map, the smaller
    assert t.plan.clock.bytes_up == t.plan.systems.compressed_upload_bytes() == up
    ups.add(up)
    ra, rb = _records(a), _records(b)
    assert [r['round'] for r in ra] == [r['round'] for r in rb] == [2, 4]
    for x, y in zip(ra, rb, strict=True):
      assert x.keys() == y.keys() and {'virtual_time_s', 'compress_error', 'comm_up_bytes'} <= x.keys()
      for k in ('virtual_time_s', 'bytes_up', 'bytes_down', 'comm_bytes', 'comm_up_bytes', 'compress_mb_up'):
        assert x[k] == y[k], (i, k)           # host arithmetic of the same schedule and counts: exact
      assert x['comm_up_bytes'] == x['round'] * 3 * up    # 3 clients a round, each its compressed upload
      for k in x:
        np.testing.assert_allclose(x[k], y[k], rtol=2e-4, atol=1e-5, err_msg=f'lane {i} {k}')
    ca, cb = _ckpt(a), _ckpt(b)
    assert ca['meta']['system_total'] == cb['meta']['system_total']
    for x, y in zip(ca['server_leaves'] + list(ca['client_leaves'] or []),
                    cb['server_leaves'] + list(cb['client_leaves'] or []), strict=True):   # residuals too
      np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5, err_msg=f'lane {i} checkpoint')
    sa, sb = (json.load(open(os.path.join(d, 'summary.json'))) for d in (a, b))
    for k in ('virtual_time_s', 'bytes_up', 'bytes_down', 'comm_total_bytes', 'compress_upload_bytes'):
      assert sa[k] == sb[k], (i, k)
  assert len(ups) == 3, 'each lane sends its own fraction'
