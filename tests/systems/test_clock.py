"""The virtual clock (systems/clock.py) against hand-computed schedules, its config rules, and the run with it:
deadlines as masks (partial work = the same steps run alone, no recompilation), host = device rounds, resume."""
import json

import jax
import numpy as np
import pytest

from fedjax_flat.config import validate
from fedjax_flat.core import engine as engine_lib
from fedjax_flat.data import batching
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.errors import ConfigError
from fedjax_flat.optimizers import client as client_opt
from fedjax_flat.systems import clock as clock_lib
from fedjax_flat.training import driver as driver_lib
from fedjax_flat.training import trainers
from tests.fixtures import resume
from tests.fixtures.configs import small_config

SIZES = [3, 17, 6, 9, 30, 1, 12, 5]
CLOCK = {'system.speed': 'lognormal', 'system.speed_median': 10.0, 'system.deadline_s': 1.0,
         'system.min_steps': 2, 'system.up_mbps': 100.0, 'system.down_mbps': 100.0}


def data():
  return synthetic(8, SIZES, input_shape=(4, 4, 1), num_classes=4, seed=3)


def hand_clock(**kw):
  """Three clients: 10, 20, 4 examples/s; 1 MB down at 8 Mbps (1 s), 1 MB up at 4 Mbps (2 s); 2 passes a step."""
  devices = clock_lib.Devices(speed=np.array([10.0, 20.0, 4.0]), up_mbps=np.full(3, 4.0),
                              down_mbps=np.full(3, 8.0), offset_h=np.array([0.0, 12.0, 20.0]), hours=())
  args = dict(devices=devices, passes=2.0, bytes_down=1e6, bytes_up=1e6, deadline_s=5.0, min_steps=2,
              availability='always', rate=1.0, window=(0.0, 8.0), round_duration_s=3600.0, dropout=0.0, seed=0)
  args.update(kw)
  return clock_lib.Clock(**args)


# examples of each local step: n = 10, 16, 5 with B = 4
STEPS = [np.array([4.0, 4.0, 2.0]), np.array([4.0, 4.0, 4.0, 4.0]), np.array([4.0, 1.0])]


def test_schedule_by_hand_under_a_deadline():
  # budget 5 - 1 - 2 = 2 s of compute. Step costs (examples x 2 / speed): client 0 0.8, 0.8, 0.4 -> all 3 fit
  # (2.0 s); client 1 0.4 x 4 -> all 4 (1.6 s); client 2 2.0, 0.5 -> 1 step < min_steps 2: dropped.
  s = clock_lib.schedule(hand_clock(), 0, [0, 1, 2], STEPS)
  np.testing.assert_array_equal(s.fit, [3, 4, 0])
  np.testing.assert_array_equal(s.reports, [True, True, False])
  np.testing.assert_allclose(s.down_s, [1, 1, 1])
  np.testing.assert_allclose(s.compute_s, [2.0, 1.6, 0.0])
  np.testing.assert_allclose(s.up_s, [2, 2, 0])
  assert s.duration_s == 5.0                     # the server waited for client 2 until the deadline
  assert (s.bytes_down, s.bytes_up) == (3e6, 2e6)
  # min_steps 1: client 2 reports its one step (1 + 2.0 + 2 = 5 s); everyone in time, the slowest sets the pace
  s = clock_lib.schedule(hand_clock(min_steps=1), 0, [0, 1, 2], STEPS)
  np.testing.assert_array_equal(s.fit, [3, 4, 1])
  np.testing.assert_allclose(s.compute_s, [2.0, 1.6, 2.0])
  assert s.duration_s == pytest.approx(5.0) and s.bytes_up == 3e6
  # a looser deadline where every client finishes early: the slowest reporting client's time, not the deadline
  s = clock_lib.schedule(hand_clock(deadline_s=100.0), 0, [0, 1, 2], STEPS)
  np.testing.assert_array_equal(s.fit, [3, 4, 2])
  assert s.duration_s == pytest.approx(1 + 2.5 + 2)         # client 2: 5 examples x 2 / 4


