"""The grid: a sweep file or flags expanded into its runs, each with the config train.py would build.

A sweep file (`configs/sweeps/<name>.py`) defines `get_sweep(arg='')` returning a dict:

  config    base config, `path[:arg]`, passed to experiments/train.py unchanged
  fixed     {dotted key: value} overrides common to every run (optional)
  grid      {dotted key: [values]} (cartesian product) or a list of cells (dicts); a cell may hold
            `config` (its own base config), `name` (its directory / row name), `reference`
            ({'source': str, 'accuracy': percent[, 'accuracy_std']}: an earlier measurement shown beside the
            new one by experiments/report.py) and dotted overrides
  seeds     [ints] (optional; default [0]); each run gets --config.seed=<s>
  stages    (optional, instead of grid) a table's pipeline: a list of stages run in order, each a dict with
            `name`, `grid` and optionally `binary` (experiments/train.py by default, or
            experiments/pretrain_source.py), `config`, `fixed`, `seeds` (else the sweep's). A cell's override
            value {'output_of': '<stage>/<cell>', 'file': '<name>'} is that earlier run's output file (the run of
            the same seed, or the producer's only seed): the path is declared before it exists, so every run is
            validated before anything launches; the file is checked when its stage starts (a run whose input is
            missing is not started, naming its producer). A stage starts when the one before it has ended;
            finished runs of any stage are skipped on a rerun. Workdirs: <dir>/<stage>/<cell>/seed=<s>.

Each run is `train.py --config=<config> --config.<k>=<v> ... --config.seed=<s> --workdir=<dir>/<cell>/seed=<s>`,
where <cell> is the cell's `name` or `k=v,...` over the keys that vary between cells (deterministic). `run_configs`
builds and validates every run's ConfigDict before anything launches (sweeps/sweep.py drives them).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import math
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence

from absl import flags
from ml_collections import config_flags

from fedjax_flat import errors
from fedjax_flat.config import algo_flags
from fedjax_flat.config import validate
from fedjax_flat.training import cli
from fedjax_flat.training import tracking as tracking_lib

RESERVED = ('config', 'name', 'reference')
TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     'experiments', 'train.py')


class SweepError(errors.BadInputError):
  """Bad sweep input; the message names the bad value and the fix."""



@dataclasses.dataclass
class Run:
  cell: str                 # directory name of the cell (also the default report group)
  seed: int
  config: str               # path[:arg]
  overrides: Dict[str, Any]  # dotted key -> value (fixed + cell), without the seed
  workdir: str
  reference: Optional[Dict[str, Any]] = None
  binary: str = TRAIN       # the entry point (a stage's: experiments/pretrain_source.py)
  stage: str = ''           # the pipeline stage ('' for a sweep without stages)
  inputs: Dict[str, str] = dataclasses.field(default_factory=dict)   # file an earlier stage writes -> its run key
  tracking: Optional[tracking_lib.Spec] = None   # --tracker of the sweep: train.py runs tracked, named by their key

  @property
  def key(self) -> str:
    return f'{self.cell}/seed={self.seed}'

  def argv(self, python: str = sys.executable, fresh: bool = False) -> List[str]:
    args = [python, self.binary, f'--config={self.config}']
    args += [f'--config.{k}={format_value(v)}' for k, v in self.overrides.items()]
    args += [f'--config.seed={self.seed}', f'--workdir={self.workdir}']
    if self.tracking is not None and self.binary == TRAIN:   # pretrain_source.py runs are not tracked
      args += self.tracking.argv() + [f'--tracking_name={self.key}']
    return args + (['--fresh'] if fresh else [])

# --------------------------------------------------------------------------------------------- values

def parse_value(text: str) -> Any:
  """A command-line grid value, typed without eval: True/False, int, float, else the string."""
  if text in ('True', 'False', 'true', 'false'):
    return text in ('True', 'true')
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return text


def format_value(v: Any) -> str:
  if isinstance(v, bool):
    return 'True' if v else 'False'
  if isinstance(v, float):
    return repr(v)
  if isinstance(v, (list, tuple)):
    return '(' + ','.join(format_value(x) for x in v) + (',)' if len(v) == 1 else ')')
  return str(v)


def _norm(v):
  if isinstance(v, bool) or v is None or isinstance(v, str):
    return v
  if isinstance(v, (int, float)):
    return float(v)
  if isinstance(v, (list, tuple)):
    return tuple(_norm(x) for x in v)
  return v


def values_equal(a, b) -> bool:
  na, nb = _norm(a), _norm(b)
  if isinstance(na, float) and isinstance(nb, float):
    return math.isclose(na, nb, rel_tol=1e-9, abs_tol=1e-12)
  return na == nb or str(a) == str(b)


def _name_value(v) -> str:
  if isinstance(v, dict) and 'output_of' in v:      # an earlier stage's output: named by its producer
    return re.sub(r'[/\\\s,=]+', '_', str(v['output_of']))
  return re.sub(r'[/\\\s]+', '_', format_value(v)).strip('()') if isinstance(v, (list, tuple)) else \
      re.sub(r'[/\\\s]+', '_', format_value(v))


# --------------------------------------------------------------------------------------------- spec

def parse_grid_flags(grid_flags: Sequence[str]) -> Dict[str, List[Any]]:
  grid = {}
  for g in grid_flags:
    key, sep, vals = g.partition('=')
    key = key.strip()
    if key.startswith('config.'):
      key = key[len('config.'):]
    if not sep or not key or not vals:
      raise SweepError(f'--grid={g!r} is not KEY=V1,V2,...; e.g. --grid=client.optimizer=sgd,sam')
    grid[key] = [parse_value(x.strip()) for x in vals.split(',')]
  return grid


def parse_seeds(text: str) -> List[int]:
  try:
    seeds = [int(s) for s in text.split(',') if s.strip()]
  except ValueError:
    raise SweepError(f'--seeds={text!r} is not a comma-separated list of integers; e.g. --seeds=0,1,2') from None
  if not seeds:
    raise SweepError(f'--seeds={text!r} is empty; e.g. --seeds=0,1,2')
  if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
    raise SweepError(f'--seeds={text!r}: seeds are distinct integers >= 0; e.g. --seeds=0,1,2')
  return seeds


def load_sweep_file(spec: str) -> Dict[str, Any]:
  """`path[:arg]` -> the dict returned by the file's get_sweep(arg)."""
  path, _, arg = spec.partition(':')
  if not os.path.isfile(path):
    raise SweepError(f'--sweep={spec!r}: no file {path!r}; give a sweep file such as configs/sweeps/<name>.py')
  mod_spec = importlib.util.spec_from_file_location('sweep_' + hashlib.md5(path.encode()).hexdigest()[:8], path)
  mod = importlib.util.module_from_spec(mod_spec)
  try:
    mod_spec.loader.exec_module(mod)
    if not hasattr(mod, 'get_sweep'):
      raise SweepError(f'--sweep={spec!r}: {path} defines no get_sweep(); see fedjax_flat/sweeps/grid.py')
    out = mod.get_sweep(arg) if arg else mod.get_sweep()
  except SweepError:
    raise
  except SyntaxError as e:
    raise SweepError(f'--sweep={spec!r}: syntax error in {e.filename}:{e.lineno}: {e.msg}') from None
  except Exception as e:  # noqa: BLE001 -- an error of the user's sweep file is one line, not a traceback
    raise SweepError(f'--sweep={spec!r}: get_sweep failed{cli.where(e, path)}: {type(e).__name__}: {e}') from None
  if not isinstance(out, dict):
    raise SweepError(f'--sweep={spec!r}: get_sweep() returned {type(out).__name__}, expected a dict')
  if out.get('config') is not None and not isinstance(out['config'], str):
    raise SweepError(f'--sweep={spec!r}: config={out["config"]!r}: a config path[:arg] string')
  return out


