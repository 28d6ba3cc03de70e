r"""Aggregates runs into a Markdown + CSV table and PNG plots: mean +- std over seeds of the last-K accuracy.

  python experiments/report.py --sweep_dir=runs/fm [--sweep_dir=runs/other] --out_dir=reports/fm \
      [--group_by=cell | --group_by=client.optimizer,swa.enabled] [--target=0.9]
  python experiments/report.py --workdirs='runs/sam_*/seed=*' --group_by=client.optimizer --out_dir=reports/x

Writes OUT_DIR/<name>.md and <name>.csv (one row per group and sweep), <name>_<sweep>_curves.png (the headline
metric each task declares, accuracy / mIoU / R@1, of the reported model vs round, mean over seeds with a min..max
band), with a virtual clock _time.png / _bytes.png (runs without one left out and named in the .md) and
<name>_<sweep>_bars.png (last-K headline metric; the personal models' accuracy beside it where the paper
publishes theirs). Groups: `cell` (the sweep cell; for bare workdirs the directory name, or its parent's for
.../seed=N) or dotted config keys read from each run's config.json. Columns (see fedjax_flat/sweeps/report.py):
last-K and final accuracy (%), finished/total runs, rounds to --target (first evaluation at or above it) and
the bits sent until then (cumulative comm_bytes x 8, thesis Table 4.19),
lambda_max when experiments/hessian.py ran, communication, config.published (paper number) and the sweep
cell's reference (earlier measurement) with measured - that. Unfinished or failed runs are counted, not averaged.
Nothing is dropped silently: torn metrics.jsonl lines are skipped and reported (run and line numbers, on stderr
and under the table), runs with a NaN / inf accuracy are shown as non-finite and left out of the means (the
seeds column says how many), and only a finite accuracy reaches --target.

Exit status (fedjax_flat/training/cli.py), each error one `error:` line without a traceback: 0 written, 1 some
run of the set is unfinished or non-finite (the report is still written) or the report cannot be written,
2 bad input (flags, a sweep.json of the wrong shape, no runs).
"""
from __future__ import annotations

import os
import sys
import time

from absl import flags

from fedjax_flat.sweeps import report as report_lib
from fedjax_flat.training import cli

_SWEEPS = flags.DEFINE_multi_string('sweep_dir', [], 'A sweep directory (holding sweep.json); repeatable.')
_WORKDIRS = flags.DEFINE_list('workdirs', [], 'Run directories or globs (comma-separated).')
_OUT = flags.DEFINE_string('out_dir', None, 'Where to write the report.')
_NAME = flags.DEFINE_string('name', 'report', 'File name stem of the report.')
_GROUP = flags.DEFINE_list('group_by', ['cell'], '"cell" or dotted config keys, e.g. client.optimizer,swa.enabled.')
_TARGET = flags.DEFINE_float('target', None, 'Target test accuracy as a fraction (0.9) for "rounds to target".')
_TITLE = flags.DEFINE_string('title', '', 'Heading of the Markdown report.')
_NOTES = flags.DEFINE_multi_string('note', [], 'Line(s) written under the heading (e.g. the protocol).')
_PLOTS = flags.DEFINE_bool('plots', True, 'Write the PNG plots.')
flags.mark_flag_as_required('out_dir')


def _fail(msg):
  raise report_lib.ReportError(msg)


