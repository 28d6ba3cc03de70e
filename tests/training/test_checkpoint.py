"""Checkpoints (training/checkpoint.py): round trip, keep-last-K, corrupt fallback, config mismatch, bad disks."""
import asyncio
import errno
import gc
import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest

from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import plan as plan_lib
from fedjax_flat.training import trainers
from fedjax_flat.training import run as run_lib
from fedjax_flat.errors import ConfigError

from tests.fixtures import scale_worker
from tests.fixtures.configs import small_config
from tests.fixtures.scale_worker import small_data

_cache = pytest.fixture(scope='module', autouse=True)(scale_worker.persistent_compile_cache)


def tiny_config(**over):
  return small_config(**{'data.num_clients': 8, 'checkpoint_every': 1, 'keep_checkpoints': 3, **over})


def leaves(tree):
  return [np.asarray(a) for a in jax.tree_util.tree_leaves(jax.device_get(tree))]


def assert_trees_equal(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(leaves(a), leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_round_trip_server_optimizer_and_client_states(tmp_path):
  """Adam server state (a tuple of optax NamedTuples) and SCAFFOLD's client-state store come back exactly."""
  cfg = tiny_config(algorithm='scaffold', **{'server.optimizer': 'adam', 'server.lr': 0.01})
  t = trainers.make_trainer(cfg, data=small_data())
  t.train(num_rounds=3)
  ck = ckpt_lib.Checkpointer(str(tmp_path / 'ck'), keep=2)
  ck.save(t)
  ck.wait()
  fresh = trainers.make_trainer(cfg, data=small_data())
  assert ckpt_lib.Checkpointer(str(tmp_path / 'ck')).restore_latest(fresh) == 3
  assert_trees_equal(fresh.server_state, t.server_state)
  assert type(fresh.server_state['opt_state']) is type(t.server_state['opt_state'])
  a, b = t.store.state_dict(), fresh.store.state_dict()
  np.testing.assert_array_equal(a['ids'], b['ids'])
  assert len(a['ids']) > 0
  assert_trees_equal(a['states'], b['states'])
  assert fresh.round == 3 and fresh.records == json.loads(json.dumps(t.records))
  assert fresh.recorder.comm_total == t.recorder.comm_total
  assert fresh.recorder.pending_train_losses == t.recorder.pending_train_losses
  # ... and the restored run continues exactly like the original one.
  t.train()
  fresh.train()
  assert_trees_equal(fresh.server_state, t.server_state)
  ck.close()


def test_keep_last_k_and_metrics_once(tmp_path):
  wd = tmp_path / 'run'
  s = run_lib.run(tiny_config(rounds=5, keep_checkpoints=2), str(wd), data=small_data())
  assert s['rounds_completed'] == 5
  assert sorted(os.listdir(wd / 'checkpoints')) == ['4', '5']
  recs = [json.loads(line) for line in (wd / 'metrics.jsonl').read_text().splitlines()]
  assert [r['round'] for r in recs] == [2, 4, 5]
  ck = ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))
  assert ck['step'] == 5 and [r['round'] for r in ck['meta']['records']] == [2, 4, 5]
  assert ck['config']['model'] == 'mlp'


def test_keep_rounds_saved_and_never_deleted(tmp_path):
  """config.keep_rounds: those rounds are checkpointed off the checkpoint_every grid, survive keep-last-K, and
  restore to exactly the state an uninterrupted run had at that round."""
  wd = tmp_path / 'run'
  s = run_lib.run(tiny_config(rounds=7, checkpoint_every=3, keep_checkpoints=1, keep_rounds=(2, 5)), str(wd),
                  data=small_data())
  assert s['rounds_completed'] == 7
  assert sorted(os.listdir(wd / 'checkpoints'), key=int) == ['2', '5', '7']
  t = trainers.make_trainer(tiny_config(rounds=7), data=small_data())
  t.train(num_rounds=2)
  kept = trainers.make_trainer(tiny_config(rounds=7), data=small_data())
  ck = ckpt_lib.Checkpointer(str(wd / 'checkpoints'), read_only=True)
  assert ck.restore_step(kept, 2) == 2
  assert_trees_equal(kept.server_state, t.server_state)
  with pytest.raises(ConfigError, match='keep_rounds'):
    run_lib.run(tiny_config(rounds=7, keep_rounds=(0, 8)), str(tmp_path / 'bad'), data=small_data())


