"""Clients sharded over devices and hosts (core/sharding.py): same parameters as one device / one process.

Forced CPU devices need XLA_FLAGS before jax starts and jax.distributed needs separate processes, so those
runs are subprocesses (tests/fixtures/scale_worker.py, experiments/train.py); the one-device references run here.
"""
import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from fedjax_flat.core import sharding
from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import run as run_lib

from tests.fixtures import scale_worker
from tests.fixtures.configs import quickstart_with_flags
from tests.fixtures.paths import REPO

_cache = pytest.fixture(scope='module', autouse=True)(scale_worker.persistent_compile_cache)



def test_plan_cohort_per_device_blocks():
  # vmap: each device vmaps its whole block; chunked: the block is a multiple of the chunk.
  assert sharding.plan_cohort('vmap', 5, 0, 4) == (8, 2)
  assert sharding.plan_cohort('chunked', 10, 10, 4) == (12, 3)
  assert sharding.plan_cohort('chunked', 100, 10, 4) == (120, 10)
  assert sharding.plan_cohort('sequential', 5, 0, 2) == (6, 1)
  assert sharding.plan_cohort('vmap', 7, 0, 1) == (7, 7)


def test_placement_round_trip_on_one_device():
  mesh = sharding.client_mesh()
  pl = sharding.ClientPlacement(mesh, 6)
  np.testing.assert_array_equal(pl.local_rows, np.arange(6))
  assert not pl.partial
  x = np.arange(12.0, dtype=np.float32).reshape(6, 2)
  keys = jax.random.split(jax.random.key(0), 6)
  b, s, k, w, v = pl.place(({'x': x}, None, keys, np.ones(6), np.ones(6, bool)), batches_are_local=False)
  assert s is None and k.dtype == np.uint32 and k.shape == (6, 2)
  np.testing.assert_array_equal(pl.to_host(b['x']), x)
  np.testing.assert_array_equal(jax.random.key_data(jax.random.wrap_key_data(k)), jax.random.key_data(keys))
  with pytest.raises(ValueError, match="shard_clients"):
    sharding.resolve_shard_clients('yes')
  assert sharding.resolve_shard_clients('auto') == (jax.device_count() > 1)


def _assert_same(a, b, tol=1e-5):
  keys = [k for k in a.files if k[0] in 'sc' and k[1:].isdigit()]
  assert keys and keys == [k for k in b.files if k[0] in 'sc' and k[1:].isdigit()]
  for k in keys:
    np.testing.assert_allclose(a[k], b[k], rtol=tol, atol=tol, err_msg=k)


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_four_devices_same_params_as_one_device(tmp_path):
  names = list(scale_worker.CONFIGS)
  proc = subprocess.Popen([sys.executable, '-m', 'tests.fixtures.scale_worker', '--devices=4', f'--out={tmp_path}',
                           *names],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    refs = {}
    for name in names:    # one device, here, while the 4-device process runs
      out = scale_worker.train(name, False)
      np.savez(tmp_path / f'ref_{name}.npz', **out)
      refs[name] = np.load(tmp_path / f'ref_{name}.npz')
    _, err = proc.communicate(timeout=600)
  finally:
    proc.kill()
  assert proc.returncode == 0, err[-3000:]
  for name in names:
    got = np.load(tmp_path / f'{name}.npz')
    assert bool(got['sharded']) and int(got['num_devices']) == 4 and int(got['cohort']) == 8
    assert int(got['cache_size']) == 1, 'the sharded round (or block) program must compile once'
    assert bool(got['device_rounds']) == (not name.endswith('_host'))   # rounds in one program, sharded
    assert not bool(refs[name]['sharded'])
    _assert_same(got, refs[name])
    if 'ids' in refs[name].files:          # stateful algorithm: the same clients hold the same states
      np.testing.assert_array_equal(got['ids'], refs[name]['ids'])


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


TWO_HOST_FLAGS = ['--config.model=mlp', '--config.algorithm=scaffold', '--config.rounds=3',
                  '--config.clients_per_round=5', '--config.eval_every=3', '--config.checkpoint_every=2']


def test_two_processes_same_result_as_one_process(tmp_path):
  """Two local processes (2 CPU devices each) joined with jax.distributed, through the binary."""
  wd = tmp_path / 'two'
  ref = {}

  def reference():   # one process, one device; runs while the two processes start up
    ref.update(run_lib.run(quickstart_with_flags(TWO_HOST_FLAGS), str(tmp_path / 'one')))
  outs = _two_processes(wd, TWO_HOST_FLAGS, during=reference)
  assert 'process 0 of 2, 2 local / 4 global devices' in outs[0][1]
  assert 'done: 3 rounds' in outs[0][0] and 'done:' not in outs[1][0]    # only process 0 reports/writes
  two = ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))
  one = ckpt_lib.read_checkpoint(str(tmp_path / 'one' / 'checkpoints'))
  assert two['step'] == one['step'] == 3 and two['meta']['num_processes'] == 2
  for a, b in zip(two['server_leaves'], one['server_leaves']):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(two['client_ids'], one['client_ids'])
  for a, b in zip(two['client_leaves'], one['client_leaves']):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  recs = [json.loads(line) for line in (wd / 'metrics.jsonl').read_text().splitlines()]
  assert [r['round'] for r in recs] == [3]
  np.testing.assert_allclose(recs[0]['test_accuracy'], ref['final_test_accuracy'], atol=1e-6)


