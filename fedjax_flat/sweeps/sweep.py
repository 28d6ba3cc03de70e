"""Sweeps: a base config x a grid of overrides x seeds, run as local processes or written as a SLURM array.

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
where <cell> is the cell's `name` or `k=v,...` over the keys that vary between cells (deterministic).

One driver per sweep directory: `lock_sweep_dir` holds an exclusive flock on <dir>/.sweep.lock for the
driver's life (a second driver is refused, naming the first's pid), so sweep.json has one writer; it is written
atomically (a temporary file renamed over it). The local runner's children die with the driver (Linux: the
kernel sends them SIGTERM when it ends, however it ends; train.py then checkpoints and stops), and a run whose
workdir is still locked by a live process (a child of a killed driver still checkpointing) is waited for, not
reported as failed. A failed child's reason is its log's last `error:` line of that attempt.
"""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import hashlib
import importlib.util
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from absl import flags
import jax
from ml_collections import config_flags

from fedjax_flat import devices
from fedjax_flat import errors
from fedjax_flat.core import runs as runs_lib
from fedjax_flat.config import algo_flags
from fedjax_flat.training import batched
from fedjax_flat.training import cli
from fedjax_flat.config import validate

RESERVED = ('config', 'name', 'reference')
TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     'experiments', 'train.py')


class SweepError(errors.BadInputError):
  """Bad sweep input; the message names the bad value and the fix."""


SWEEP_LOCK = '.sweep.lock'


def lock_sweep_dir(sweep_dir: str) -> Optional[int]:
  """An exclusive flock on <sweep_dir>/.sweep.lock, held until the returned descriptor is closed (the kernel
  drops it when the driver ends, however it ends). SweepError naming the holder's pid if another driver
  holds it. None on filesystems without flock (then a second driver is not detected)."""
  os.makedirs(sweep_dir, exist_ok=True)
  path = os.path.join(sweep_dir, SWEEP_LOCK)
  fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = os.pread(fd, 64, 0).decode(errors='replace').strip()
    os.close(fd)
    raise SweepError(f'sweep directory {sweep_dir} is in use by another sweep driver '
                     f'({"process " + holder if holder.isdigit() else "its pid is not recorded yet"}; lock {path}): '
                     'wait for it to finish, or stop it (its runs checkpoint and stop), then rerun') from None
  except OSError as e:
    os.close(fd)
    if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
      return None
    raise
  try:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
  except OSError:
    pass
  return fd


def workdir_holder(workdir: str) -> Optional[str]:
  """The pid (as text) of a live process holding the run's workdir lock (training/workdir.py), else None."""
  path = os.path.join(workdir, '.run.lock')
  try:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
  except OSError:
    return None
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except BlockingIOError:
    return os.pread(fd, 64, 0).decode(errors='replace').split(' ')[0].strip() or '?'
  except OSError:
    return None
  finally:
    os.close(fd)       # releases the probe's shared lock, if it got one
  return None


_PR_SET_PDEATHSIG = 1


def _die_with_parent():
  """A preexec_fn for the driver's children: the kernel sends the child SIGTERM when the driver ends, however
  it ends (Linux prctl PR_SET_PDEATHSIG; train.py then checkpoints and stops). None where there is no prctl:
  a rerun then waits for a still-running child (`workdir_holder`). Everything is resolved before the fork;
  the child only makes the call (and ends if the driver died before it)."""
  try:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
  except (OSError, AttributeError):
    return None
  parent, sig = os.getpid(), int(signal.SIGTERM)

  def bind():
    prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:       # the driver ended between the fork and the call
      os._exit(143)
  return bind


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

  @property
  def key(self) -> str:
    return f'{self.cell}/seed={self.seed}'

  def argv(self, python: str = sys.executable, fresh: bool = False) -> List[str]:
    args = [python, self.binary, f'--config={self.config}']
    args += [f'--config.{k}={format_value(v)}' for k, v in self.overrides.items()]
    args += [f'--config.seed={self.seed}', f'--workdir={self.workdir}']
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
      raise SweepError(f'--sweep={spec!r}: {path} defines no get_sweep(); see fedjax_flat/sweeps/sweep.py')
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