def _corrupt(step_dir, how):
  if how == 'server_item_removed':
    shutil.rmtree(step_dir / 'server')
  elif how == 'data_truncated':
    for root, _, files in os.walk(step_dir / 'server'):
      for f in files:
        open(os.path.join(root, f), 'w').close()
  elif how == 'meta_garbage':
    for root, _, files in os.walk(step_dir / 'meta'):
      for f in files:
        with open(os.path.join(root, f), 'w') as fh:
          fh.write('{not json')


@pytest.mark.parametrize('how', ['server_item_removed', 'data_truncated', 'meta_garbage'])
def test_corrupt_newest_falls_back_to_previous(tmp_path, caplog, how):
  data = small_data()
  ref = tmp_path / 'ref'
  run_lib.run(tiny_config(), str(ref), data=data)
  final = ckpt_lib.read_checkpoint(str(ref / 'checkpoints'))['server_leaves']
  wd = tmp_path / 'run'
  shutil.copytree(ref, wd)
  _corrupt(wd / 'checkpoints' / '4', how)
  (wd / 'checkpoints' / '5.orbax-checkpoint-tmp-123').mkdir()    # a write interrupted by a crash
  with caplog.at_level(logging.WARNING):
    s = run_lib.run(tiny_config(), str(wd), data=data)
  msg = ' '.join(r.getMessage() for r in caplog.records)
  assert f'{wd}/checkpoints/4 is corrupt or incomplete' in msg and 'resumed from round 3' in msg
  assert s['resumed_from_round'] == 3 and s['rounds_completed'] == 4
  assert os.listdir(tmp_path / 'run' / 'checkpoints.corrupt')[0].startswith('4-')
  assert not (wd / 'checkpoints' / '5.orbax-checkpoint-tmp-123').exists()
  got = ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))
  assert got['step'] == 4
  for a, b in zip(got['server_leaves'], final):
    np.testing.assert_array_equal(a, b)   # round 4 recomputed bit for bit
  recs = [json.loads(line)['round'] for line in (wd / 'metrics.jsonl').read_text().splitlines()]
  assert recs == [2, 4]


def test_mismatched_config_refused_unless_fresh(tmp_path):
  data = small_data()
  wd = tmp_path / 'run'
  run_lib.run(tiny_config(rounds=2), str(wd), data=data)
  for over, field in [({'algorithm': 'fedprox'}, 'algorithm'), ({'seed': 1}, 'seed'),
                      ({'client.lr': 0.2}, 'client.lr'), ({'model_kwargs.conv_impl': 'lax'}, 'model_kwargs')]:
    with pytest.raises(ckpt_lib.CheckpointMismatchError, match=rf'config\.{field}.*checkpoint') as e:
      run_lib.run(tiny_config(rounds=2, **over), str(wd), data=data)
    assert '--fresh' in str(e.value) and isinstance(e.value, ConfigError)
  s = run_lib.run(tiny_config(rounds=2, seed=1), str(wd), data=data, fresh=True)
  assert s['resumed_from_round'] is None and s['rounds_completed'] == 2
  assert ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))['config']['seed'] == 1
  recs = [json.loads(line)['round'] for line in (wd / 'metrics.jsonl').read_text().splitlines()]
  assert recs == [2]
  # More rounds for the same computation is a continuation, not a mismatch.
  s = run_lib.run(tiny_config(rounds=3, seed=1), str(wd), data=data)
  assert s['resumed_from_round'] == 2 and s['rounds_completed'] == 3


