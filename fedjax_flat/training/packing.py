"""The pack planner: which runs of a sweep or a `run_batch` share one compiled runs program (core/runs.py).

Runs share a program when their compatibility keys are equal (`pack_key`: the config without its per-run values;
the population is a per-run input unless it sizes the algorithm's arrays) and, once opened, their shapes are
(`signature`). `pack_groups` splits the runs of one key into balanced packs; `batch_blocker` / `trainer_blocker`
say why a run trains alone (a chain algorithm, an algorithm built from the run's own data, host-side rounds).
Runs whose batch plans differ only in their shapes (another Dirichlet alpha or data seed gives other client
sizes: more local steps, a larger client) first get the pack's common plan (`align_plans`: the largest of each
shape), so a data grid is one program; the padding is masked and changes no run's numbers. `lane_bytes` sizes
a lane for the memory budget. The packs are trained by training/batched.py.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Optional, Sequence

import jax
import numpy as np

from fedjax_flat import errors
from fedjax_flat.core import runs as runs_lib
from fedjax_flat.data import batching
from fedjax_flat.data import sampling
from fedjax_flat.training import chain_loop
from fedjax_flat.training import loop
from fedjax_flat.training import plan as plan_lib


# --batch_runs=auto: runs per program, by measurement. CPU: 4 (benchmarks/speed/runs_axis.py,
# benchmarks/speed/README.runs.md: the lanes keep both cores busy). GPU: 1, i.e. the runs one after another in one
# process (each program structure compiled once): on an H100 one paper-CNN run of 10 clients x 500 already runs at
# 215k examples/s and R = 8 / 32 lanes gave 0.88x / 0.79x its run-rounds/s (benchmarks/speed/device/kit_h100*.md).
AUTO_BATCH_RUNS = 4
AUTO_BATCH_RUNS_ACCELERATOR = 1


def auto_batch_runs() -> int:
  return AUTO_BATCH_RUNS if jax.default_backend() == 'cpu' else AUTO_BATCH_RUNS_ACCELERATOR


# Needs read from the run's own data (H-FL's cities; LADD's style clusters, also of its seed) before its algorithm
# is built: the runs program builds one algorithm for every run without them, so such a run trains alone.
RUN_DATA_NEEDS = {'client_groups': 'client groups', 'style_clusters': 'style clusters'}


def run_data_blocker(name: str, needs) -> Optional[str]:
  what = [v for k, v in RUN_DATA_NEEDS.items() if k in needs]
  return f"{name} is built from the run's own {' and '.join(what)}" if what else None


def batch_blocker(config) -> Optional[str]:
  """Why a config cannot join a batched program before anything is loaded (None: it may)."""
  if chain_loop.is_chain_config(config):
    return 'chain algorithms (FedSeq family) have their own trainer'
  declared = plan_lib.declaration(config)
  if declared is not None and run_data_blocker(declared.name, declared.needs):
    return run_data_blocker(declared.name, declared.needs)
  if config.get('sampler', 'auto') == 'floyd':
    return "sampler='floyd' (the runs program draws with 'sort')"
  if config.engine.get('device_data', 'auto') is False:
    return 'engine.device_data=False'
  if config.get('init') is not None and (config.init.get('checkpoint') or config.init.get('pretrained')):
    return 'config.init loads initial params per run'
  return None


def trainer_blocker(t: loop.Trainer) -> Optional[str]:
  if run_data_blocker(t.algorithm.label, t.algorithm.needs):
    return run_data_blocker(t.algorithm.label, t.algorithm.needs)
  if not t.plan.device_rounds:
    return t.plan.device_rounds_blocker() or 'the run keeps its data on the host'
  if t.plan.mesh is not None:
    return 'clients are sharded over devices (engine.shard_clients)'
  if t.plan.sampler.sampler != 'sort':
    return (f"sampler='auto' draws with 'floyd' above {sampling.AUTO_FLOYD_ABOVE:,} clients "
            f"({t.plan.data.num_clients:,} here) and the runs program with 'sort'")
  return None


def pack_key(config) -> str:
  """The compatibility key of a run (core/runs.compat_key) for packing: its population is a per-run input, except
  for an algorithm whose arrays it sizes (need 'static_population': FedFomo's per-client slots are [N, ...] in its
  server state), whose runs share a program only with runs of the same N."""
  key = runs_lib.compat_key(config)
  declared = plan_lib.declaration(config)
  if declared is not None and 'static_population' in declared.needs:
    key += f'|data.num_clients={config.data.get("num_clients")}'
  return key


def signature(t: loop.Trainer):
  """What must be equal for two opened runs to share a program, beyond the compatibility key. The per-client and
  per-example arrays (the client-state store [K, ...], the device data) are compared without their leading axis:
  a pack pads them to its largest (`BatchedTrainer`), so runs of other populations or data sizes share a program."""
  shapes = lambda tree: tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree_util.tree_leaves(tree))
  rows = lambda tree: tuple((tuple(a.shape[1:]), str(a.dtype)) for a in jax.tree_util.tree_leaves(tree))
  return (t.plan.batch_plan, t.plan.cohort, t.plan.chunk, t.plan.rounds_per_call, shapes(t.server_state),
          rows(t.store.arrays) if t.store is not None else None, rows(t.driver.dev_data), t.round)


# The BatchPlan fields that only size the program (data/batching.py): padding them changes no run's numbers.
# Extra steps are all-masked (the engine skips them), a longer permutation keeps its first n entries (the random
# bits of a shorter draw are a prefix of a longer one's, and padding sorts last), extra permutations go unread.
PLAN_SHAPES = ('num_steps', 'max_size', 'num_perms')


def common_plan(plans) -> Optional[batching.BatchPlan]:
  """The one plan of runs whose plans differ only in PLAN_SHAPES (the largest of each), else None. Plans with a
  pool draw (data/federated.py) are not padded: their draw keys are shaped by the step count."""
  p0 = plans[0]
  strip = lambda p: dataclasses.replace(p, **{f: 0 for f in PLAN_SHAPES})
  if p0.draw is not None or any(strip(p) != strip(p0) for p in plans):
    return None
  return dataclasses.replace(p0, **{f: max(getattr(p, f) for p in plans) for f in PLAN_SHAPES})


def align_plans(trainers: Sequence[loop.Trainer]) -> int:
  """Gives runs that could share a program but for their plans' shapes the common plan (in place, before their
  signatures are compared); returns how many plans changed."""
  groups: Dict[tuple, list] = {}
  for t in trainers:
    if trainer_blocker(t) is None:
      groups.setdefault((pack_key(t.config),) + signature(t)[1:], []).append(t)
  changed = 0
  for ts in groups.values():
    plan = common_plan([t.plan.batch_plan for t in ts]) if len(ts) > 1 else None
    for t in ts if plan is not None else ():
      if t.plan.batch_plan != plan:
        t.plan.pad_batch_plan(plan)
        changed += 1
  return changed


def pack_groups(specs: Sequence, max_runs: int, num_devices: Optional[int] = None) -> List[List[int]]:
  """Indices of `specs` packed into programs: runs with equal compatibility keys, in order, split into
  balanced packs of at most max_runs (n runs -> ceil(n / max_runs) packs of nearly equal size). On several devices
  (num_devices; None: the local devices) a pack larger than the device count is rounded up to a multiple of it
  within max_runs: a program's lanes are a multiple of the devices, and a lane without a run computes a copy
  (6 runs, at most 4 a program, 2 devices: packs of 4 + 2 runs in 6 lanes, not 3 + 3 in 8)."""
  d = len(jax.local_devices()) if num_devices is None else max(int(num_devices), 1)
  most = max(int(max_runs), 1)
  groups: Dict[str, List[int]] = {}
  for i, s in enumerate(specs):
    groups.setdefault(pack_key(s.config), []).append(i)
  packs = []
  for idx in groups.values():
    k = -(-len(idx) // most)
    size = -(-len(idx) // k)
    if size > d and runs_lib.lanes_for(size, d) <= most:
      size = runs_lib.lanes_for(size, d)
    packs += [idx[j:j + size] for j in range(0, len(idx), size)]
  return packs


def single_run_pack_alone(pack_size: int, num_devices: int) -> bool:
  """A pack of one run on several devices trains as train.py would, its clients sharded over the devices: a runs
  program would give the other lanes to copies of it (half the work wasted on two CPU devices). Decided by the
  pack's size, not by how many of its runs are left, so a pack resumes in the program shape it started with."""
  return pack_size == 1 and runs_lib.lanes_for(1, num_devices) > 1