def pack_runs(runs: List[Run], configs: List[Any], batch_runs: int) -> List[List[int]]:
  """Runs (indices) packed into batched programs of at most `batch_runs`: compatible runs (equal config once
  the per-run values are removed: core/runs.compat_key) together, in sweep order; a config that cannot be
  batched at all (training/batched.batch_blocker) alone. Deterministic in the whole sweep, so a resumed
  sweep packs the unfinished runs as the first attempt did."""
  specs = [batched.RunSpec(r.key, c, r.workdir) for r, c in zip(runs, configs)]
  alone = [i for i, c in enumerate(configs) if batched.batch_blocker(c)]
  packable = [i for i in range(len(runs)) if i not in alone]
  packs = [[packable[j] for j in p] for p in batched.pack_groups([specs[i] for i in packable], batch_runs)]
  return sorted(packs + [[i] for i in alone], key=lambda p: p[0])


# --------------------------------------------------------------------------------------------- status

def _get(d: Dict, dotted: str):
  for part in dotted.split('.'):
    if not isinstance(d, dict) or part not in d:
      return '<absent>'
    d = d[part]
  return d


def run_status(run: Run) -> str:
  """'finished' (summary.json complete and config.json holds this run's overrides and seed), 'mismatch'
  (finished, but with other values: rerun with --fresh), 'partial' (started: train.py resumes it) or 'new'."""
  try:
    with open(os.path.join(run.workdir, 'summary.json')) as f:
      summary = json.load(f)
    with open(os.path.join(run.workdir, 'config.json')) as f:
      config = json.load(f)
  except (OSError, ValueError):
    return 'partial' if os.path.isdir(os.path.join(run.workdir, 'checkpoints')) else 'new'
  if summary.get('experiment') == 'source pre-training':
    pass              # its summary.json is written once, at the end (training/source_pretrain.py)
  elif summary.get('rounds_completed', -1) < config.get('rounds', math.inf) or summary.get('stopped_by_signal'):
    return 'partial'
  wanted = {**run.overrides, 'seed': run.seed}
  if any(not values_equal(_get(config, k), v) for k, v in wanted.items()):
    return 'mismatch'
  # config.json does not name the config file it came from: the sweep that launched the run wrote it beside
  # (two single-cell sweeps in one --sweep_dir share the cell name 'base' but not their config).
  try:
    with open(os.path.join(run.workdir, CONFIG_MARK)) as f:
      if f.read().strip() != (run.config or '').strip():
        return 'mismatch'
  except OSError:
    pass              # a run from before the mark, or not launched by a sweep: overrides and seed decide
  return 'finished'


CONFIG_MARK = 'sweep_config.txt'


def mark_config(run: Run) -> None:
  """Names the run's config (file[:cell]) in its workdir, for run_status."""
  os.makedirs(run.workdir, exist_ok=True)
  tmp = os.path.join(run.workdir, f'.{CONFIG_MARK}.{os.getpid()}')
  with open(tmp, 'w') as f:
    f.write((run.config or '') + '\n')
  os.replace(tmp, os.path.join(run.workdir, CONFIG_MARK))


# --------------------------------------------------------------------------------------------- manifest

def _manifest_writer(manifest_runs: Optional[List[Run]], prior: Optional[Dict[str, Dict]]):
  """write_manifest, or for one stage of a sweep (run_stages) a writer listing every run of the sweep: the other
  stages' with their states `prior`, this stage's with the states it is given."""
  if manifest_runs is None:
    return write_manifest
  return lambda sweep_dir, runs, info, states: write_manifest(sweep_dir, manifest_runs, info,
                                                              {**(prior or {}), **states})


class ManifestWriteError(errors.OperationError):
  """sweep.json could not be written (a full disk, permissions)."""


def write_manifest(sweep_dir: str, runs: List[Run], info: Dict[str, Any], states: Dict[str, Dict]) -> str:
  """sweep.json, atomically (a temporary file of this process renamed over it; the driver holds the sweep
  directory's lock, so it is the one writer). ManifestWriteError on a full disk / permissions."""
  path = os.path.join(sweep_dir, 'sweep.json')
  doc = dict(info, runs=[dict(cell=r.cell, seed=r.seed, workdir=os.path.relpath(r.workdir, sweep_dir),
                              config=r.config, overrides=r.overrides, reference=r.reference,
                              command=shlex.join(r.argv()), **({'stage': r.stage} if r.stage else {}),
                              **states.get(r.key, {})) for r in runs])
  tmp = f'{path}.{os.getpid()}.tmp'
  try:
    os.makedirs(sweep_dir, exist_ok=True)
    with open(tmp, 'w') as f:
      f.write(json.dumps(doc, indent=1, default=str))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise ManifestWriteError(f'could not write {path}: {e.strerror or e}. Free disk space or fix permissions, '
                             'then rerun the same command: finished runs are skipped, interrupted ones resume '
                             'from their checkpoints') from None
  return path