def test_unwritable_workdir_clear_error(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('x')
  with pytest.raises(ConfigError, match='workdir.*is not writable'):
    run_lib.run(tiny_config(), str(blocker / 'run'), data=small_data())


def test_failed_save_clear_error_previous_intact(tmp_path, monkeypatch):
  """A save that fails (here: ENOSPC on round 3) raises CheckpointError; resume uses round 2."""
  import orbax.checkpoint as ocp
  real_save = ocp.CheckpointManager.save

  def failing_save(self, step, *a, **kw):
    if step == 3:
      raise OSError(errno.ENOSPC, 'No space left on device')
    return real_save(self, step, *a, **kw)
  monkeypatch.setattr(ocp.CheckpointManager, 'save', failing_save)
  wd = tmp_path / 'run'
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r'round 3 to .*No space left on device.*previous checkpoint \(round 2\) is intact'):
    run_lib.run(tiny_config(), str(wd), data=small_data())
  assert sorted(os.listdir(wd / 'checkpoints')) == ['1', '2']
  monkeypatch.setattr(ocp.CheckpointManager, 'save', real_save)
  s = run_lib.run(tiny_config(), str(wd), data=small_data())
  assert s['resumed_from_round'] == 2 and s['rounds_completed'] == 4


def test_fields_added_since_the_checkpoint_count_as_their_defaults():
  """A checkpoint written before a config field existed (or with config.algo left empty) resumes when the
  field now holds its default, and is refused when it does not."""
  current = ckpt_lib.config_dict(tiny_config(algorithm='fedprox'))
  current['algo'] = {'mu': 0.01}                       # the registered default, as --config.algo.* fills it
  saved = json.loads(json.dumps(current))
  del saved['client']['base_optimizer'], saved['client']['adam_b2']
  saved['algo'] = {}
  defaults = plan_lib.algo_defaults(tiny_config(algorithm='fedprox'))   # what run.py passes before the build
  assert ckpt_lib.config_diffs(saved, current) == [('algo.mu', '<absent>', 0.01)]    # no defaults given
  assert ckpt_lib.config_diffs(saved, current, algo_defaults=defaults) == []
  current['client']['base_optimizer'] = 'adam'
  current['algo'] = {'mu': 0.5}
  assert ckpt_lib.config_diffs(saved, current, algo_defaults=defaults) == [('algo.mu', '<absent>', 0.5),
                                                   ('client.base_optimizer', '<absent>', 'adam')]


def test_a_sort_checkpoint_resumes_under_auto_where_auto_draws_sort(tmp_path):
  """Checkpoints written when 'sort' was the default resume under sampler='auto' for a population it draws with
  'sort' (up to sampling.AUTO_FLOYD_ABOVE); above it the draws differ and the restore refuses."""
  from fedjax_flat.data import sampling
  saved = ckpt_lib.config_dict(tiny_config(sampler='sort'))
  current = ckpt_lib.config_dict(tiny_config(sampler='auto'))
  assert ckpt_lib.config_diffs(saved, current) == []                         # before the data: left to restore
  assert ckpt_lib.config_diffs(saved, current, num_clients=sampling.AUTO_FLOYD_ABOVE) == []
  assert ckpt_lib.config_diffs(saved, current, num_clients=sampling.AUTO_FLOYD_ABOVE + 1) == [
      ('sampler', 'sort', 'auto')]
  saved['sampler'] = 'floyd'
  assert ckpt_lib.config_diffs(saved, current, num_clients=sampling.AUTO_FLOYD_ABOVE + 1) == []
  assert ckpt_lib.config_diffs(saved, current, num_clients=10) == [('sampler', 'floyd', 'auto')]
  data = small_data()
  wd = tmp_path / 'run'
  run_lib.run(tiny_config(sampler='sort'), str(wd), data=data)
  ck = ckpt_lib.Checkpointer(str(wd / 'checkpoints'), read_only=True)
  t = trainers.make_trainer(tiny_config(sampler='auto'), data=data)
  assert ck.restore_latest(t) == 4 and t.plan.sampler.sampler == 'sort'
  ck.close()


