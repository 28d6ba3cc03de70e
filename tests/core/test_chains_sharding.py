"""Chain lanes sharded over devices (core/chains.make_chain_round_fn(mesh=...), ChainTrainer with
engine.shard_clients): 4 simulated CPU devices in a subprocess (XLA_FLAGS must be set before jax starts)
give the one-device parameters up to the order of the floating-point sums, with one compiled program.

Run as a module from the repository root (`python -m tests.core.test_chains_sharding --worker OUT NAME...`) it
is that subprocess."""
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.fixtures.paths import REPO

SIZES = [5, 9, 13, 4, 8, 11, 6, 7, 10, 3, 12, 9]
GROUPS = [[0, 1], [2, 3, 4], [5], [6, 7], [8, 9, 10], [11]]
CASES = {          # name: (algorithm, engine.strategy, config overrides)
    'fedseq_chunked_sam': ('fedseq', 'chunked', {'client.optimizer': 'sam', 'client.rho': 0.05,
                                                 'algo.fraction': 0.7}),
    'fedasyncseq_sequential': ('fedasyncseq', 'sequential', {'algo.fraction': 0.5, 'algo.merge_every': 2}),
}


def train(name, shard):
  import jax
  from tests.fixtures.configs import small_config
  from fedjax_flat.algorithms import registry
  from fedjax_flat.data.sources import builtin
  from fedjax_flat.training import chain_loop
  alg, strategy, over = CASES[name]
  c = small_config(algorithm=alg, rounds=3)
  c.algo.update({**registry.default_hparams(alg)})
  for k, v in over.items():
    sec, field = k.split('.')
    c[sec][field] = v
  c.data.num_clients = len(SIZES)
  c.engine.strategy, c.engine.clients_per_chunk, c.engine.shard_clients = strategy, 2, shard
  data = builtin.synthetic(len(SIZES), SIZES, seed=0)
  groups = [np.asarray(g) for g in (GROUPS if alg == 'fedseq' else GROUPS[:4])]
  t = chain_loop.ChainTrainer(c, data=data, superclients=groups)
  t.train()
  out = {f's{i}': np.asarray(a) for i, a in enumerate(jax.tree_util.tree_leaves(jax.device_get(t.server_state)))}
  out.update(sharded=np.asarray(t.plan.mesh is not None), devices=np.asarray(jax.device_count()),
             lanes=np.asarray(t.plan.num_lanes), cache_size=np.asarray(t.driver.round_fn._cache_size()),
             loss=np.asarray([r.get('train_loss', np.nan) for r in t.records], np.float64))
  return out


@pytest.mark.slow   # ~17 s, two host devices in a subprocess (CI time budget); fast: tests/core/test_sharding.py's
#                    sharded rounds and the FedSeq chain tests on one device
def test_sharded_lanes_equal_one_device(tmp_path):
  names = sorted(CASES)
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=4', 'JAX_PLATFORMS': 'cpu'}
  proc = subprocess.Popen([sys.executable, '-m', 'tests.core.test_chains_sharding', '--worker', str(tmp_path),
                           *names], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    refs = {n: train(n, False) for n in names}      # one device, here, while the 4-device process runs
    _, err = proc.communicate(timeout=600)
  finally:
    proc.kill()
  assert proc.returncode == 0, err[-3000:]
  for n in names:
    got = np.load(tmp_path / f'{n}.npz')
    assert bool(got['sharded']) and int(got['devices']) == 4 and not bool(refs[n]['sharded'])
    assert int(got['lanes']) % 4 == 0 and int(got['cache_size']) == 1, 'one compiled program for every round'
    keys = [k for k in got.files if k[0] == 's' and k[1:].isdigit()]
    assert keys and len(keys) == len([k for k in refs[n] if k[0] == 's' and k[1:].isdigit()])
    for k in keys:
      a, b = got[k], refs[n][k]
      if a.shape != b.shape:    # FedAsyncSeq: one slot per lane, padded to a multiple of the devices (p = 0)
        assert n.startswith('fedasyncseq') and a.shape[1:] == b.shape[1:] and a.shape[0] > b.shape[0], k
        a = a[:b.shape[0]]
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg=f'{n} {k}')
    np.testing.assert_allclose(got['loss'], refs[n]['loss'], rtol=2e-5, err_msg=n)


if __name__ == '__main__' and sys.argv[1:2] == ['--worker']:
  out_dir, run_names = sys.argv[2], sys.argv[3:]
  for run_name in run_names:
    np.savez(os.path.join(out_dir, f'{run_name}.npz'), **train(run_name, 'auto'))
