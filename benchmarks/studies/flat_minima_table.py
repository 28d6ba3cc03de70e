"""Markdown table from the runs of benchmarks/studies/flat_minima_digits.sh: final / last-K accuracy of the reported
model (and of the FedAvg chain when the reported model is SWA or WiMA), averaged over the seed directories.

  .venv/bin/python -m benchmarks.studies.flat_minima_table runs/flat_minima_digits [runs/flat_minima_digits_s1 ...]
"""
import json
import os
import sys

import numpy as np

ORDER = ['fedavg', 'fedsam', 'fedasam', 'fedavg_swa', 'fedsam_swa', 'fedasam_swa', 'fedgloss_sgd',
         'fedgloss_sam', 'fedgloss_sgd_release', 'fedgloss_sam_release', 'naive_fedgloss_sam_release',
         'fedgloss_sam_swa', 'fedavg_wima', 'fedasam_wima', 'fedavg_man',
         'fedasam_man']


def main(dirs):
  print('| run | reported model | final acc | mean last-K acc | global final | global last-K | s/run |')
  print('|---|---|---|---|---|---|---|')
  for name in ORDER:
    rows = []
    for d in dirs:
      path = os.path.join(d, name, 'summary.json')
      if os.path.exists(path):
        with open(path) as f:
          rows.append(json.load(f))
    if not rows:
      continue
    k = rows[0]['summary_last_k']
    key = f'mean_last_{k}_test_accuracy'
    fmt = lambda xs: f'{100 * np.mean(xs):.2f}' + (f' ± {100 * np.std(xs):.2f}' if len(xs) > 1 else '')
    g = [r['models']['global'] for r in rows]
    print(f"| {name} | {rows[0]['reported_model']} | {fmt([r['final_test_accuracy'] for r in rows])} | "
          f"{fmt([r[key] for r in rows])} | {fmt([m['final_test_accuracy'] for m in g])} | "
          f"{fmt([m[key] for m in g])} | {np.mean([r['wall_time_s'] for r in rows]):.0f} |")


if __name__ == '__main__':
  main(sys.argv[1:] or ['runs/flat_minima_digits'])