def test_compute_dtype_must_match_and_an_older_checkpoint_ran_float32():
  """engine.compute_dtype changes the numbers (the only engine field that does): a checkpoint of the other
  dtype is a difference; a checkpoint written before the field existed computed in float32."""
  current = ckpt_lib.config_dict(tiny_config())
  saved = json.loads(json.dumps(current))
  del saved['engine']['compute_dtype']
  assert ckpt_lib.config_diffs(saved, current) == []
  current['engine']['compute_dtype'] = 'bfloat16'
  assert ckpt_lib.config_diffs(saved, current) == [('engine.compute_dtype', '<absent>', 'bfloat16')]
  saved['engine']['compute_dtype'] = 'float32'
  assert ckpt_lib.config_diffs(saved, current) == [('engine.compute_dtype', 'float32', 'bfloat16')]
  current['engine'].update(compute_dtype='float32', strategy='sequential', unroll=2)   # warned, not refused
  assert ckpt_lib.config_diffs(saved, current) == []


def _largest_array_file(item_dir):
  files = [p for p in item_dir.rglob('*') if p.is_file() and p.parent.name == 'd']
  return max(files, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize('item, algorithm', [('server', 'fedavg'), ('clients', 'scaffold')])
def test_bit_rot_in_the_newest_checkpoint_falls_back(tmp_path, caplog, item, algorithm):
  """Bytes flipped inside the newest checkpoint's array data load without any orbax error; the content hashes
  catch them, the fallback takes the previous checkpoint, and the recomputed run is the uninterrupted one."""
  data = small_data()
  cfg = tiny_config(algorithm=algorithm)
  ref = tmp_path / 'ref'
  run_lib.run(cfg, str(ref), data=data)
  final = ckpt_lib.read_checkpoint(str(ref / 'checkpoints'))
  detected = 0
  for i, where in enumerate((0.35, 0.65)):
    wd = tmp_path / f'run{i}'
    shutil.copytree(ref, wd)
    f = _largest_array_file(wd / 'checkpoints' / '4' / item)
    raw = bytearray(f.read_bytes())
    raw[int(len(raw) * where)] ^= 0x5A
    f.write_bytes(bytes(raw))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      s = run_lib.run(cfg, str(wd), data=data)
    msg = ' '.join(r.getMessage() for r in caplog.records)
    if s['resumed_from_round'] == 3:
      assert f'{wd}/checkpoints/4 is corrupt' in msg, msg
      detected += 'content hash mismatch' in msg
    got = ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))
    for a, b in zip(got['server_leaves'], final['server_leaves'], strict=True):
      np.testing.assert_array_equal(a, b)
    if final['client_leaves'] is not None:
      for a, b in zip(got['client_leaves'], final['client_leaves'], strict=True):
        np.testing.assert_array_equal(a, b)
  assert detected >= 1


def _edit_meta(step_dir, fn):
  p = step_dir / 'meta' / 'metadata'
  meta = json.loads(p.read_text())
  fn(meta)
  p.write_text(json.dumps(meta))


def test_edited_metadata_is_corrupt_and_unhashed_checkpoints_still_restore(tmp_path, caplog):
  data = small_data()
  ref = tmp_path / 'ref'
  run_lib.run(tiny_config(), str(ref), data=data)
  wd = tmp_path / 'edited'
  shutil.copytree(ref, wd)

  def edit(meta):
    meta['records'][-1]['test_accuracy'] += 0.125     # still valid JSON, a different number
  _edit_meta(wd / 'checkpoints' / '4', edit)
  with caplog.at_level(logging.WARNING):
    s = run_lib.run(tiny_config(), str(wd), data=data)
  assert s['resumed_from_round'] == 3 and 'content hash mismatch in its metadata' in caplog.text
  # A checkpoint written before hashes existed (format 1) restores, unverified.
  wd = tmp_path / 'format1'
  shutil.copytree(ref, wd)

  def strip(meta):
    meta['format'] = 1
    for k in ('server_sha256', 'clients_sha256', 'config_sha256', 'meta_sha256'):
      meta.pop(k)
  _edit_meta(wd / 'checkpoints' / '4', strip)
  s = run_lib.run(tiny_config(rounds=5), str(wd), data=data)
  assert s['resumed_from_round'] == 4