# --------------------------------------------------------------------------------------------- local runner

def _fmt_s(s: float) -> str:
  s = int(max(s, 0))
  return f'{s // 3600}h{s // 60 % 60:02d}m' if s >= 3600 else f'{s // 60}m{s % 60:02d}s'


def _last_error(log_path: str, returncode: Optional[int] = None) -> str:
  """Why a child failed: the last `error:` (or absl `FATAL`) line its log holds after the driver's header of
  this attempt; else the last line of a traceback; else the signal that killed it or its exit status. Never
  the header (the command line) itself."""
  try:
    with open(log_path, 'rb') as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - (1 << 20)))
      lines = [ln.strip() for ln in f.read().decode(errors='replace').splitlines()]
  except OSError:
    lines = []
  heads = [i for i, ln in enumerate(lines) if ln.startswith('# ') and ' --workdir=' in ln]
  lines = [ln for ln in lines[heads[-1] + 1 if heads else 0:] if ln]
  for ln in reversed(lines):
    if ln.startswith(('error:', 'FATAL')):
      return ln[:300]
  for ln in reversed(lines):
    if re.match(r'^[A-Za-z_.]*(Error|Exception)\b', ln):
      return ln[:300]
  if returncode is not None and returncode < 0:
    try:
      name = signal.Signals(-returncode).name
    except ValueError:
      name = f'signal {-returncode}'
    return f'killed by {name} (no error line in the log)'
  return f'exit {returncode} (no error line in the log)' if returncode is not None else ''