def test_schedule_by_hand_without_a_deadline_and_with_dropout():
  s = clock_lib.schedule(hand_clock(deadline_s=0.0), 3, [1, 2], STEPS[1:])
  np.testing.assert_array_equal(s.fit, [4, 2])
  assert s.duration_s == pytest.approx(5.5)
  # dropout 1 - tiny: every client drops mid-round: it downloaded, nothing is uploaded, nobody reports
  s = clock_lib.schedule(hand_clock(deadline_s=0.0, dropout=0.999999), 3, [1, 2], STEPS[1:])
  assert not s.reports.any() and s.dropped_out.all() and s.bytes_down == 2e6 and s.bytes_up == 0
  assert s.duration_s == 0.0


def test_availability_by_hand():
  c = hand_clock(availability='diurnal')        # offsets 0, 12, 20 h; window [0, 8) local time; 1 h a round
  np.testing.assert_array_equal(clock_lib.available(c, 2, [0, 1, 2]), [True, False, False])   # local 2, 14, 22
  np.testing.assert_array_equal(clock_lib.available(c, 6, [0, 1, 2]), [True, False, True])    # local 6, 18, 2
  np.testing.assert_array_equal(clock_lib.available(c, 30, [0, 1, 2]), [True, False, True])   # day 2, 6 h UTC
  s = clock_lib.schedule(c, 2, [0, 1, 2], STEPS)
  np.testing.assert_array_equal(s.reports, [True, False, False])
  assert s.bytes_down == 1e6          # the unavailable receive nothing
  assert s.duration_s == 3600.0       # one round per nominal slot (the reporting client took 5 s)
  b = hand_clock(availability='bernoulli', rate=0.3)
  draws = np.concatenate([clock_lib.available(b, r, np.arange(3)) for r in range(2000)])
  assert abs(draws.mean() - 0.3) < 0.03
  np.testing.assert_array_equal(clock_lib.available(b, 7, [2, 0]), clock_lib.available(b, 7, [0, 1, 2])[[2, 0]])


def test_step_examples_match_the_batch_masks():
  d = data()
  plan = batching.batch_plan(d.client_sizes(), batch_size=4, num_steps=8, epochs=1)
  rb = batching.make_round_batches(d, list(range(8)), round_idx=0, seed=0, batch_size=4, num_steps=8, plan=plan)
  for k, n in enumerate(SIZES):
    want = rb.mask[k].sum(axis=1)
    got = clock_lib.step_examples(n, 4)
    np.testing.assert_array_equal(want[:len(got)], got)
    assert want[len(got):].sum() == 0
  np.testing.assert_array_equal(clock_lib.step_examples(10, 4, epochs=2, full_batches=True, max_steps=3), [4, 4, 4])
  np.testing.assert_array_equal(clock_lib.step_examples(3, 4, local_steps=2), [4, 4])


def test_passes_are_declared_by_the_optimizers_and_algorithms():
  c = small_config()
  assert client_opt.gradient_passes(c.client) == 1
  for opt in ('sam', 'asam'):
    c.client.optimizer = opt
    assert client_opt.gradient_passes(c.client) == 2
  t = trainers.make_trainer(small_config(**CLOCK, **{'client.optimizer': 'sam'}), data=data())
  assert t.plan.clock.passes == 2
  t = trainers.make_trainer(small_config(**CLOCK, algorithm='mimelite'), data=data())
  assert t.plan.clock.passes == 2       # SGD + the gradient at the server model
  t = trainers.make_trainer(small_config(**CLOCK, algorithm='mime'), data=data())
  assert t.plan.clock.passes == 3       # phase 0's pass + phase 1's SGD step and gradient at x


