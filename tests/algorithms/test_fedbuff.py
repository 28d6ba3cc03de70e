"""FedBuff and FedAsync (algorithms/fedbuff.py, fedasync.py) on the event simulation (systems/events.py): the
schedule's invariants, and the compiled server steps against an event-by-event reference in plain Python (each
arrival trained alone from the model it started from, the server formulas in numpy); resume."""
import jax
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.errors import ConfigError
from fedjax_flat.systems import events
from fedjax_flat.training import trainers
from tests.fixtures import resume
from tests.fixtures.configs import small_config

CLOCK = {'system.speed': 'lognormal', 'system.speed_median': 10.0, 'system.speed_sigma': 1.0}


def data():
  return synthetic(8, [3, 17, 6, 9, 30, 1, 12, 5], input_shape=(4, 4, 1), num_classes=4, seed=3)


def config(algorithm, rounds=5, **over):
  c = small_config(algorithm=algorithm, rounds=rounds, **{'data.num_clients': 8}, **CLOCK)
  c.algo.update(registry.default_hparams(algorithm))
  for k, v in over.items():
    c.algo[k] = v
  return c


def test_event_simulation_by_hand_and_its_invariants():
  # equal durations: arrivals in dispatch order; concurrency 3, buffer 2
  steps = events.simulate(lambda k: 1.0, population=6, concurrency=3, buffer=2, num_steps=3, seed=0)
  # t=0: the three first dispatches (version 0) finish at 1 s; the first two arrive; the first's replacement starts
  # at 1 s from version 0, the second's from version 1. t=1: the third (v 0, at 1 s) and the first replacement
  # (v 0, at 2 s). t=2: the second replacement (v 1, 2 s) and the third's replacement (started at 1 s with v 1).
  np.testing.assert_array_equal([s.versions.tolist() for s in steps], [[0, 0], [0, 0], [1, 1]])
  assert [s.time_s for s in steps] == [1.0, 2.0, 2.0]
  durations = {k: 1.0 + (k * 7919 % 13) for k in range(10)}
  steps = events.simulate(durations.get, population=10, concurrency=4, buffer=3, num_steps=40, seed=5)
  times = [s.time_s for s in steps]
  assert times == sorted(times)
  for t, s in enumerate(steps):
    assert len(set(s.ids.tolist())) == 3 and (s.versions <= t).all()
  assert max(t - v for t, s in enumerate(steps) for v in s.versions) >= 2       # the slow ones arrive stale
  again = events.simulate(durations.get, population=10, concurrency=4, buffer=3, num_steps=40, seed=5)
  assert all((a.ids == b.ids).all() and (a.versions == b.versions).all() for a, b in zip(steps, again))


_STEPS = {}


def _jitted(alg):
  return _STEPS.setdefault(id(alg), jax.jit(alg.client_step))


def _client_delta(alg, params, hp, batch, rng):
  """One arrival trained alone, step by step in Python (padded steps skipped, as the engine does; each local step
  is the algorithm's own client_step, jitted alone)."""
  bcast = {'params': params, 'hparams': hp}
  local = alg.client_init(bcast, None, rng)
  step = _jitted(alg)
  for s in range(batch['mask'].shape[0]):
    b = {k: v[s] for k, v in batch.items()}
    if b['mask'].sum() > 0:
      local, _ = step(bcast, local, b, jax.random.fold_in(rng, s))
  out, _ = alg.client_final(bcast, local, None)
  return [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(out['weighted']['delta'])]


@pytest.mark.parametrize('algorithm,hp', [('fedbuff', {'buffer': 2, 'concurrency': 3, 'max_staleness': 1}),
                                          pytest.param('fedasync', {'alpha': 0.6, 'concurrency': 3, 'max_staleness': 1},
                                                       marks=pytest.mark.slow)])   # 8 s (suite budget)
