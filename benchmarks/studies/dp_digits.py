"""DP-FedAvg vs DP-FedSAM vs DP-FedASAM on the digits at epsilon inf, 8, 2 (configs/dp.py's digits cells), over
seeds: final and last-5 mean test accuracy, the epsilon reached, the calibrated noise multiplier, and lambda_max
of the final global model (the Hessian tool: Lanczos on the test set's mean loss), as DP-FedSAM's reader expects
(benchmarks/studies/README.dp.md).

  .venv/bin/python -m benchmarks.studies.dp_digits --out=benchmarks/studies/dp_digits.jsonl [--seeds=0,1,2]
      [--cells='fedavg;fedsam,eps=2'] [--rounds=100]
  .venv/bin/python -m benchmarks.studies.dp_digits --out=benchmarks/studies/dp_digits.jsonl --table [--figure=F]

Each run is the Trainer on configs/dp.py:<cell> with config.seed = data.seed = the seed (split, sampling,
training and the DP noise all change with it). Runs already in --out are skipped.
"""
from __future__ import annotations

import math
import os

import numpy as np

from benchmarks.studies import study_util
from benchmarks.studies.study_util import mean_std as _fmt

METHODS = ('fedavg', 'fedsam', 'fedasam')
EPSILONS = (0.0, 8.0, 2.0)       # 0 = non-private (epsilon inf)
DEFAULT_CELLS = tuple(m + ('' if e == 0 else f',eps={e:g}') for m in METHODS for e in EPSILONS)
DEFAULT_OUT = os.path.join('runs', 'dp_digits', 'study.jsonl')


def run_one(cell, seed, rounds):
  c, t, s, wall = study_util.train_cell('dp', cell, seed, rounds)
  params = t.algorithm.eval_models(t.server_state)['global'][0]
  return {'cell': cell, 'seed': seed, 'rounds': c.rounds, 'train_wall_s': wall,
          'final_test_accuracy': s['final_test_accuracy'],
          'mean_last_k': s.get(f'mean_last_{c.summary_last_k}_test_accuracy'),
          'dp_epsilon': s.get('dp_epsilon', math.inf), 'dp_noise_multiplier': s.get('dp_noise_multiplier', 0.0),
          'lambda_max': study_util.lambda_max(t, params)}


def _split(cell):
  """(method, epsilon) of a configs/dp.py cell ('fedsam,eps=2,cohort=25' -> ('fedsam', 2.0); 0 = inf)."""
  tokens = cell.split(',')
  eps = [float(t[len('eps='):]) for t in tokens if t.startswith('eps=')]
  return tokens[0], (eps[0] if eps else 0.0)


def table(path):
  recs = study_util.records(path)
  order = {c: i for i, c in enumerate(DEFAULT_CELLS)}
  cells = sorted(dict.fromkeys(r['cell'] for r in recs), key=lambda c: (METHODS.index(_split(c)[0]),
                                                                         EPSILONS.index(_split(c)[1]) if _split(c)[1]
                                                                         in EPSILONS else 9, order.get(c, 0)))
  out = [f'Mean (std) over seeds {sorted({r["seed"] for r in recs})}; accuracy in %:\n',
         '| method | epsilon (target) | epsilon reached | z | final acc | mean last-5 acc | lambda_max | seeds |',
         '|---|---|---|---|---|---|---|---|']
  for cell in cells:
    rs = [r for r in recs if r['cell'] == cell]
    method, eps = _split(cell)
    reached = [r['dp_epsilon'] for r in rs]
    out.append(f'| {method} | {"inf" if eps == 0 else f"{eps:g}"} | '
               f'{"inf" if any(math.isinf(e) for e in reached) else f"{max(reached):.3f}"} | '
               f'{rs[0]["dp_noise_multiplier"]:.3f} | {_fmt([r["final_test_accuracy"] for r in rs], 100)} | '
               f'{_fmt([r["mean_last_k"] for r in rs], 100)} | {_fmt([r["lambda_max"] for r in rs], 1, 1)} | '
               f'{len(rs)} |')
  return '\n'.join(out)


def figure(path, out_png):
  import matplotlib   # the figure only (not a dependency of the study's runs)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  recs = study_util.records(path)
  fig, ax = plt.subplots(figsize=(4.5, 3.2))
  xs = {0.0: 2, 8.0: 1, 2.0: 0}      # epsilon 2, 8, inf left to right
  for method in METHODS:
    pts = []
    for eps, x in xs.items():
      acc = [r['final_test_accuracy'] * 100 for r in recs if _split(r['cell']) == (method, eps)]
      if acc:
        pts.append((x, np.mean(acc), np.std(acc)))
    if pts:
      x, m, sd = zip(*sorted(pts))
      ax.errorbar(x, m, yerr=sd, marker='o', capsize=3, label=method)
  ax.set_xticks([0, 1, 2], ['2', '8', 'inf'])
  ax.set_xlabel('epsilon (delta 1e-5)')
  ax.set_ylabel('final test accuracy (%)')
  ax.legend()
  fig.tight_layout()
  fig.savefig(out_png, dpi=120)


def main():
  ap = study_util.argument_parser('dp', DEFAULT_OUT, DEFAULT_CELLS, '0 = the config (100)')
  ap.add_argument('--figure', default='', help='with --table: also write the accuracy-vs-epsilon figure here')
  a = ap.parse_args()
  if a.table:
    study_util.require_results(a.out)
    print(table(a.out))
    if a.figure:
      figure(a.out, a.figure)
    return
  study_util.run_cells(a.out, a.cells, a.seeds, lambda cell, seed: run_one(cell, seed, a.rounds))


if __name__ == '__main__':
  main()