def main(argv):
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}; give runs with --sweep_dir or --workdirs')
  if not _SWEEPS.value and not _WORKDIRS.value:
    _fail('no runs: give --sweep_dir=DIR (written by experiments/sweep.py) or --workdirs=GLOB')
  if _TARGET.value is not None and not 0 < _TARGET.value <= 1:
    _fail(f'--target={_TARGET.value} is not an accuracy fraction in (0, 1]; e.g. --target=0.9')
  if not _GROUP.value:
    _fail('--group_by is empty; use cell or dotted config keys such as client.optimizer')
  if not _OUT.value.strip():
    _fail("--out_dir='' is empty: give the directory for the report")
  runs = report_lib.collect(_SWEEPS.value, _WORKDIRS.value)
  unknown = [k for k in _GROUP.value if k != 'cell' and all(
      report_lib._get(r['config'], k, '<unset>') == '<unset>' for r in runs)]
  if unknown:
    _fail(f'--group_by key(s) {unknown} are in no run\'s config.json; use cell or dotted config keys')
  os.makedirs(_OUT.value, exist_ok=True)
  rows = report_lib.aggregate(runs, _GROUP.value, _TARGET.value)
  split = [r for r in rows if r['differs']]
  if split:     # runs of different experiments are never pooled as seeds of one group
    print(f'warning: {len(split)} rows come from groups whose runs differ in config keys beyond --group_by '
          f'({", ".join(sorted({r["differs"].split("=")[0] for r in split}))}...): split, see the "differs in" '
          'column; add the key(s) to --group_by to name them', file=sys.stderr)
  stem = os.path.join(_OUT.value, _NAME.value)
  report_lib.write_csv(rows, _GROUP.value, stem + '.csv')
  md = [f'# {_TITLE.value or "Report"}', ''] + [n for n in _NOTES.value] + ([''] if _NOTES.value else [])
  md += [f'Generated {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())} by `experiments/report.py`. '
         'Accuracies in percent: mean ± std over seeds (population std); "last-K" is summary.json\'s mean of the '
         'reported model\'s last K evaluations; "seeds" counts finished runs of the group; "diff" is measured '
         'last-K minus that column. Runs are pooled only when their configs differ in nothing but the seed and '
         'execution settings (device count, checkpoint / progress cadence): a group holding different experiments '
         'is split into rows named in "differs in".', '']
  for sweep in dict.fromkeys(r['sweep'] for r in rows):
    rs = [r for r in rows if r['sweep'] == sweep]
    desc = next((r['description'] for r in runs if r['sweep'] == sweep and r['description']), '')
    md += [f'## {sweep}', ''] + ([desc, ''] if desc else [])
    refs = sorted({r['reference_source'] for r in rs if r['reference_source']})
    pubs = sorted({r['published_source'] for r in rs if r['published_source']})
    md += [f'reference: {s}' for s in refs] + [f'published: {s}' for s in pubs] + ([''] if refs or pubs else [])
    for col in ('reference', 'published'):
      diffs = [abs(r[f'diff_{col}']) for r in rs if r[f'diff_{col}'] is not None]
      if diffs:     # the one-line answer to "does it reproduce?"
        md += [f'{len(diffs)} of {len(rs)} groups measured against the {col}: |measured - {col}| is at most '
               f'{max(diffs):.2f} points (median {sorted(diffs)[len(diffs) // 2]:.2f}).', '']
    md += report_lib.markdown_table(rs, _GROUP.value, _TARGET.value) + ['']
    if _PLOTS.value:
      left_out = []      # runs a plot could not draw (no virtual clock), named under the plots
      for p in report_lib.plot(rs, _GROUP.value, f'{stem}_{sweep}', notes=left_out):
        md.append(f'![{os.path.basename(p)}]({os.path.basename(p)})')
      md += [''] + [f'{n}.' for n in left_out] + ([''] if left_out else [])
    bad = [r['failed'] for r in rs if r['failed']]
    if bad:
      md += ['Unfinished or failed runs (not averaged): ' + ' '.join(bad), '']
    nonfinite = [r['nonfinite_runs'] for r in rs if r['nonfinite_runs']]
    if nonfinite:
      md += ['Runs with a non-finite (NaN / inf) accuracy (shown here, not averaged): ' + ' '.join(nonfinite), '']
    torn = [r['torn'] for r in rs if r['torn']]
    if torn:
      md += ['Unreadable (torn) metrics.jsonl lines, skipped (the lines after them are read): ' + '; '.join(torn),
             '']
  with open(stem + '.md', 'w') as f:
    f.write('\n'.join(md))
  n_bad = sum(not r['finished'] for r in runs)
  n_nonfinite = sum(r['finished'] and report_lib.nonfinite(r) for r in runs)
  for r in runs:
    if r['torn_lines']:
      print(f"warning: {r['workdir']}/metrics.jsonl: {len(r['torn_lines'])} unreadable line(s) skipped (line(s) "
            f"{', '.join(map(str, r['torn_lines'][:10]))}); the records after them are kept", file=sys.stderr)
    if r['finished'] and report_lib.nonfinite(r):
      print(f"warning: {r['workdir']}: non-finite accuracy (NaN / inf): shown, not averaged", file=sys.stderr)
  print(f'{len(rows)} rows from {len(runs)} runs ({n_bad} unfinished, {n_nonfinite} non-finite, '
        f'{sum(len(r["torn_lines"]) for r in runs)} torn metrics lines): {stem}.md {stem}.csv')
  sys.exit(1 if n_bad or n_nonfinite else 0)


if __name__ == '__main__':
  cli.run_main(main)   # every error one line and its exit status