# slow [fedavg]: the default suite covers the streamed path by [scaffold] (the same path, with client state) and
# tests/algorithms/wrappers/test_robust.py::test_round_paths_give_the_same_median_run[streamed]
@pytest.mark.parametrize('algorithm', [pytest.param('fedavg', marks=pytest.mark.slow), 'scaffold'])
def test_streamed_batches_bit_identical_to_chunked(algorithm):
  """engine.stream_batches builds each chunk's batches on the host inside the round (O(chunk) memory)."""
  from fedjax_flat.training import trainers
  out = {}
  for stream in (False, True):
    c = scale_worker.make_config('fedavg_chunked_adam', False)
    c.algorithm = algorithm
    c.engine.stream_batches = stream
    t = trainers.make_trainer(c, data=scale_worker.small_data())
    t.train()
    fn = t.driver.block_fn if t.plan.device_rounds else t.driver.round_fn     # device path unless streaming
    assert fn._cache_size() == 1
    assert t.plan.device_rounds == (not stream)
    out[stream] = jax.tree_util.tree_leaves(jax.device_get(t.server_state))
    if t.store is not None:
      out[stream] += jax.tree_util.tree_leaves(t.store.state_dict())
  for a, b in zip(out[False], out[True], strict=True):
    np.testing.assert_array_equal(a, b)


def test_stream_with_sharding_refused():
  from fedjax_flat.training import trainers
  from fedjax_flat.errors import ConfigError
  c = scale_worker.make_config('fedavg_vmap', True)
  c.engine.stream_batches = True
  with pytest.raises(ConfigError, match='stream_batches'):
    trainers.make_trainer(c, data=scale_worker.small_data())


def _two_processes(wd, flags, timeout=600, during=None):
  port = _free_port()
  env = {**os.environ, **scale_worker.CACHE_ENV, 'JAX_NUM_CPU_DEVICES': '2', 'JAX_PLATFORMS': 'cpu'}
  env.pop('XLA_FLAGS', None)
  procs = [subprocess.Popen(
      [sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
       f'--config={os.path.join(REPO, "configs", "quickstart.py")}', f'--workdir={wd}', *flags,
       f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={i}'],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  try:
    if during is not None:
      during()
    outs = [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-4000:]
  return outs


@pytest.mark.slow
def test_two_processes_checkpoint_and_resume(tmp_path):
  """A 2-process run checkpointed at round 3 and resumed by 2 processes to round 5 = one process, 5 rounds."""
  flags = ['--config.model=mlp', '--config.algorithm=scaffold', '--config.clients_per_round=5',
           '--config.eval_every=1', '--config.checkpoint_every=2']
  wd = tmp_path / 'two'
  _two_processes(wd, flags + ['--config.rounds=3'])
  assert ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))['step'] == 3
  outs = _two_processes(wd, flags + ['--config.rounds=5'])
  assert 'resumed from round 3' in outs[0][0]
  run_lib.run(quickstart_with_flags(flags + ['--config.rounds=5']), str(tmp_path / 'one'))
  two = ckpt_lib.read_checkpoint(str(wd / 'checkpoints'))
  one = ckpt_lib.read_checkpoint(str(tmp_path / 'one' / 'checkpoints'))
  assert two['step'] == one['step'] == 5
  for a, b in zip(two['server_leaves'] + two['client_leaves'], one['server_leaves'] + one['client_leaves']):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  recs = [json.loads(line)['round'] for line in (wd / 'metrics.jsonl').read_text().splitlines()]
  assert recs == [1, 2, 3, 4, 5]
