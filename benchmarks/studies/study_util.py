"""What the cell x seed studies share: the resumable JSONL of their runs (one record per (cell, seed), appended as
each finishes, finished runs skipped on a rerun) and the one-line refusal of a table of runs never made."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Callable

import jax
import numpy as np

from benchmarks.paths import REPO
from fedjax_flat import analysis
from fedjax_flat.config import families as config_strings
from fedjax_flat.training import trainers


def argument_parser(family: str, default_out: str, cells, rounds_help: str,
                    table_files: bool = True) -> argparse.ArgumentParser:
  """The flags every cell x seed study takes: --out (the resumable JSONL), --cells (the family's cells),
  --seeds, --rounds (0: the config's), --table (print the table of --out instead of training)."""
  ap = argparse.ArgumentParser()
  ap.add_argument('--out', default=default_out, help='JSONL of the runs (appended; finished runs are skipped)' + (
      "; with --table: ';'-separated JSONL files, one table" if table_files else ''))
  ap.add_argument('--cells', default=';'.join(cells), help=f'configs/{family}.py cells, ";"-separated')
  ap.add_argument('--seeds', default='0,1,2')
  ap.add_argument('--rounds', type=int, default=0, help=rounds_help)
  ap.add_argument('--table', action='store_true')
  return ap


def require_results(out: str) -> None:
  """--table on ';'-separated JSONL files: every one must exist (else one line, exit 2)."""
  if not all(os.path.isfile(p) for p in out.split(';')):
    print(f'error: --out={out} does not exist: run the study first (without --table) to write it', file=sys.stderr)
    sys.exit(2)


def run_cells(out: str, cells: str, seeds: str, run_one: Callable[[str, int], dict],
              show: Callable[[dict], str] = json.dumps) -> None:
  """Runs every (cell, seed) of ';'-separated `cells` x ','-separated `seeds` not yet in `out`, appending each
  record (`run_one(cell, seed)`) as it finishes and printing `show(record)`."""
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  done = set()
  if os.path.exists(out):
    done = {(r['cell'], r['seed']) for r in map(json.loads, open(out))}
  for seed in map(int, seeds.split(',')):
    for cell in cells.split(';'):
      if (cell, seed) in done:
        continue
      rec = run_one(cell, seed)
      with open(out, 'a') as f:
        f.write(json.dumps(rec, default=float) + '\n')
      print(show(rec), flush=True)


def train_cell(family: str, cell: str, seed: int, rounds: int = 0):
  """configs/<family>.py:<cell> trained with `seed` (the data's partition too; `rounds` > 0 overrides the config's):
  (config, trainer, summary, training wall seconds)."""
  c = config_strings.load_config(os.path.join(REPO, 'configs', f'{family}.py:{cell}'))
  c.seed = seed
  c.data.seed = seed
  if rounds:
    c.rounds = rounds
  c.progress_every_s = 1e9
  t0 = time.time()
  t = trainers.make_trainer(c)
  s = t.train()
  return c, t, s, time.time() - t0


def records(path: str) -> list:
  """The runs of `path` (';'-separated paths: several studies in one table, e.g. the non-private cells)."""
  return [json.loads(line) for p in path.split(';') for line in open(p)]


def mean_std(vals, scale: float = 1.0, digits: int = 2) -> str:
  """'mean (std)' of the values that are numbers (None and NaN left out), times `scale`; '-' when none."""
  v = [x for x in vals if x is not None and not (isinstance(x, float) and math.isnan(x))]
  if not v:
    return '-'
  m = np.mean(v) * scale
  return f'{m:.{digits}f} ({np.std(v) * scale:.{digits}f})' if len(v) > 1 else f'{m:.{digits}f}'


def lambda_max(t, params) -> float:
  """The top Hessian eigenvalue of `params` on the trainer's test set (Lanczos, fedjax_flat.analysis)."""
  x, y = t.data.test_examples()
  batches = analysis.make_fixed_batches(x, y, batch_size=120)
  hvp = analysis.make_hvp(t.model, params, batches)
  pairs = analysis.top_eigenpairs(hvp, analysis.param_dim(params), k=1, rng=jax.random.PRNGKey(0))
  return float(np.asarray(pairs.eigenvalues)[0])


def accuracy_at(curve, x, axis: int = 1):
  """The accuracy (each point's last entry) of a run's last evaluation whose coordinate `axis` (virtual time,
  bytes, ...) is <= x (None: none yet). The studies' curves are lists of (round, ..., accuracy)."""
  pts = [p[-1] for p in curve if p[axis] <= x * (1 + 1e-12)]
  return pts[-1] if pts else None


def save_accuracy_figure(fig, ax, path: str, *, xlabel: str, title: str, mark=None, legend_size: int = 7) -> str:
  """The studies' accuracy curves end alike: a dotted grey line at the fixed point they compare at (`mark`), the
  axis labels, a grid and a legend; saved at 120 dpi. Returns path (the caller closes the figure)."""
  if mark is not None:
    ax.axvline(mark, color='grey', ls=':', lw=1)
  ax.set_xlabel(xlabel)
  ax.set_ylabel('test accuracy (%)')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=legend_size)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path
