"""The flat2024 study's table (benchmarks/studies/README.flat2024.md) from its sweep directories:

  python -m benchmarks.studies.flat2024_table runs/flat2024 benchmarks/studies/flat2024

Reads RUNS/<protocol>[_extra|_ctl]/<method>/seed=<s>/summary.json (+ hessian/hessian*.json where
experiments/hessian.py ran)
and writes OUT/results.jsonl (one record per run), OUT/table.md (mean +- std over seeds) and OUT/acc_vs_lambda.png.

Passes per step: declared by each algorithm where it is registered (num_phases x the client optimizer's passes +
extra_passes; fedjax_flat/systems/run_part.py) and, beside it, MEASURED from the virtual clock: the client compute
seconds of a round (virtual time / rounds - the transfers, scaled by the algorithm's comm_down / comm_up as read
from the communication totals) divided by FedAvg's in the same protocol. Every device runs at the same speed
(system.speed_sigma = 0), so that ratio is the passes a step relative to SGD's one.
"""
import glob
import json
import os
import statistics
import sys

METHODS = ('fedavg', 'fedsam', 'fedlesam', 'fedlesam_s', 'fedlesam_d', 'fednsam', 'fedgf', 'fedswa', 'fedmoswa',
           'fedwmsam', 'fedgf_t0', 'fedswa_c5', 'fedmoswa_c5', 'scaffold', 'feddyn', 'fedavgm')
NAMES = {'fedavg': 'FedAvg', 'fedsam': 'FedSAM', 'fedlesam': 'FedLESAM', 'fedlesam_s': 'FedLESAM-S',
         'fedlesam_d': 'FedLESAM-D', 'fednsam': 'FedNSAM', 'fedgf': 'FedGF', 'fedswa': 'FedSWA',
         'fedmoswa': 'FedMoSWA', 'fedwmsam': 'FedWMSAM',
         'fedgf_t0': 'FedGF, T_D = 0', 'fedswa_c5': 'FedSWA, cycle 5', 'fedmoswa_c5': 'FedMoSWA, cycle 5',
         'scaffold': 'control: SCAFFOLD', 'feddyn': 'control: FedDyn', 'fedavgm': 'control: FedAvgM'}
# Declared passes a local step (the registrations: fedlesam.py, fednsam.py 'paper', fedswa.py, fedwmsam.py declare
# extra_passes=0 over an SGD client; fedgf.py over its required SAM client; FedSAM = SAM's 2).
DECLARED = {'fedavg': 1, 'fedsam': 2, 'fedlesam': 1, 'fedlesam_s': 1, 'fedlesam_d': 1, 'fednsam': 1, 'fedgf': 2,
            'fedswa': 1, 'fedmoswa': 1, 'fedwmsam': 1, 'fedgf_t0': 2, 'fedswa_c5': 1, 'fedmoswa_c5': 1, 'scaffold': 1,
            'feddyn': 1, 'fedavgm': 1}
# The clock of configs/sweeps/flat2024.py: 10 / 1 Mbps down / up, float32 parameters.
DOWN_MBPS, UP_MBPS = 10.0, 1.0


def load(runs):
  recs = []
  for protocol in ('usual', 'xdev'):
    for m in METHODS:
      for wd in sorted(glob.glob(os.path.join(runs, protocol + '*', m, 'seed=*'))):
        p = os.path.join(wd, 'summary.json')
        if not os.path.isfile(p):
          continue
        s = json.load(open(p))
        if s.get('rounds_completed') != s.get('rounds_planned'):
          continue
        R, P = s['rounds_completed'], s['num_params']
        reports = s.get('system_reports_per_round', 0.0)
        cp = s['comm_total_params']
        k_down = cp['down_params'] / (R * reports * P)    # messages of the model's size each way (FedGF: 2 down)
        k_up = cp['up_params'] / (R * reports * P)
        transfer = k_down * P * 32 / (DOWN_MBPS * 1e6) + k_up * P * 32 / (UP_MBPS * 1e6)
        r = {'protocol': protocol, 'method': m, 'seed': int(wd.rsplit('=', 1)[1]), 'rounds': R,
             'acc_last_k': s['models']['global'][f"mean_last_{s['summary_last_k']}_test_accuracy"],
             'acc_final': s['final_test_accuracy'], 'virtual_time_s': s['virtual_time_s'],
             'compute_s_per_round': s['virtual_time_s'] / R - transfer, 'wall_time_s': s['wall_time_s'],
             'comm_down': k_down, 'comm_up': k_up, 'passes_declared': DECLARED[m]}
        ev = [json.loads(l) for l in open(os.path.join(wd, 'metrics.jsonl'))]
        r['curve'] = [(e['virtual_time_s'], e['test_accuracy']) for e in ev
                      if 'test_accuracy' in e and 'virtual_time_s' in e]
        r['last_k'] = s['summary_last_k']
        hs = sorted(glob.glob(os.path.join(wd, 'hessian', 'hessian*.json')))
        if hs:
          h = json.load(open(hs[-1]))
          r['lambda_max'] = h.get('lambda_max')
          r['trace'] = h.get('trace')
        recs.append(r)
  base = {}
  for r in recs:
    if r['method'] == 'fedavg':
      base.setdefault(r['protocol'], []).append(r['compute_s_per_round'])
  # accuracy at a fixed virtual time: T = the smallest total virtual time of the protocol's cells (FedAvg's);
  # the mean of the last K evaluations at or before T (K = summary_last_k, as the last-K column)
  budget = {}
  for r in recs:
    budget[r['protocol']] = min(budget.get(r['protocol'], float('inf')), r['virtual_time_s'])
  for r in recs:
    T = budget[r['protocol']] * (1 + 1e-9)
    pts = [a for t, a in r.pop('curve') if t <= T][-r['last_k']:]
    r['acc_at_T'] = statistics.mean(pts) if pts else None
    r['T_s'] = budget[r['protocol']]
  for r in recs:
    b = base.get(r['protocol'])
    r['passes_measured'] = r['compute_s_per_round'] / statistics.mean(b) if b else None
  return recs


