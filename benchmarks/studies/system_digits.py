"""FedAvg, FedProx, FedNova, FedSAM and FedASAM on the digits under a virtual clock (configs/system.py's cells:
homogeneous devices, log-normal speeds with a deadline, diurnal availability; and log-normal speeds without a
deadline, where synchronous FedAvg / FedSAM wait for stragglers and FedBuff does not), over seeds: accuracy at a fixed
virtual time, final and last-5 accuracy, the virtual time and bytes the round budget took, the reporting clients
and local steps a round, lambda_max of the final global model (the Hessian tool, as dp_digits.py), and one figure
of accuracy against virtual time per setting (benchmarks/studies/README.system.md).

  .venv/bin/python -m benchmarks.studies.system_digits --out=benchmarks/studies/system_digits.jsonl [--seeds=0,1,2]
      [--cells='fedavg,none;fedsam,deadline'] [--rounds=50]
  .venv/bin/python -m benchmarks.studies.system_digits --out=benchmarks/studies/system_digits.jsonl --table \
      [--figures=benchmarks/studies/system_digits]

Each run is the Trainer on configs/system.py:<cell> with config.seed = data.seed = the seed (split, sampling,
training, the devices' speeds and time zones all change with it). Runs already in --out are skipped. The fixed
virtual time of a setting is the earliest end of its runs (every run has reached it); a run's accuracy there is
that of its last evaluation at or before it.
"""
from __future__ import annotations

import json
import os

import numpy as np

from benchmarks.studies import study_util
from benchmarks.studies.study_util import mean_std as _fmt
from configs import system as system_configs

METHODS = ('fedavg', 'fedprox', 'fednova', 'fedsam', 'fedasam', 'fedbuff', 'fedbuff_sam', 'fedasync')
SETTINGS = ('none', 'deadline', 'diurnal', 'speeds')
DEFAULT_CELLS = tuple(system_configs.CELLS)
DEFAULT_OUT = os.path.join('runs', 'system_digits', 'study.jsonl')


def run_one(cell, seed, rounds):
  c, t, s, wall = study_util.train_cell('system', cell, seed, rounds)
  params = t.algorithm.eval_models(t.server_state)['global'][0]
  if t.algorithm.asynchronous is None:
    steps = [int(t.plan.systems.round_schedule(r, t.plan.sample_round(r)).fit.sum()) for r in range(c.rounds)]
  else:       # every arrival ran all its steps (each client: 5)
    steps = [sum(len(t.plan.systems.client_step_examples[k]) for k in st.ids) for st in t.driver.steps]
  return {'cell': cell, 'seed': seed, 'rounds': c.rounds, 'train_wall_s': wall,
          'final_test_accuracy': s['final_test_accuracy'],
          'mean_last_k': s.get(f'mean_last_{c.summary_last_k}_test_accuracy'),
          'virtual_time_s': s['virtual_time_s'], 'bytes_down': s['bytes_down'], 'bytes_up': s['bytes_up'],
          'reports_per_round': s['system_reports_per_round'], 'local_steps_per_round': float(np.mean(steps)),
          'curve': [(r['round'], r['virtual_time_s'], r['test_accuracy']) for r in t.records],
          'lambda_max': study_util.lambda_max(t, params)}


def fixed_times(recs):
  """Per setting: the earliest final virtual time of its runs."""
  out = {}
  for r in recs:
    setting = r['cell'].split(',')[1]
    out[setting] = min(out.get(setting, np.inf), r['virtual_time_s'])
  return out


def table(path):
  recs = study_util.records(path)
  fixed = fixed_times(recs)
  out = [f'Mean (std) over seeds {sorted({r["seed"] for r in recs})}; accuracy in %, virtual time in hours:\n',
         '| setting | method | acc at T | T (h) | final acc | mean last-5 | time for the rounds (h) | MiB up | '
         'reporting / round | local steps / round | lambda_max | seeds |',
         '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for setting in SETTINGS:
    for method in METHODS:
      rs = [r for r in recs if r['cell'] == f'{method},{setting}']
      if not rs:
        continue
      t = fixed[setting]
      out.append(f'| {setting} | {method} | {_fmt([study_util.accuracy_at(r["curve"], t) for r in rs], 100)} | '
                 f'{t / 3600:.2f} | {_fmt([r["final_test_accuracy"] for r in rs], 100)} | '
                 f'{_fmt([r["mean_last_k"] for r in rs], 100)} | '
                 f'{_fmt([r["virtual_time_s"] for r in rs], 1 / 3600)} | '
                 f'{_fmt([r["bytes_up"] for r in rs], 1 / 2**20, 1)} | '
                 f'{_fmt([r["reports_per_round"] for r in rs], 1, 2)} | '
                 f'{_fmt([r["local_steps_per_round"] for r in rs], 1, 1)} | '
                 f'{_fmt([r["lambda_max"] for r in rs], 1, 1)} | {len(rs)} |')
  return '\n'.join(out)


def figures(path, stem):
  """<stem>_<setting>.png: accuracy against virtual time, mean over seeds (x: the mean virtual time of each
  evaluation round), one line per method."""
  import matplotlib   # the figures only (not a dependency of the study's runs)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  recs = study_util.records(path)
  fixed = fixed_times(recs)
  written = []
  for setting in SETTINGS:
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for method in METHODS:
      rs = [r for r in recs if r['cell'] == f'{method},{setting}']
      if not rs:
        continue
      n = min(len(r['curve']) for r in rs)
      x = np.mean([[v for _, v, _ in r['curve'][:n]] for r in rs], axis=0) / 3600
      y = np.mean([[a for _, _, a in r['curve'][:n]] for r in rs], axis=0) * 100
      ax.plot(x, y, marker='.', label=method)
    written.append(study_util.save_accuracy_figure(
        fig, ax, f'{stem}_{setting}.png', xlabel='virtual time (h)', title=f'setting: {setting}',
        mark=fixed[setting] / 3600 if setting in fixed else None))
    plt.close(fig)
  return written


def main():
  ap = study_util.argument_parser('system', DEFAULT_OUT, DEFAULT_CELLS,
                                  '0 = the config (50; FedBuff 83 server steps)')
  ap.add_argument('--figures', default='', help='with --table: also write <this>_<setting>.png')
  a = ap.parse_args()
  if a.table:
    study_util.require_results(a.out)
    print(table(a.out))
    if a.figures:
      print('\n'.join(figures(a.out, a.figures)))
    return
  study_util.run_cells(a.out, a.cells, a.seeds, lambda cell, seed: run_one(cell, seed, a.rounds),
                       show=lambda r: json.dumps({k: v for k, v in r.items() if k != 'curve'}, default=float))


if __name__ == '__main__':
  main()
