"""FedAvg vs FedProx vs FedSoup on the feature-shift digits: local / global / unseen accuracy + AUC, and the
median lambda_max of the clients' personalized models (benchmarks/studies/README.fedsoup.md).

  .venv/bin/python -m benchmarks.studies.fedsoup_compare --out=/tmp/fsb/results.jsonl [--seeds=0,1,2]
      [--folds=-1,0,1,2,3,4] [--algorithms=fedavg,fedprox,fedbn,moon,fedfomo,fedrep,fedbabu,fedsoup] [--rounds=100]
      [--gn_groups=4]
  .venv/bin/python -m benchmarks.studies.fedsoup_compare --out=/tmp/fsb/results.jsonl --table   (prints the table)

Each run is the Trainer on configs/fedsoup_digits.py:<algorithm> (fold -1 = no client left out; fold j =
leave-one-client-out with hospital j as the unseen domain), then lambda_max (power iteration on HVPs) of every
client's personalized model on its own training data, both estimates of FedSoup's Fig. 2a side by side
(fedjax_flat.analysis.client_lambda_max_estimates): the paper's median over training batches (batches of
client.batch_size; `lambda_max_batch_median_clients`) and the release's full-data estimate
(`lambda_max_full_data_clients`); `lambda_max_median` / `lambda_max_median_batch_median` are their medians over
clients (the former as before: full data). Runs already in --out are skipped (resumable).

Fig. 2b (the fine-tuning trade-off): after the runs, and with --table, the study writes --plot (default
<out>_fig2b.png) from the runs' `finetune` curves (config.personalized.finetune_epochs): local vs global accuracy
after 1, 7 and 15 fine-tuning iterations per method (mean over seeds, no client left out). One "iteration" of
the paper is one local epoch (the release: one client.train() call per fine-tuning iteration).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

from benchmarks.paths import REPO

import numpy as np


def run_one(algorithm, seed, fold, rounds, hessian_iters, num_clients=0, gn_groups=None):
  import jax
  from fedjax_flat.algorithms import personalization
  from fedjax_flat.evaluation import personalized
  from fedjax_flat.training import personalized_eval
  from fedjax_flat.data.batching import make_eval_batches
  from fedjax_flat.training import trainers
  from fedjax_flat.config import families as config_strings
  c = config_strings.load_config(os.path.join(REPO, 'configs', f'fedsoup_digits.py:{algorithm}'))
  c.seed = seed
  c.data.seed = seed
  c.data.leave_out = fold
  if num_clients:
    c.data.num_clients = num_clients
  if gn_groups is not None:
    c.model_kwargs.gn_groups = gn_groups
  c.clients_per_round = c.data.num_clients - (1 if fold >= 0 else 0)   # all training clients every round
  c.rounds = rounds
  c.progress_every_s = 1e9
  c.personalized.per_client = False
  t0 = time.time()
  t = trainers.make_trainer(c)
  s = t.train()
  train_s = time.time() - t0
  p = s['personalized']
  rec = {'algorithm': algorithm, 'seed': seed, 'fold': fold, 'rounds': rounds, 'train_wall_s': train_s,
         'gn_groups': int(c.model_kwargs.get('gn_groups', 0)),
         'num_clients': c.data.num_clients,
         'server_global_acc_final': s['final_test_accuracy'], **personalized.headline(p),
         **{f'server_{k}': v for k, v in p['server'].items()},
         'finetune': p.get('finetune', [])}
  if algorithm == 'fedsoup':
    states = personalized_eval.client_states_of(t.store)
    rec['soup_counts'] = [float(states[k]['count']) for k in sorted(states)]
  if hessian_iters > 0:
    from fedjax_flat.analysis import client_lambda_max_estimates
    states = personalized_eval.client_states_of(t.store)
    full, per_batch = [], []
    for k in range(t.data.num_clients):
      params = jax.tree_util.tree_map(jax.numpy.asarray,
                                      personalization.personal_params(t.algorithm, t.server_state, states.get(k)))
      x, y = t.data.client_examples(k)
      if len(y) == 0:
        continue
      r = client_lambda_max_estimates(t.model, params, make_eval_batches(x, y, int(c.client.batch_size)),
                                      num_iters=hessian_iters, rng=jax.random.PRNGKey(seed))
      full.append(r['lambda_full_data'])
      per_batch.append(r['lambda_batch_median'])
    rec.update(sharpness_fields(full, per_batch))
  rec['wall_s'] = time.time() - t0
  return rec


def sharpness_fields(full_data, batch_median) -> dict:
  """The record's Fig. 2a fields from each client's two lambda_max estimates (full data, median over batches)."""
  return {'lambda_max_full_data_clients': list(map(float, full_data)),
          'lambda_max_batch_median_clients': list(map(float, batch_median)),
          'lambda_max_clients': list(map(float, full_data)),          # the earlier name (full data)
          'lambda_max_median': float(np.median(full_data)),
          'lambda_max_median_batch_median': float(np.median(batch_median))}


FINETUNE_ITERATIONS = (1, 7, 15)     # FedSoup Fig. 2b


def finetune_points(recs, iterations=FINETUNE_ITERATIONS) -> dict:
  """{method: [(iteration, mean local acc, mean global acc)]} over the no-client-left-out runs' finetune curves."""
  out = {}
  for r in recs:
    if r.get('fold', -1) != -1 or not r.get('finetune'):
      continue
    out.setdefault(r['algorithm'], []).append(r['finetune'])
  pts = {}
  for alg, curves in out.items():
    row = []
    for it in iterations:
      at = [f for curve in curves for f in curve if f['epoch'] == it]
      if at:
        row.append((it, float(np.mean([f['local_acc_weighted'] for f in at])),
                    float(np.mean([f['global_acc_client_mean'] for f in at]))))
    if row:
      pts[alg] = row
  return pts


