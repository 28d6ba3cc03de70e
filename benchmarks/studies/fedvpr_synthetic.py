r"""FedVPR on the synthetic place-recognition stand-in (data/sources/vpr_synthetic.py): the thesis' findings in
miniature, over seeds.

Methods (every run: configs/quickstart_vpr.py's model, loss and client optimizer, `--rounds` rounds, through the
trainer as `experiments/train.py` runs it):
  untrained      Recall@K of the initial model (no training)
  centralized    one client holding every training query and sequence (split 'single': mining over the whole
                 database), 1 client a round, `--central_steps` steps a round (40 = the 5 FedAvg clients'
                 padded steps): the reference
  proximity      FedAvg on Table 6.5's proximity split (100 m on 300 m cities), 5 clients a round
  random         FedAvg on the random split (queries of all cities per client): few hard negatives
  proximity_c8   FedAvg on the proximity split with 8 clients a round (H-FL's budget at 2 per city)
  hfl            H-FL, the registered algorithm `hfl` with configs/fedvpr.py's H-FL cell settings scaled down:
                 algo.group_by='city' (the 4 cities as clusters), algo.clients_per_group=`--hfl_per_cluster`,
                 algo.sync_every=`--sync_every` (T_c), clients_per_round = clusters x clients_per_group
Validation: `--val_clients` proximity clients are held out of every split (the same clients for every method:
data.val_clients) and evaluated at every evaluation (`--eval_every` rounds) on their own databases
(val_recall@K); `selected_test_recall@1` is the test R@1 at the first round with the best validation R@5
(summary.json's `validation`: the model a VPR researcher would pick); every run's curve (round, test R@1,
val R@1, val R@5 per evaluation) is kept in the JSON.
The thesis' findings to compare with: random is worst (hard negatives missing, Table 6.5); H-FL below FedAvg
at a matched client budget (Table 6.6). Seeds change the model initialisation, sampling and batch order; the
data (data.seed 0) stay the same.

  PYTHONPATH=. nice -n 10 .venv/bin/python -m benchmarks.studies.fedvpr_synthetic --seeds=0,1,2 --rounds=8 \
      --central_steps=16 --hfl_per_cluster=1 --sync_every=4 \
      --methods=untrained,proximity,random,hfl,centralized --json=benchmarks/studies/fedvpr_synthetic.json
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from configs import quickstart_vpr
from fedjax_flat.training import trainers

METHODS = ('untrained', 'centralized', 'proximity', 'random', 'proximity_c8', 'hfl')
METRICS = ('test_recall@1', 'test_recall@5', 'test_recall@10', 'val_recall@1', 'val_recall@5', 'val_recall@10')


def config(split, seed, rounds, clients, val_clients, eval_every):
  c = quickstart_vpr.get_config()
  c.data.split = split
  c.data.val_clients = val_clients
  c.seed, c.rounds, c.clients_per_round = seed, rounds, clients
  c.eval_every, c.progress_every_s = eval_every, 1e9
  return c


def hfl_config(seed, rounds, per_cluster, sync_every, val_clients, eval_every):
  """configs/fedvpr.py's H-FL cell (hfl=city) on the stand-in: `hfl` with the cities as clusters."""
  c = config('proximity', seed, rounds, 1, val_clients, eval_every)
  c.algorithm = 'hfl'
  c.algo = {'group_by': 'city', 'clients_per_group': per_cluster, 'sync_every': sync_every}
  c.clients_per_round = per_cluster * c.data.num_cities       # every city holds >= per_cluster clients here
  return c


def run(c):
  t = trainers.make_trainer(c)
  t0 = time.time()
  summary = t.train()
  out = {k: t.records[-1][k] for k in METRICS if k in t.records[-1]}
  sel = summary.get('validation') or {}
  if sel:
    out['selected_round'], out['selected_test_recall@1'] = sel['best_round'], sel['test_recall@1']
  out.update({k: v for k, v in (summary.get('messages') or {}).items()})
  out['curve'] = [[r['round'], r['test_recall@1'], r.get('val_recall@1'), r.get('val_recall@5')] for r in t.records]
  out['clients'] = int(t.data.num_clients)
  return out, time.time() - t0


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--seeds', default='0,1,2')
  ap.add_argument('--rounds', type=int, default=15)
  ap.add_argument('--sync_every', type=int, default=5)
  ap.add_argument('--hfl_per_cluster', type=int, default=2)
  ap.add_argument('--central_steps', type=int, default=40, help='centralized local steps a round (5 FedAvg '
                  'clients x 8 padded steps on the proximity split = 40)')
  ap.add_argument('--val_clients', type=int, default=3, help='proximity clients held out for validation')
  ap.add_argument('--eval_every', type=int, default=2)
  ap.add_argument('--methods', default=','.join(METHODS))
  ap.add_argument('--json', default='')
  args = ap.parse_args()
  rows = []
  for seed in [int(s) for s in args.seeds.split(',')]:
    for m in args.methods.split(','):
      v, e = args.val_clients, args.eval_every
      if m == 'untrained':
        t = trainers.make_trainer(config('proximity', seed, args.rounds, 5, v, e))
        res, wall = {k: x for k, x in t.evaluate().items() if k in METRICS}, 0.0
      elif m == 'centralized':
        c = config('single', seed, args.rounds, 1, v, e)
        c.client.local_steps = args.central_steps
        res, wall = run(c)
      elif m in ('proximity', 'random'):
        res, wall = run(config(m, seed, args.rounds, 5, v, e))
      elif m == 'proximity_c8':
        res, wall = run(config('proximity', seed, args.rounds, 8, v, e))
      elif m == 'hfl':
        res, wall = run(hfl_config(seed, args.rounds, args.hfl_per_cluster, args.sync_every, v, e))
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
    summary[m] = {'seeds': sum(r['method'] == m for r in rows)}
    for key, name in (('test_recall@1', 'r1'), ('test_recall@5', 'r5'), ('test_recall@10', 'r10'),
                      ('val_recall@1', 'val_r1'), ('selected_test_recall@1', 'sel_r1')):
      vals = np.array([r[key] for r in rows if r['method'] == m and key in r]) * 100
      if len(vals):
        summary[m][f'{name}_mean'], summary[m][f'{name}_std'] = float(vals.mean()), float(vals.std())
    s_ = summary[m]
    print(f"{m:14s} R@1 {s_['r1_mean']:5.1f} +- {s_['r1_std']:4.1f}  val R@1 {s_.get('val_r1_mean', np.nan):5.1f} "
          f"+- {s_.get('val_r1_std', np.nan):4.1f}  ({s_['seeds']} seeds)")
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'args': vars(args), 'runs': rows, 'summary': summary}, f, indent=1)


if __name__ == '__main__':
  main()