def run_local(runs: List[Run], sweep_dir: str, info: Dict[str, Any], *, parallel: int = 1, fresh: bool = False,
              python: str = sys.executable, poll_s: float = 0.5, stream=sys.stderr,
              env: Optional[Dict[str, str]] = None, manifest_runs: Optional[List[Run]] = None,
              prior: Optional[Dict[str, Dict]] = None) -> Dict[str, Dict]:
  """Runs the unfinished runs `parallel` at a time; returns {run key: state dict}. One failure stops nothing.

  env: the runs' environment (default: fedjax_flat/devices.child_env, i.e. usable cores // parallel host
  devices per run unless the user chose a count). manifest_runs / prior: a stage's call (run_stages): sweep.json
  lists every run of the sweep, those of other stages with their states `prior`."""
  env = devices.child_env(parallel) if env is None else env
  states: Dict[str, Dict] = {}
  write_manifest = _manifest_writer(manifest_runs, prior)
  todo = []
  for r in runs:
    st = run_status(r)
    if st == 'finished':
      states[r.key] = {'status': 'skipped (finished)'}
    elif st == 'mismatch' and not fresh:
      states[r.key] = {'status': 'failed', 'returncode': None,
                       'error': f'{r.workdir} finished with another config or other values; give this sweep '
                       'its own --sweep_dir, or rerun it with --fresh'}
    else:
      todo.append(r)
  n_skip = sum(s['status'].startswith('skipped') for s in states.values())
  total, t0 = len(todo), time.time()
  running: Dict[str, tuple] = {}
  durations: List[float] = []
  stop = {'sig': None}
  tty = hasattr(stream, 'isatty') and stream.isatty()
  last = {'line': '', 't': 0.0}

  def show(force=False):
    done = sum(s['status'] == 'done' for s in states.values())
    failed = sum(s['status'] == 'failed' for s in states.values())
    pending = len(queue)
    eta = ''
    if durations:
      waves = math.ceil((pending + len(running)) / max(parallel, 1))
      eta = f', ETA {_fmt_s(waves * sum(durations) / len(durations))}'
    line = (f'[sweep] {done}/{total} done, {len(running)} running, {failed} failed, {pending} pending'
            f' ({n_skip} finished earlier), elapsed {_fmt_s(time.time() - t0)}{eta}')
    now = time.time()
    if tty:
      stream.write('\r' + line.ljust(len(last['line'])))
    elif force or now - last['t'] > 60:      # a log file: state changes and a heartbeat, not a line a second
      stream.write(line + '\n')
    else:
      return
    stream.flush()
    last.update(line=line, t=now)

  def on_signal(signum, frame):
    stop['sig'] = signum
    for _, (proc, _, _, _) in list(running.items()):
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)    # train.py checkpoints and exits 0; the next sweep resumes it

  old = {}
  for s in (signal.SIGINT, signal.SIGTERM):
    try:
      old[s] = signal.signal(s, on_signal)
    except ValueError:                       # not the main thread (tests): no forwarding
      pass
  queue = list(todo)
  bind_child = _die_with_parent()
  waiting: Dict[str, str] = {}      # run key -> pid of the live process holding its workdir
  manifest_failed = {'msg': None}

  def manifest():
    """sweep.json now; while runs are going, a failed write is one warning (the runs go on and the final write
    says it again), not the driver's end."""
    try:
      write_manifest(sweep_dir, runs, info, states)
      manifest_failed['msg'] = None
    except ManifestWriteError as e:
      if manifest_failed['msg'] is None:
        stream.write(f'warning: {e}\n')
        stream.flush()
      manifest_failed['msg'] = str(e)

  try:
    def launch():
      for r in list(queue):
        if len(running) >= parallel or stop['sig'] is not None:
          break
        holder = workdir_holder(r.workdir)
        if holder is not None:       # e.g. a child of a killed driver, still checkpointing: wait for it
          if waiting.get(r.key) != holder:
            stream.write(f'[sweep] {r.key}: its workdir is in use by process {holder} (a run of an earlier '
                         'sweep driver?); waiting for it to end\n')
            stream.flush()
          waiting[r.key] = holder
          states[r.key] = {'status': 'waiting', 'holder_pid': holder}
          continue
        waiting.pop(r.key, None)
        queue.remove(r)
        mark_config(r)
        log_path = os.path.join(r.workdir, 'sweep.log')
        log = open(log_path, 'a')
        log.write(f'\n# {time.strftime("%Y-%m-%d %H:%M:%S")} {shlex.join(r.argv(python, fresh))}\n')
        log.flush()
        # its own session (a terminal's Ctrl-C reaches the driver only, which forwards SIGTERM), and the
        # kernel's SIGTERM when the driver ends however it ends (killed included): no orphaned runs
        proc = subprocess.Popen(r.argv(python, fresh), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                preexec_fn=bind_child)
        running[r.key] = (proc, log, time.time(), log_path)
        states[r.key] = {'status': 'running', 'pid': proc.pid}

    launch()
    manifest()
    show(force=True)
    while queue or running:
      if stop['sig'] is not None and not running:
        break
      time.sleep(poll_s if not waiting or running else max(poll_s, 2.0))
      changed = False
      for key in list(running):
        proc, log, start, log_path = running[key]
        rc = proc.poll()
        if rc is None:
          continue
        log.close()
        del running[key]
        changed = True
        wall = time.time() - start
        run = next(r for r in todo if r.key == key)
        if rc == 0 and run_status(run) == 'finished':
          durations.append(wall)
          states[key] = {'status': 'done', 'returncode': 0, 'wall_s': round(wall, 1)}
        elif stop['sig'] is not None and rc in (0, -signal.SIGTERM):
          # stopped by the driver's forwarded SIGTERM: checkpointed (0), or ended by it before train.py had
          # installed its handler (still starting): nothing to report as a failure, the rerun resumes it
          states[key] = {'status': 'stopped', 'returncode': rc, 'wall_s': round(wall, 1)}
        else:
          states[key] = {'status': 'failed', 'returncode': rc, 'wall_s': round(wall, 1),
                         'error': _last_error(log_path, rc), 'log': log_path}
      n_wait = len(waiting)
      launch()      # before the display, so it shows the slots refilled
      if changed or len(waiting) != n_wait:
        manifest()
      show(force=changed)
    for r in queue:
      if states.get(r.key, {}).get('status') in (None, 'waiting'):
        states[r.key] = {'status': 'not started'}
  finally:
    for s, h in old.items():
      signal.signal(s, h)
    if tty:
      stream.write('\n')
  write_manifest(sweep_dir, runs, info, states)     # the last word: a failure here is the driver's error
  return states


