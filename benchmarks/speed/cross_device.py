r"""configs/cross_device.py's protocol measured (issue 50 item 4): per-round time after compilation, peak host memory
and where a stateful method's client states live (device / host / disk, and their bytes) at 10^4, 10^5 and 10^6
clients, for SCAFFOLD (stateful) and FedLESAM (stateless, the release's server direction).

Each (algorithm, population) is the cell `configs/cross_device.py:<population>,<algorithm>` as it stands (floyd
sampler, client_state_store='auto', cohort 100, 2 local steps of batch 2, 2 images a client) with a smaller model
and image so that the measurement takes minutes: 8x8x1 images (62 classes) and the MLP 64-8-62 (1,078 parameters:
SCAFFOLD's c_k is 4.3 KB a client, so the auto store puts 10^4 on the device, 10^5 on the host and 10^6 on disk:
10^6 x 4.3 KB = 4,112 MB > client_state_host_max_mb = 4,096). Evaluation off. Each runs in its own subprocess
(peak RSS = ru_maxrss): `--warm` rounds (compilation included), then `--repeats` stretches of `--rounds` rounds
(median s/round, wall and CPU).

  python -m benchmarks.speed.cross_device [--populations=1e4,1e5,1e6] [--algorithms=scaffold,fedlesam]
      [--out=benchmarks/speed/cross_device_cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.paths import REPO
from benchmarks.speed.population import _rss_mb, _run_rounds

CELL_FILE = os.path.join(REPO, 'configs', 'cross_device.py')


def _config(population: str, algorithm: str):
  from fedjax_flat.config import families as config_strings
  c = config_strings.load_config(f'{CELL_FILE}:{population},{algorithm}')
  c.data.input_shape = (8, 8, 1)
  c.data.test_size = 64
  c.model_kwargs.hidden = (8,)
  c.rounds = 10 ** 6
  c.eval_every = 10 ** 7
  c.progress_every_s = 1e9
  return c


def worker(population, algorithm, rounds, repeats, warm) -> dict:
  import jax
  from fedjax_flat.training import trainers
  base = _rss_mb()
  c = _config(population, algorithm)
  with tempfile.TemporaryDirectory(prefix='cross_device_') as wd:
    t0 = time.perf_counter()
    t = trainers.make_trainer(c, wd)
    _run_rounds(t, warm)
    startup = time.perf_counter() - t0
    wall, cpu = [], []
    for _ in range(repeats):
      w, p = time.perf_counter(), time.process_time()
      _run_rounds(t, rounds)
      wall.append((time.perf_counter() - w) / rounds)
      cpu.append((time.process_time() - p) / rounds)
    row = {'algorithm': algorithm, 'population': c.data.num_clients, 'cohort': c.clients_per_round,
           'cell_rounds': _config_rounds(population, algorithm), 'path': type(t.driver).__name__,
           'startup_s': startup, 's_per_round': statistics.median(wall), 'cpu_s_per_round': statistics.median(cpu),
           'wall_s_per_round_all': wall, 'rounds_run': t.round, 'rss_base_mb': base, 'peak_rss_mb': _rss_mb(),
           'num_params': int(sum(x.size for x in jax.tree_util.tree_leaves(t.server_state['params'])))}
    if t.store is not None:
      row.update(store_kind=t.store.kind, store_bytes_per_client=t.store.bytes_per_client,
                 store_population_bytes=t.store.bytes_per_client * c.data.num_clients,
                 store_bytes_written=t.store.nbytes(), clients_written=len(t.store))
      disk = os.path.join(wd, 'client_states')
      if os.path.isdir(disk):     # sparse memmaps: the apparent size and the blocks actually allocated
        files = [os.path.join(disk, f) for f in os.listdir(disk)]
        row['disk_apparent_mb'] = sum(os.path.getsize(f) for f in files) / 2**20
        row['disk_allocated_mb'] = sum(os.stat(f).st_blocks * 512 for f in files) / 2**20
    else:
      row['store_kind'] = 'none (stateless)'
  return row


def _config_rounds(population, algorithm):
  from fedjax_flat.config import families as config_strings
  return int(config_strings.load_config(f'{CELL_FILE}:{population},{algorithm}').rounds)


def _markdown(res: dict) -> str:
  m = res['machine']
  lines = [f"Machine: {m['cpu']} ({m['cpus']} CPUs), jax {m['jax']} {m['backend']}; shared with other engineers' "
           f"jobs: load before `{res['uptime_before']}`, after `{res['uptime_after']}`.", '',
           f"{res['rounds']} rounds x {res['repeats']} timed stretches after {res['warm']} warm rounds; cohort 100, "
           'MLP 64-8-62, 2 images a client.', '',
           '| algorithm | K | cell rounds (R C / K) | path | client states: where, bytes (written / all K) | '
           's/round | CPU s/round | x 10^4 | start-up s | peak RSS MB |',
           '|---|---|---|---|---|---|---|---|---|---|']
  first = {}
  for r in res['rows']:
    if 'failed' in r:
      lines.append(f"| {r['algorithm']} | {r['population']} | failed: {r['failed'][-160:]!r} |" + ' |' * 7)
      continue
    f = first.setdefault(r['algorithm'], r)
    if 'store_bytes_per_client' in r:
      store = (f"{r['store_kind']}: {r['store_bytes_written'] / 2**20:.1f} MB of "
               f"{r['store_population_bytes'] / 2**20:.0f} MB ({r['store_bytes_per_client']:,} B x "
               f"{r['clients_written']:,} written)")
      if 'disk_allocated_mb' in r:
        store += f"; files {r['disk_apparent_mb']:.0f} MB apparent, {r['disk_allocated_mb']:.1f} MB allocated"
    else:
      store = r['store_kind']
    lines.append(f"| {r['algorithm']} | {r['population']:,} | {r['cell_rounds']:,} "
                 f"({r['cell_rounds'] * r['cohort'] / r['population']:.2f}) | {r['path']} | {store} | "
                 f"{r['s_per_round'] * 1e3:.2f} ms | {r['cpu_s_per_round'] * 1e3:.2f} ms | "
                 f"{r['s_per_round'] / f['s_per_round']:.2f} | {r['startup_s']:.1f} | {r['peak_rss_mb']:.0f} |")
  return '\n'.join(lines) + '\n'


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--populations', default='1e4,1e5,1e6')
  ap.add_argument('--algorithms', default='scaffold,fedlesam')
  ap.add_argument('--rounds', type=int, default=10, help='rounds per timed stretch')
  ap.add_argument('--repeats', type=int, default=3)
  ap.add_argument('--warm', type=int, default=3)
  ap.add_argument('--out', default=os.path.join(REPO, 'benchmarks', 'speed', 'cross_device_cpu'))
  ap.add_argument('--worker', default=None, help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.worker:
    pop, alg = a.worker.split(':')
    print('RESULT ' + json.dumps(worker(pop, alg, a.rounds, a.repeats, a.warm), default=str), flush=True)
    return
  from benchmarks.speed import bench_util
  res = {'machine': bench_util.machine_info(), 'uptime_before': bench_util.uptime(), 'rounds': a.rounds,
         'repeats': a.repeats, 'warm': a.warm, 'rows': []}
  for alg in a.algorithms.split(','):
    for pop in a.populations.split(','):
      env = {**os.environ, 'JAX_PLATFORMS': os.environ.get('JAX_PLATFORMS', 'cpu')}
      p = subprocess.run([sys.executable, '-m', 'benchmarks.speed.cross_device', f'--worker={pop}:{alg}',
                          f'--rounds={a.rounds}', f'--repeats={a.repeats}', f'--warm={a.warm}'],
                         capture_output=True, text=True, env=env, cwd=REPO)
      line = [x for x in p.stdout.splitlines() if x.startswith('RESULT ')]
      row = (json.loads(line[0][len('RESULT '):]) if p.returncode == 0 and line else
             {'algorithm': alg, 'population': pop, 'failed': f'status {p.returncode}: {p.stderr[-400:]}'})
      row['uptime'] = bench_util.uptime()
      res['rows'].append(row)
      print(json.dumps({k: row.get(k) for k in ('algorithm', 'population', 'path', 'store_kind', 's_per_round',
                                                 'peak_rss_mb', 'failed')}), file=sys.stderr, flush=True)
  res['uptime_after'] = bench_util.uptime()
  bench_util.write_report(a.out, res, _markdown)


if __name__ == '__main__':
  main()