def product(**lists) -> List[Dict[str, Any]]:
  """Cartesian product of {key: [values]} as a list of cells (for sweep files)."""
  keys = list(lists)
  return [dict(zip(keys, vals)) for vals in itertools.product(*(lists[k] for k in keys))]


STAGE_KEYS = ('name', 'binary', 'config', 'fixed', 'grid', 'seeds')
BINARIES = ('experiments/train.py', 'experiments/pretrain_source.py')


def expand(spec: Dict[str, Any], sweep_dir: str) -> List[Run]:
  """The sweep's runs, in a deterministic order (stages in order, cells in grid order, seeds inner)."""
  unknown = set(spec) - {'config', 'fixed', 'grid', 'seeds', 'name', 'description', 'stages'}
  if unknown:
    raise SweepError(f'unknown sweep keys {sorted(unknown)}; allowed: config, fixed, grid, seeds, name, description, '
                     'stages')
  if spec.get('stages') is None:
    return _expand_grid(spec, sweep_dir)
  stages = spec['stages']
  if spec.get('grid') is not None or not isinstance(stages, (list, tuple)) or not stages:
    raise SweepError('stages: a non-empty list of stages (dicts with name and grid) instead of a grid, not both')
  runs: List[Run] = []
  seen = set()
  for st in stages:
    if not isinstance(st, dict) or set(st) - set(STAGE_KEYS) or not st.get('name') or st.get('grid') is None:
      raise SweepError(f'stage {st!r}: a dict with name and grid (optional: binary, config, fixed, seeds)')
    name = str(st['name'])
    if not re.fullmatch(r'[A-Za-z0-9_.-]+', name) or name in seen:
      raise SweepError(f'stage name {name!r}: distinct names of letters, digits, _ . - (a directory of the sweep)')
    seen.add(name)
    binary = st.get('binary') or 'experiments/train.py'
    if binary not in BINARIES:
      raise SweepError(f'stage {name}: binary={binary!r}; one of {", ".join(BINARIES)}')
    sub = {'config': st.get('config') or spec.get('config'), 'fixed': {**(spec.get('fixed') or {}),
                                                                         **(st.get('fixed') or {})},
           'grid': st['grid'], 'seeds': st.get('seeds') or spec.get('seeds')}
    path = os.path.join(os.path.dirname(os.path.dirname(TRAIN)), binary)
    for r in _expand_grid(sub, os.path.join(sweep_dir, name)):
      runs.append(dataclasses.replace(r, cell=f'{name}/{r.cell}', binary=path, stage=name))
  return _resolve_outputs(runs)


