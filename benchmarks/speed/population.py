r"""Populations at the cost of the cohort (issue 54 item 2): time per round and memory against the population K
at a fixed cohort, for a stateless (FedAvg) and a stateful (SCAFFOLD) algorithm.

The samplers (config `sampler`): 'auto' (the default: 'sort' up to 10^4 clients, 'floyd' above), 'sort' (one key
per client per round, O(K)) and 'floyd' (O(C^2), data/sampling.py), so the table separates the draw's cost from the
rest of the round.

Setup: synthetic IID data (float32, built as CSR arrays), K clients x `--examples` examples of 8 features
(4 classes), the MLP 8-8-4 (108 parameters), `--cohort` clients per round, batch 2, one local step; defaults
everywhere else (the device path with blocks of rounds when it applies: training/plan.py). SCAFFOLD's
client-state store is whatever config `client_state_store='auto'` picks (device up to
client_state_device_max_mb, host up to client_state_host_max_mb, else memmaps on disk: core/client_state.py);
`--forced` adds SCAFFOLD rows with the store named (e.g. the disk store at 10^6).

Each (algorithm, K) runs in its own subprocess, one after another (peak RSS = ru_maxrss only grows):
  startup_s     data built + Trainer made + the first `--warm` rounds (compilation included)
  s_per_round   median wall seconds per round over `--repeats` timed stretches of `--rounds` rounds (steady state);
                cpu_s_per_round the same in this process's CPU seconds (steadier on a shared machine)
  rss_base_mb   RSS after importing jax and the library (before any data)
  peak_rss_mb   peak RSS after the timed rounds; beyond_data_mb = peak - base - the dataset's own bytes (x, y, index
                arrays); beyond_data_and_copy_mb also less the device path's copy of the data (on the CPU backend
                the "device" is this process: the copy is a second dataset in RSS)
  peak_rss_full_store_mb   (stateful, with the full checkpoint) the peak once every client's state is written
  store         the client-state store: kind and bytes (device: the whole population; host/disk: the rows written)
  checkpoint_s  (stateful) one checkpoint of the store with EVERY client written (`--full_checkpoint`): what a
                checkpoint of a long run costs once the whole population has been seen
  device memory jax's memory_stats() of the device (None on the CPU backend: then stated so)

  python -m benchmarks.speed.population [--populations=1000,10000,100000,1000000] [--algorithms=fedavg,scaffold]
      [--samplers=auto,sort,floyd] [--forced=scaffold:floyd:host:1000000,scaffold:floyd:disk:1000000] [--cohort=20]
      [--out=benchmarks/speed/population_cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.paths import REPO


def _rss_mb(peak: bool = True) -> float:
  if peak:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20


def _data(k: int, examples: int):
  """K clients x `examples` IID examples of 8 float32 features, 4 classes (class means + noise), as CSR arrays
  directly: drawn in float32 so that building them needs no float64 temporaries twice their size (the peak RSS
  is then the run's, not the generator's)."""
  import numpy as np
  from fedjax_flat.data.federated import FederatedDataset
  rng = np.random.default_rng(0)
  n = k * examples
  means = rng.standard_normal((4, 8), dtype=np.float32)
  y = rng.integers(0, 4, n, dtype=np.int32)
  x = rng.standard_normal((n, 8), dtype=np.float32)
  for lo in range(0, n, 1 << 18):      # in slices: means[y] whole would be a second x
    x[lo:lo + (1 << 18)] += means[y[lo:lo + (1 << 18)]]
  ty = rng.integers(0, 4, 32, dtype=np.int32)
  tx = rng.standard_normal((32, 8), dtype=np.float32) + means[ty]
  return FederatedDataset(x=x, y=y, client_index=np.arange(n, dtype=np.int64),
                          client_offsets=np.arange(0, n + 1, examples, dtype=np.int64), test_x=tx, test_y=ty,
                          num_classes=4, name='population')


def _config(algorithm, k, cohort, examples, store, host_max_mb, sampler='auto'):
  from fedjax_flat.config.default_config import default_config
  c = default_config()
  c.dataset, c.model, c.algorithm = 'synthetic', 'mlp', algorithm
  c.data.num_clients = k
  c.model_kwargs.hidden = (8,)
  c.clients_per_round = cohort
  c.client.batch_size, c.client.local_steps, c.client.lr = 2, 1, 0.05
  c.rounds = 10 ** 6
  c.eval_every = 10 ** 7
  c.progress_every_s = 1e9
  c.client_state_store = store
  c.sampler = sampler
  c.client_state_host_max_mb = int(host_max_mb) if float(host_max_mb).is_integer() else host_max_mb   # int field
  return c


def _run_rounds(t, n: int):
  """Rounds as Trainer.train runs them (blocks up to the recorder's boundaries), without the end-of-run report."""
  import jax
  end = t.begin_training(n)
  while t.round < end:
    r = t.round
    t.server_state, block = t.driver.step(t.server_state, t.store, r, t.block_length(r, end), end)
    t.recorder.record(t, block, end, lambda: False)
  jax.block_until_ready(t.server_state)


def worker(algorithm, sampler, k, cohort, examples, store, host_max_mb, rounds, repeats, warm,
           full_checkpoint) -> dict:
  import jax
  import numpy as np
  from fedjax_flat.training import checkpoint as ckpt_lib
  from fedjax_flat.training import trainers
  base = _rss_mb()
  with tempfile.TemporaryDirectory(prefix='population_') as wd:
    t0 = time.perf_counter()
    data = _data(k, examples)
    t_data = time.perf_counter() - t0
    t = trainers.make_trainer(_config(algorithm, k, cohort, examples, store, host_max_mb, sampler), wd, data=data)
    t_trainer = time.perf_counter() - t0 - t_data
    _run_rounds(t, warm)
    startup = time.perf_counter() - t0
    wall, cpu = [], []
    for _ in range(repeats):
      w, c = time.perf_counter(), time.process_time()
      _run_rounds(t, rounds)
      wall.append((time.perf_counter() - w) / rounds)
      cpu.append((time.process_time() - c) / rounds)
    data_bytes = int(sum(np.asarray(a).nbytes for a in (data.x, data.y, data.client_index, data.client_offsets)))
    row = {'algorithm': algorithm, 'sampler': sampler, 'population': k, 'cohort': cohort,
           'examples_per_client': examples,
           'path': type(t.driver).__name__, 'data_s': t_data, 'trainer_s': t_trainer, 'startup_s': startup,
           's_per_round': statistics.median(wall), 'cpu_s_per_round': statistics.median(cpu),
           'wall_s_per_round_all': wall, 'rss_base_mb': base, 'data_mb': data_bytes / 2**20}
    if t.store is not None:
      row['store_kind'] = t.store.kind
      row['store_bytes_per_client'] = t.store.bytes_per_client
      row['store_population_bytes'] = t.store.bytes_per_client * k
      row['store_bytes'] = t.store.nbytes()
      row['clients_written'] = len(t.store)
    dev = getattr(t.driver, 'dev_data', None)      # the device path's copy of the data (a second copy on CPU)
    row['device_data_mb'] = (sum(a.nbytes for a in jax.tree_util.tree_leaves(dev)) / 2**20) if dev else 0.0
    row['peak_rss_mb'] = _rss_mb()      # the rounds' peak, before the full-store checkpoint below
    row['beyond_data_mb'] = row['peak_rss_mb'] - base - row['data_mb']
    row['beyond_data_and_copy_mb'] = row['beyond_data_mb'] - row['device_data_mb']
    stats = jax.devices()[0].memory_stats()
    row['device_memory'] = (stats if stats else 'not available: jax memory_stats() is None on the '
                            f'{jax.default_backend()} backend (the device is this process: see peak RSS)')
    if t.store is not None and full_checkpoint:
      # Every client written once (the state after a long run), then one checkpoint of the run timed.
      # Random rows: the checkpoint compresses (orbax's ocdbt), so equal rows would measure nothing.
      tmpl = jax.device_get(t.store.gather(np.array([0])))
      rng = np.random.default_rng(1)
      step = 1 << 16
      for lo in range(0, k, step):
        ids = np.arange(lo, min(k, lo + step))
        t.store.scatter(ids, jax.tree_util.tree_map(
            lambda a: rng.standard_normal((len(ids),) + a.shape[1:], dtype=np.float32).astype(a.dtype), tmpl))
      ck = ckpt_lib.Checkpointer(os.path.join(wd, 'ck'), keep=1)
      w = time.perf_counter()
      ck.save(t)
      ck.wait()
      row['checkpoint_s'] = time.perf_counter() - w
      row['checkpoint_clients'] = len(t.store)
      row['checkpoint_mb'] = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(wd, 'ck'))
                                 for f in fs) / 2**20
      ck.close()
      row['peak_rss_full_store_mb'] = _rss_mb()
  return row


