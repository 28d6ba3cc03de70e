"""Tables of the security study (benchmarks/studies/README.security.md) from its run directories.

  .venv/bin/python -m benchmarks.studies.security_table --root=runs/security --out=benchmarks/studies/security

Reads runs/security/{main,ten,asam,asam_ten,standin,standin_asam,standin_ten}[.<suffix>]/<cell>/seed=<s>/ (sweeps
of configs/sweeps/security_digits.py; a part's cells added later run into <part>.<suffix>/ beside it),
runs/security/{persist,persist_standin}/<cell>/seed=<s>/ (clean continuation of the backdoored runs),
runs/security/leak/<run>/ (digits: SGD vs SAM, with and without DP, experiments/attack.py's privacy_attacks/) and
the stand-in's unattacked mean / DP runs' privacy_attacks*/ (every seed), and writes OUT/runs.jsonl (one record
per run), OUT/leak.json, OUT/leak_standin.json and OUT/tables.md (mean +- std over seeds).

`--previous=OUT/runs.jsonl` (and OUT/leak.json) keeps the records of an earlier invocation whose run directories are
gone: a (part, cell, seed) found under --root replaces its previous record, so seeds can be added one at a time.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os

import numpy as np


ORDER = ('mean', 'median', 'krum', 'centered_clipping', 'dp')   # the defence columns, in the study's order
ATTACK_ORDER = ('none', 'sign_flip', 'alie', 'backdoor')          # the rows, per method
METHOD_ORDER = ('sgd', 'sam', 'asam')                              # FedAvg, FedSAM, FedASAM


def _load(p):
  try:
    with open(p) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _records(wd):
  try:
    with open(os.path.join(wd, 'metrics.jsonl')) as f:
      return [json.loads(l) for l in f if l.strip()]
  except OSError:
    return []


def _cell_fields(c):
  """What a run's config says of its cell: the client optimizer, the attack, the aggregator and the defence
  column (the aggregator, or 'dp' for central DP with the mean)."""
  return {'optimizer': c['client']['optimizer'], 'attack': c['attack']['kind'],
          'fraction': c['attack']['fraction'] if c['attack']['kind'] != 'none' else 0.0,
          'aggregator': c['server']['aggregator'],
          'defence': 'dp' if (c.get('dp') or {}).get('mode', 'off') != 'off' else c['server']['aggregator']}


def run_record(wd, part):
  s = _load(os.path.join(wd, 'summary.json'))
  c = _load(os.path.join(wd, 'config.json'))
  if not s or not c or s['rounds_completed'] < c['rounds']:   # not a finished run (interrupted: it resumes)
    return None
  recs = [r for r in _records(wd) if 'test_accuracy' in r]
  k = c.get('summary_last_k', 2)
  last = recs[-k:]
  asr = [r['attack_success_rate'] for r in last if 'attack_success_rate' in r]
  h = _load(os.path.join(wd, 'hessian', 'hessian_global.json'))
  cell = os.path.basename(os.path.dirname(wd))
  return {'part': part, 'cell': cell, 'seed': int(os.path.basename(wd).split('=')[1]), **_cell_fields(c),
          'rounds': s['rounds_completed'], 'dp_epsilon': s.get('dp_epsilon'),
          'final_acc': s['final_test_accuracy'], 'lastk_acc': float(np.mean([r['test_accuracy'] for r in last])),
          'lastk_asr': float(np.mean(asr)) if asr else None,
          'asr_curve': [(r['round'], r['attack_success_rate']) for r in recs if 'attack_success_rate' in r],
          'acc_curve': [(r['round'], r['test_accuracy']) for r in recs],
          'lambda_max': h['lambda_max'] if h else None, 'wall_s': s.get('wall_time_s')}


def diverged_records(sweep_dir, part):
  """The runs of a sweep directory that diverged (the manifest's DivergenceError), as records without accuracy,
  so that a table says how many seeds of a cell diverged instead of silently averaging the others."""
  m = _load(os.path.join(sweep_dir, 'sweep.json')) or {}
  out = []
  for run in m.get('runs', []):
    err = run.get('error') or ''
    if run.get('status') != 'failed' or 'divergence (NaN/inf)' not in err:
      continue
    c = _load(os.path.join(sweep_dir, run['workdir'], 'config.json'))
    if not c:
      continue
    rd = err.split(' at round ', 1)[1].split(':', 1)[0] if ' at round ' in err else '?'
    out.append({'part': part, 'cell': run['cell'], 'seed': run['seed'], **_cell_fields(c),
                'diverged_round': int(rd) if rd.isdigit() else None, 'lastk_acc': None, 'lastk_asr': None,
                'final_acc': None, 'asr_curve': [], 'acc_curve': [], 'lambda_max': None, 'rounds': None})
  return out


def acc_cell(runs):
  """mean ± std of the finished seeds' last-K accuracy, and how many seeds diverged (with their rounds)."""
  div = [r for r in runs if 'diverged_round' in r]
  text = ms([r['lastk_acc'] for r in runs])
  if div:
    rounds = '/'.join(str(r['diverged_round']) for r in sorted(div, key=lambda r: r['seed']))
    text = (f'{text}, ' if text != '-' else '') + f'{len(div)} of {len(runs)} diverged (round {rounds})'
  return text


def _g(d, k):
  v = d.get(k) if isinstance(d, dict) else None
  return '-' if v is None else (f'{v:.3f}' if isinstance(v, (int, float)) else str(v))


def ms(xs, scale=100.0, nd=1):
  xs = [x for x in xs if x is not None and math.isfinite(x)]
  if not xs:
    return '-'
  a = np.array(xs) * scale
  return f'{a.mean():.{nd}f} ± {a.std():.{nd}f}' if len(a) > 1 else f'{a[0]:.{nd}f}'


def lam_cell(rs):
  """lambda_max mean ± std over a cell's measured runs, their last-K accuracy in brackets, and the seeds when not
  the usual three (or seed 0 alone)."""
  rs = sorted(rs, key=lambda r: r['seed'])
  n = ('' if len(rs) == 3 or [r['seed'] for r in rs] == [0] else
       f", seed {rs[0]['seed']}" if len(rs) == 1 else f', {len(rs)} seeds')
  return f"{ms([r['lambda_max'] for r in rs], 1.0, 2)} ({ms([r['lastk_acc'] for r in rs], 100.0, 1)}{n})"


def defence(r):
  """The defence column: the aggregator, or 'dp' (central DP with the mean; records before it existed: the
  aggregator)."""
  return r.get('defence') or r['aggregator']


def grouped(rows):
  g = {}
  for r in rows:
    g.setdefault((r['part'], r['cell']), []).append(r)
  return g


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--root', default='runs/security')
  ap.add_argument('--out', default='benchmarks/studies/security')
  ap.add_argument('--previous', default=None, help='an earlier runs.jsonl whose records are kept (leak.json beside '
                  'it too, when --root has no leak runs)')
  a = ap.parse_args()
  os.makedirs(a.out, exist_ok=True)
  rows = []
  for part in ('main', 'ten', 'asam', 'asam_ten', 'standin', 'standin_asam', 'standin_ten', 'persist',
               'persist_standin'):
    dirs = sorted(glob.glob(os.path.join(a.root, part)) + glob.glob(os.path.join(a.root, part + '.*')))
    seen_run = set()
    for wd in sorted(w for d in dirs for w in glob.glob(os.path.join(d, '*', 'seed=*'))):
      r = run_record(wd, part)
      if r and (r['cell'], r['seed']) not in seen_run:   # a cell rerun in a second sweep directory counts once
        seen_run.add((r['cell'], r['seed']))
        rows.append(r)
    for d in dirs:
      for r in diverged_records(d, part):
        if (r['cell'], r['seed']) not in seen_run:
          seen_run.add((r['cell'], r['seed']))
          rows.append(r)
  if a.previous:
    seen = {(r['part'], r['cell'], r['seed']) for r in rows}
    with open(a.previous) as f:
      old = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in old if (r['part'], r['cell'], r['seed']) not in seen] + rows
  with open(os.path.join(a.out, 'runs.jsonl'), 'w') as f:
    for r in rows:
      f.write(json.dumps(r) + '\n')
  md = []
  g = grouped(rows)
  opt_name = {'sgd': 'FedAvg', 'sam': 'FedSAM', 'asam': 'FedASAM'}
  # Accuracy table: rows (method, attack, fraction), columns defences.
  for part, title in (('main', '30% attackers (main grid)'), ('ten', '10% attackers'),
                      ('asam', 'FedASAM, 30% attackers'), ('asam_ten', 'FedASAM, 10% attackers'),
                      ('standin', 'CIFAR stand-in, 30% attackers'),
                      ('standin_asam', 'CIFAR stand-in, FedASAM, 30% attackers'),
                      ('standin_ten', 'CIFAR stand-in, 10% attackers')):
    cells = {k[1]: v for k, v in g.items() if k[0] == part}
    if not cells:
      continue
    # The last-K rounds, from a run's own curve (the parts differ: 35 and 40 on the digits, 70 and 80 on the stand-in).
    first = next((r for v in cells.values() for r in v if r['acc_curve']), None)
    lk = [rd for rd, _ in first['acc_curve']][-2:] if first else []
    lk_s = ' and '.join(str(rd) for rd in lk)
    aggs = []
    for v in cells.values():
      if defence(v[0]) not in aggs:
        aggs.append(defence(v[0]))
    aggs.sort(key=lambda d: ORDER.index(d) if d in ORDER else len(ORDER))
    md.append(f'### {title}: last-K test accuracy % (rounds {lk_s}), mean ± std over seeds\n')
    md.append('| method | attack | ' + ' | '.join(aggs) + ' | seeds |')
    md.append('|---|---|' + '---|' * len(aggs) + '---|')
    keys = []
    for v in cells.values():
      kk = (v[0]['optimizer'], v[0]['attack'])
      if kk not in keys:
        keys.append(kk)
    keys.sort(key=lambda k: (METHOD_ORDER.index(k[0]), ATTACK_ORDER.index(k[1])))
    for opt, att in keys:
      vals, n = [], 0
      for ag in aggs:
        v = [x for x in cells.values() if x[0]['optimizer'] == opt and x[0]['attack'] == att and
             defence(x[0]) == ag]
        vals.append(acc_cell(v[0]) if v else '-')
        n = max(n, len(v[0]) if v else 0)
      md.append(f'| {opt_name[opt]} | {att} | ' + ' | '.join(vals) + f' | {n} |')
    md.append('')
    bd = [(k, v) for k, v in cells.items() if v[0]['attack'] == 'backdoor']
    if bd:
      md.append(f'### {title}: backdoor attack success rate % (last-K), mean ± std over seeds\n')
      md.append('| method | ' + ' | '.join(aggs) + ' |')
      md.append('|---|' + '---|' * len(aggs))
      for opt in sorted({v[0]['optimizer'] for _, v in bd}, key=METHOD_ORDER.index):
        vals = []
        for ag in aggs:
          v = [x for _, x in bd if x[0]['optimizer'] == opt and defence(x[0]) == ag]
          vals.append(ms([r['lastk_asr'] for r in v[0]]) if v else '-')
        md.append(f'| {opt_name[opt]} | ' + ' | '.join(vals) + ' |')
      md.append('')
    # lambda_max (the seeds where experiments/hessian.py ran): the same rows and columns
    lam = {}
    for x in cells.values():
      for r in x:
        if r['lambda_max'] is not None:
          lam.setdefault((x[0]['optimizer'], x[0]['attack'], defence(x[0])), []).append(r)
    if lam:
      md.append(f'### {title}: lambda_max of the final global model, mean ± std over the seeds measured (top '
                'Hessian eigenvalue on the 359 test images, experiments/hessian.py; in brackets the last-K test '
                'accuracy % of those runs and, below 3, how many seeds; one value: seed 0)\n')
      md.append('| method | attack | ' + ' | '.join(aggs) + ' |')
      md.append('|---|---|' + '---|' * len(aggs))
      for opt, att in keys:
        vals = [lam_cell(lam[k]) if k in lam else '-' for k in ((opt, att, ag) for ag in aggs)]
        md.append(f'| {opt_name[opt]} | {att} | ' + ' | '.join(vals) + ' |')
      md.append('')
  for ppart, src in (('persist', 'digits, the round-40 model'),
                     ('persist_standin', 'CIFAR stand-in, the round-80 model')):
    per = {k[1]: v for k, v in g.items() if k[0] == ppart}
    if not per:
      continue
    md.append(f'### Backdoor persistence: ASR % after the attackers leave (clean rounds from {src})\n')
    rounds = sorted({rd for v in per.values() for r in v for rd, _ in r['asr_curve']})
    md.append('| cell | ' + ' | '.join(f'+{rd}' for rd in rounds) + ' | acc % at end |')
    md.append('|---|' + '---|' * len(rounds) + '---|')
    for cell, v in sorted(per.items()):
      cols = []
      for rd in rounds:
        cols.append(ms([dict(r['asr_curve']).get(rd) for r in v]))
      md.append(f'| {cell} | ' + ' | '.join(cols) + f" | {ms([r['final_acc'] for r in v])} |")
    md.append('')
  leak = []
  for wd in sorted(glob.glob(os.path.join(a.root, 'leak', '*'))):
    for pa in sorted(glob.glob(os.path.join(wd, 'privacy_attacks*'))):
      rep = _load(os.path.join(pa, 'report.json')) or _load(os.path.join(pa, 'attack.json'))
      inv = _load(os.path.join(pa, 'inversion.json'))
      mem = _load(os.path.join(pa, 'membership.json'))
      s = _load(os.path.join(wd, 'summary.json')) or {}
      leak.append({'run': os.path.basename(wd), 'attack_dir': os.path.basename(pa), 'inversion': inv,
                   'membership': mem, 'report': rep, 'final_acc': s.get('final_test_accuracy'),
                   'dp_epsilon': s.get('dp_epsilon'), 'lambda_max': (_load(os.path.join(
                       wd, 'hessian', 'hessian_global.json')) or {}).get('lambda_max')})
  if not leak and a.previous and os.path.exists(os.path.join(os.path.dirname(a.previous), 'leak.json')):
    leak = _load(os.path.join(os.path.dirname(a.previous), 'leak.json')) or []
  if leak:
    with open(os.path.join(a.out, 'leak.json'), 'w') as f:
      json.dump(leak, f, indent=1, default=str)
  if leak:
    md.append('### Leakage on the digits: SGD vs SAM clients, without and with central DP (eps 8), seed 0, round 100\n')
    md.append('| run | test acc % | lambda_max | inversion PSNR dB (mean ± std, images x clients) | SSIM | '
              'clients | MI AUC (loss threshold) | TPR@1%FPR | empirical eps lower bound (best threshold in-sample) | '
              'accountant eps | train / test acc |')
    md.append('|---|---|---|---|---|---|---|---|---|---|---|')
    for run in dict.fromkeys(x['run'] for x in leak):
      xs = [x for x in leak if x['run'] == run]
      psnr = [p for x in xs if x['inversion'] for p in x['inversion']['psnr']]
      ssim = [p for x in xs if x['inversion'] for p in x['inversion']['ssim']]
      ncl = sum(1 for x in xs if x['inversion'])
      mem = next((x['membership'] for x in xs if x['membership']), None) or {}
      att = mem.get('loss_threshold', mem)
      lam = xs[0]['lambda_max']
      md.append(f"| {run} | {100 * (xs[0]['final_acc'] or 0):.1f} | {'-' if lam is None else f'{lam:.2f}'} | "
                f"{ms(psnr, 1, 2)} | {ms(ssim, 1, 3)} | {ncl} | {_g(att, 'auc')} | {_g(att, 'tpr_at_fpr_0.01')} | "
                f"{_g(att, 'epsilon_lower_bound')} ({_g(att, 'epsilon_all_thresholds')}) | "
                f"{_g(mem, 'accountant_epsilon')} | {_g(mem, 'train_accuracy')} / {_g(mem, 'test_accuracy')} |")
    md.append('')
  md += standin_leakage(a.root, a.out)
  md += standin_real_upload(a.root, a.out)
  with open(os.path.join(a.out, 'tables.md'), 'w') as f:
    f.write('\n'.join(md) + '\n')
  print('\n'.join(md))


