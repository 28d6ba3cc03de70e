"""Builds a grouping of the clients into superclients and prints / saves it with statistics.

  python experiments/group.py --config=configs/quickstart.py --workdir=runs/grouping \
      --config.data.alpha=0 --config.grouping.method=greedy --config.grouping.estimator=conf \
      [--num_superclients=0] [--compare=random,kmeans]

Uses config.grouping (fedjax_flat/grouping/; fields in config/default_config.py). The pre-training /
estimator passes are cached in WORKDIR/grouping/ (a training run with the same WORKDIR reuses them).
Prints every superclient (clients, examples, classes present, label entropy in bits) and a table comparing
the grouping with --compare groupings built under the same constraints and seed (random grouping by
default: the baseline a grouping criterion has to beat). Writes WORKDIR/grouping/report.json (ids and
statistics of every grouping) and report.md.

Exit status (fedjax_flat/training/cli.py), each error one `error:` line without a traceback: 0 done, 1 a failed
operation (a cache or report that cannot be written), 2 bad input (config, flags, --compare, dataset files,
an init / probe checkpoint that is not a run).
"""
from __future__ import annotations

import json
import os

from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a config file returning a ConfigDict.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for the cache and the report (WORKDIR/grouping/).')
_NUM = flags.DEFINE_integer('num_superclients', 0, 'Number of superclients (0 = from grouping.min_examples '
                            'and grouping.max_clients).')
_COMPARE = flags.DEFINE_string('compare', 'random', 'Comma-separated methods to compare with, with the same '
                               'estimator and constraints (random, kmeans, greedy, icg; empty = none).')
flags.mark_flags_as_required(['config', 'workdir'])


def _range(d, fmt='{:.1f}'):
  return f"{fmt.format(d['mean'])} [{fmt.format(d['min'])}, {fmt.format(d['max'])}]"


def summary_table(records) -> str:
  lines = ['| grouping | N_S | clients | examples | classes | label entropy (bits) | below min | above max |',
           '|---|---|---|---|---|---|---|---|']
  for r in records:
    s = r['summary']
    name = r['method'] + (f" ({r['estimator']}, {r['distance']})" if r['estimator'] else '')
    lines.append(f"| {name} | {s['num_superclients']} | {_range(s['clients'])} | {_range(s['examples'], '{:.0f}')}"
                 f" | {_range(s['classes'], '{:.2f}')} | {_range(s['entropy_bits'], '{:.3f}')}"
                 f" | {s['below_min_examples']} | {s['above_max_clients']} |")
  return '\n'.join(lines)


def superclient_table(record) -> str:
  lines = ['| superclient | clients | examples | classes | entropy (bits) | client ids |', '|---|---|---|---|---|---|']
  for row, ids in zip(record['superclients'], record['groups']):
    lines.append(f"| {row['superclient']} | {row['clients']} | {row['examples']} | {row['classes']} | "
                 f"{row['entropy_bits']:.3f} | {' '.join(map(str, ids))} |")
  return '\n'.join(lines)


def main(argv):
  from fedjax_flat.errors import BadInputError
  from fedjax_flat.grouping import groupers, superclients as sc
  from fedjax_flat.training import init as init_lib
  from fedjax_flat.config import validate
  if len(argv) > 1:
    raise BadInputError(f'unexpected arguments {argv[1:]}; config overrides are --config.<field>=<value>')
  if not _WORKDIR.value.strip():
    raise BadInputError("--workdir='' is empty: give the directory for the grouping cache and report")
  if _NUM.value < 0:
    raise BadInputError(f'--num_superclients={_NUM.value} must be >= 0 (0 = from the constraints)')
  config = _CONFIG.value
  validate.validate_config(config)
  methods = [m for m in _COMPARE.value.split(',') if m]
  for m in methods:
    if m not in groupers.METHODS:
      raise BadInputError(f'--compare={_COMPARE.value!r}: {m!r} is no grouping method; allowed: '
                          f'{", ".join(groupers.METHODS)}')
  ctx = init_lib.grouping_context(config)   # w_0 as the run starts from it (config.init), the run loader
  validate.validate_against_data(config, ctx.data)
  workdir = os.path.abspath(_WORKDIR.value)
  n = _NUM.value or None
  main_grouping = sc.make_grouping(config, ctx, workdir, n)
  records = [sc.describe(main_grouping, ctx.data, config)]
  for m in methods:
    if m == main_grouping.method:
      continue
    other = sc.make_grouping(config, ctx, workdir, n, method=m,
                             distance='auto' if m != config.grouping.method else None)
    records.append(sc.describe(other, ctx.data, config))
  out = os.path.join(workdir, 'grouping')
  os.makedirs(out, exist_ok=True)
  g = config.grouping
  head = (f"# Grouping of {ctx.data.num_clients} clients ({config.dataset}, {ctx.data.num_classes} classes)\n\n"
          f"min_examples={g.min_examples}, max_clients={g.max_clients}, num_superclients={n or 'from constraints'}, "
          f"seed={sc.grouping_seed(config)}; label entropy of all the data: "
          f"{records[0]['summary']['global_entropy_bits']:.3f} bits\n")
  md = '\n'.join([head, summary_table(records), '', f"## Superclients of {records[0]['method']}", '',
                  superclient_table(records[0]), ''])
  with open(os.path.join(out, 'report.json'), 'w') as f:
    json.dump(records, f, indent=1)
  with open(os.path.join(out, 'report.md'), 'w') as f:
    f.write(md)
  print(md)
  print(f'report: {out}/report.md  {out}/report.json')


if __name__ == '__main__':
  from fedjax_flat.training import cli as _cli
  _cli.run_main(main, config_preflight=True)   # every error one line and its exit status