def _markdown(res: dict) -> str:
  m = res['machine']
  lines = [f"Machine: {m['cpu']} ({m['cpus']} CPUs), jax {m['jax']} {m['backend']}; GEMM {res['gemm_gflops']:.0f} "
           f"GFLOP/s; load before: `{res['uptime_before']}`; after: `{res['uptime_after']}`.", '',
           f"Cohort {res['cohort']} clients/round, {res['examples']} examples/client, MLP 8-8-4; "
           f"{res['rounds']} rounds x {res['repeats']} timed stretches after {res['warm']} warm rounds.", '',
           '| algorithm | sampler | K | path | store (kind, MB) | s/round | CPU s/round | x K=min | start-up s | '
           'data MB (+ device copy) | peak RSS MB | beyond data (less the copy) MB | x K=min | '
           'full checkpoint (peak RSS) |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  first = {}
  for r in res['rows']:
    if 'failed' in r:
      lines.append(f"| {r['algorithm']} | {r.get('sampler')} | {r['population']:,} | "
                   f"failed: {r['failed'][-120:]!r} |" + ' |' * 10)
      continue
    key = (r['algorithm'], r.get('sampler'), r.get('forced', ''))
    f = first.setdefault(key, r)
    store = (f"{r['store_kind']}, {r['store_bytes'] / 2**20:.1f} of {r['store_population_bytes'] / 2**20:.0f}"
             if 'store_kind' in r else '-')
    ck = (f"{r['checkpoint_s']:.1f} s, {r['checkpoint_mb']:.1f} MB, {r['checkpoint_clients']:,} clients "
          f"({r['peak_rss_full_store_mb']:.0f} MB)" if 'checkpoint_s' in r else '-')
    lines.append(f"| {r['algorithm']}{' (' + r['forced'] + ')' if r.get('forced') else ''} | {r['sampler']} | "
                 f"{r['population']:,} | "
                 f"{r['path']} | {store} | {r['s_per_round'] * 1e3:.2f} ms | {r['cpu_s_per_round'] * 1e3:.2f} ms | "
                 f"{r['s_per_round'] / f['s_per_round']:.2f} | {r['startup_s']:.1f} | "
                 f"{r['data_mb']:.0f} (+{r['device_data_mb']:.0f}) | {r['peak_rss_mb']:.0f} | "
                 f"{r['beyond_data_mb']:.0f} ({r['beyond_data_and_copy_mb']:.0f}) | "
                 f"{r['beyond_data_and_copy_mb'] / max(f['beyond_data_and_copy_mb'], 1e-9):.2f} | {ck} |")
  dev = next((r['device_memory'] for r in res['rows'] if 'device_memory' in r), None)
  lines += ['', f'Device memory: {dev}']
  return '\n'.join(lines) + '\n'


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--populations', default='1000,10000,100000,1000000')
  ap.add_argument('--algorithms', default='fedavg,scaffold')
  ap.add_argument('--samplers', default='auto,sort,floyd', help="config sampler: 'auto' (the default), 'sort', 'floyd'")
  ap.add_argument('--forced', default='scaffold:floyd:host:1000,scaffold:floyd:host:1000000,'
                  'scaffold:floyd:disk:1000,scaffold:floyd:disk:1000000',
                  help='extra rows ALGORITHM:SAMPLER:STORE:K with the client-state store named')
  ap.add_argument('--cohort', type=int, default=20)
  ap.add_argument('--examples', type=int, default=2)
  ap.add_argument('--rounds', type=int, default=20, help='rounds per timed stretch')
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--warm', type=int, default=5)
  ap.add_argument('--host_max_mb', type=float, default=4096)
  ap.add_argument('--full_checkpoint', default='true', choices=('true', 'false'))
  ap.add_argument('--out', default=os.path.join(REPO, 'benchmarks', 'speed', 'population_cpu'))
  ap.add_argument('--worker', default=None, help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.worker:
    alg, sampler, store, k = a.worker.split(':')
    row = worker(alg, sampler, int(k), a.cohort, a.examples, store, a.host_max_mb, a.rounds, a.repeats, a.warm,
                 a.full_checkpoint == 'true')
    print('RESULT ' + json.dumps(row, default=str), flush=True)
    return
  from benchmarks.speed import bench_util
  jobs = [(alg, s, 'auto', int(k), '') for alg in a.algorithms.split(',') for s in a.samplers.split(',')
          for k in a.populations.split(',')]
  jobs += [(*f.split(':')[:3], int(f.split(':')[3]), f.split(':')[2]) for f in a.forced.split(',') if f]
  res = {'machine': bench_util.machine_info(), 'gemm_gflops': bench_util.gemm_gflops(1024),
         'uptime_before': bench_util.uptime(), 'cohort': a.cohort, 'examples': a.examples, 'rounds': a.rounds,
         'repeats': a.repeats, 'warm': a.warm, 'host_max_mb': a.host_max_mb, 'rows': []}
  for alg, sampler, store, k, forced in jobs:
    env = {**os.environ, 'JAX_PLATFORMS': os.environ.get('JAX_PLATFORMS', 'cpu')}
    cmd = [sys.executable, '-m', 'benchmarks.speed.population', f'--worker={alg}:{sampler}:{store}:{k}',
           f'--cohort={a.cohort}', f'--examples={a.examples}', f'--rounds={a.rounds}', f'--repeats={a.repeats}',
           f'--warm={a.warm}', f'--host_max_mb={a.host_max_mb}', f'--full_checkpoint={a.full_checkpoint}']
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    line = [x for x in p.stdout.splitlines() if x.startswith('RESULT ')]
    row = (json.loads(line[0][len('RESULT '):]) if p.returncode == 0 and line else
           {'algorithm': alg, 'sampler': sampler, 'population': k,
            'failed': f'status {p.returncode}: {p.stderr[-400:]}'})
    row['forced'] = forced
    row['uptime'] = bench_util.uptime()
    res['rows'].append(row)
    print(json.dumps({x: row.get(x) for x in ('algorithm', 'sampler', 'forced', 'population', 'path', 'store_kind',
                                              's_per_round', 'startup_s', 'peak_rss_mb', 'checkpoint_s', 'failed')}),
          file=sys.stderr, flush=True)
  res['uptime_after'] = bench_util.uptime()
  bench_util.write_report(a.out, res, _markdown)


if __name__ == '__main__':
  main()