def test_bad_input_is_one_line_before_compiling(tmp_path):
  def refused(over, field, d=None):
    with pytest.raises(ConfigError) as e:
      cfg = small_config(**over)
      validate.validate_config(cfg)
      trainers.make_trainer(cfg, data=d or data())
    assert e.value.field == field and '\n' not in str(e.value), str(e.value)
    return str(e.value)

  refused({'system.speed_median': -1.0}, 'system.speed_median')
  refused({'system.deadline_s': 2.0}, 'system.deadline_s')                      # no speeds
  refused({'system.speed': 'trace'}, 'system.trace')                            # no file
  bad = tmp_path / 'bad.csv'
  bad.write_text('client,examples_per_s\n0,10\n1,-3\n')
  assert 'bad.csv:3' in refused({'system.speed': 'trace', 'system.trace': str(bad)}, 'system.trace')
  unknown = tmp_path / 'unknown.json'
  unknown.write_text(json.dumps({str(k): {'examples_per_s': 5} for k in range(9)}))
  assert 'beyond the population' in refused({'system.speed': 'trace', 'system.trace': str(unknown)},
                                            'system.trace')
  missing = tmp_path / 'missing.csv'
  missing.write_text('client,examples_per_s\n0,10\n')
  assert 'misses clients' in refused({'system.speed': 'trace', 'system.trace': str(missing)}, 'system.trace')
  assert 'no client can meet it' in refused({**CLOCK, 'system.deadline_s': 1e-3}, 'system.deadline_s')
  # issue 48: speeds that overflow (metrics.jsonl had Infinity)
  assert 'must be <= 10' in refused({**CLOCK, 'system.speed_sigma': 1000.0}, 'system.speed_sigma')
  assert 'the clock needs' in refused({**CLOCK, 'system.speed_median': 1e-299, 'system.speed_sigma': 10.0},
                                      'system.speed_median')


def test_hostile_trace_files_are_one_line_and_bounded(tmp_path, monkeypatch):
  """Issue 48: non-UTF-8 bytes, JSON nested 10^5 deep, a 5,001-digit number, NUL bytes, a huge id, an oversized
  file: each is one ConfigError line naming system.trace (not UnicodeDecodeError / RecursionError / ValueError)."""
  cases = {
      'latin.csv': b'client,examples_per_s\n0,\xff\xfe\n',
      'deep.json': b'[' * 100000 + b']' * 100000,
      'digits.json': b'{"0": {"examples_per_s": ' + b'1' * 5001 + b'}}',
      'digits.csv': b'client,examples_per_s\n0,' + b'1' * 5001 + b'\n',
      'id.csv': b'client,examples_per_s\n' + b'1' * 5001 + b',3\n',
      'nul.csv': b'client,examples_per_s\n0,3\x00\n',
      'hours.json': b'{"0": {"examples_per_s": 3, "available_hours": 5}}',
      'big_id.csv': b'client,examples_per_s\n12345678901,3\n',
  }
  for name, raw in cases.items():
    p = tmp_path / name
    p.write_bytes(raw)
    cfg = small_config(**{'system.speed': 'trace', 'system.trace': str(p)})
    with pytest.raises(ConfigError) as e:
      validate.validate_config(cfg)
    assert e.value.field == 'system.trace' and '\n' not in str(e.value) and len(str(e.value)) < 400, (name, e.value)
  big = tmp_path / 'big.csv'
  big.write_text('client,examples_per_s\n' + ''.join(f'{k},5\n' for k in range(100)))
  monkeypatch.setattr(clock_lib, 'MAX_TRACE_BYTES', 100)
  with pytest.raises(ConfigError, match='over the 0 MiB a trace may hold'):
    clock_lib.read_trace(str(big))
  monkeypatch.setattr(clock_lib, 'MAX_TRACE_BYTES', 1 << 20)
  monkeypatch.setattr(clock_lib, 'MAX_TRACE_CLIENTS', 50)
  with pytest.raises(ConfigError, match='more than 50 rows'):
    clock_lib.read_trace(str(big))


