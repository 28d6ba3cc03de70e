"""FedAvg (the plain body, and a wider one of FedCG's parameter count) vs FedCG (oracle, discovered and k-means
domains) and FedCG's ablations on the planted-domain digits, over seeds: test accuracy (soft and hard test-time
domain weights), per planted domain, parameter counts, and the purity of the discovered domains
(benchmarks/studies/README.fedcg.md). The k-means cell is the config value algo.domains='kmeans': the trainer
runs the pre-training pass (grouping/domains.py); its client clusters are scored against the planted domains.

  .venv/bin/python -m benchmarks.studies.fedcg_digits --out=benchmarks/studies/fedcg_digits.jsonl [--seeds=0,1,2]
      [--cells='fedavg;fedcg,oracle;fedcg,discovered'] [--rounds=100]
  .venv/bin/python -m benchmarks.studies.fedcg_digits --out=benchmarks/studies/fedcg_digits.jsonl --table

Each run is the Trainer on configs/fedcg_digits.py:<cell> with config.seed = data.seed = the seed (the planted
domains, the split and the training all change with it). Purity: the test images grouped by the final student's
argmax (or the final teacher's), sum over groups of the count of their majority planted domain / N
(algorithms/fedcg.purity): 1 = every discovered domain is one planted domain (or a part of one); 1/D_planted =
no information when the groups are as many as the planted domains. Runs already in --out are skipped.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from benchmarks.studies import study_util
from benchmarks.studies.study_util import mean_std as _fmt
from fedjax_flat.training.evals import domains as evals_domains

DEFAULT_CELLS = ('fedavg', 'fedavg,width=267', 'fedcg,oracle', 'fedcg,discovered', 'fedcg,kmeans',
                 'fedcg,discovered,soft=0', 'fedcg,discovered,all', 'fedcg,discovered,D=2', 'fedcg,discovered,D=8',
                 'fedcg,discovered,rand', 'fedcg,oracle,W=0', 'fedcg,oracle,relu=0', 'fedcg,oracle,residual=0',
                 'fedcg,oracle,U,fixed', 'fedcg,oracle,H,fixed')


def run_one(cell, seed, rounds):
  """A cell of configs/fedcg_digits.py ('kmeans': the trainer runs grouping/domains.py's pass first)."""
  c, t, s, wall = study_util.train_cell('fedcg_digits', cell, seed, rounds)
  t0 = time.time() - wall             # wall_s: training and the analyses below
  rec = {'cell': cell, 'seed': seed, 'rounds': c.rounds, 'train_wall_s': wall,
         'final_test_accuracy': s['final_test_accuracy'],
         'models': {k: v['final_test_accuracy'] for k, v in s['models'].items()},
         'num_params': s.get('num_params'), 'comm_down_params': s.get('comm_down_params'),
         'comm_up_params': s.get('comm_up_params')}
  tx, ty = t.data.test_examples()
  params = t.algorithm.eval_models(t.server_state)['global'][0]
  rec['per_domain_accuracy'] = evals_domains.per_domain_accuracy(t.model, params, tx, ty)
  dom = s.get('domains')             # FedCG runs: what the run found (training/evals/domains.py)
  if dom is not None:
    for k in ('purity_kmeans_clients', 'purity_student', 'purity_teacher', 'domains_used', 'student_vs_planted'):
      if k in dom:
        rec[k] = dom[k]
  rec['wall_s'] = time.time() - t0
  return rec


DEFAULT_OUT = os.path.join('runs', 'fedcg_digits', 'study.jsonl')


def table(path):
  recs = [json.loads(line) for line in open(path)]
  order = {c: i for i, c in enumerate(DEFAULT_CELLS)}
  cells = sorted(dict.fromkeys(r['cell'] for r in recs), key=lambda c: order.get(c, len(order)))
  out = [f'Mean (std) over seeds {sorted({r["seed"] for r in recs})}, final round, %:\n',
         '| cell | params | test acc | other assignment | acc per planted domain | purity student | purity teacher '
         '| domains used | seeds |', '|---|---|---|---|---|---|---|---|---|']
  for cell in cells:
    rs = [r for r in recs if r['cell'] == cell]
    other = [v for r in rs for k, v in r['models'].items() if k != 'global']
    per = np.mean([r['per_domain_accuracy'] for r in rs], axis=0) * 100
    used = [r['domains_used'] for r in rs if 'domains_used' in r]
    params = sorted({r.get('num_params') for r in rs if r.get('num_params')})
    out.append(f'| {cell} | {" ".join(f"{p:,}" for p in params) or "-"} '
               f'| {_fmt([r["final_test_accuracy"] for r in rs], 100.0)} | {_fmt(other, 100.0)} '
               f'| {" / ".join(f"{p:.1f}" for p in per)} | {_fmt([r.get("purity_student") for r in rs], 100.0)} '
               f'| {_fmt([r.get("purity_teacher") for r in rs], 100.0)} | {" ".join(map(str, used)) or "-"} '
               f'| {len(rs)} |')
  return '\n'.join(out)


def main():
  ap = study_util.argument_parser('fedcg_digits', DEFAULT_OUT, DEFAULT_CELLS, '0 = the config (100)',
                                  table_files=False)
  a = ap.parse_args()
  if a.table:
    study_util.require_results(a.out)
    print(table(a.out))
    return
  study_util.run_cells(a.out, a.cells, a.seeds, lambda cell, seed: run_one(cell, seed, a.rounds),
                       lambda rec: (f"{rec['cell']} seed={rec['seed']}: acc {rec['final_test_accuracy']:.4f} purity "
                                    f"{rec.get('purity_student')} ({rec['wall_s']:.0f}s)"))


if __name__ == '__main__':
  main()