def run_batched(runs: List[Run], configs: List[Any], sweep_dir: str, info: Dict[str, Any], *, batch_runs: int,
                fresh: bool = False, stop_requested=lambda: False, signal_name=lambda: None,
                stream=sys.stderr, poll_s: float = 2.0, compile_ahead: bool = True,
                manifest_runs: Optional[List[Run]] = None, prior: Optional[Dict[str, Dict]] = None
                ) -> Dict[str, Dict]:
  """Runs the unfinished runs in this process, packed into batched programs (training/batched.py): every run
  still writes its own workdir (and a line in its sweep.log). Returns {run key: state dict} as run_local. A run
  whose workdir is held by a live process is waited for (sweep.json: 'waiting'), never marked failed; a stop
  request while waiting leaves it 'not started'.

  compile_ahead: while pack p trains, pack p+1 is opened and its program compiled on a thread (XLA compiles
  outside the GIL), so a table of several program structures pays for one compilation in its wall time, not
  for each. The packs' numbers do not depend on it (the same executable either way)."""
  states: Dict[str, Dict] = {}
  write_manifest = _manifest_writer(manifest_runs, prior)
  for r in runs:
    st = run_status(r)
    if st == 'finished':
      states[r.key] = {'status': 'skipped (finished)'}
    elif st == 'mismatch' and not fresh:
      states[r.key] = {'status': 'failed', 'returncode': None,
                       'error': f'{r.workdir} finished with another config or other values; give this sweep '
                       'its own --sweep_dir, or rerun it with --fresh'}
  packs = pack_runs(runs, configs, batch_runs)
  n_dev = len(jax.local_devices())
  write_manifest(sweep_dir, runs, info, states)
  t0 = time.time()
  data_cache: Dict[str, Any] = {}          # each dataset loaded once for the whole sweep
  ahead: Dict[int, tuple] = {}             # pack index -> (its todo, batched.OpenedBatch), opened ahead

  def open_ahead(q: int):
    """Opens pack q (its runs not finished and not held elsewhere) and compiles its program on a thread."""
    if not compile_ahead or q >= len(packs) or q in ahead or stop_requested():
      return
    todo_q = [i for i in packs[q] if runs[i].key not in states and workdir_holder(runs[i].workdir) is None]
    if todo_q:
      specs = [batched.RunSpec(runs[i].key, configs[i], runs[i].workdir) for i in todo_q]
      try:
        ob = batched.open_batch(specs, fresh=fresh, lanes=runs_lib.lanes_for(len(packs[q]), n_dev),
                                data_cache=data_cache, alone=batched.single_run_pack_alone(len(packs[q]), n_dev))
      except Exception as e:  # noqa: BLE001 -- the pack is opened again in its turn, where its error is reported
        stream.write(f'[sweep] program {q + 1}/{len(packs)} could not be opened ahead ({type(e).__name__}: '
                     f'{str(e).splitlines()[0] if str(e) else ""}); it compiles in its turn\n')
        return
      ob.compile_ahead()
      ahead[q] = (todo_q, ob)

  try:
    for p, pack in enumerate(packs):
      lanes = runs_lib.lanes_for(len(pack), n_dev)    # the pack's program shape, kept on resume
      todo = [i for i in pack if runs[i].key not in states]
      prepared = ahead.pop(p, None)
      while todo and not stop_requested():
        # A workdir held by a live process (a run started by hand, a child of another driver) is waited for, as
        # run_local does: it is not a failure. 'busy' results (taken between the check and the lock) go round
        # again. Runs opened ahead are held by this process: nothing to wait for; the pack's other runs (held
        # elsewhere when it was opened) go round again after them.
        if prepared is not None:
          now, rest = prepared[0], [i for i in todo if i not in prepared[0]]
        else:
          _wait_for_workdirs([runs[i] for i in todo], runs, sweep_dir, info, states, stop_requested, stream,
                             poll_s, manifest=write_manifest)
          if stop_requested():
            break
          now, rest = todo, []
        busy = _run_pack(p, len(packs), pack, now, lanes, runs, configs, sweep_dir, info, states, fresh,
                         stop_requested, signal_name, stream, t0, prepared=prepared and prepared[1],
                         before_training=lambda: open_ahead(p + 1), data_cache=data_cache,
                         manifest=write_manifest)
        prepared = None
        todo = busy + rest
        if todo:
          time.sleep(poll_s)
      if prepared is not None:         # opened ahead, then a stop: release its runs untouched
        prepared[1].close()
  finally:
    for _, ob in ahead.values():
      ob.close()
  for r in runs:
    if states.get(r.key, {}).get('status') in (None, 'waiting'):
      states[r.key] = {'status': 'not started'}
  write_manifest(sweep_dir, runs, info, states)
  return states