def test_trace_is_read_only_up_to_the_population(tmp_path):
  """With the population known, the first row outside it stops the read: the garbage after it is never parsed
  and only the population's rows are kept."""
  p = tmp_path / 't.csv'
  p.write_text('client,examples_per_s\n' + ''.join(f'{k},{k + 1}\n' for k in range(8)) + '8,5\nnot,a row\n')
  with pytest.raises(ConfigError, match='names client 8 beyond the population of 8'):
    clock_lib.read_trace(str(p), 8)
  p.write_text('client,examples_per_s\n' + ''.join(f'{k},{k + 1}\n' for k in range(8)))
  rows = clock_lib.read_trace(str(p), 8)
  assert sorted(rows) == list(range(8)) and rows[7]['examples_per_s'] == 8.0
  assert clock_lib.read_trace(str(p)) == {}       # validation keeps no rows


def test_trace_csv_and_json_give_the_same_devices(tmp_path):
  csv_path, json_path = tmp_path / 't.csv', tmp_path / 't.json'
  rows = {k: {'examples_per_s': 5.0 + k, 'up_mbps': 1.0 + k, 'available_hours': [[k, k + 2]]} for k in range(8)}
  csv_path.write_text('client,examples_per_s,up_mbps,available_hours\n' + ''.join(
      f"{k},{r['examples_per_s']},{r['up_mbps']},{k}-{k + 2}\n" for k, r in rows.items()))
  json_path.write_text(json.dumps({str(k): r for k, r in rows.items()}))
  devs = []
  for p in (csv_path, json_path):
    cfg = small_config(**{'system.speed': 'trace', 'system.availability': 'trace', 'system.trace': str(p)})
    devs.append(clock_lib.devices(cfg, 8))
  for f in ('speed', 'up_mbps', 'down_mbps', 'offset_h'):
    np.testing.assert_array_equal(getattr(devs[0], f), getattr(devs[1], f))
  assert devs[0].hours == devs[1].hours and devs[0].hours[3] == ((3.0, 5.0),)
  np.testing.assert_array_equal(devs[0].down_mbps, np.full(8, 10.0))       # not in the trace: system.down_mbps
  c = clock_lib.make_clock(cfg, 8, passes=1, bytes_down=1, bytes_up=1)
  np.testing.assert_array_equal(clock_lib.available(c, 4, np.arange(8)), [k in (3, 4) for k in range(8)])


def test_deadline_masks_partial_work_equal_to_the_same_steps_run_alone():
  """A client cut to its first s steps by the mask computes what a client given only those s steps does (FedNova:
  its delta, FedAvg's divided by tau_k, and tau_k itself)."""
  for algorithm in ('fednova',):
    t = trainers.make_trainer(small_config(algorithm=algorithm, **CLOCK), data=data())
    host = driver_lib.HostDriver(t.plan)
    rb = host.prepare_round(1)
    full = t.plan.round_batches(1, t.plan.sample_round(1), t.plan.cohort)
    run = jax.jit(engine_lib.make_client_runner(t.algorithm))
    bcast = t.algorithm.broadcast(t.server_state, 1)
    cut = 0
    for i, k in enumerate(rb.client_ids[rb.client_ids >= 0]):
      fit = int((rb.mask[i].sum(axis=1) > 0).sum())
      work = int((full.mask[i].sum(axis=1) > 0).sum())
      if not rb.reports[i] or fit == work:
        continue
      cut += 1
      key = t.plan.client_keys(1, rb.client_ids)[i]
      batch = {n: a[i] for n, a in rb.as_dict().items()}
      alone = {n: a[i][:fit] for n, a in full.as_dict().items()}
      out_masked, _, m1 = run(bcast, batch, None, key)
      out_alone, _, m2 = run(bcast, alone, None, key)
      for a, b in zip(jax.tree_util.tree_leaves(out_masked), jax.tree_util.tree_leaves(out_alone)):
        np.testing.assert_array_equal(a, b)
      assert m1['count'] == m2['count'] == full.mask[i][:fit].sum()
      if algorithm == 'fednova':
        assert float(out_masked['weighted']['a']) == fit          # tau_k: the steps that ran
    assert cut, 'the deadline must cut some client in this round'