def ms(vals, scale=1.0, digits=2):
  vals = [v * scale for v in vals if v is not None]
  if not vals:
    return ''
  if len(vals) == 1:
    return f'{vals[0]:.{digits}f} (n=1)'
  return f'{statistics.mean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}'


def table(recs, protocol):
  rows = ['| method | last-K acc % | vs FedSAM, paired (pp) | final acc % | last-K acc % at T | lambda_max | trace | '
          'passes/step (declared / clock) | virtual time (h) | comm down/up | seeds |', '|' + '---|' * 11]
  fedsam = {r['seed']: r['acc_last_k'] for r in recs if r['protocol'] == protocol and r['method'] == 'fedsam'}
  for m in METHODS:
    rs = [r for r in recs if r['protocol'] == protocol and r['method'] == m]
    if not rs:
      continue
    pm = statistics.mean(r['passes_measured'] for r in rs) if rs[0]['passes_measured'] is not None else None
    diff = [r['acc_last_k'] - fedsam[r['seed']] for r in rs if r['seed'] in fedsam]
    rows.append(
        f"| {NAMES[m]} | {ms([r['acc_last_k'] for r in rs], 100)} | {ms(diff, 100) if m != 'fedsam' else ''} | "
        f"{ms([r['acc_final'] for r in rs], 100)} | {ms([r['acc_at_T'] for r in rs], 100)} | "
        f"{ms([r.get('lambda_max') for r in rs], 1, 1)} | {ms([r.get('trace') for r in rs], 1, 0)} | "
        f"{rs[0]['passes_declared']} / {pm:.2f} | {ms([r['virtual_time_s'] for r in rs], 1 / 3600, 3)} | "
        f"{rs[0]['comm_down']:g} / {rs[0]['comm_up']:g} | "
        f"{','.join(str(r['seed']) for r in rs)} |")
  return '\n'.join(rows)


def figure(recs, path):
  """last-K accuracy against lambda_max, one point per method (mean over seeds), one panel per protocol."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for ax, protocol in zip(axes, ('usual', 'xdev')):
    for m in METHODS:
      rs = [r for r in recs if r['protocol'] == protocol and r['method'] == m and r.get('lambda_max') is not None]
      if not rs:
        continue
      x = statistics.mean(r['lambda_max'] for r in rs)
      y = 100 * statistics.mean(r['acc_last_k'] for r in rs)
      ax.scatter([x], [y], marker='s' if DECLARED[m] == 2 else 'o')
      ax.annotate(NAMES[m], (x, y), fontsize=7, xytext=(3, 2), textcoords='offset points')
    ax.set_xscale('log')
    ax.set_xlabel('lambda_max (final model, test split)')
    ax.set_ylabel('last-K test accuracy %')
    ax.set_title({'usual': 'usual (alpha 0, 100 rounds)', 'xdev': 'cross-device (400 clients, 60 rounds)'}[protocol]
                 + '; squares: 2 passes/step', fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=80)


def main(argv):
  runs, out = argv[1], argv[2]
  os.makedirs(out, exist_ok=True)
  recs = load(runs)
  with open(os.path.join(out, 'results.jsonl'), 'w') as f:
    for r in recs:
      f.write(json.dumps(r) + '\n')
  md = []
  for protocol, title in (('usual', 'Usual protocol (digits, alpha = 0, 20 clients, 5 a round)'),
                          ('xdev', 'Cross-device protocol (digits, 400 clients, 10 a round, 60 rounds)')):
    T = [r['T_s'] for r in recs if r['protocol'] == protocol]
    md += [f'## {title}', '', f'T = {T[0] / 3600:.3f} h of virtual time (the smallest total, FedAvg\'s).' if T else '',
           '', table(recs, protocol), '']
  open(os.path.join(out, 'table.md'), 'w').write('\n'.join(md))
  figure(recs, os.path.join(out, 'acc_vs_lambda.png'))
  print('\n'.join(md))


if __name__ == '__main__':
  main(sys.argv)