def _wait_for_workdirs(todo: List[Run], runs, sweep_dir, info, states, stop_requested, stream, poll_s,
                       manifest=write_manifest) -> None:
  """Returns once no run of `todo` has its workdir held by a live process (or a stop is requested); says so
  once per holder, and sweep.json shows the runs as 'waiting' meanwhile."""
  said: Dict[str, str] = {}
  while not stop_requested():
    busy = {r.key: h for r in todo for h in [workdir_holder(r.workdir)] if h is not None}
    if not busy:
      return
    changed = False
    for key, holder in busy.items():
      if said.get(key) != holder:
        stream.write(f'[sweep] {key}: its workdir is in use by process {holder} (a run started elsewhere, or of an '
                     'earlier sweep driver?); waiting for it to end\n')
        stream.flush()
        said[key] = holder
        states[key] = {'status': 'waiting', 'holder_pid': holder}
        changed = True
    if changed:
      manifest(sweep_dir, runs, info, states)
    time.sleep(poll_s)


def _run_pack(p, n_packs, pack, todo, lanes, runs, configs, sweep_dir, info, states, fresh, stop_requested,
              signal_name, stream, t0, prepared=None, before_training=lambda: None, data_cache=None,
              manifest=write_manifest) -> List[int]:
  """Trains the runs `todo` of pack p in one batched program (training/batched.py); returns those found
  busy (their workdir taken by a live process before the program could lock it), to be waited for.
  prepared: the pack opened ahead (batched.OpenedBatch of exactly `todo`), its program compiled or compiling."""
  for i in todo:
    mark_config(runs[i])
    with open(os.path.join(runs[i].workdir, 'sweep.log'), 'a') as log:
      log.write(f'\n# {time.strftime("%Y-%m-%d %H:%M:%S")} batched program {p + 1}/{n_packs} '
                f'({len(pack)} runs, {lanes} lanes): {shlex.join(runs[i].argv("python", fresh))}\n')
    states[runs[i].key] = {'status': 'running', 'pid': os.getpid(), 'program': p}
  manifest(sweep_dir, runs, info, states)
  alone = batched.single_run_pack_alone(len(pack), len(jax.local_devices()))
  stream.write(f'[sweep] program {p + 1}/{n_packs}: {len(todo)} runs '
               f'({"alone, clients over the devices" if alone else f"{lanes} lanes"}), '
               f'elapsed {_fmt_s(time.time() - t0)}' + (', compiled ahead' if prepared is not None else '') + '\n')
  stream.flush()
  if prepared is None:
    specs = [batched.RunSpec(runs[i].key, configs[i], runs[i].workdir) for i in todo]
    res = batched.run_batch(specs, fresh=fresh, stop_requested=stop_requested, signal_name=signal_name,
                            lanes=lanes, before_training=before_training, data_cache=data_cache,
                            alone=alone)
  else:
    try:
      before_training()
      res = prepared.train(stop_requested=stop_requested, signal_name=signal_name)
    finally:
      prepared.close()
  busy = []
  for k, i in enumerate(todo):
    rr = res.get(k, batched.RunResult('failed', error='not run'))
    if rr.status == 'busy':
      busy.append(i)
      states[runs[i].key] = {'status': 'waiting'}
      continue
    st = {'status': rr.status, 'returncode': 0 if rr.status != 'failed' else 1, 'wall_s': round(rr.wall_s, 1),
          'program': p, 'lanes': rr.lanes}
    if rr.error:
      st['error'] = rr.error[:300]
      with open(os.path.join(runs[i].workdir, 'sweep.log'), 'a') as log:
        log.write(f'error: {rr.error}\n')
    states[runs[i].key] = st
  manifest(sweep_dir, runs, info, states)
  return busy


def stages_of(runs: List[Run]) -> List[tuple]:
  """[(stage name, [run indices])] in the sweep's order."""
  out: List[tuple] = []
  for i, r in enumerate(runs):
    if not out or out[-1][0] != r.stage:
      out.append((r.stage, []))
    out[-1][1].append(i)
  return out