def _write_json(out, name, rows):
  with open(os.path.join(out, name), 'w') as f:
    json.dump(rows, f, indent=1, default=str)


# The stand-in's leakage runs are the security grid's own unattacked runs (mean / central DP at eps 8).
STANDIN_LEAK = (('fedavg', 'standin/fedavg-none-mean'), ('fedsam', 'standin/fedsam-none-mean'),
                ('fedavg_eps8', 'standin.kd/fedavg-none-dp'), ('fedsam_eps8', 'standin.kd/fedsam-none-dp'))


def standin_leakage(root, out):
  """Inversion PSNR / SSIM over seeds x clients x images, membership inference per seed (loss threshold; LiRA where
  it ran), for the stand-in's SGD / SAM clients without and with DP; writes OUT/leak_standin.json."""
  rows = []
  for label, cell in STANDIN_LEAK:
    for wd in sorted(glob.glob(os.path.join(root, cell, 'seed=*'))):
      s = _load(os.path.join(wd, 'summary.json')) or {}
      for pa in sorted(glob.glob(os.path.join(wd, 'privacy_attacks*')) + glob.glob(os.path.join(wd, 'lira_*'))):
        rows.append({'run': label, 'seed': int(wd.rsplit('=', 1)[1]), 'attack_dir': os.path.basename(pa),
                     'inversion': _load(os.path.join(pa, 'inversion.json')),
                     'membership': _load(os.path.join(pa, 'membership.json')),
                     'final_acc': s.get('final_test_accuracy'), 'dp_epsilon': s.get('dp_epsilon'),
                     'lambda_max': (_load(os.path.join(wd, 'hessian', 'hessian_global.json')) or {}).get('lambda_max')})
  if not rows:
    return []
  _write_json(out, 'leak_standin.json', rows)
  md = ['### Leakage on the CIFAR stand-in: SGD vs SAM clients, without and with central DP (eps 8), round 80, '
        'every seed\n',
        '| run | seeds | test acc % | inversion PSNR dB (mean ± std over images x clients x seeds) | SSIM | '
        'inversions | MI AUC loss threshold (mean ± std over seeds) | TPR@1%FPR | max empirical eps lower bound | '
        'LiRA AUC (seed 0, 16 central shadows) | LiRA eps lower bound | LiRA AUC (seed 0, 16 federated shadows) | '
        "its eps lower bound | its TPR@1%FPR | shadows' held-out acc (central / federated) | accountant eps | "
        'train / test acc (seed 0) |',
        '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  for label, _ in STANDIN_LEAK:
    xs = [x for x in rows if x['run'] == label]
    if not xs:
      continue
    inv = [x['inversion'] for x in xs if x['inversion']]
    psnr = [p for v in inv for p in v['psnr']]
    ssim = [p for v in inv for p in v['ssim']]
    lt = [x['membership']['loss_threshold'] for x in xs
          if x['membership'] and x['attack_dir'] == 'privacy_attacks' and 'loss_threshold' in x['membership']]
    lira = [x['membership']['lira'] for x in xs if x['membership'] and 'lira' in x['membership']
            and x['membership']['lira'].get('shadow_trainer', 'central') == 'central']
    fed = [x['membership']['lira'] for x in xs if x['membership'] and 'lira' in x['membership']
           and x['membership']['lira'].get('shadow_trainer') == 'federated']
    mem = next((x['membership'] for x in xs if x['membership']), {})
    acc = {x['seed']: x['final_acc'] for x in xs if x['final_acc'] is not None}
    eps_lb = max((m['epsilon_lower_bound'] for m in lt), default=None)
    md.append(f"| {label} | {len(acc)} | {ms(list(acc.values()))} | {ms(psnr, 1, 2)} | {ms(ssim, 1, 3)} | "
              f"{len(inv)} x {inv[0]['num_images'] if inv else 0} | {ms([m['auc'] for m in lt], 1, 3)} | "
              f"{ms([m['tpr_at_fpr_0.01'] for m in lt], 1, 3)} | {'-' if eps_lb is None else f'{eps_lb:.3f}'} | "
              f"{ms([m['auc'] for m in lira], 1, 3)} | {ms([m['epsilon_lower_bound'] for m in lira], 1, 3)} | "
              f"{ms([m['auc'] for m in fed], 1, 3)} | {ms([m['epsilon_lower_bound'] for m in fed], 1, 3)} | "
              f"{ms([m['tpr_at_fpr_0.01'] for m in fed], 1, 3)} | "
              f"{ms([m['shadow_heldout_accuracy'] for m in lira], 1, 3)} / "
              f"{ms([m['shadow_heldout_accuracy'] for m in fed], 1, 3)} | "
              f"{_g(mem, 'accountant_epsilon')} | {_g(mem, 'train_accuracy')} / {_g(mem, 'test_accuracy')} |")
  md.append('')
  return md


# experiments/attack.py --upload=local outputs: the run's own client optimizer for 2 steps (attack.py's docstring)
UPLOAD_DIRS = ('inversion_local', 'inversion_local_release')
VIEW_NAMES = {'none': 'the upload (no DP)', 'upload': 'what the server receives (clipped)',
              'release': "the DP adversary's view (clipped + the release's noise)"}


def standin_real_upload(root, out):
  """Inversion of what a client really sends (several steps of its own optimizer, SAM's ascent included) on the
  stand-in's leakage runs, and for the DP runs as the DP adversary sees it; writes OUT/inversion_local.json."""
  rows = []
  for label, cell in STANDIN_LEAK:
    for wd in sorted(glob.glob(os.path.join(root, cell, 'seed=*'))):
      for d in UPLOAD_DIRS:
        inv = _load(os.path.join(wd, d, 'inversion.json'))
        if inv:
          rows.append({'run': label, 'seed': int(wd.rsplit('=', 1)[1]), 'view': inv['dp_noise'], 'inversion': inv})
  if not rows:
    return []
  _write_json(out, 'inversion_local.json', rows)
  md = ['### Inversion of what a client really sends on the CIFAR stand-in (2 local steps of its own optimizer on '
        '2 images, round 80, client 0 of every seed)\n',
        '| run | upload observed | client steps | inversions | PSNR dB (mean ± std over images x seeds) | SSIM | '
        'random image PSNR dB | cos(observed, sent) | DP noise std | steps with an overflow |',
        '|---|---|---|---|---|---|---|---|---|---|']
  for label, _ in STANDIN_LEAK:
    for view, what in VIEW_NAMES.items():
      inv = [x['inversion'] for x in rows if x['run'] == label and x['view'] == view]
      if not inv:
        continue
      md.append(f"| {label} | {what} | {inv[0]['local_steps']} x {inv[0]['client_optimizer']} | {len(inv)} x "
                f"{inv[0]['num_images']} | {ms([p for v in inv for p in v['psnr']], 1, 2)} | "
                f"{ms([p for v in inv for p in v['ssim']], 1, 3)} | "
                f"{ms([p for v in inv for p in v['psnr_random']], 1, 2)} | "
                f"{ms([v['observed_cosine_to_sent'] for v in inv], 1, 3)} | "
                f"{'-' if not inv[0]['dp_noise_std'] else format(inv[0]['dp_noise_std'], '.3g')} | "
                f"{sum(v.get('nonfinite_steps', 0) for v in inv)} of {sum(v['steps'] for v in inv)} |")
  md.append('')
  return md


if __name__ == '__main__':
  main()