ALONE = 'a one-run pack on several devices: trained as train.py would, its clients sharded over the devices'


class BatchIncompatible(errors.BadInputError):
  """Runs given to one run_batch / open_batch that cannot share a program: one line naming the run and the key."""


def _first_difference(a, b, prefix=''):
  """(dotted key, value in a, value in b) of the first difference of two JSON values, or None when equal."""
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      if k not in a or k not in b:
        return (prefix + k, a.get(k, '<unset>'), b.get(k, '<unset>'))
      d = _first_difference(a[k], b[k], f'{prefix}{k}.')
      if d:
        return d
    return None
  return None if a == b else (prefix.rstrip('.'), a, b)


def check_one_pack(specs: Sequence) -> None:
  """BatchIncompatible naming the first run whose compatibility key (pack_key) differs from run 0's, with the
  config key and both values; a config that cannot be keyed is left to the run's own opening to report."""
  keys = []
  for i, spec in enumerate(specs):
    try:
      keys.append((i, spec, json.loads(pack_key(spec.config).split('|', 1)[0]), pack_key(spec.config)))
    except Exception:  # noqa: BLE001 -- a bad config fails alone when its run is opened
      continue
  for i, spec, d, key in keys[1:]:
    i0, s0, d0, key0 = keys[0]
    if key != key0:
      diff = _first_difference(d0, d) or ('data.num_clients', key0.partition('|')[2], key.partition('|')[2])
      raise BatchIncompatible(
          f'run {i} ({spec.name!r}) cannot share a batched program with run {i0} ({s0.name!r}): config key '
          f'{diff[0]} differs ({diff[1]!r} vs {diff[2]!r}); give them to separate run_batch calls, or let a sweep '
          'pack them (packing.pack_groups)')


def lane_bytes(t: loop.Trainer) -> int:
  c = t.config
  item = np.dtype(getattr(t.data, 'input_dtype', t.data.x.dtype)).itemsize
  batch = t.plan.cohort * t.plan.num_steps * c.client.batch_size * (int(np.prod(t.data.input_shape)) * item + 8)
  data_run = sum(int(np.asarray(t.driver.dev_data[k]).nbytes) for k in ('index', 'offsets', 'sizes'))
  return runs_lib.estimate_run_bytes(server_state=t.server_state,
                                     store_arrays=t.store.arrays if t.store is not None else None,
                                     batch_bytes=batch, data_run_bytes=data_run)