def run_stages(runs: List[Run], configs: List[Any], sweep_dir: str, info: Dict[str, Any], *, batch_runs: int = 0,
               parallel: int = 1, fresh: bool = False, python: str = sys.executable, stop_requested=lambda: False,
               signal_name=lambda: None, stream=sys.stderr, compile_ahead: bool = True,
               env: Optional[Dict[str, str]] = None) -> Dict[str, Dict]:
  """A pipeline's stages in order (expand's `stages`): each stage's runs as run_local (or run_batched for train.py
  stages with batch_runs) once the stage before it has ended; a run whose input file (an earlier stage's output)
  is absent when its stage starts is 'not started', naming its producer. A stop (a signal, an interrupted run)
  ends the sweep after the current stage. sweep.json lists every run of every stage throughout."""
  states: Dict[str, Dict] = {}
  stopped = False
  for name, idx in stages_of(runs):
    ready = []
    for i in idx:
      r = runs[i]
      missing = [p for p in r.inputs if not os.path.isfile(p)]
      if stopped:
        states[r.key] = {'status': 'not started'}
      elif missing and run_status(r) != 'finished':
        states[r.key] = {'status': 'not started', 'error': f'its input {missing[0]} is absent: {r.inputs[missing[0]]} '
                         'did not finish; rerun the sweep once it has'}
      else:
        ready.append(i)
    if not ready:
      continue
    stream.write(f'[sweep] stage {name}: {len(ready)} runs ({runs[ready[0]].binary.rsplit(os.sep, 1)[-1]})\n')
    stream.flush()
    sub = [runs[i] for i in ready]
    if batch_runs and runs[ready[0]].binary == TRAIN:
      got = run_batched(sub, [configs[i] for i in ready], sweep_dir, info, batch_runs=batch_runs, fresh=fresh,
                        stop_requested=stop_requested, signal_name=signal_name, stream=stream,
                        compile_ahead=compile_ahead, manifest_runs=runs, prior=states)
    else:
      got = run_local(sub, sweep_dir, info, parallel=parallel, fresh=fresh, python=python, stream=stream, env=env,
                      manifest_runs=runs, prior=states)
    states.update(got)
    stopped = stop_requested() or any(st['status'] in ('stopped', 'not started', 'running') for st in got.values())
  write_manifest(sweep_dir, runs, info, states)
  return states


# --------------------------------------------------------------------------------------------- SLURM

def write_slurm(runs: List[Run], sweep_dir: str, *, name: str, python: str, parallel: int = 0, nodes: int = 1,
                sbatch_args: Sequence[str] = (), include_finished: bool = False) -> tuple:
  """Writes sweep_dir/commands.txt (one train.py command per array task) and sweep_dir/sweep.sbatch.

  nodes > 1: every array task is a multi-host job (docs/scaling.md): srun starts one train.py per node with
  --distributed, and JAX reads the SLURM environment. Returns (script path, commands path, task count).
  """
  todo = [r for r in runs if include_finished or run_status(r) != 'finished']
  os.makedirs(os.path.join(sweep_dir, 'slurm_logs'), exist_ok=True)
  cmd_path = os.path.join(sweep_dir, 'commands.txt')
  with open(cmd_path, 'w') as f:
    for r in todo:
      argv = r.argv(python) + (['--distributed'] if nodes > 1 else [])
      f.write(shlex.join(argv) + '\n')
  script = os.path.join(sweep_dir, 'sweep.sbatch')
  lines = ['#!/bin/bash', f'#SBATCH --job-name={name}',
           f'#SBATCH --array=0-{len(todo) - 1}' + (f'%{parallel}' if parallel else ''),
           f'#SBATCH --output={os.path.abspath(sweep_dir)}/slurm_logs/%A_%a.out']
  if nodes > 1:
    lines += [f'#SBATCH --nodes={nodes}', '#SBATCH --ntasks-per-node=1']
  lines += [f'#SBATCH {a}' for a in sbatch_args]
  lines += ['# Generated by experiments/sweep.py --launcher=slurm; submit with: sbatch ' + script,
            '# Task i runs line i+1 of commands.txt. A preempted or requeued task resumes from its workdir.',
            # relative config / workdir paths mean what they meant here
            'set -euo pipefail', f'cd {shlex.quote(os.getcwd())}',
            f'CMD=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(os.path.abspath(cmd_path))})',
            # The line is a shlex-quoted argv written above; bash -c parses it as such (no config is evaluated).
            ('srun --nodes=$SLURM_JOB_NUM_NODES --ntasks-per-node=1 bash -c "$CMD"' if nodes > 1
             else 'bash -c "$CMD"')]
  with open(script, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  os.chmod(script, 0o755)
  return script, cmd_path, len(todo)