def test_after_a_failed_restore_the_closed_loop_filter_stays_until_exit(tmp_path):
  """A corrupt checkpoint's orphaned tensorstore reads can call back into orbax's closed asyncio loop after the
  Checkpointer is closed (even while the process exits: 'hessian corrupt checkpoint' once printed a traceback
  under load): after a failed restore the filter stays installed; it drops only that error."""
  import sys
  import types
  data = small_data()
  wd = tmp_path / 'run'
  run_lib.run(tiny_config(), str(wd), data=data)
  for f in (wd / 'checkpoints' / '4' / 'server').rglob('*'):
    if f.is_file() and f.parent.name == 'd':          # array data only: the reads start, then fail
      f.write_bytes(b'')
  saved = sys.unraisablehook
  sys.unraisablehook = sys.__unraisablehook__     # whatever an earlier test in this process left installed
  try:
    ck = ckpt_lib.Checkpointer(str(wd / 'checkpoints'), read_only=True)
    assert ck.restore_latest(trainers.make_trainer(tiny_config(), data=data)) == 3
    ck.close()
    hook = sys.unraisablehook
    assert hook is ck._quiet and hook.keep
    seen = []
    hook.previous = lambda u: seen.append(u.exc_value)
    hook(types.SimpleNamespace(exc_value=RuntimeError('Event loop is closed')))
    hook(types.SimpleNamespace(exc_value=ValueError('another error')))
    assert [str(e) for e in seen] == ['another error']
    # asyncio's report of a read task collected with its error unread: tensorstore's dropped, others kept.
    logged = []
    catch = logging.Handler()
    catch.emit = lambda r: logged.append(str(r.exc_info[1]))
    logging.getLogger('asyncio').addHandler(catch)
    try:
      for err in (ValueError("OUT_OF_RANGE: Error reading [tensorstore_spec='{}']"), ValueError('a user error')):
        loop = asyncio.new_event_loop()

        async def fail(err=err):
          raise err
        task = loop.create_task(fail())
        loop.run_until_complete(asyncio.wait([task]))
        loop.close()
        del task
        gc.collect()
    finally:
      logging.getLogger('asyncio').removeHandler(catch)
    assert logged == ['a user error']
    sys.unraisablehook = sys.__unraisablehook__
    ok = ckpt_lib.Checkpointer(str(wd / 'checkpoints'), read_only=True)    # a clean restore leaves nothing
    ok.restore_step(trainers.make_trainer(tiny_config(), data=data), 3)
    ok.close()
    assert sys.unraisablehook is sys.__unraisablehook__
  finally:
    sys.unraisablehook = saved


def test_a_checkpoint_keeps_its_cpu_kernel_path_and_another_path_resumes_with_a_warning(tmp_path, caplog,
                                                                                        monkeypatch):
  """The meta names the kernel path (cpu_paths.applied); resuming under another one says the rounds agree to fp32
  rounding, not bit for bit; under the same one nothing is said."""
  from fedjax_flat import cpu_paths
  monkeypatch.delenv(cpu_paths.ENV, raising=False)
  monkeypatch.delenv('XLA_FLAGS', raising=False)
  cfg = tiny_config()
  t = trainers.make_trainer(cfg, data=small_data())
  t.train(num_rounds=2)
  ck = ckpt_lib.Checkpointer(str(tmp_path / 'ck'))
  ck.save(t)
  ck.wait()
  assert ckpt_lib.read_checkpoint(str(tmp_path / 'ck'))['meta']['cpu_path'] == 'default'
  for path, warned in (('default', False), ('dense_direct', True)):
    monkeypatch.setenv(cpu_paths.ENV, path)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      assert ckpt_lib.Checkpointer(str(tmp_path / 'ck'), read_only=True).restore_latest(
          trainers.make_trainer(cfg, data=small_data())) == 2
    said = [r.getMessage() for r in caplog.records if 'CPU kernel path' in r.getMessage()]
    assert said == (["resuming under CPU kernel path 'dense_direct' from a checkpoint written under 'default': "
                     "the resumed rounds agree with an uninterrupted run to float32 rounding, not bit for bit "
                     "(resume under 'default', --cpu_path or XLA_FLAGS, for the same bits)"] if warned else [])
  ck.close()
