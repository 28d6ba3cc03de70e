"""Many rounds per compiled call (core/rounds.py) and on-device sampling / batching (one definition with the
host path): R rounds per call == one round per call bit for bit, for stateful algorithms and wrappers too;
one compilation per run; resume from a block-boundary checkpoint == an uninterrupted run."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.data import sampling
from fedjax_flat.data import batching
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.training import driver as driver_lib
from fedjax_flat.training import trainers
from fedjax_flat.config import validate
from fedjax_flat.training import run as run_lib

from tests.fixtures.configs import small_config

SIZES = [7, 3, 12, 0, 5, 9, 1, 4, 10, 6]          # quantity skew, an empty client, a 1-example client


def _data():
  return synthetic(len(SIZES), SIZES, input_shape=(3, 3, 1), num_classes=4, seed=0)


@pytest.mark.parametrize('mode', [dict(epochs=2), dict(local_steps=3), dict(epochs=1, shuffle=False)])
def test_device_batches_equal_host_batches(mode):
  data = _data()
  steps = mode.get('local_steps') or batching.padded_num_steps(data.client_sizes(), 4, epochs=mode.get('epochs', 1))
  plan = batching.batch_plan(data.client_sizes(), batch_size=4, num_steps=steps, **mode)
  arrays = batching.device_data(data)
  gather = jax.jit(lambda r, ids: batching.gather_round_device(plan, arrays, sampling.seed_key(3), r, ids))
  sample = jax.jit(lambda r: sampling.sample_ids(sampling.seed_key(3), r, len(SIZES), 4))
  for r in range(6):
    ids = sampling.sample_clients(len(SIZES), 4, seed=3, round_idx=r)
    np.testing.assert_array_equal(np.asarray(sample(r)), ids)               # sampling: device == host
    padded = np.concatenate([ids, [-1]]).astype(np.int32)                    # a padding client too
    rb = batching.make_round_batches(data, ids, round_idx=r, seed=3, batch_size=4, num_steps=steps,
                                     pad_clients_to=5, plan=plan, epochs=mode.get('epochs', 1),
                                     local_steps=mode.get('local_steps', 0), shuffle=mode.get('shuffle', True))
    dev, weights = jax.device_get(gather(jnp.int32(r), jnp.asarray(padded)))
    for k in ('x', 'y', 'mask'):
      np.testing.assert_array_equal(dev[k], getattr(rb, k), err_msg=k)
    np.testing.assert_array_equal(weights, rb.num_examples)
    # every example of a client once per epoch (epoch mode)
    for i, k in enumerate(ids):
      if mode.get('epochs') and SIZES[k]:
        assert rb.mask[i].sum() == SIZES[k] * mode['epochs']


def test_sampling_is_uniform_without_replacement():
  counts = np.zeros(10)
  for r in range(500):
    ids = sampling.sample_clients(10, 3, seed=1, round_idx=r)
    assert len(set(ids.tolist())) == 3 and list(ids) == sorted(ids)
    counts[ids] += 1
  assert np.all(np.abs(counts / 150 - 1) < 0.25), counts


def test_sampling_from_a_padded_population_with_a_traced_size():
  # A batched program over population sizes (10 / 16 / 20 clients) draws each run's cohort from its own K inside
  # one padded population of 20: one compiled program, each run's ids equal to its unpadded draw bit for bit.
  key, pops = sampling.seed_key(7), (10, 16, 20)
  draw = jax.jit(jax.vmap(lambda n, r: sampling.sample_ids(key, r, n, 4, size=20), in_axes=(0, None)))
  for r in range(40):
    ids = np.asarray(draw(jnp.asarray(pops, jnp.int32), jnp.int32(r)))
    for i, k in enumerate(pops):
      np.testing.assert_array_equal(ids[i], np.asarray(sampling.sample_ids(key, r, k, 4)))
      assert ids[i].max() < k
  assert draw._cache_size() == 1


CASES = {
    'fedavg_sam': {'client.optimizer': 'sam', 'client.rho': 0.05},
    'scaffold_server_adam': {'algorithm': 'scaffold', 'server.optimizer': 'adam', 'server.lr': 0.01},
    'feddyn': {'algorithm': 'feddyn'},
    'swa': {'swa.enabled': True, 'swa.start_fraction': 0.3, 'swa.cycle': 2},
}


def _trainer(over, data, **engine):
  c = small_config(**over)
  c.rounds, c.eval_every, c.eval_every_last, c.clients_per_round = 9, 4, 2, 3
  c.data.num_clients = len(SIZES)
  c.engine.strategy, c.engine.clients_per_chunk = 'chunked', 2       # cohort padded to 4: a padding client
  for k, v in engine.items():
    c.engine[k] = v
  if c.algorithm != 'fedavg':
    from fedjax_flat.algorithms import registry
    c.algo.update({**registry.default_hparams(c.algorithm), **c.algo.to_dict()})
  return trainers.make_trainer(c, data=data)


def _leaves(t):
  out = jax.tree_util.tree_leaves(jax.device_get(t.server_state))
  if t.store is not None:
    sd = t.store.state_dict()
    out += [sd['ids']] + jax.tree_util.tree_leaves(sd['states'])
  return out


# fedavg_sam runs in the default suite; the stateful cases (client-state store + server optimizer state) in
# `pytest -m slow` (each case trains 5 trainers).
SLOW_CASES = ('feddyn', 'swa', 'scaffold_server_adam', 'fedavg_sam')   # fedavg stays in the default suite


@pytest.mark.parametrize('case', [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in sorted(CASES)])
def test_rounds_per_call_bit_identical(case):
  data = _data()
  runs = {}
  for name, engine in {'host_R1': dict(device_data=False), 'R1': dict(rounds_per_call=1),
                       'R2': dict(rounds_per_call=2), 'R4': dict(rounds_per_call=4),
                       'auto': {}}.items():
    t = _trainer(CASES[case], data, **engine)
    assert t.plan.device_rounds == (name != 'host_R1')
    t.train()
    runs[name] = (_leaves(t), t.records, t.recorder.comm_total)
    if name == 'R4':     # 9 rounds, eval at 4, 8, 8..9 (eval_every_last): blocks 4, 4, 1 -> one program
      assert t.driver.block_fn._cache_size() == 1
  ref_leaves, ref_records, ref_comm = runs['host_R1']
  assert [r['round'] for r in ref_records] == [4, 8, 9]
  for name, (leaves, records, comm) in runs.items():
    assert len(leaves) == len(ref_leaves)
    for a, b in zip(leaves, ref_leaves):
      np.testing.assert_array_equal(a, b, err_msg=name)
    assert comm == ref_comm
    for r, q in zip(records, ref_records, strict=True):
      for k in r:
        if k not in ('elapsed_s', 'rounds_per_s'):
          assert r[k] == q[k], (name, r['round'], k)


def test_block_ends_at_every_boundary_and_train_loss_per_round():
  t = _trainer({'checkpoint_every': 3}, _data(), rounds_per_call=5)

  class Ckpt:                               # records the rounds at which the loop offers a checkpoint
    every, seen = 3, []

    def maybe_save(self, trainer, final=False):
      self.seen.append(trainer.round)

    def wait(self):
      pass
  t.recorder.checkpointer = Ckpt()
  blocks = []
  step = t.driver.step
  t.driver.step = lambda state, store, r, n, end: blocks.append((r, n)) or step(state, store, r, n, end)
  t.train()
  assert blocks == [(0, 3), (3, 1), (4, 2), (6, 2), (8, 1)]     # eval 4, 8, 9; checkpoint 3, 6, 9
  assert Ckpt.seen == [3, 4, 6, 8, 9]
  ref = _trainer({}, _data(), device_data=False)
  ref.train()
  assert [r['train_loss'] for r in t.records] == [r['train_loss'] for r in ref.records]


def test_unsupported_rounds_per_call_is_a_config_error():
  data = _data()
  with pytest.raises(validate.ConfigError, match='rounds_per_call'):
    _trainer({'algorithm': 'scaffold', 'client_state_store': 'host'}, data, rounds_per_call=4)
  t = _trainer({'algorithm': 'scaffold', 'client_state_store': 'host'}, data)   # auto: the host path
  assert not t.plan.device_rounds and t.plan.rounds_per_call == 1
  with pytest.raises(validate.ConfigError, match='rounds_per_call'):
    validate.validate_config(small_config(**{'engine.rounds_per_call': 0}))
  with pytest.raises(validate.ConfigError, match='device_data'):
    validate.validate_config(small_config(**{'engine.device_data': 'yes'}))


def test_divergence_in_a_block_names_round_and_clients():
  t = _trainer({'client.lr': 1e30}, _data(), rounds_per_call=4)
  with pytest.raises(driver_lib.DivergenceError, match=r'at round 1: clients \[\d'):
    t.train()


def test_resume_from_a_block_boundary_checkpoint(tmp_path):
  data = _data()

  def config(**engine):
    c = _trainer({'algorithm': 'scaffold', 'checkpoint_every': 3}, data, **engine).config
    return c
  run_lib.run(config(device_data=False), str(tmp_path / 'ref'), data=data)   # the reference checkpoints
  polls = {'n': 0}

  def stop_after_two_blocks():        # the loop polls once per block: stop after the block ending at round 4
    polls['n'] += 1
    return polls['n'] == 2
  wd = str(tmp_path / 'resumed')
  first = run_lib.run(config(rounds_per_call=5), wd, data=data, stop_requested=stop_after_two_blocks)
  assert first['rounds_completed'] == 4
  second = run_lib.run(config(rounds_per_call=5), wd, data=data)
  assert second['resumed_from_round'] == 4 and second['rounds_completed'] == 9
  from fedjax_flat.training import checkpoint as ckpt_lib
  got, want = (ckpt_lib.read_checkpoint(str(tmp_path / d / 'checkpoints')) for d in ('resumed', 'ref'))
  for a, b in zip(got['server_leaves'], want['server_leaves'], strict=True):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(got['client_leaves'], want['client_leaves'], strict=True):
    np.testing.assert_array_equal(a, b)
  lines = lambda d: [json.loads(s) for s in (tmp_path / d / 'metrics.jsonl').read_text().splitlines()]
  strip = lambda recs: [{k: v for k, v in r.items() if k not in ('elapsed_s', 'rounds_per_s')} for r in recs]
  assert strip(lines('resumed')) == strip(lines('ref'))
