"""Subprocess helper of tests/test_sharding.py: trains small configs on N forced CPU devices.

  python tests/scale_worker.py --devices=4 --out=DIR NAME [NAME ...]

XLA_FLAGS must be set before jax initializes, hence a separate process. Writes DIR/NAME.npz with the final
server-state leaves ('s0', 's1', ...) and the client-state store ('ids', 'c0', ...).
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


CACHE_DIR = os.path.join(os.environ.get('TMPDIR', '/tmp'), f'fedjax_flat_scale_tests_xla_cache_{os.getuid()}')
CACHE_ENV = {'JAX_COMPILATION_CACHE_DIR': CACHE_DIR, 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
             'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0'}


def persistent_compile_cache():
  """Generator for a module-scoped fixture: XLA's persistent compilation cache for these tests only.

  The scale/checkpoint tests build many Trainers and subprocesses that compile the same small programs;
  a cached executable is the same compiled code, so results (and bit-exactness checks) are unaffected.
  """
  import jax
  from jax._src import compilation_cache
  keys = ('jax_compilation_cache_dir', 'jax_persistent_cache_min_compile_time_secs',
          'jax_persistent_cache_min_entry_size_bytes')
  old = {k: jax.config.values[k] for k in keys}
  jax.config.update('jax_compilation_cache_dir', CACHE_DIR)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  compilation_cache.reset_cache()
  yield
  for k, v in old.items():
    jax.config.update(k, v)
  compilation_cache.reset_cache()


def small_data():
  from fedjax_flat.data.sources.builtin import synthetic
  return synthetic(8, [3, 17, 6, 9, 30, 1, 12, 5], input_shape=(4, 4, 1), num_classes=4, seed=3)


CONFIGS = {
    # name: (algorithm, strategy, clients_per_chunk, server optimizer)
    'fedavg_vmap': ('fedavg', 'vmap', 0, 'sgd'),
    'fedavg_chunked_adam': ('fedavg', 'chunked', 2, 'adam'),
    'scaffold_sequential': ('scaffold', 'sequential', 0, 'sgd'),
}


def make_config(name, shard):
  from fedjax_flat.config.default_config import default_config
  alg, strategy, chunk, server = CONFIGS[name]
  c = default_config()
  c.dataset = 'synthetic'
  c.model = 'mlp'
  c.algorithm = alg
  c.data.num_clients = 8            # small_data's population (SCAFFOLD scales by N)
  c.rounds = 3
  c.clients_per_round = 5           # 4 devices: padded to 8 (padding clients on the last device)
  c.client.batch_size = 4
  c.client.lr = 0.1
  c.server.optimizer = server
  c.server.lr = 1.0 if server == 'sgd' else 0.01
  c.eval_every = 3
  c.progress_every_s = 1e9
  c.engine.strategy = strategy
  c.engine.clients_per_chunk = chunk
  c.engine.shard_clients = shard
  return c


def train(name, shard):
  import jax
  import numpy as np
  from fedjax_flat.training import trainers
  t = trainers.make_trainer(make_config(name, shard), data=small_data())
  t.train()
  out = {f's{i}': np.asarray(a) for i, a in enumerate(jax.tree_util.tree_leaves(jax.device_get(t.server_state)))}
  if t.store is not None:
    sd = t.store.state_dict()
    out['ids'] = sd['ids']
    out.update({f'c{i}': np.asarray(a) for i, a in enumerate(jax.tree_util.tree_leaves(sd['states']))})
  out['sharded'] = np.asarray(t.mesh is not None)
  out['num_devices'] = np.asarray(jax.device_count())
  out['cohort'] = np.asarray(t.cohort)
  out['cache_size'] = np.asarray(t.round_fn._cache_size())
  return out


def main(argv):
  import argparse
  ap = argparse.ArgumentParser()
  ap.add_argument('--devices', type=int, default=4)
  ap.add_argument('--out', required=True)
  ap.add_argument('names', nargs='+')
  a = ap.parse_args(argv)
  os.environ['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={a.devices}'
  os.environ['JAX_PLATFORMS'] = 'cpu'
  os.environ.update(CACHE_ENV)
  sys.path.insert(0, REPO)
  import numpy as np
  for name in a.names:
    np.savez(os.path.join(a.out, f'{name}.npz'), **train(name, 'auto'))


if __name__ == '__main__':
  main(sys.argv[1:])
