"""Mixed precision on the quickstart: configs/quickstart.py (FedAvg, digits_cnn, 20 clients, 100 rounds) with
engine.compute_dtype 'float32' and 'bfloat16' over seeds: final and last-5 mean test accuracy, and the wall time
per round (benchmarks/studies/README.bf16.md).

  .venv/bin/python -m benchmarks.studies.bf16_quickstart --out=benchmarks/studies/bf16_quickstart.json
      [--seeds=0,1,2] [--rounds=100]

Each run is the Trainer in this process on configs/quickstart.py with config.seed = the seed (the data split is
the config's, the same for every run); the two dtypes of a seed run one after the other, so a load change on a
shared machine hits both alike. Time per round: (elapsed at the last evaluation - elapsed at round
`--timing_from`) / the rounds between, so the compilation of the first block is left out (evaluations, every 5
rounds, are in). On a CPU bfloat16 is emulated and slower than float32: that ratio says nothing of a GPU or TPU.
The criterion (tests/e2e/test_bf16_quickstart.py): the mean final accuracy over the seeds in bfloat16 within one
point of float32's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import jax

from benchmarks.paths import REPO
from fedjax_flat.config import families as config_strings
from fedjax_flat.training import trainers

DTYPES = ('float32', 'bfloat16')


def run_one(dtype: str, seed: int, rounds: int, timing_from: int = 10) -> dict:
  c = config_strings.load_config(os.path.join(REPO, 'configs', 'quickstart.py'))
  c.seed = seed
  c.rounds = rounds
  c.engine.compute_dtype = dtype
  c.progress_every_s = 1e9
  t0 = time.time()
  t = trainers.make_trainer(c)
  s = t.train()
  recs = [r for r in t.records if 'elapsed_s' in r]
  first = [r for r in recs if r['round'] >= timing_from][0]
  last = recs[-1]
  per_round = (last['elapsed_s'] - first['elapsed_s']) / max(last['round'] - first['round'], 1)
  return {'dtype': dtype, 'seed': seed, 'rounds': rounds, 'wall_s': time.time() - t0,
          'final_test_accuracy': s['final_test_accuracy'],
          'mean_last_5_test_accuracy': s.get('mean_last_5_test_accuracy'),
          's_per_round': per_round, 'timed_rounds': [first['round'], last['round']]}


def cpu_model() -> str:
  try:
    out = subprocess.run(['lscpu'], capture_output=True, text=True, timeout=10).stdout
    for line in out.splitlines():
      if line.startswith('Model name:'):
        return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def summarize(runs: list) -> dict:
  out = {}
  for d in DTYPES:
    rs = [r for r in runs if r['dtype'] == d]
    if rs:
      out[d] = {'seeds': [r['seed'] for r in rs],
                'final_test_accuracy': sum(r['final_test_accuracy'] for r in rs) / len(rs),
                'mean_last_5_test_accuracy': sum(r['mean_last_5_test_accuracy'] for r in rs) / len(rs),
                's_per_round': sum(r['s_per_round'] for r in rs) / len(rs)}
  if len(out) == 2:
    out['difference_points'] = 100 * (out['bfloat16']['final_test_accuracy'] - out['float32']['final_test_accuracy'])
    out['time_ratio_bf16_f32'] = out['bfloat16']['s_per_round'] / out['float32']['s_per_round']
  return out


def markdown(runs: list, summary: dict, machine: dict, command: str) -> str:
  lines = [f"Machine: {machine['cpu']} ({machine['backend']}, {machine['devices']} device(s)); jax {machine['jax']}.",
           f'Command: `{command}`', '',
           '| dtype | seed | final test acc. | mean last 5 | s / round (CPU) |', '|---|---|---|---|---|']
  for r in runs:
    lines.append(f"| {r['dtype']} | {r['seed']} | {100 * r['final_test_accuracy']:.2f} | "
                 f"{100 * r['mean_last_5_test_accuracy']:.2f} | {r['s_per_round']:.3f} |")
  for d in DTYPES:
    if d in summary:
      m = summary[d]
      lines.append(f"| **{d} mean** | {len(m['seeds'])} seeds | {100 * m['final_test_accuracy']:.2f} | "
                   f"{100 * m['mean_last_5_test_accuracy']:.2f} | {m['s_per_round']:.3f} |")
  if 'difference_points' in summary:
    lines += ['', f"bfloat16 - float32, mean final test accuracy: {summary['difference_points']:+.2f} points "
              f"(criterion: within 1 point). Time per round bfloat16 / float32 on this CPU: "
              f"{summary['time_ratio_bf16_f32']:.2f}x (CPU only: bfloat16 is emulated there; no accelerator "
              'measured).']
  return '\n'.join(lines) + '\n'


def study(seeds, rounds: int) -> tuple:
  runs = []
  for seed in seeds:
    for d in DTYPES:
      r = run_one(d, seed, rounds)
      print(json.dumps(r), flush=True)
      runs.append(r)
  return runs, summarize(runs)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--out', default=os.path.join(REPO, 'benchmarks', 'studies', 'bf16_quickstart.json'))
  ap.add_argument('--seeds', default='0,1,2')
  ap.add_argument('--rounds', type=int, default=100)
  a = ap.parse_args()
  seeds = [int(s) for s in a.seeds.split(',')]
  runs, summary = study(seeds, a.rounds)
  machine = {'cpu': cpu_model(), 'backend': jax.default_backend(), 'devices': jax.device_count(),
             'jax': jax.__version__}
  command = f'python -m benchmarks.studies.bf16_quickstart --seeds={a.seeds} --rounds={a.rounds}'
  with open(a.out, 'w') as f:
    json.dump({'machine': machine, 'command': command, 'runs': runs, 'summary': summary}, f, indent=1)
  md = markdown(runs, summary, machine, command)
  with open(os.path.splitext(a.out)[0] + '.md', 'w') as f:
    f.write(md)
  print(md)


if __name__ == '__main__':
  main()