def host_rounds(rounds):
  t = trainers.make_trainer(small_config(rounds=rounds, **CLOCK), data=data())
  host = driver_lib.HostDriver(t.plan)
  fits = set()
  for r in range(rounds):
    rb = host.prepare_round(r)
    fits.add(tuple((rb.mask.sum(axis=2) > 0).sum(axis=1)))
    t.server_state, _ = host.run_round(t.server_state, t.store, r, rb)
  return t, host, fits


def test_varying_fit_steps_do_not_recompile():
  _, host, fits = host_rounds(3)
  assert len(fits) > 1 and host.round_fn._cache_size() == 1


@pytest.mark.slow   # 7 s (suite budget); the default suite keeps the host rounds above
def test_device_rounds_with_the_clock_equal_host_rounds():
  t, _, _ = host_rounds(4)
  on_device = small_config(rounds=4, **CLOCK)
  on_device.engine.device_data = True
  d = trainers.make_trainer(on_device, data=data())
  assert d.plan.device_rounds
  d.train()
  for a, b in zip(jax.tree_util.tree_leaves(t.server_state), jax.tree_util.tree_leaves(d.server_state)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow   # 9 s (suite budget)
def test_records_carry_the_clock_and_a_resumed_run_continues_it_exactly(tmp_path):
  cfg = small_config(algorithm='scaffold', rounds=4, eval_every=1, **CLOCK,
                     **{'data.num_clients': 8, 'system.availability': 'bernoulli', 'system.availability_rate': 0.7,
                        'system.dropout': 0.2})
  t, fresh = resume.stopped_and_restored(cfg, data(), tmp_path / 'ck', 2)
  assert fresh.recorder.system_total == t.recorder.system_total
  s1, s2 = t.train(), fresh.train()
  resume.assert_same_run(t, fresh)
  times = [r['virtual_time_s'] for r in t.records]
  assert all(b > a for a, b in zip(times, times[1:])) and all('bytes_up' in r for r in t.records)
  for k in ('virtual_time_s', 'bytes_down', 'bytes_up'):
    assert s1[k] == s2[k] == t.records[-1][k]
  # the sums of the round schedules, recomputed from the plan alone
  want = sum(t.plan.systems.round_schedule(r, t.plan.sample_round(r)).duration_s for r in range(4))
  assert s1['virtual_time_s'] == pytest.approx(want)
  assert 'virtual clock' in s1['facts']['system']


def test_without_the_section_nothing_changes():
  t = trainers.make_trainer(small_config(rounds=2), data=data())
  assert t.plan.clock is None and t.recorder.system_total is None
  t.train()
  assert not any('virtual_time_s' in r for r in t.records)
  assert 'system_total' not in t.recorder.state_dict()


def test_one_byte_count_when_clients_do_not_report(tmp_path):
  # Issue 48: comm_bytes charged every sampled client while the clock charged the online / reporting ones only
  # (194112 vs 91664 bytes here). One definition (clock.COMM_BYTES) now feeds both, and summary.md prints one figure.
  cfg = small_config(rounds=6, eval_every=3, **CLOCK, **{'data.num_clients': 8, 'system.availability': 'bernoulli',
                                                          'system.availability_rate': 0.7, 'system.dropout': 0.2})
  t = trainers.make_trainer(cfg, data=data(), workdir=str(tmp_path))
  s = t.train()
  scheds = [t.plan.systems.round_schedule(r, t.plan.sample_round(r)) for r in range(6)]
  online = sum(int(np.sum(x.available)) for x in scheds)
  reported = sum(int(np.sum(x.reports)) for x in scheds)
  assert reported < online < 6 * cfg.clients_per_round          # some clients were offline, some did not report
  model = 4.0 * t.plan.num_params
  assert s['comm_total_bytes'] == s['bytes_down'] + s['bytes_up'] == model * (online + reported)
  assert [r['comm_bytes'] for r in t.records] == [r['bytes_down'] + r['bytes_up'] for r in t.records]
  md = open(tmp_path / 'summary.md').read()
  assert md.count('MiB') == 1 and f"bytes sent: {s['comm_total_bytes'] / 2**20:.4g} MiB" in md
  assert clock_lib.COMM_BYTES in md
