"""Checkpoint overhead: time of a save (blocking part and until on disk) and of a restore vs a round.

Two setups: the quickstart (digits CNN, FedAvg, 5 clients/round; configs/quickstart.py) and the CIFAR CNN
(797,962 parameters; FedAvg with server momentum so the optimizer state is a second params-sized tree;
10 clients/round of 50 synthetic 32x32x3 images, batch 16, 1 epoch; chunked strategy, 5 clients per chunk).
For each: the median round time (after compilation), the median blocking time of `Checkpointer.save` (host
copy + launching the asynchronous write: what a round pays when checkpoint_every=1), the median time until
the checkpoint is on disk (save + wait), a restore into a fresh Trainer, and the checkpoint's size; then the
run loop (`Trainer.train`, evaluation off) with checkpoint_every = 0, 10 and 1: seconds per round, where a save
also waits for the previous asynchronous write to finish.

  .venv/bin/python -m benchmarks.speed.checkpoint_bench [--repeats=5] [--json=/tmp/ckpt.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import jax
import numpy as np

from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import trainers


def quickstart():
  from configs import quickstart as q
  c = q.get_config()
  c.eval_every = 10 ** 6
  c.progress_every_s = 1e9
  return c, None


def cifar_cnn():
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.config.default_config import default_config
  c = default_config()
  c.dataset = 'synthetic'
  c.data.num_clients = 100
  c.model = 'cifar_cnn'
  c.clients_per_round = 10
  c.client.batch_size = 16
  c.client.lr = 0.01
  c.server.momentum = 0.9
  c.engine.strategy = 'chunked'
  c.engine.clients_per_chunk = 5
  c.eval_every = 10 ** 6
  c.progress_every_s = 1e9
  return c, synthetic(100, 50, input_shape=(32, 32, 3), num_classes=10, test_size=64, seed=0)


def du(path):
  return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def bench(name, make, repeats, loop_rounds):
  config, data = make()
  config.rounds = 1000
  t = trainers.make_trainer(config, data=data)
  for r in range(2):                                  # compile + warm up
    t.server_state, _ = t.driver.run_round(t.server_state, t.store, r, t.driver.prepare_round(r))
    t.round = r + 1
  jax.block_until_ready(t.server_state)
  rounds, saves, durable = [], [], []
  tmp = tempfile.mkdtemp(prefix='ckpt_bench_')
  ck = ckpt_lib.Checkpointer(os.path.join(tmp, 'checkpoints'), keep=2)
  for i in range(repeats):
    r = t.round
    rb = t.driver.prepare_round(r)
    t0 = time.perf_counter()
    t.server_state, _ = t.driver.run_round(t.server_state, t.store, r, rb)
    jax.block_until_ready(t.server_state)
    rounds.append(time.perf_counter() - t0)
    t.round = r + 1
    t0 = time.perf_counter()
    ck.save(t)
    saves.append(time.perf_counter() - t0)
    ck.wait()
    durable.append(time.perf_counter() - t0)
  size = du(os.path.join(tmp, 'checkpoints', str(t.round)))
  fresh = trainers.make_trainer(config, data=data)
  t0 = time.perf_counter()
  step = ckpt_lib.Checkpointer(os.path.join(tmp, 'checkpoints'), keep=2).restore_latest(fresh)
  jax.block_until_ready(fresh.server_state)
  restore = time.perf_counter() - t0
  assert step == t.round
  ck.close()
  # The run loop with checkpoint_every = 0 (never), 10 and 1: wall time per round (includes waiting for the
  # previous asynchronous write before the next save).
  # Wall and process CPU seconds (all threads, so the background writes count even when they overlap).
  t.train(num_rounds=1)                                   # compiles the evaluation that ends train()
  loop_s, loop_cpu = {}, {}
  for every in (0, 10, 1, 0):
    d = tempfile.mkdtemp(prefix='ckpt_loop_', dir=tmp)
    t.recorder.checkpointer = (ckpt_lib.Checkpointer(os.path.join(d, 'checkpoints'), keep=2, every=every) if every
                               else None)
    n = loop_rounds
    t0, c0 = time.perf_counter(), time.process_time()
    t.train(num_rounds=n)
    jax.block_until_ready(t.server_state)
    wall, cpu = (time.perf_counter() - t0) / n, (time.process_time() - c0) / n
    if every == 0 and every in loop_s:                    # 'no checkpoint' measured before and after
      wall, cpu = (wall + loop_s[0]) / 2, (cpu + loop_cpu[0]) / 2
    loop_s[every], loop_cpu[every] = wall, cpu
    if t.recorder.checkpointer is not None:
      t.recorder.checkpointer.close()
  shutil.rmtree(tmp, ignore_errors=True)
  med = lambda xs: float(np.median(xs))
  return {'setup': name, 'num_params': t.plan.num_params, 'round_s': med(rounds), 'save_blocking_s': med(saves),
          'save_durable_s': med(durable), 'restore_s': restore, 'checkpoint_mb': size / 2 ** 20,
          'blocking_over_round': med(saves) / med(rounds), 'repeats': repeats,
          'loop_round_s': {str(k): v for k, v in loop_s.items()},
          'loop_round_cpu_s': {str(k): v for k, v in loop_cpu.items()},
          'loop_overhead_every_1': loop_s[1] / loop_s[0] - 1, 'loop_overhead_every_10': loop_s[10] / loop_s[0] - 1,
          'cpu_overhead_every_1': loop_cpu[1] / loop_cpu[0] - 1,
          'cpu_overhead_every_10': loop_cpu[10] / loop_cpu[0] - 1}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--setups', default='quickstart,cifar_cnn')
  ap.add_argument('--loop_rounds', default='40,10', help='rounds of the run-loop timing, per setup')
  ap.add_argument('--json', default=None)
  a = ap.parse_args()
  makers = {'quickstart': quickstart, 'cifar_cnn': cifar_cnn}
  setups = a.setups.split(',')
  loops = [int(x) for x in a.loop_rounds.split(',')]
  rows = [bench(s, makers[s], a.repeats, loops[i % len(loops)]) for i, s in enumerate(setups)]
  print('| setup | params | round (s) | save, blocking (s) | save, until on disk (s) | restore (s) | size (MB) | '
        'run loop s/round: no ckpt / every 10 / every 1 | wall overhead every 10 / every 1 | '
        'CPU overhead every 10 / every 1 |')
  print('|---|---|---|---|---|---|---|---|---|---|')
  for r in rows:
    ls = r['loop_round_s']
    print(f"| {r['setup']} | {r['num_params']:,} | {r['round_s']:.3f} | {r['save_blocking_s']:.3f} | "
          f"{r['save_durable_s']:.3f} | {r['restore_s']:.3f} | {r['checkpoint_mb']:.1f} | "
          f"{ls['0']:.3f} / {ls['10']:.3f} / {ls['1']:.3f} | "
          f"{100 * r['loop_overhead_every_10']:+.0f}% / {100 * r['loop_overhead_every_1']:+.0f}% | "
          f"{100 * r['cpu_overhead_every_10']:+.0f}% / {100 * r['cpu_overhead_every_1']:+.0f}% |")
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(rows, f, indent=2)


if __name__ == '__main__':
  main()