def test_server_steps_equal_an_event_by_event_reference(algorithm, hp):
  t = trainers.make_trainer(config(algorithm, rounds=4, **hp), data=data())
  plan, alg, spec = t.plan, t.algorithm, t.algorithm.asynchronous
  leaves0, treedef = jax.tree_util.tree_flatten(t.server_state['params'])
  history = {0: [np.asarray(x, np.float64) for x in leaves0]}
  w, discarded = history[0], 0
  for r, st in enumerate(t.driver.steps):
    rb = plan.round_batches(r, st.ids, len(st.ids))
    keys = plan.client_keys(r, rb.client_ids)
    hp_r = alg.broadcast(t.server_state, r)['hparams']
    contrib = []
    for i, (k, v) in enumerate(zip(st.ids, st.versions)):
      tau = r - v
      if tau > spec.max_staleness:
        discarded += 1
        continue
      start = history[int(v)]
      d = _client_delta(alg, jax.tree_util.tree_unflatten(treedef, [x.astype(np.float32) for x in start]), hp_r,
                        {n: a[i] for n, a in rb.as_dict().items()}, keys[i])
      contrib.append((1 / np.sqrt(1 + tau), start, d))
    if algorithm == 'fedbuff':     # server SGD lr 1: w - (1/K) sum s(tau) Delta
      w = [x - sum(s * d[j] for s, _, d in contrib) / spec.buffer for j, x in enumerate(w)]
    elif contrib:                  # FedAsync: (1 - a s) w + a s (start - Delta)
      s, start, d = contrib[0]
      a = hp['alpha'] * s
      w = [(1 - a) * x + a * (st_ - dd) for x, st_, dd in zip(w, start, d)]
    history[r + 1] = w
    t.server_state, _ = t.driver.step(t.server_state, None, r, 1, r + 1)
    got = [np.asarray(x) for x in jax.tree_util.tree_leaves(t.server_state['params'])]
    for a, b in zip(got, w):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
  assert discarded, 'the schedule must discard an arrival staler than max_staleness'


def test_bad_concurrency_is_one_line():
  with pytest.raises(ConfigError) as e:
    trainers.make_trainer(config('fedbuff', buffer=3, concurrency=6), data=data())
  assert e.value.field == 'algo.concurrency' and '\n' not in str(e.value)
  with pytest.raises(ConfigError) as e:
    c = config('fedbuff')
    c.system.deadline_s = 5.0
    trainers.make_trainer(c, data=data())
  # issue 48: the field that was set and the conflict, not "config.system='on'" (a value nobody typed)
  assert e.value.field == 'system.deadline_s' and e.value.value == 5.0, str(e.value)
  assert "algorithm='fedbuff' is asynchronous" in str(e.value) and 'set system.deadline_s=0.0' in str(e.value)
  assert '\n' not in str(e.value)


@pytest.mark.slow   # 8 s (suite budget)
def test_resume_is_bit_identical(tmp_path):
  cfg = config('fedbuff', rounds=4, buffer=2, concurrency=3)
  cfg.eval_every = 1
  t, fresh = resume.stopped_and_restored(cfg, data(), tmp_path / 'ck', 2)
  t.train()
  fresh.train()
  resume.assert_same_run(t, fresh)
  assert t.records[-1]['virtual_time_s'] == t.driver.steps[-1].time_s


def test_fedasync_has_a_config_cell_beside_fedbuffs():
  # Issue 48: FedBuff had cells in configs/system.py, FedAsync none.
  import os

  from fedjax_flat.config import families
  from fedjax_flat.config import validate
  from tests.fixtures.paths import REPO
  system = families.load_module(os.path.join(REPO, 'configs', 'system.py'))
  assert 'fedasync,speeds' in system.CELLS and 'fedbuff,speeds' in system.CELLS
  c = system.get_config('fedasync,speeds')
  validate.validate_config(c)
  assert (c.algorithm, c.rounds, dict(c.algo)) == ('fedasync', 250, {'alpha': 0.6, 'concurrency': 5,
                                                                     'max_staleness': 8})
  with pytest.raises(families.ConfigStringError, match='fedasync takes server steps on arrivals'):
    system.get_config('fedasync,deadline')
