"""The CIFAR stand-in pilot's table (benchmarks/studies/README.standin.md) from its runs: per cell, the mean and
std over seeds of the final test accuracy, the all-client distribution at the last round (mean, p10, worst, Gini)
and lambda_max where experiments/hessian.py was run.

  python benchmarks/studies/standin_table.py --runs=runs/standin --out=benchmarks/studies/standin
"""
import argparse
import glob
import json
import os

import numpy as np


def _load(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _cell(vals):
  vals = [v for v in vals if v is not None]
  if not vals:
    return '-'
  return f'{np.mean(vals):.3f} ± {np.std(vals):.3f} (n={len(vals)})' if len(vals) > 1 else f'{vals[0]:.3f} (n=1)'


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--runs', default='runs/standin')
  ap.add_argument('--out', default='benchmarks/studies/standin')
  a = ap.parse_args()
  rows = {}
  for wd in sorted(glob.glob(os.path.join(a.runs, '*', 'seed=*'))):
    s = _load(os.path.join(wd, 'summary.json'))
    if not s:
      continue
    h = _load(os.path.join(wd, 'hessian', 'hessian_global.json')) or {}
    ce = s.get('client_eval', {})
    eig = h.get('eigenvalues') or h.get('top_eigenvalues')
    r = rows.setdefault(os.path.basename(os.path.dirname(wd)), {k: [] for k in
                                                               ('acc', 'c_mean', 'c_p10', 'c_worst', 'gini', 'lmax')})
    r['acc'].append(s.get('final_test_accuracy'))
    r['c_mean'].append(ce.get('clients_acc_mean'))
    r['c_p10'].append(ce.get('clients_acc_p10'))
    r['c_worst'].append(ce.get('clients_acc_worst'))
    r['gini'].append(ce.get('clients_acc_gini'))
    r['lmax'].append(float(eig[0]) if eig else None)
  lines = ['| cell | test acc | clients: mean | p10 | worst | Gini | lambda_max |', '|---|---|---|---|---|---|---|']
  for name, r in rows.items():
    lines.append(f"| {name} | " + ' | '.join(_cell(r[k]) for k in ('acc', 'c_mean', 'c_p10', 'c_worst', 'gini',
                                                                     'lmax')) + ' |')
  os.makedirs(a.out, exist_ok=True)
  with open(os.path.join(a.out, 'table.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
  print('\n'.join(lines))


if __name__ == '__main__':
  main()
