"""Domain-generalization evaluation on CIFAR-10-C / CIFAR-100-C: every (corruption, severity) test set.

The reported model (global, or SWA/WiMA when enabled) is evaluated on each of the official .npy test sets
(19 corruptions x 5 severities, data/sources/cifar_c.py), one set in memory at a time, with the run's eval
preprocessing. Result: {'<corruption>': {'<severity>': accuracy}, 'mean_by_severity': {...}, 'mean': x},
stored in summary.json under 'corruptions' and as WORKDIR/corruptions.csv (the FedSAM appendix layout).
One progress line per (corruption, severity) on stderr: done/total, accuracy, images/s and ETA (the full
95 sets of CIFAR-C take minutes on CPU).
"""
from __future__ import annotations

import csv
import os
import sys
import time

import numpy as np

from fedjax_flat.errors import ConfigError
from fedjax_flat.evaluation.evaluator import Evaluator
from fedjax_flat.data.sources import cifar_c
from fedjax_flat.data.batching import make_eval_batches
from fedjax_flat.schema import Choice, Field, Flag, Section, String, Test


class Progress:
  """'[cifar10_c] 3/95 fog s5: acc 0.4123 | 12.3 s, 2400 img/s, ETA 6m20s' lines; ETA = mean time per set so far
  times the sets left (each set is the same size in the official files)."""

  def __init__(self, name: str, total: int, stream=None, clock=time.monotonic):
    self.name, self.total, self.stream, self.clock = name, total, stream or sys.stderr, clock
    self.start = clock()
    self.done = 0
    self.images = 0

  def update(self, corruption: str, severity: int, num_images: int, accuracy: float) -> str:
    self.done += 1
    self.images += num_images
    elapsed = self.clock() - self.start
    rate = self.images / elapsed if elapsed > 0 else float('inf')
    eta = elapsed / self.done * (self.total - self.done)
    line = (f'[{self.name}] {self.done}/{self.total} {corruption} s{severity}: acc {accuracy:.4f} | '
            f'{elapsed:.1f} s, {rate:.0f} img/s, ETA {_hms(eta)}')
    print(line, file=self.stream, flush=True)
    return line


def _hms(sec: float) -> str:
  sec = int(round(sec))
  h, m, s = sec // 3600, sec % 3600 // 60, sec % 60
  return f'{h}h{m:02d}m{s:02d}s' if h else (f'{m}m{s:02d}s' if m else f'{s}s')


def evaluate_corruptions(model, params, cfg, preprocess, batch_size: int, workdir=None, stream=None) -> dict:
  corruptions = (cifar_c.available(cfg.data_dir, cfg.name) if cfg.corruptions == 'all'
                 else tuple(c.strip() for c in cfg.corruptions.split(',')))
  progress = Progress(cfg.name, len(corruptions) * len(tuple(cfg.severities)), stream)
  table, rows = {}, []
  evaluator = None
  for corr, sev, x, y in cifar_c.iterate(cfg.data_dir, name=cfg.name, corruptions=corruptions,
                                         severities=tuple(cfg.severities),
                                         check_official_sizes=cfg.check_official_sizes):
    if evaluator is None or evaluator.batches['mask'].size < len(y):
      evaluator = Evaluator(model, x, y, batch_size, preprocess=preprocess)
    else:  # same shapes: reuse the compiled program, swap the data
      import jax
      evaluator.batches = jax.device_put(make_eval_batches(x, y, batch_size))
    acc = evaluator(params)['accuracy']
    table.setdefault(corr, {})[str(sev)] = acc
    rows.append((corr, sev, acc))
    progress.update(corr, sev, len(y), acc)
  by_sev = {str(s): float(np.mean([a for _, t, a in rows if t == s])) for s in cfg.severities
            if any(t == s for _, t, _ in rows)}
  out = {**table, 'mean_by_severity': by_sev, 'mean': float(np.mean([a for *_, a in rows])) if rows else None}
  if workdir:
    with open(os.path.join(workdir, 'corruptions.csv'), 'w', newline='') as f:
      w = csv.writer(f)
      w.writerow(['corruption', 'severity', 'accuracy'])
      w.writerows(rows)
  return out


def check_files(config) -> None:
  """config.corruption_eval's files exist (one bad-input line naming the field and the download command):
  they are read at the end of training, so a missing directory must not cost the whole run."""
  ce = config.get('corruption_eval')
  if ce is None or not ce.name:
    return
  try:
    cifar_c.locate(ce.data_dir, ce.name)
  except FileNotFoundError as e:
    raise ConfigError('corruption_eval.data_dir', ce.data_dir, str(e).replace('\n', ' ')) from None


# config.corruption_eval: declared with the code that reads it (config/schema.py collects it)
SECTION = Section('corruption_eval', (
    Field('name', Choice('', ('', 'cifar10_c', 'cifar100_c'), sort=True), "'' = off; 'cifar10_c' | 'cifar100_c'"),
    Field('data_dir', String(''), 'the directory of the corrupted test sets'),
    Field('corruptions', String('all'), "'all' present, or a comma-separated list"),
    Field('severities', Test((1, 2, 3, 4, 5), ok=lambda v: set(v) <= {1, 2, 3, 4, 5}, message='a subset of 1..5',
                             what='subset of 1..5'),
          'severities evaluated', when=lambda cfg: bool(cfg.corruption_eval.name)),
    Field('check_official_sizes', Flag(True), 'require the official example counts'),
), doc='CIFAR-10-C / 100-C evaluation of the reported model at the end of training (evaluation/corruption.py)')
