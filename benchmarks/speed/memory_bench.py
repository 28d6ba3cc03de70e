"""Peak memory (RSS) against clients per round: chunked client execution vs one vmap over the cohort.

Strategies: 'vmap' (all clients of the round in one vmap), 'chunked' (engine.strategy='chunked',
clients_per_chunk=--chunk: vmap over a chunk, lax.scan over chunks), 'stream' (chunked + engine.stream_batches:
the host builds and copies only the current chunk's batches, core/streaming.py).

Setup: the CIFAR CNN ('cifar_cnn', 797,962 parameters) on synthetic 32x32x3 float32 data, a population of
`--population` clients with 8 examples each, 1 local step of batch 8 (FedAvg, client SGD), server SGD.
Each configuration runs in its own subprocess (peak RSS = resource.getrusage(RUSAGE_SELF).ru_maxrss, which
only grows): `setup` is the peak after building the Trainer (data, model, evaluator: the same for every
configuration), `peak` after 2 rounds (compile + run). `round_delta` = peak - setup is what the rounds add.
`host_batches` is the size of the host batch arrays that exist at once: the round's [C, S, B, 32, 32, 3] for
'vmap' and 'chunked' (it grows with the cohort), one chunk's [chunk, S, B, ...] for 'stream'.

  .venv/bin/python -m benchmarks.speed.memory_bench               # chunked, stream: 10/100/1000; vmap: 10/100
  .venv/bin/python -m benchmarks.speed.memory_bench --cohorts=10,100,1000 --strategies=chunked,stream,vmap \
      --max_vmap_gb=12 --json=/tmp/mem.json

A one-vmap cohort keeps every client's parameters, gradients and activations live at once; the script skips
vmap configurations whose estimate (7.5 parameter copies per client, as measured at 100) exceeds --max_vmap_gb, so a
shared
machine is not pushed into swap or the OOM killer (the estimate is printed instead).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

from benchmarks.paths import REPO

PARAMS = 797_962


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # Linux: KiB


def worker(strategy: str, cohort: int, chunk: int, population: int, rounds: int) -> dict:
  import jax
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.training import trainers
  from fedjax_flat.config.default_config import default_config

  c = default_config()
  c.dataset = 'synthetic'
  c.data.num_clients = population
  c.model = 'cifar_cnn'
  c.rounds = rounds
  c.clients_per_round = cohort
  c.client.batch_size = 8
  c.client.local_steps = 1
  c.client.lr = 0.01
  c.eval_every = 10 ** 6
  c.progress_every_s = 1e9
  chunked = strategy in ('chunked', 'stream')
  c.engine.strategy = 'chunked' if chunked else strategy
  c.engine.clients_per_chunk = chunk if chunked else 0
  c.engine.stream_batches = strategy == 'stream'
  c.engine.shard_clients = False
  data = synthetic(population, 8, input_shape=(32, 32, 3), num_classes=10, test_size=64, seed=0)
  t = trainers.make_trainer(c, data=data)
  jax.block_until_ready(t.server_state)
  setup = _rss_mb()
  times = []
  host_bytes = 0
  for r in range(rounds):
    t0 = time.perf_counter()
    rb = t.driver.prepare_round(r)
    batches = rb.chunk_batches(0) if t.plan.stream else rb.as_dict()   # streamed: only one chunk at a time
    host_bytes = sum(a.nbytes for a in batches.values())
    del batches
    t.server_state, _ = t.driver.run_round(t.server_state, t.store, r, rb)
    jax.block_until_ready(t.server_state)
    times.append(time.perf_counter() - t0)
    del rb
  peak = _rss_mb()
  return {'strategy': strategy, 'cohort': cohort, 'padded_cohort': t.plan.cohort, 'chunk': t.plan.chunk,
          'setup_mb': setup,
          'peak_mb': peak, 'round_delta_mb': peak - setup,
          'host_batches_mb': host_bytes / 2 ** 20, 'first_round_s': times[0], 'last_round_s': times[-1],
          'backend': jax.default_backend(), 'devices': jax.device_count()}


def vmap_estimate_gb(cohort: int) -> float:
  return 7.5 * cohort * PARAMS * 4 / 2 ** 30     # measured: vmap over 100 clients adds ~24 MB per client


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--cohorts', default='10,100,1000')
  ap.add_argument('--strategies', default='chunked,stream,vmap',
                  help="'chunked' (engine.strategy='chunked'), 'stream' (chunked + engine.stream_batches), 'vmap'")
  ap.add_argument('--chunk', type=int, default=10)
  ap.add_argument('--population', type=int, default=1000)
  ap.add_argument('--rounds', type=int, default=2)
  ap.add_argument('--max_vmap_gb', type=float, default=3.0)
  ap.add_argument('--json', default=None)
  ap.add_argument('--worker', default=None, help=argparse.SUPPRESS)
  a = ap.parse_args()
  if a.worker:
    strategy, cohort = a.worker.split(':')
    print('RESULT ' + json.dumps(worker(strategy, int(cohort), a.chunk, a.population, a.rounds)), flush=True)
    return
  rows = []
  for strategy in a.strategies.split(','):
    for cohort in [int(x) for x in a.cohorts.split(',')]:
      if strategy == 'vmap' and vmap_estimate_gb(cohort) > a.max_vmap_gb:
        rows.append({'strategy': strategy, 'cohort': cohort, 'skipped': True,
                     'estimate_gb': vmap_estimate_gb(cohort)})
        print(f'{strategy:8s} {cohort:5d}  skipped: estimated {vmap_estimate_gb(cohort):.1f} GB > '
              f'--max_vmap_gb={a.max_vmap_gb}', flush=True)
        continue
      env = {**os.environ, 'JAX_PLATFORMS': os.environ.get('JAX_PLATFORMS', 'cpu')}
      cmd = [sys.executable, '-m', 'benchmarks.speed.memory_bench', f'--worker={strategy}:{cohort}',
             f'--chunk={a.chunk}',
             f'--population={a.population}', f'--rounds={a.rounds}']
      res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
      line = [x for x in res.stdout.splitlines() if x.startswith('RESULT ')]
      if res.returncode != 0 or not line:
        rows.append({'strategy': strategy, 'cohort': cohort, 'failed': True, 'returncode': res.returncode,
                     'stderr': res.stderr[-500:]})
        print(f'{strategy:8s} {cohort:5d}  FAILED (status {res.returncode}): {res.stderr[-300:]}', flush=True)
        continue
      row = json.loads(line[0][len('RESULT '):])
      rows.append(row)
      print(f"{strategy:8s} {cohort:5d}  peak {row['peak_mb']:7.0f} MB  setup {row['setup_mb']:6.0f} MB  "
            f"rounds add {row['round_delta_mb']:6.0f} MB  host batches {row['host_batches_mb']:6.1f} MB  "
            f"round {row['last_round_s']:.2f} s (first {row['first_round_s']:.1f} s)", flush=True)
  print()
  print('| strategy | clients/round | chunk | peak RSS (MB) | after setup (MB) | added by rounds (MB) | '
        'host batches (MB) | round (s) |')
  print('|---|---|---|---|---|---|---|---|')
  for r in rows:
    if r.get('skipped'):
      print(f"| {r['strategy']} | {r['cohort']} | {r['cohort']} | not run (estimate {r['estimate_gb']:.1f} GB) "
            '| | | | |')
    elif r.get('failed'):
      print(f"| {r['strategy']} | {r['cohort']} | | failed (status {r['returncode']}) | | | | |")
    else:
      print(f"| {r['strategy']} | {r['cohort']} | {r['chunk']} | {r['peak_mb']:.0f} | {r['setup_mb']:.0f} | "
            f"{r['round_delta_mb']:.0f} | {r['host_batches_mb']:.1f} | {r['last_round_s']:.2f} |")
  if a.json:
    with open(a.json, 'w') as f:
      json.dump({'rows': rows, 'machine': platform.platform(), 'cpus': os.cpu_count(),
                 'population': a.population, 'chunk': a.chunk}, f, indent=2)


if __name__ == '__main__':
  main()