def _resolve_outputs(runs: List[Run]) -> List[Run]:
  """Replaces each {'output_of': '<stage>/<cell>', 'file': f} override by the producer's declared output path (the
  producer's run of the same seed, or its only seed), recorded in the run's inputs."""
  order = {r.stage: i for i, r in reversed(list(enumerate(runs)))}
  by_cell: Dict[str, List[Run]] = {}
  for r in runs:
    by_cell.setdefault(r.cell, []).append(r)
  for r in runs:
    for k, v in list(r.overrides.items()):
      if not isinstance(v, dict):
        continue
      src, fname = v.get('output_of'), v.get('file')
      if set(v) != {'output_of', 'file'} or not isinstance(src, str) or not isinstance(fname, str) or not fname:
        raise SweepError(f"{r.key}: {k}={v!r}; an earlier stage's output is {{'output_of': '<stage>/<cell>', "
                         "'file': '<file name>'}")
      producers = by_cell.get(src)
      if not producers or order[producers[0].stage] >= order[r.stage]:
        raise SweepError(f"{r.key}: {k} reads the output of {src!r}, which is not a cell of an earlier stage; cells: "
                         + ', '.join(c for c in by_cell if order[by_cell[c][0].stage] < order[r.stage]))
      same = [p for p in producers if p.seed == r.seed]
      if not same and len(producers) != 1:
        raise SweepError(f'{r.key}: {src} has no run of seed {r.seed} (its seeds: '
                         f'{[p.seed for p in producers]}); give both stages the same seeds, or the producer one seed')
      p = (same or producers)[0]
      path = os.path.join(p.workdir, fname)
      r.overrides = {**r.overrides, k: path}
      r.inputs = {**r.inputs, path: p.key}
  return runs