def finetune_tradeoff_plot(recs, path, iterations=FINETUNE_ITERATIONS):
  """FedSoup Fig. 2b as a PNG: global vs local accuracy (%) after each fine-tuning iteration, one line per method
  (its points labelled by the iteration). Returns the path, or None when no run has a fine-tuning curve."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  pts = finetune_points(recs, iterations)
  if not pts:
    return None
  fig = Figure(figsize=(5.5, 4.2))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot(1, 1, 1)
  colors = [f'C{i}' for i in range(10)]
  for i, (alg, row) in enumerate(sorted(pts.items())):
    its, loc, glo = zip(*row)
    ax.plot([100 * v for v in loc], [100 * v for v in glo], '-o', color=colors[i % 10], label=alg)
    for it, lv, gv in row:
      ax.annotate(str(it), (100 * lv, 100 * gv), textcoords='offset points', xytext=(3, 3), fontsize=7)
  ax.set_xlabel('local accuracy (%)')
  ax.set_ylabel('global accuracy (%)')
  ax.set_title(f'fine-tuning trade-off (iterations {", ".join(map(str, iterations))})')
  ax.legend(fontsize=8)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=120, format='png')
  return path


def _fmt(vals, scale=100.0):
  v = [x for x in vals if x is not None and not (isinstance(x, float) and math.isnan(x))]
  if not v:
    return '-'
  m = np.mean(v) * scale
  return f'{m:.2f} ({np.std(v) * scale:.2f})' if len(v) > 1 else f'{m:.2f}'


def table(path):
  recs = [json.loads(l) for l in open(path)]
  order = ('fedavg', 'fedprox', 'fedbn', 'moon', 'fedfomo', 'fedrep', 'fedbabu', 'fedsoup')
  algs = [a for a in order if any(r['algorithm'] == a for r in recs)]
  out = []
  full = [r for r in recs if r['fold'] == -1]
  if full:
    out.append(f'No client left out ({len({r["seed"] for r in full})} seeds; mean (std) over seeds, %):\n')
    out.append('| Method | Local Acc | Local AUC | Global Acc | Global AUC | Other-clients Acc | Server global Acc '
               '| median lambda_max (full data / batch median) |')
    out.append('|---|---|---|---|---|---|---|---|')
    for a in algs:
      rs = [r for r in full if r['algorithm'] == a]
      out.append(f'| {a} | {_fmt([r["local_acc_weighted"] for r in rs])} | {_fmt([r["local_auc_pooled"] for r in rs])} '
                 f'| {_fmt([r["global_acc_client_mean"] for r in rs])} '
                 f'| {_fmt([r["global_auc_client_mean"] for r in rs])} '
                 f'| {_fmt([r["ood_other_clients_acc_client_mean"] for r in rs])} '
                 f'| {_fmt([r["server_global_acc"] for r in rs])} '
                 f'| {_fmt([r.get("lambda_max_median") for r in rs], 1.0)} '
                 f'/ {_fmt([r.get("lambda_max_median_batch_median") for r in rs], 1.0)} |')
  loo = [r for r in recs if r['fold'] >= 0]
  if loo:
    folds = sorted({r['fold'] for r in loo})
    out.append(f'\nLeave-one-client-out (folds {folds} x seeds {sorted({r["seed"] for r in loo})}; mean (std) over '
               'runs, %):\n')
    out.append('| Method | Local Acc | Local AUC | Global Acc | Global AUC | Unseen Acc | Unseen AUC '
               '| median lambda_max (full data / batch median) |')
    out.append('|---|---|---|---|---|---|---|---|')
    for a in algs:
      rs = [r for r in loo if r['algorithm'] == a]
      out.append(f'| {a} | {_fmt([r["local_acc_weighted"] for r in rs])} | {_fmt([r["local_auc_pooled"] for r in rs])} '
                 f'| {_fmt([r["global_acc_client_mean"] for r in rs])} '
                 f'| {_fmt([r["global_auc_client_mean"] for r in rs])} '
                 f'| {_fmt([r["unseen_acc_client_mean"] for r in rs])} '
                 f'| {_fmt([r["unseen_auc_client_mean"] for r in rs])} '
                 f'| {_fmt([r.get("lambda_max_median") for r in rs], 1.0)} '
                 f'/ {_fmt([r.get("lambda_max_median_batch_median") for r in rs], 1.0)} |')
  if loo:
    out.append('\nUnseen-domain accuracy per left-out hospital (%; AUC in parentheses):\n')
    out.append('| Method | ' + ' | '.join(f'fold {f}' for f in folds) + ' |')
    out.append('|---|' + '---|' * len(folds))
    for a in algs:
      cells = []
      for f in folds:
        rs = [r for r in loo if r['algorithm'] == a and r['fold'] == f]
        acc, auc = _fmt([r['unseen_acc_client_mean'] for r in rs]), _fmt([r['unseen_auc_client_mean'] for r in rs])
        cells.append(f'{acc} ({auc})' if rs else '-')
      out.append(f'| {a} | ' + ' | '.join(cells) + ' |')
  ft = [r for r in full if r.get('finetune')]
  if ft:
    out.append('\nFine-tuning after training (no client left out; mean over seeds, %): local acc / global acc\n')
    epochs = [1, 7, 15]
    out.append('| Method | ' + ' | '.join(f'epoch {e}' for e in epochs) + ' |')
    out.append('|---|' + '---|' * len(epochs))
    for a in algs:
      rs = [r for r in ft if r['algorithm'] == a]
      cells = []
      for e in epochs:
        pts = [f for r in rs for f in r['finetune'] if f['epoch'] == e]
        if pts:
          cells.append(f'{100 * np.mean([f["local_acc_weighted"] for f in pts]):.2f} / '
                       f'{100 * np.mean([f["global_acc_client_mean"] for f in pts]):.2f}')
        else:
          cells.append('-')
      out.append(f'| {a} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(out)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--out', required=True)
  ap.add_argument('--algorithms', default='fedavg,fedprox,fedsoup')
  ap.add_argument('--seeds', default='0,1,2')
  ap.add_argument('--folds', default='-1')
  ap.add_argument('--rounds', type=int, default=100)
  ap.add_argument('--hessian_iters', type=int, default=20)
  ap.add_argument('--num_clients', type=int, default=0, help='0 = the config (5 hospitals); up to 8')
  ap.add_argument('--gn_groups', type=int, default=None,
                  help='digits_cnn GroupNorm groups for every method (default: each config; fedbn uses 4)')
  ap.add_argument('--table', action='store_true')
  ap.add_argument('--plot', default='', help="Fig. 2b's PNG (default: <out>_fig2b.png)")
  a = ap.parse_args()
  plot = a.plot or os.path.splitext(a.out)[0] + '_fig2b.png'
  if a.table:
    print(table(a.out))
    _write_plot(a.out, plot)
    return
  done = set()
  if os.path.exists(a.out):
    done = {(r['algorithm'], r['seed'], r['fold']) for r in map(json.loads, open(a.out))}
  for fold in map(int, a.folds.split(',')):
    for seed in map(int, a.seeds.split(',')):
      for alg in a.algorithms.split(','):
        if (alg, seed, fold) in done:
          continue
        rec = run_one(alg, seed, fold, a.rounds, a.hessian_iters, a.num_clients, a.gn_groups)
        with open(a.out, 'a') as f:
          f.write(json.dumps(rec, default=float) + '\n')
        print(f"{alg} seed={seed} fold={fold}: local {rec['local_acc_weighted']:.4f} global "
              f"{rec['global_acc_client_mean']:.4f} lambda_med {rec.get('lambda_max_median')} "
              f"({rec['wall_s']:.0f}s)", flush=True)
  _write_plot(a.out, plot)


def _write_plot(out, plot):
  if os.path.exists(out) and finetune_tradeoff_plot([json.loads(l) for l in open(out)], plot):
    print(f'fine-tuning trade-off (Fig. 2b): {plot}')


if __name__ == '__main__':
  main()
