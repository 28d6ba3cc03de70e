r"""FedAvg vs FedSAM vs FedASAM vs SiloBN vs FedBN on the synthetic domain-shift segmentation set, several seeds.

Each run is `experiments/train.py --config=configs/quickstart_seg.py:<method> --config.seed=<s>` in its own
process (BiSeNetV2 with BatchNorm on seg_synthetic; the config's docstring gives the setting), its workdir
under --runs_dir (a finished run, i.e. one with summary.json, is not run again). Reported per run, from its
summary.json: the mean over the last `summary_last_k` evaluations of the seen-domain and unseen-domain mIoU
(`mean_last_<k>_test_seen_miou` / `..._unseen_miou`), the final ones, the wall time; per method, the mean and
std (ddof=1) over the seeds. --set key=value (repeatable) overrides config fields of every run (e.g. a
shorter --set=rounds=20 smoke). The XLA compilation cache (--cache_dir) lets the seeds of a method share one
compilation.

  .venv/bin/python -m benchmarks.studies.seg_synthetic_compare --seeds=0,1,2 \
      --json=benchmarks/studies/seg_synthetic_compare.json --md=benchmarks/studies/seg_synthetic_compare.md
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks.paths import REPO
METHODS = ('fedavg', 'fedsam', 'fedasam', 'silobn', 'fedbn', 'fedavg_bnbatch')
NAMES = {'fedavg': 'FedAvg', 'fedsam': 'FedSAM', 'fedasam': 'FedASAM', 'silobn': 'SiloBN', 'fedbn': 'FedBN',
         'fedavg_bnbatch': 'FedAvg, test BN = batch'}
# Controls: a method's config with extra overrides. FedAvg trained exactly as 'fedavg' (same seed, same bits)
# but its test clients normalized with each test batch's statistics, SiloBN's test-time policy: separates
# what SiloBN's training does from what its test-time normalization does.
VARIANTS = {'fedavg_bnbatch': ('fedavg', ['bn.test_policy=batch'])}


def run_one(method: str, seed: int, workdir: str, sets, cache_dir: str, log) -> dict:
  summary = os.path.join(workdir, 'summary.json')
  if not os.path.exists(summary):
    base, extra = VARIANTS.get(method, (method, []))
    cmd = [sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
           f'--config={os.path.join(REPO, "configs", "quickstart_seg.py")}:{base}', f'--config.seed={seed}',
           f'--workdir={workdir}'] + [f'--config.{s}' for s in extra + list(sets)]
    env = {**os.environ, 'PYTHONPATH': REPO}
    if cache_dir:
      env.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if p.returncode != 0:
      raise RuntimeError(f'{method} seed {seed} failed (exit {p.returncode}):\n{p.stderr[-3000:]}')
    log(f'{method} seed {seed}: {time.time() - t0:.0f} s')
  with open(summary) as f:
    s = json.load(f)
  k = next(key for key in s if key.startswith('mean_last_') and key.endswith('_test_seen_miou'))
  last_k = k[len('mean_last_'):-len('_test_seen_miou')]
  g = s['models']['global']
  return {'method': method, 'seed': seed, 'workdir': os.path.relpath(workdir, REPO), 'last_k': int(last_k),
          'seen_miou': s[k], 'unseen_miou': s[f'mean_last_{last_k}_test_unseen_miou'],
          'final_seen_miou': g.get('final_test_seen_miou'), 'final_unseen_miou': g.get('final_test_unseen_miou'),
          'final_seen_iou': g.get('final_test_seen_iou'), 'final_unseen_iou': g.get('final_test_unseen_iou'),
          'rounds': s.get('rounds_completed'), 'wall_s': s.get('wall_time_total_s', s.get('wall_time_s'))}


def aggregate(rows):
  out = {}
  for m in dict.fromkeys(r['method'] for r in rows):
    rs = [r for r in rows if r['method'] == m]
    agg = {'seeds': [r['seed'] for r in rs]}
    for key in ('seen_miou', 'unseen_miou'):
      v = np.array([r[key] for r in rs], np.float64) * 100
      agg[key] = {'mean': float(v.mean()), 'std': float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                  'per_seed': v.round(2).tolist()}
    agg['wall_s_mean'] = float(np.mean([r['wall_s'] for r in rs]))
    out[m] = agg
  return out


def markdown(agg, rows, meta) -> str:
  k = rows[0]['last_k']
  lines = [f"mIoU (%) on seg_synthetic, mean +- std over seeds {meta['seeds']} (mean of the last {k} "
           f"evaluations, {rows[0]['rounds']} rounds each); per-seed values in brackets.", '',
           '| method | seen-domain mIoU | unseen-domain mIoU | seen per seed | unseen per seed | wall s / run |',
           '|---|---|---|---|---|---|']
  for m, a in agg.items():
    s, u = a['seen_miou'], a['unseen_miou']
    lines.append(f"| {NAMES.get(m, m)} | {s['mean']:.2f} +- {s['std']:.2f} | {u['mean']:.2f} +- {u['std']:.2f} | "
                 f"{s['per_seed']} | {u['per_seed']} | {a['wall_s_mean']:.0f} |")
  return '\n'.join(lines) + '\n'


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--methods', default=','.join(METHODS))
  ap.add_argument('--seeds', default='0,1,2')
  ap.add_argument('--set', action='append', default=[], help='config override key=value (every run)')
  ap.add_argument('--runs_dir', default=os.path.join(REPO, 'runs', 'seg_synthetic_compare'))
  ap.add_argument('--cache_dir', default=os.path.join(REPO, 'runs', 'xla_cache'))
  ap.add_argument('--parallel', type=int, default=1, help='runs at a time')
  ap.add_argument('--json', default='')
  ap.add_argument('--md', default='')
  a = ap.parse_args()
  methods = [m for m in a.methods.split(',') if m]
  bad = sorted(set(methods) - set(METHODS))
  if bad:
    ap.error(f'--methods: unknown {bad}; allowed: {",".join(METHODS)}')
  seeds = [int(s) for s in a.seeds.split(',')]
  log = lambda msg: print(f'[{time.strftime("%H:%M:%S")}] {msg}', file=sys.stderr, flush=True)  # noqa: E731
  rows = []
  uptime = [os.popen('uptime').read().strip()]
  tag = ','.join(a.set).replace('/', '_')
  # Seeds outermost: a cut-off run still leaves every method with the same seeds done.
  jobs = [(seed, m, os.path.join(a.runs_dir, f'{m}{("," + tag) if tag else ""}', f'seed={seed}'))
          for seed in seeds for m in methods]
  with concurrent.futures.ThreadPoolExecutor(a.parallel) as pool:   # each run is its own process
    futures = [pool.submit(run_one, m, seed, wd, a.set, a.cache_dir, log) for seed, m, wd in jobs]
    for fut in futures:
      rows.append(fut.result())
      r = rows[-1]
      log(f'{r["method"]} seed {r["seed"]}: seen {100 * r["seen_miou"]:.2f}  unseen {100 * r["unseen_miou"]:.2f}  '
          f'({len(rows)}/{len(jobs)})')
      agg = aggregate(rows)
      meta = {'seeds': sorted({r['seed'] for r in rows}), 'overrides': a.set, 'config': 'configs/quickstart_seg.py',
              'uptime': uptime + [os.popen('uptime').read().strip()], 'cpu_count': os.cpu_count()}
      if a.json:   # after every run: a cut-off still leaves the runs so far
        with open(a.json, 'w') as f:
          json.dump({'meta': meta, 'aggregate': agg, 'runs': rows}, f, indent=2)
      if a.md:
        with open(a.md, 'w') as f:
          f.write(markdown(agg, rows, meta))
  print(markdown(aggregate(rows), rows, {'seeds': seeds}))


if __name__ == '__main__':
  main()
