r"""FedVPR on the synthetic place-recognition stand-in (data/sources/vpr_synthetic.py): the thesis' findings in
miniature, over seeds.

Methods (every run: configs/quickstart_vpr.py's model, loss and client optimizer, `--rounds` rounds):
  untrained      Recall@K of the initial model (no training)
  centralized    one client holding every query and sequence (split 'single': mining over the whole
                 database), 1 client a round, `--central_steps` steps a round (40 = the 5 FedAvg clients'
                 padded steps): the reference
  proximity      FedAvg on Table 6.5's proximity split (100 m on 300 m cities), 5 clients a round
  random         FedAvg on the random split (queries of all cities per client): few hard negatives
  proximity_c8   FedAvg on the proximity split with 8 clients a round (H-FL's budget)
  hfl            H-FL (algorithms/hfl.py): the 4 cities as clusters, `--hfl_per_cluster` clients per cluster
                 a round (2: 8 a round, FedAvg's proximity_c8 budget), cluster models averaged every
                 `--sync_every` rounds
The thesis' findings to compare with: random is worst (hard negatives missing, Table 6.5); H-FL below FedAvg
at a matched client budget (Table 6.6). Seeds change the model initialisation, sampling and batch order; the
data (data.seed 0) stay the same.

  PYTHONPATH=. nice -n 10 .venv/bin/python -m benchmarks.studies.fedvpr_synthetic --seeds=0,1,2 --rounds=12 \
      --json=benchmarks/studies/fedvpr_synthetic.json
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs import quickstart_vpr
from fedjax_flat.algorithms import hfl as hfl_lib
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.core import engine
from fedjax_flat.data import batching, sampling
from fedjax_flat.data.sources import vpr_synthetic
from fedjax_flat.optimizers.server import make_server_tx
from fedjax_flat.training import trainers

METHODS = ('untrained', 'centralized', 'proximity', 'random', 'proximity_c8', 'hfl')
METRICS = ('test_recall@1', 'test_recall@5', 'test_recall@10')


def config(split, seed, rounds, clients):
  c = quickstart_vpr.get_config()
  c.data.split = split
  c.seed, c.rounds, c.clients_per_round = seed, rounds, clients
  c.eval_every, c.progress_every_s = rounds, 1e9
  return c


def fedavg_run(split, seed, rounds, clients, local_steps=0):
  c = config(split, seed, rounds, clients)
  c.client.local_steps = local_steps
  t = trainers.make_trainer(c)
  t0 = time.time()
  t.train()
  return {k: t.records[-1][k] for k in METRICS}, time.time() - t0


def hfl_run(seed, rounds, per_cluster, sync_every):
  """H-FL driven by hand: stratified sampling over the cities, the trainer's data, model, loss and evaluator."""
  t = trainers.make_trainer(config('proximity', seed, rounds, 5))
  data, cfg = t.data, t.config
  city = (data.image_pos[data.tuple_index[:, 0], 0] // vpr_synthetic.CITY_SPACING).astype(np.int64)
  cluster_of = np.array([city[data.client_indices(k)[0]] for k in range(data.num_clients)])
  sizes = data.client_sizes().astype(np.float64)
  g = int(cluster_of.max()) + 1
  loss = local_lib.make_loss(t.model, task=t.task)
  alg = hfl_lib.hfl(t.model, loss, cfg.client, make_server_tx(cfg.server), num_clusters=g,
                    cluster_sizes=[sizes[cluster_of == c].sum() for c in range(g)], sync_every=sync_every)
  params0 = t.algorithm.eval_models(t.server_state)['global'][0]
  state = alg.server_init(jax.tree_util.tree_map(jnp.copy, params0), None)
  round_fn = engine.make_round_fn(alg, chunk=1)
  b = cfg.client.batch_size
  steps = int(-(-sizes.max() // b))
  pre = t.eval_transform
  t0 = time.time()
  for r in range(rounds):
    ids = hfl_lib.stratified_sample(cluster_of, per_cluster, seed=seed, round_idx=r)
    c = len(ids)
    # The engine's round batches (data/batching.py): the batch order and each tuple's negative candidates drawn
    # afresh from its pool, keyed by (seed, round, client).
    rb = batching.make_round_batches(data, ids, round_idx=r, seed=seed, batch_size=b, num_steps=steps)
    batches = {'x': pre(jnp.asarray(rb.x)), 'y': jnp.asarray(rb.y), 'mask': jnp.asarray(rb.mask)}
    rngs = sampling.client_keys(jax.random.key(seed), r, jnp.asarray(ids, jnp.int32))
    state, _, _ = round_fn(state, batches, hfl_lib.initial_client_states(cluster_of[ids]), rngs,
                           jnp.asarray(sizes[ids], jnp.float32), jnp.ones(c, bool), jnp.int32(r))
  res = t.evaluator(alg.eval_models(state)['global'][0])
  out = {f'test_{k}': res[k] for k in ('recall@1', 'recall@5', 'recall@10')}
  out['messages_bottom'], out['messages_top'] = float(state['messages_bottom']), float(state['messages_top'])
  return out, time.time() - t0


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--seeds', default='0,1,2')
  ap.add_argument('--rounds', type=int, default=15)
  ap.add_argument('--sync_every', type=int, default=5)
  ap.add_argument('--hfl_per_cluster', type=int, default=2)
  ap.add_argument('--central_steps', type=int, default=40, help='centralized local steps a round (5 FedAvg '
                  'clients x 8 padded steps on the proximity split = 40)')
  ap.add_argument('--methods', default=','.join(METHODS))
  ap.add_argument('--json', default='')
  args = ap.parse_args()
  rows = []
  for seed in [int(s) for s in args.seeds.split(',')]:
    for m in args.methods.split(','):
      if m == 'untrained':
        t = trainers.make_trainer(config('proximity', seed, args.rounds, 5))
        res, wall = {k: v for k, v in t.evaluate().items() if k in METRICS}, 0.0
      elif m == 'centralized':
        res, wall = fedavg_run('single', seed, args.rounds, 1, local_steps=args.central_steps)
      elif m in ('proximity', 'random'):
        res, wall = fedavg_run(m, seed, args.rounds, 5)
      elif m == 'proximity_c8':
        res, wall = fedavg_run('proximity', seed, args.rounds, 8)
      elif m == 'hfl':
        res, wall = hfl_run(seed, args.rounds, args.hfl_per_cluster, args.sync_every)
      else:
        raise SystemExit(f'unknown method {m!r}; allowed: {METHODS}')
      row = {'method': m, 'seed': seed, 'wall_s': round(wall, 1), **res}
      print(json.dumps(row), flush=True)
      rows.append(row)
      if args.json:                      # partial results survive an interrupted study
        with open(args.json, 'w') as f:
          json.dump({'args': vars(args), 'runs': rows}, f, indent=1)
  summary = {}
  for m in dict.fromkeys(r['method'] for r in rows):
    vals = np.array([r['test_recall@1'] for r in rows if r['method'] == m]) * 100
    summary[m] = {'r1_mean': float(vals.mean()), 'r1_std': float(vals.std()), 'seeds': len(vals)}
    print(f'{m:14s} R@1 {vals.mean():5.1f} +- {vals.std():4.1f}  ({len(vals)} seeds)')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'args': vars(args), 'runs': rows, 'summary': summary}, f, indent=1)


if __name__ == '__main__':
  main()
