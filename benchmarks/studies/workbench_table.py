"""The workbench study's tables (benchmarks/studies/README.workbench.md) from its run directories.

  PYTHONPATH=. .venv/bin/python benchmarks/studies/workbench_table.py --runs=runs/workbench \
      --out=benchmarks/studies/workbench

Reads RUNS/digits/<method>_a<alpha>/seed=<s>/ (metrics.jsonl, clients.jsonl, lab.jsonl, summary.json,
hessian/hessian_global.json, hessian/connectivity_global.json) and RUNS/spurious/<method>_<strength>/seed=<s>/;
writes OUT/runs.jsonl (one record per run), OUT/tables.md (mean +- std over seeds) and OUT/clients_cdf.png
(the final per-client accuracies, the three seeds pooled, one panel per alpha).
"""
from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np

METHODS = ['fedavg', 'fedsam', 'fedasam', 'fedgloss', 'fedlesam']
LABELS = {'fedavg': 'FedAvg', 'fedsam': 'FedSAM', 'fedasam': 'FedASAM', 'fedgloss': 'FedGloSS',
          'fedlesam': 'FedLESAM'}


def _jsonl(path):
  return [json.loads(l) for l in open(path)] if os.path.exists(path) else []


def _json(path):
  return json.load(open(path)) if os.path.exists(path) else None


