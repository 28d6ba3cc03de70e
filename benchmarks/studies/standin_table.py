"""The CIFAR stand-in study's tables (benchmarks/studies/README.standin.md) from its runs: per cell, the mean and
std over seeds of the final and last-K test accuracy, the all-client distribution at the last round (mean, p10,
worst, Gini), lambda_max and the Hessian trace where experiments/hessian.py was run, the declared passes a local step
and the messages a round (down / up, in model sizes), and the landscape lab on the final checkpoint (`hessian.py
--lab --out_dir=<run>/lab`: drift, feature rank, loss barriers) where it was run.

  python benchmarks/studies/standin_table.py --runs=runs/standin --out=benchmarks/studies/standin
"""
import argparse
import glob
import json
import os

import numpy as np

# Declared passes (forward + backward) a local step: the client optimizer's (SGD 1, SAM / ASAM 2) and the
# algorithm's registered extra passes (fedlesam.py, fednsam.py, fedswa.py, fedwmsam.py: none over an SGD client;
# fedgf.py and FedGloSS over their SAM client).
DECLARED = {'fedavg': 1, 'fedsam': 2, 'fedasam': 2, 'fedgloss': 2, 'fedlesam': 1, 'fedlesam_s': 1, 'fedlesam_d': 1,
            'fednsam': 1, 'fedgf': 2, 'fedswa': 1, 'fedmoswa': 1, 'fedwmsam': 1}
ACC = ('acc', 'acc_k', 'c_mean', 'c_p10', 'c_worst', 'gini', 'lmax', 'trace')
LAB = ('drift_norm_mean', 'drift_cos_mean', 'drift_aggregate_norm', 'feature_rank/act0', 'feature_rank/act1',
       'feature_rank/act2', 'feature_rank/act3', 'barrier_mean', 'barrier_max', 'barrier_pair_mean')


def _load(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _cell(vals, nd=3):
  vals = [v for v in vals if v is not None]
  if not vals:
    return '-'
  if len(vals) == 1:
    return f'{vals[0]:.{nd}f} (n=1)'
  return f'{np.mean(vals):.{nd}f} ± {np.std(vals):.{nd}f} (n={len(vals)})'


def _lab(wd):
  reps = sorted(glob.glob(os.path.join(wd, 'lab', 'lab_global_round*.json')))
  return (_load(reps[-1]) or {}).get('fields', {}) if reps else {}


def load(runs):
  rows = {}
  for wd in sorted(glob.glob(os.path.join(runs, '*', 'seed=*'))):
    s = _load(os.path.join(wd, 'summary.json'))
    if not s or s.get('rounds_completed') != s.get('rounds_planned'):
      continue
    h = _load(os.path.join(wd, 'hessian', 'hessian_global.json')) or {}
    ce = s.get('client_eval', {})
    eig = h.get('eigenvalues') or h.get('top_eigenvalues')
    r = rows.setdefault(os.path.basename(os.path.dirname(wd)), {k: [] for k in ACC + LAB + ('down', 'up')})
    r['acc'].append(s.get('final_test_accuracy'))
    r['acc_k'].append(s.get(f"mean_last_{s.get('summary_last_k')}_test_accuracy"))
    r['c_mean'].append(ce.get('clients_acc_mean'))
    r['c_p10'].append(ce.get('clients_acc_p10'))
    r['c_worst'].append(ce.get('clients_acc_worst'))
    r['gini'].append(ce.get('clients_acc_gini'))
    r['lmax'].append(float(eig[0]) if eig else None)
    r['trace'].append(h.get('trace'))
    cp, n, rounds = s.get('comm_total_params') or {}, s.get('num_params'), s.get('rounds_completed')
    per = (rounds or 0) * 5 * (n or 0)         # 5 clients a round (configs/cifar_standin.py)
    r['down'].append(cp.get('down_params') / per if cp and per else None)
    r['up'].append(cp.get('up_params') / per if cp and per else None)
    lab = _lab(wd)
    for k in LAB:
      r[k].append(lab.get(k))
  return rows


def tables(rows) -> str:
  lines = ['| cell | test acc (final) | last-3 | clients: mean | p10 | worst | Gini | lambda_max | trace | '
           'passes / step | messages down / up |', '|---|---|---|---|---|---|---|---|---|---|---|']
  for name, r in rows.items():
    method = name.rsplit('_a', 1)[0]
    msgs = '-' if not any(v is not None for v in r['down']) else (
        f"{np.nanmean([v for v in r['down'] if v is not None]):.0f} / "
        f"{np.nanmean([v for v in r['up'] if v is not None]):.0f}")
    lines.append(f'| {name} | ' + ' | '.join(_cell(r[k], 1 if k in ('lmax', 'trace') else 3) for k in ACC) +
                 f" | {DECLARED.get(method, '-')} | {msgs} |")
  if any(v is not None for r in rows.values() for v in r['drift_norm_mean']):
    lines += ['', '| cell | drift norm mean | drift cos mean | aggregate norm | rank act0 | rank act1 | rank act2 | '
              'rank act3 | barrier mean | barrier max | barrier pair mean |', '|---|' + '---|' * len(LAB)]
    for name, r in rows.items():
      if any(v is not None for v in r['drift_norm_mean']):
        lines.append(f'| {name} | ' + ' | '.join(_cell(r[k], 1 if k.startswith('feature_rank') else 3)
                                                   for k in LAB) + ' |')
  return '\n'.join(lines) + '\n'


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--runs', default='runs/standin')
  ap.add_argument('--out', default='benchmarks/studies/standin')
  a = ap.parse_args()
  md = tables(load(a.runs))
  os.makedirs(a.out, exist_ok=True)
  with open(os.path.join(a.out, 'table.md'), 'w') as f:
    f.write(md)
  print(md)


if __name__ == '__main__':
  main()