def _expand_grid(spec: Dict[str, Any], sweep_dir: str) -> List[Run]:
  base = spec.get('config')
  fixed = spec.get('fixed') or {}
  grid = spec.get('grid') or [{}]
  seeds = spec.get('seeds') or [0]
  if not isinstance(seeds, (list, tuple)) or any(not isinstance(s, int) or isinstance(s, bool) or s < 0
                                                 for s in seeds) or len(set(seeds)) != len(seeds):
    raise SweepError(f'seeds={seeds!r}: a list of distinct integers >= 0, e.g. [0, 1, 2]')
  if not isinstance(fixed, dict) or not isinstance(grid, (dict, list)):
    raise SweepError('fixed must be a dict {key: value} and grid a dict {key: [values]} or a list of cells')
  if isinstance(grid, dict) and any(not isinstance(v, (list, tuple)) or not v for v in grid.values()):
    raise SweepError(f'grid {grid!r}: every key needs a non-empty list of values, e.g. {{"client.lr": [0.1, 0.05]}}')
  if isinstance(grid, list) and any(not isinstance(c, dict) for c in grid):
    raise SweepError('grid: a list of cells holds dicts of overrides')
  if base is not None and not isinstance(base, str):
    raise SweepError(f'config={base!r}: a config path[:arg] string')
  fixed = dict(fixed)
  cells = product(**grid) if isinstance(grid, dict) else [dict(c) for c in grid]
  for c in cells:
    if not (c.get('config') or base):
      raise SweepError(f'cell {c} has no config and the sweep has no base config; set config=path[:arg]')
    bad = [k for k in c if k not in RESERVED and not re.fullmatch(r'[A-Za-z_][\w.]*', k)]
    if bad or 'seed' in c or 'seed' in fixed:
      raise SweepError(f'bad override key(s) {bad or ["seed"]} in cell {c}; use dotted config keys '
                       '(client.rho), seeds go in seeds=[...] / --seeds')
  overrides = [{k: v for k, v in c.items() if k not in RESERVED} for c in cells]
  # Name cells by what varies between them (config included), so names stay short and readable.
  varying = []
  for k in ['config'] + sorted({k for o in overrides for k in o}):
    vals = [(c.get('config') or base) if k == 'config' else o.get(k, '<unset>') for c, o in zip(cells, overrides)]
    if len({format_value(v) for v in vals}) > 1:
      varying.append(k)
  runs, names = [], {}
  for c, o in zip(cells, overrides):
    if c.get('name'):
      name = str(c['name'])
    else:
      parts = []
      for k in varying:
        if k == 'config':
          cfg = c.get('config') or base
          parts.append('config=' + os.path.splitext(os.path.basename(cfg.split(':')[0]))[0] +
                       ('_' + cfg.split(':', 1)[1] if ':' in cfg else ''))
        elif k in o:
          parts.append(f'{k}={_name_value(o[k])}')
      name = ','.join(parts) or 'base'
    name = re.sub(r'[/\\\s]+', '_', name)
    if len(name) > 150:      # file-system limits; keep a readable prefix and a hash of the whole
      name = name[:140] + '~' + hashlib.md5(name.encode()).hexdigest()[:8]
    if name in names:
      raise SweepError(f'two cells get the directory name {name!r} ({names[name]} and {c}); give them names')
    names[name] = c
    for s in seeds:
      runs.append(Run(cell=name, seed=s, config=c.get('config') or base, overrides={**fixed, **o},
                      workdir=os.path.join(sweep_dir, name, f'seed={s}'), reference=c.get('reference')))
  return runs


# --------------------------------------------------------------------------------------------- configs

def run_config(run: Run):
  """The run's ConfigDict exactly as experiments/train.py builds it from the same command line (absl's
  config flag, --config.algo.* over the registry defaults), validated. SweepError: train.py's one line."""
  return config_from_argv(run.argv('python')[1:], run.key, pending_files=tuple(run.inputs))


def config_from_argv(argv: List[str], where: str = 'command', pending_files: Sequence[str] = ()):
  """The ConfigDict a binary's command line (argv[0] the program; --config=... and --config.* overrides, other
  flags ignored) builds, exactly as experiments/train.py builds it, validated. SweepError naming `where`.
  pending_files: an earlier stage's declared outputs, validated as paths before they exist."""
  argv = [argv[0]] + [a for a in argv[1:] if a.startswith('--config')]
  try:
    argv, algo = algo_flags.split_argv(argv)
  except validate.ConfigError as e:
    raise SweepError(f'{where}: {e}') from None
  bad = cli.preflight(argv)
  if bad:
    raise SweepError(f'{where}: {bad}')
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, 'run config', flag_values=fv, lock_config=True, sys_argv=argv)
  try:
    fv(argv)
    config = algo_flags.apply(fv['config'].value, algo)
    validate.validate_config(config, pending_files)
  except (flags.Error, validate.ConfigError, ValueError) as e:
    raise SweepError(f'{where}: {e}') from None
  return config


def run_configs(runs: List[Run]) -> List[Any]:
  """Every run's config, validated before anything launches (the first bad one raises SweepError)."""
  return [run_config(r) for r in runs]