def digits_record(wd, method, alpha, seed):
  recs = _jsonl(os.path.join(wd, 'metrics.jsonl'))
  summ = _json(os.path.join(wd, 'summary.json'))
  if not recs or summ is None:
    return None
  last = recs[-1]
  cl = [r for r in recs if 'clients_acc_mean' in r][-1]
  labs = [r for r in recs if 'drift_norm_mean' in r]
  rec = {'part': 'digits', 'method': method, 'alpha': alpha, 'seed': seed, 'round': last['round'],
         'test_acc': last['test_accuracy'], 'test_acc_lastk': summ.get('mean_last_4_test_accuracy'),
         'wall_s': summ.get('wall_time_total_s')}
  for k in ('mean', 'std', 'p10', 'worst', 'gini'):
    rec[f'clients_{k}'] = cl[f'clients_acc_{k}']
  for k in ('drift_norm_mean', 'drift_cos_mean', 'drift_aggregate_norm'):
    rec[k] = float(np.mean([r[k] for r in labs]))       # mean over the lab calls (rounds 20, 40, 60)
    rec[k + '_last'] = labs[-1][k]
  for k in [k for k in labs[-1] if k.startswith('feature_rank/')]:
    rec[k.replace('/', '_')] = labs[-1][k]
  rec['profile_spearman'] = labs[-1]['profile_loss_gradnorm_spearman']
  rec['client_acc_final'] = [r['acc'] for r in _jsonl(os.path.join(wd, 'clients.jsonl'))
                             if r['round'] == cl['round'] and r['n'] > 0]
  h = _json(os.path.join(wd, 'hessian', 'hessian_global.json'))
  rec['lambda_max'] = h.get('lambda_max') if h else None
  c = _json(os.path.join(wd, 'hessian', 'connectivity_global.json'))
  if c:
    rec['barrier_clients'] = c['mean_barrier_clients']
    rec['barrier_client_global'] = c['mean_barrier_client_global']
    rec['barrier_max_clients'] = max(r['barrier'] for r in c['paths'] if r['b'] != 'global')
    rec['path_max_loss'] = max(r['max_loss'] for r in c['paths'])
    pairs = [r for r in c['paths'] if r['b'] != 'global']
    mid = [r['loss'][len(r['loss']) // 2] for r in pairs]     # t = 0.5: the two clients' average
    rec['pair_mid_loss'] = float(np.mean(mid))
    rec['pair_end_loss'] = float(np.mean([np.mean(r['end_losses']) for r in pairs]))
    rec['global_loss'] = [r for r in c['paths'] if r['b'] == 'global'][0]['end_losses'][1]
  return rec


def spurious_record(wd, method, strength, seed):
  recs = _jsonl(os.path.join(wd, 'metrics.jsonl'))
  if not recs or not os.path.exists(os.path.join(wd, 'summary.json')):
    return None
  ev = [r for r in recs if 'test_worst_group_acc' in r]
  k = ev[-5:]
  return {'part': 'spurious', 'method': method, 'strength': strength, 'seed': seed, 'round': ev[-1]['round'],
          'test_acc': ev[-1]['test_accuracy'], 'worst_group': ev[-1]['test_worst_group_acc'],
          'avg_group': ev[-1]['test_avg_group_acc'],
          'test_acc_lastk': float(np.mean([r['test_accuracy'] for r in k])),
          'worst_group_lastk': float(np.mean([r['test_worst_group_acc'] for r in k]))}


def ms(vals, scale=1.0, fmt='{:.2f}'):
  v = [x * scale for x in vals if x is not None]
  if not v:
    return '-'
  s = fmt.format(np.mean(v)) + ' ± ' + fmt.format(np.std(v, ddof=1) if len(v) > 1 else 0.0)
  return s + ('' if len(v) == 3 else f' (n={len(v)})')


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--runs', default='runs/workbench')
  ap.add_argument('--out', default='benchmarks/studies/workbench')
  a = ap.parse_args()
  os.makedirs(a.out, exist_ok=True)
  dig, spu = [], []
  for wd in sorted(glob.glob(os.path.join(a.runs, 'digits', '*', 'seed=*'))):
    cell, seed = wd.split(os.sep)[-2:]
    m, _, al = cell.rpartition('_a')
    r = digits_record(wd, m, float(al), int(seed.split('=')[1]))
    if r:
      dig.append(r)
  for wd in sorted(glob.glob(os.path.join(a.runs, 'spurious', '*', 'seed=*'))):
    cell, seed = wd.split(os.sep)[-2:]
    m, _, st = cell.rpartition('_')
    r = spurious_record(wd, m, st, int(seed.split('=')[1]))
    if r:
      spu.append(r)
  with open(os.path.join(a.out, 'runs.jsonl'), 'w') as f:
    for r in dig + spu:
      f.write(json.dumps(r) + '\n')

  def cell(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]

  out = ['# Workbench tables (mean ± std over seeds; generated by benchmarks/studies/workbench_table.py)', '']
  alphas = sorted({r['alpha'] for r in dig})
  out += ['## Accuracy and the client-accuracy distribution (digits, last round; percent)', '',
          '| alpha | method | test acc | test acc, last 4 evals | clients mean | clients std | p10 | worst | Gini '
          '| lambda_max |', '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|']
  for al in alphas:
    for m in METHODS:
      c = cell(dig, alpha=al, method=m)
      if c:
        g = lambda k, s=100.0, f='{:.1f}': ms([r[k] for r in c], s, f)
        out.append(f"| {al:g} | {LABELS[m]} | {g('test_acc')} | {g('test_acc_lastk')} | {g('clients_mean')} | "
                   f"{g('clients_std')} | {g('clients_p10')} | {g('clients_worst')} | "
                   f"{g('clients_gini', 1.0, '{:.3f}')} | {g('lambda_max', 1.0, '{:.1f}')} |")
  out += ['', '## The landscape lab (digits): drift (mean over the lab calls at rounds 20, 40, 60), feature rank and '
          'profile (round 60)', '',
          '| alpha | method | ‖Δ_k‖ mean | cos(Δ_k, Δ) mean | ‖Δ‖ aggregate | rank act0 | rank act1 | rank act2 '
          '| loss-gradnorm Spearman |', '|---|---|---:|---:|---:|---:|---:|---:|---:|']
  for al in alphas:
    for m in METHODS:
      c = cell(dig, alpha=al, method=m)
      if c:
        g = lambda k, f='{:.3f}': ms([r.get(k) for r in c], 1.0, f)
        out.append(f"| {al:g} | {LABELS[m]} | {g('drift_norm_mean')} | {g('drift_cos_mean')} | "
                   f"{g('drift_aggregate_norm')} | {g('feature_rank_act0', '{:.1f}')} | "
                   f"{g('feature_rank_act1', '{:.1f}')} | {g('feature_rank_act2', '{:.1f}')} | "
                   f"{g('profile_spearman')} |")
  con = [r for r in dig if 'barrier_clients' in r]
  if con:
    out += ['', '## Loss barriers (digits, seed 0, test loss on the 359 test digits, 21 points a linear path; 4 '
            'clients of the round after the last, one local epoch from the final global model)', '',
            '| alpha | method | mean barrier, client pairs | max barrier, client pairs | mean barrier, client-global '
            '| highest loss on a path | client loss (pair ends, mean) | loss at t = 0.5, pairs (mean) '
            '| global model loss |',
            '|---|---|---:|---:|---:|---:|---:|---:|---:|']
    for r in sorted(con, key=lambda r: (r['alpha'], METHODS.index(r['method']))):
      out.append(f"| {r['alpha']:g} | {LABELS[r['method']]} | {r['barrier_clients']:.4f} | "
                 f"{r['barrier_max_clients']:.4f} | {r['barrier_client_global']:.4f} | {r['path_max_loss']:.3f} | "
                 f"{r['pair_end_loss']:.3f} | {r['pair_mid_loss']:.3f} | {r['global_loss']:.3f} |")
  if spu:
    out += ['', '## Worst-group accuracy (coloured digits, configs/spurious.py; percent)', '',
            '| colour | method | test acc (last) | worst group (last) | avg group (last) | test acc, last 5 evals '
            '| worst group, last 5 evals |', '|---|---|---:|---:|---:|---:|---:|']
    for st in ('strong', 'weak'):
      for m in METHODS:
        c = cell(spu, strength=st, method=m)
        if c:
          g = lambda k: ms([r[k] for r in c], 100.0, '{:.1f}')
          out.append(f"| {st} | {LABELS[m]} | {g('test_acc')} | {g('worst_group')} | {g('avg_group')} | "
                     f"{g('test_acc_lastk')} | {g('worst_group_lastk')} |")
  open(os.path.join(a.out, 'tables.md'), 'w').write('\n'.join(out) + '\n')
  print('\n'.join(out))
  if dig:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(alphas), figsize=(5 * len(alphas), 3.6), squeeze=False)
    for ax, al in zip(axes[0], alphas):
      for m in METHODS:
        v = np.sort(np.concatenate([r['client_acc_final'] for r in cell(dig, alpha=al, method=m)] or [[]]))
        if len(v):
          ax.step(v, np.arange(1, len(v) + 1) / len(v), where='post', label=LABELS[m])
      ax.set_title(f'digits, alpha {al:g}: clients at round 60 (3 seeds pooled)', fontsize=9)
      ax.set_xlabel('client accuracy')
      ax.set_ylabel('fraction of clients')
      ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, 'clients_cdf.png'), dpi=80)


if __name__ == '__main__':
  main()
