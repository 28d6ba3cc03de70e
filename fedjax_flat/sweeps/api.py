"""`sweep(algorithm, config, grid, seeds)`: a grid over config fields x seeds from Python, on the runs axis.

    runs = ff.sweep(my_builder, config, grid={'client.rho': [0.05, 0.1]}, seeds=[0, 1], batch_runs=4)
    for r in runs:
      print(r.name, r.seed, r.lanes, r.summary['final_test_accuracy'])

Every grid point (the cartesian product of `grid`'s value lists over dotted config keys) x seed is one run of
`config` with those fields set (`config.seed` = the seed). Runs that may share a compiled program
(training/packing.pack_groups: equal compatibility keys, e.g. values that differ only in numbers) train as lanes
of one program, up to `batch_runs` a program (default training/packing.auto_batch_runs()); the others train
alone, as experiments/sweep.py --batch_runs does. `algorithm` is a registered name or a builder, which
stays unregistered after the sweep (training/api.running). Every config is validated before any run starts (a
bad key or value is one ConfigError line). Each run writes its workdir <sweep_dir>/<name>/seed=<s> (a temporary
directory, removed after, when sweep_dir is None; an existing sweep_dir resumes its finished runs unless
fresh=True). Returns one `SweepRun` per run, in grid order then seed order.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import jax

from fedjax_flat.config import validate
from fedjax_flat.errors import BadInputError, ConfigError
from fedjax_flat.training import api
from fedjax_flat.training import batched
from fedjax_flat.training import packing


@dataclasses.dataclass(frozen=True)
class SweepRun:
  """One run of a sweep: its name ('k=v,...' over the grid's keys, 'base' without a grid), the grid point, the
  seed, status ('done' | 'stopped' | 'failed'), summary (summary.json's dict; None if it failed), the lanes of the
  program that trained it (0: trained alone), the error line of a failed run and its workdir."""
  name: str
  overrides: Dict[str, Any]
  seed: int
  status: str
  summary: Optional[dict]
  lanes: int
  error: Optional[str]
  workdir: str


def _set(config, key: str, value) -> None:
  *path, leaf = key.split('.')
  node = config
  for part in path:
    if part not in node:
      raise ConfigError(key, value, f'{part!r} is not a section of the config (a dotted config key: client.rho)')
    node = node[part]
  if not hasattr(node, 'keys') or leaf not in node:
    raise ConfigError(key, value, 'not a field of the config (a dotted config key, e.g. client.rho)')
  with node.unlocked() if hasattr(node, 'unlocked') else contextlib.nullcontext():
    node[leaf] = value


def _points(grid: Optional[Mapping[str, Sequence[Any]]]) -> List[Dict[str, Any]]:
  grid = dict(grid or {})
  for k, v in grid.items():
    if not isinstance(k, str) or isinstance(v, (str, bytes)) or not hasattr(v, '__len__') or not len(v):
      raise BadInputError(f'grid[{k!r}]={v!r}: every key needs a non-empty list of values, e.g. '
                          "{'client.rho': [0.05, 0.1]}")
    if k == 'seed':
      raise BadInputError("grid['seed']: seeds go in seeds=[...]")
  keys = list(grid)
  return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def sweep(algorithm: Union[str, Callable], config, grid: Optional[Mapping[str, Sequence[Any]]] = None,
          seeds: Sequence[int] = (0,), *, sweep_dir: Optional[str] = None, batch_runs: Optional[int] = None,
          fresh: bool = False) -> List[SweepRun]:
  """Trains the grid x seeds (module docstring) and returns their `SweepRun`s."""
  seeds = list(seeds)
  if not seeds or len(set(seeds)) != len(seeds) or any(
      isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
    raise BadInputError(f'seeds={seeds!r}: a list of distinct integers >= 0, e.g. [0, 1]')
  if batch_runs is not None and (isinstance(batch_runs, bool) or not isinstance(batch_runs, int) or batch_runs < 1):
    raise BadInputError(f'batch_runs={batch_runs!r}: an integer >= 1 (1: every run alone)')
  points = _points(grid)
  if sweep_dir is None:
    with tempfile.TemporaryDirectory(prefix='ff_sweep_') as tmp:
      return _sweep(algorithm, config, points, seeds, tmp, batch_runs, fresh=True)
  return _sweep(algorithm, config, points, seeds, sweep_dir, batch_runs, fresh=fresh)


def _sweep(algorithm, config, points, seeds, sweep_dir, batch_runs, *, fresh) -> List[SweepRun]:
  with api.running(algorithm) as algorithm_name:
    runs, specs = [], []
    for point in points:
      name = ','.join(f'{k}={v}' for k, v in point.items()) or 'base'
      for seed in seeds:
        c = config.copy_and_resolve_references()
        with c.unlocked():
          c.algorithm = algorithm_name
          c.seed = seed
        for k, v in point.items():
          _set(c, k, v)
        validate.validate_config(c)      # every run's bad value is one line before any run starts
        workdir = os.path.join(sweep_dir, name.replace('/', '_'), f'seed={seed}')
        runs.append((name, point, seed, workdir))
        specs.append(batched.RunSpec(f'{name}/seed={seed}', c, workdir))
    most = batch_runs or packing.auto_batch_runs()
    results, data_cache = {}, {}
    devices = len(jax.local_devices())
    for pack in packing.pack_groups(specs, most):
      alone = most == 1 or packing.single_run_pack_alone(len(pack), devices)
      out = batched.run_batch([specs[i] for i in pack], fresh=fresh, data_cache=data_cache, alone=alone)
      results.update({pack[j]: res for j, res in out.items()})
  return [SweepRun(name, dict(point), seed, results[i].status, results[i].summary, results[i].lanes,
                   results[i].error, workdir)
          for i, (name, point, seed, workdir) in enumerate(runs)]
