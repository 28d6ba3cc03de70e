"""R runs in one compiled program (core/runs.py), each writing its own workdir exactly as when run alone.

`run_batch(specs)` opens every run as training/run.py does (workdir lock, resume from its checkpoints or
fresh, config.json), groups the runs that can share a program (`pack_groups`: same compatibility key, same
batch plan and data shapes, same resumed round), and drives each group with a `BatchedTrainer`. Runs whose batch
plans differ only in their shapes (another Dirichlet alpha or data seed gives other client sizes: more local
steps, a larger client) first get the pack's common plan (`align_plans`: the largest of each shape), so a data
grid is one program; so is a grid over the number of clients (the per-client arrays padded to the pack's largest
population, each lane sampling from its own); the padding is masked and changes no run's numbers:

  every block:  stack the runs' server states / client stores -> one call of the runs program (vmapped over
                R lanes, sharded over the local devices) -> unstack -> per run: divergence check, train loss,
                evaluation, metrics.jsonl / TensorBoard, checkpoint (each run's driver.block_results / recorder.record)
  at the end:   per run: summary.json / .md, metrics.png (Trainer.end_training)

Virtual clock (config.system): its numbers are per-run inputs (core/runs.INPUT_FIELDS), so a deadline or speed
grid is one program; each block, every lane's step limits come from its own run's schedule on the host
(DeviceDriver.block_limits) and each run records its own virtual time and bytes.

Lanes: a program always has `lanes` lanes (runs rounded up to the device count); missing lanes are copies
of the first run whose outputs are dropped, so a pack that lost finished members, or resumes with fewer,
reuses the same program shape. Everything random is a function of each run's (seed, round, client), so a
run's numbers do not depend on which runs share its program (up to fp32 reduction order between programs).
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from absl import logging
import jax
import numpy as np

from fedjax_flat import errors
from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.core import engine as engine_lib
from fedjax_flat.core import runs as runs_lib
from fedjax_flat.evaluation.evaluator import Evaluator
from fedjax_flat.data import attacks
from fedjax_flat.data import batching
from fedjax_flat.data import registry as data_registry
from fedjax_flat.training import chain_loop
from fedjax_flat.training import driver as driver_lib
from fedjax_flat.training import loop
from fedjax_flat.training import run as run_lib
from fedjax_flat.config import validate
from fedjax_flat.training import workdir as workdir_lib


# --batch_runs=auto: runs per program, by measurement. CPU: 4 (benchmarks/speed/runs_axis.py,
# benchmarks/speed/README.runs.md: the lanes keep both cores busy). GPU: 1, i.e. the runs one after another in one
# process (each program structure compiled once): on an H100 one paper-CNN run of 10 clients x 500 already runs at
# 215k examples/s and R = 8 / 32 lanes gave 0.88x / 0.79x its run-rounds/s (benchmarks/speed/device/kit_h100*.md).
AUTO_BATCH_RUNS = 4
AUTO_BATCH_RUNS_ACCELERATOR = 1


def auto_batch_runs() -> int:
  return AUTO_BATCH_RUNS if jax.default_backend() == 'cpu' else AUTO_BATCH_RUNS_ACCELERATOR


@dataclasses.dataclass
class RunSpec:
  name: str                 # how messages name the run (the sweep's cell/seed)
  config: object            # the run's ConfigDict, as train.py builds it
  workdir: str


# Needs read from the run's own data (H-FL's cities; LADD's style clusters, also of its seed) before its algorithm
# is built: the runs program builds one algorithm for every run without them, so such a run trains alone.
RUN_DATA_NEEDS = {'client_groups': 'client groups', 'style_clusters': 'style clusters'}


def _run_data_blocker(name: str, needs) -> Optional[str]:
  what = [v for k, v in RUN_DATA_NEEDS.items() if k in needs]
  return f"{name} is built from the run's own {' and '.join(what)}" if what else None


def batch_blocker(config) -> Optional[str]:
  """Why a config cannot join a batched program before anything is loaded (None: it may)."""
  if chain_loop.is_chain_config(config):
    return 'chain algorithms (FedSeq family) have their own trainer'
  declared = alg_registry.declared(config)
  if declared is not None and _run_data_blocker(declared.name, declared.needs):
    return _run_data_blocker(declared.name, declared.needs)
  if attacks.enabled(config):
    return 'a label-flipping attack poisons each run\'s data'
  if config.get('sampler', 'sort') != 'sort':
    return f"sampler={config.sampler!r} (the runs program draws with the default 'sort')"
  if config.engine.get('device_data', 'auto') is False:
    return 'engine.device_data=False'
  if config.get('init') is not None and (config.init.get('checkpoint') or config.init.get('pretrained')):
    return 'config.init loads initial params per run'
  return None


def _trainer_blocker(t: loop.Trainer) -> Optional[str]:
  if _run_data_blocker(t.algorithm.label, t.algorithm.needs):
    return _run_data_blocker(t.algorithm.label, t.algorithm.needs)
  if not t.plan.device_rounds:
    return t.plan.device_rounds_blocker() or 'the run keeps its data on the host'
  if t.plan.mesh is not None:
    return 'clients are sharded over devices (engine.shard_clients)'
  return None


def pack_key(config) -> str:
  """The compatibility key of a run (core/runs.compat_key) for packing: its population is a per-run input, except
  for an algorithm whose arrays it sizes (need 'static_population': FedFomo's per-client slots are [N, ...] in its
  server state), whose runs share a program only with runs of the same N."""
  key = runs_lib.compat_key(config)
  declared = alg_registry.declared(config)
  if declared is not None and 'static_population' in declared.needs:
    key += f'|data.num_clients={config.data.get("num_clients")}'
  return key


def _signature(t: loop.Trainer):
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
    if _trainer_blocker(t) is None:
      groups.setdefault((pack_key(t.config),) + _signature(t)[1:], []).append(t)
  changed = 0
  for ts in groups.values():
    plan = common_plan([t.plan.batch_plan for t in ts]) if len(ts) > 1 else None
    for t in ts if plan is not None else ():
      if t.plan.batch_plan != plan:
        t.plan.pad_batch_plan(plan)
        changed += 1
  return changed


_PROGRAMS: Dict[tuple, Callable] = {}     # runs programs of this process (see BatchedTrainer)
_COMPILED: Dict[tuple, Callable] = {}     # their executables, compiled ahead of time (BatchedTrainer.compile)


class BatchRefused(errors.BadInputError):
  """A pack's algorithm cannot share one program between runs (one line, before compiling; bad input: exit 2)."""


class BatchedTrainer:
  """Drives opened trainers (training/run.open_run) of one pack through one runs program."""

  def __init__(self, trainers: Sequence[loop.Trainer], *, lanes: Optional[int] = None, devices=None):
    self.trainers = list(trainers)
    t0 = self.trainers[0]
    for t in self.trainers:
      why = _trainer_blocker(t)
      if why:
        raise ValueError(f'{t.workdir}: cannot run in a batched program: {why}')
    keys = {pack_key(t.config) for t in self.trainers}
    sigs = {_signature(t) for t in self.trainers}
    if len(keys) > 1 or len(sigs) > 1:
      raise ValueError('runs of one batched program must have equal compatibility keys and shapes '
                       '(training/batched.pack_groups groups them)')
    devices = list(devices if devices is not None else jax.local_devices())
    self.lanes = lanes or runs_lib.lanes_for(len(self.trainers), len(devices))
    if self.lanes < len(self.trainers):
      raise ValueError(f'lanes={self.lanes} < {len(self.trainers)} runs')
    self.mesh = runs_lib.runs_mesh(self.lanes, devices)
    self.fields = runs_lib.present_value_fields(t0.config)
    self.has_store = t0.store is not None
    # The virtual clock (config.system): each lane's schedule is computed on the host from its own run's clock
    # (DeviceDriver.block_limits) and enters the program as that lane's step limits (core/runs.py).
    self.has_clock = t0.plan.clock is not None
    self._system: Dict[int, list] = {}     # block start round -> each run's per-round clock totals
    # The test set is the same for every run of the pack (same data config up to the partition): one
    # evaluator, so its program is compiled once, not once per run.
    if type(t0.plan.evaluator) is Evaluator:
      for t in self.trainers[1:]:
        if type(t.plan.evaluator) is Evaluator and _same_test_set(t.data, t0.data):
          t.plan.evaluator = t0.plan.evaluator
    # Device data: arrays equal in every run are passed once; the others (a run's partition) per lane, padded
    # to the pack's longest (rows past a run's own clients or examples: no index of the run reaches them).
    shared, per_run = {}, {}
    for k, v in t0.driver.dev_data.items():
      if all(t.driver.dev_data[k] is v or np.array_equal(np.asarray(t.driver.dev_data[k]), np.asarray(v))
             for t in self.trainers[1:]):
        shared[k] = v
      else:
        rows = max(int(t.driver.dev_data[k].shape[0]) for t in self.trainers)
        per_run[k] = [runs_lib.pad_rows(t.driver.dev_data[k], rows) for t in self.trainers]
    # Populations (data.num_clients) differ: the program's per-client arrays have the largest K's rows, each lane
    # draws its cohort from its own K (core/runs.POPULATION) and its algorithm scales by its own N.
    populations = [int(t.data.num_clients) for t in self.trainers]
    self.population_size = max(populations) if len(set(populations)) > 1 else None
    if self.population_size is not None:
      per_run[runs_lib.POPULATION] = [np.int32(k) for k in populations]
    self.data_shared = runs_lib.replicate(shared, self.mesh)
    self.per_run_keys = sorted(per_run)
    self.data_runs = runs_lib.place(runs_lib.stack([{k: per_run[k][i] for k in self.per_run_keys}
                                                    for i in self._lane_runs()]), self.mesh)
    self.values = runs_lib.place(runs_lib.stack([
        {f: np.float32(v) for f, v in runs_lib.run_values(
            self.trainers[i].config, self.fields,
            num_leaves=len(jax.tree_util.tree_leaves(self.trainers[i].plan.param_shapes))).items()}
        for i in self._lane_runs()]), self.mesh)
    self.keys = runs_lib.place(runs_lib.stack([self.trainers[i].plan.key for i in self._lane_runs()]), self.mesh)
    self.templates = (runs_lib.place(runs_lib.stack([self.trainers[i].store.template for i in self._lane_runs()]),
                                     self.mesh) if self.has_store else None)
    base = t0.config

    def build_round_fn(values, population):
      cfg = runs_lib.traced_config(base, values)
      if not isinstance(population, int):    # each lane's own N, as a value the builders cannot freeze
        population = runs_lib.RunValue(population.astype(np.float32), 'data.num_clients')
      alg = alg_registry.build_algorithm(cfg, t0.model, population=population, task=t0.task)
      return engine_lib.make_round_fn(alg, chunk=t0.plan.chunk, unroll=base.engine.unroll,
                                      augment_fn=t0.plan.train_transform, jit=False)

    # Packs of one compatibility group (a grid split into several packs, a resumed remainder) reuse the
    # compiled program: same key, same shapes, same lanes -> same program, compiled once per process.
    program_key = (pack_key(base), _signature(t0)[:-1], self.lanes, self.fields, tuple(self.per_run_keys),
                   tuple(str(d) for d in devices), self.has_clock, self.population_size,
                   tuple((k, a.shape) for k, a in sorted(self.data_runs.items())), self._store_rows())
    if program_key not in _PROGRAMS:
      _PROGRAMS[program_key] = runs_lib.make_runs_block_fn(
          build_round_fn, plan=t0.plan.batch_plan, num_clients=t0.data.num_clients,
          clients_per_round=base.clients_per_round, cohort=t0.plan.cohort, rounds_per_call=t0.plan.rounds_per_call,
          has_store=self.has_store, mesh=self.mesh, has_limits=self.has_clock, population_size=self.population_size)
    self.fn = _PROGRAMS[program_key]
    self.program_key = program_key
    self.compiled = None
    self._preflight()
    self.failed: Dict[int, BaseException] = {}
    self.compile_s = None

  def _preflight(self):
    """Traces the program once before anything compiles or trains: an algorithm whose builder
    would freeze a per-run value (core/runs.RunValueError: float() of a traced lr) or that needs what a batched
    program does not give it (a ConfigError of its builder) is refused in one line (`BatchRefused`). The trace is
    kept for `compile` (with the placed arguments it compiles from): tracing a SAM runs program takes seconds, and
    a second trace for the lowering cost a sweep that much per program structure."""
    self._traced = None
    if self.program_key in _COMPILED:      # traced, checked and compiled before in this process
      return
    try:
      self._traced = self.fn.trace(*self._args(0, 1, *self._initial()))
    except (runs_lib.RunValueError, errors.ConfigError) as e:
      t0 = self.trainers[0]
      raise BatchRefused(f'{t0.algorithm.label} cannot run in a batched program: '
                         f'{str(e).splitlines()[0]}; run it alone (--batch_runs=1)') from None

  def _initial(self):
    """The lanes' stacked server states and client stores, as the first block reads them."""
    lanes = self._lane_runs()
    states = runs_lib.place(runs_lib.stack([self.trainers[i].server_state for i in lanes]), self.mesh)
    stores = None
    if self.has_store:       # each run's [K, ...] rows padded to the pack's largest K (never sampled, never read)
      rows = self._store_rows()
      stores = runs_lib.place(runs_lib.stack([
          jax.tree_util.tree_map(lambda a: runs_lib.pad_rows(a, rows), self.trainers[i].store.arrays)
          for i in lanes]), self.mesh)
    return states, stores

  def _store_rows(self) -> int:
    """Rows of the program's client-state stores: the pack's largest population (0: no store)."""
    if not self.has_store:
      return 0
    return max(int(jax.tree_util.tree_leaves(t.store.arrays)[0].shape[0]) for t in self.trainers)

  def _run_store(self, stores, i: int):
    """Run i's own store arrays from the program's stacked ones: its lane, its own K rows (what it checkpoints,
    so that it resumes alone or in another pack bit-identically)."""
    k = int(jax.tree_util.tree_leaves(self.trainers[i].store.arrays)[0].shape[0])
    return jax.tree_util.tree_map(lambda a: a[i, :k], stores)

  def _args(self, r: int, n: int, states, stores, limits=None):
    """The runs program's arguments for rounds r .. r+n-1 (r and n are traced: one program for every block);
    with a clock, each lane's step limits (`_limits`; None: all zero, for tracing and compiling)."""
    args = (self.values, states, stores, self.templates, self.data_runs, self.data_shared, self.keys,
            np.int32(r), np.int32(n))
    if not self.has_clock:
      return args
    if limits is None:
      shape = (self.lanes, self.trainers[0].plan.rounds_per_call, self.trainers[0].plan.cohort)
      limits = runs_lib.place({'fit': np.zeros(shape, np.int32), 'reports': np.zeros(shape, bool)}, self.mesh)
    return args + (limits,)

  def _limits(self, r: int, n: int):
    """Each lane's virtual-clock step limits of rounds r .. r+n-1, stacked [lanes, rounds_per_call, cohort] (its
    own run's schedule: deadline, speeds, availability, dropout); each run's per-round totals are kept for its
    records (`train`). None without a clock."""
    if not self.has_clock:
      return None
    per_run = [t.driver.block_limits(r, n) for t in self.trainers]
    self._system[r] = [totals for _, totals in per_run]
    return runs_lib.place(runs_lib.stack([jax.device_get(per_run[i][0]) for i in self._lane_runs()]), self.mesh)

  def compile(self) -> float:
    """Compiles the runs program ahead of time (XLA works outside the GIL, so a sweep can call this on a thread
    while another pack trains); returns the seconds it took (0: compiled before in this process). Every block
    of `train` then calls this executable; it is the program the jitted function would compile."""
    if self.compiled is None:
      t = time.time()
      if self.program_key not in _COMPILED:
        traced = self._traced or self.fn.trace(*self._args(0, 1, *self._initial()))
        _COMPILED[self.program_key] = traced.lower().compile()
      self._traced = None
      self.compiled = _COMPILED[self.program_key]
      self.compile_s = time.time() - t
    return self.compile_s

  def _lane_runs(self) -> List[int]:
    """The run each lane computes: runs in order, then copies of run 0 (dropped outputs)."""
    n = len(self.trainers)
    return list(range(n)) + [0] * (self.lanes - n)

  def _on_host(self, tree):
    # With several devices, per-run states come to the host (cheap on CPU, where host devices share memory)
    # so each run's evaluation and checkpoint see ordinary arrays; on one device they stay there.
    return jax.device_get(tree) if self.mesh is not None else tree

  def dispatch(self, r: int, n: int, states=None, stores=None):
    """Starts rounds r .. r+n-1 of every lane (asynchronously) from the previous block's device outputs, or
    from the trainers' states; returns the device outputs (states, stores, metrics)."""
    if states is None:
      states, stores = self._initial()
    self.compile()
    return self.compiled(*self._args(r, n, states, stores, self._limits(r, n)))

  def train(self, stop_requested: Callable[[], bool] = lambda: False) -> Dict[int, dict]:
    """Trains every run to its end (or a stop); returns {run index: summary} of the runs that finished
    or stopped; diverged runs are in self.failed.

    Pipelined: block k+1 is dispatched (from block k's device outputs) before the host handles block k
    (divergence checks, evaluation, metrics, checkpoints of every run), so the device is not idle while the
    host writes. A stop or a divergence found in block k discards block k+1's outputs: every run's state
    and files are those at the end of block k, as without the pipeline.
    """
    ends = [t.begin_training() for t in self.trainers]
    end = ends[0]
    active = list(range(len(self.trainers)))
    start = self.trainers[0].round
    block_len = lambda r: min(self.trainers[i].block_length(r, end) for i in active)
    pending = None
    if start < end:
      n = block_len(start)
      pending = (start, n, self.dispatch(start, n))
    ready_prev = time.time()
    while pending is not None:
      r, n, (states_d, stores_d, m_d) = pending
      pending = None
      if r + n < end:               # the next block runs while the host handles this one
        n2 = block_len(r + n)
        pending = (r + n, n2, self.dispatch(r + n, n2, states_d, stores_d))
      m = jax.device_get(m_d)
      wall, ready_prev = time.time() - ready_prev, time.time()
      states = self._on_host(states_d)
      stores = self._on_host(stores_d) if self.has_store else None
      stop = bool(stop_requested())
      for i in list(active):
        t = self.trainers[i]
        t.server_state = runs_lib.unstack(states, i)
        if r > start:
          t.driver.round_s = wall / max(n, 1)      # pylint: disable=protected-access
        try:
          block = t.driver.block_results(t.store, r, n, runs_lib.unstack(m, i),
                                         self._run_store(stores, i) if self.has_store else None,
                                         system=self._system[r][i] if self.has_clock else None)
        except driver_lib.DivergenceError as e:
          logging.error('%s: %s', t.workdir, e)
          self.failed[i] = e
          active.remove(i)
          continue
        t.recorder.record(t, block, end, lambda: stop)
      self._system.pop(r, None)
      if stop or not active:
        pending = None               # dispatched ahead: its outputs are dropped
    return {i: self.trainers[i].end_training() for i in active}


def _same_test_set(a, b) -> bool:
  if a is b:
    return True
  ax, ay = a.test_examples()
  bx, by = b.test_examples()
  return np.array_equal(ax, bx) and np.array_equal(ay, by)


def pack_groups(specs: Sequence[RunSpec], max_runs: int, num_devices: Optional[int] = None) -> List[List[int]]:
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


@dataclasses.dataclass
class RunResult:
  status: str               # 'done' | 'stopped' | 'failed' | 'busy' (its workdir is held by a live process)
  lanes: int = 0            # lanes of the program that ran it (0: trained alone in this process)
  summary: Optional[dict] = None
  error: Optional[str] = None
  wall_s: float = 0.0


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


def check_one_pack(specs: Sequence[RunSpec]) -> None:
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
          'pack them (batched.pack_groups)')


def run_batch(specs: Sequence[RunSpec], *, fresh: bool = False, stop_requested=lambda: False,
              signal_name=lambda: None, lanes: Optional[int] = None, memory_bytes: Optional[int] = None,
              on_result: Callable[[int, RunResult], None] = lambda i, res: None,
              before_training: Callable[[], None] = lambda: None,
              data_cache: Optional[Dict[str, object]] = None, alone: bool = False) -> Dict[int, RunResult]:
  """Opens and trains `specs` (one compatible pack) in as few batched programs as memory allows.

  Runs that cannot be opened (bad config for the data) fail alone; the others go on. A run whose workdir is
  locked by a live process is 'busy' (nothing of it was touched): the caller waits and retries it.
  memory_bytes: the budget for the program's lanes (default: runs.device_memory_bytes() / 2).
  before_training: called once the pack is opened and its program built, before it compiles and trains (a
  sweep opens its next pack there and compiles that one's program on a thread meanwhile: `open_batch`).
  """
  batch = open_batch(specs, fresh=fresh, lanes=lanes, memory_bytes=memory_bytes, on_result=on_result,
                     data_cache=data_cache, alone=alone)
  try:
    before_training()
    return batch.train(stop_requested=stop_requested, signal_name=signal_name)
  finally:
    batch.close()


def open_batch(specs: Sequence[RunSpec], *, fresh: bool = False, lanes: Optional[int] = None,
               memory_bytes: Optional[int] = None, on_result: Callable[[int, RunResult], None] = lambda i, res: None,
               data_cache: Optional[Dict[str, object]] = None, alone: bool = False) -> 'OpenedBatch':
  """Opens `specs` (workdir locks, resumed or fresh, as training/run.py does) and builds the pack's first
  program, without compiling or training it: `OpenedBatch.compile_ahead`, `.train`, `.close`. data_cache:
  {data config: dataset}, shared between the packs of a sweep so that each dataset is loaded once. alone: train
  every run as train.py would (`single_run_pack_alone`), no runs program. Runs that cannot share a program are
  one BatchIncompatible line before anything is opened (`check_one_pack`)."""
  check_one_pack(specs)
  results: Dict[int, RunResult] = {}
  opened = []          # (spec index, trainer, checkpointer, step, lock)
  t_open = time.time()
  data_cache = {} if data_cache is None else data_cache
  for i, spec in enumerate(specs):
    lock = None
    try:
      validate.validate_config(spec.config)
      lock = workdir_lib.WorkdirLock(spec.workdir).acquire()
      workdir_lib.prepare(spec.workdir)
      data_key = repr(sorted(spec.config.data.to_dict().items())) + spec.config.dataset
      if data_key not in data_cache:
        data_cache[data_key] = data_registry.get_dataset(spec.config.dataset, **spec.config.data.to_dict())
      # Clients are not sharded: the devices take the runs axis instead (core/runs.py).
      trainer, ckpt, step = run_lib.open_run(spec.config, spec.workdir, fresh=fresh, data=data_cache[data_key],
                                             trainer_kwargs=({'shard_clients': False}
                                                             if batch_blocker(spec.config) is None and not alone
                                                             else None))
      opened.append((i, trainer, ckpt, step, lock))
    except workdir_lib.WorkdirBusyError as e:      # not a failure: the caller waits for it and retries
      results[i] = RunResult('busy', error=str(e))
      on_result(i, results[i])
    except Exception as e:  # noqa: BLE001 -- one run's failure stops nothing; the sweep reports it
      if lock is not None:
        lock.release()
      results[i] = RunResult('failed', error=f'{type(e).__name__}: {e}')
      on_result(i, results[i])
  batch = OpenedBatch(results, opened, t_open, lanes=lanes, memory_bytes=memory_bytes, on_result=on_result,
                      alone=alone)
  try:
    batch.build_first()
  except BaseException:
    batch.close()
    raise
  return batch


class OpenedBatch:
  """One pack, opened: its runs grouped by program (`by_sig`), the first program built (`first`)."""

  def __init__(self, results, opened, t_open, *, lanes, memory_bytes, on_result, alone=False):
    self.results: Dict[int, RunResult] = results
    self.opened = opened
    self.t_open = t_open
    self.lanes = lanes
    self.on_result = on_result
    self.budget = memory_bytes if memory_bytes is not None else runs_lib.device_memory_bytes() // 2
    self.first: Optional[BatchedTrainer] = None
    self._thread: Optional[threading.Thread] = None
    self._compile_error: Optional[BaseException] = None
    self.ahead = False                   # compile_ahead was called
    self._closed = False
    if align_plans([item[1] for item in opened]):
      logging.info('runs with other client sizes (data grid) share the largest batch plan of their pack')
    self.by_sig: Dict[object, list] = {}
    for item in opened:
      sig = _trainer_blocker(item[1]) or (ALONE if alone else _signature(item[1]))
      self.by_sig.setdefault(sig, []).append(item)

  def _chunks(self, items):
    """The items of one program split by the memory budget, and the lanes each chunk's program has."""
    per = _lane_bytes(items[0][1])
    cap = max(1, int(self.budget // max(per, 1)))
    n_dev = len(jax.local_devices())
    if cap >= n_dev:
      cap -= cap % n_dev
    chunks = [items[j:j + cap] for j in range(0, len(items), cap)]
    use_lanes = self.lanes if (self.lanes and self.lanes >= len(items)) else None     # the pack's program shape
    if len(chunks) > 1:
      use_lanes = runs_lib.lanes_for(cap, n_dev) if cap >= n_dev else None
      logging.warning('a batch of %d runs (%.1f MB per lane) exceeds the memory budget %.0f MB: split into '
                      '%d programs', len(items), per / 2**20, self.budget / 2**20, len(chunks))
    return chunks, use_lanes

  def build_first(self):
    """Builds (traces, does not compile) the program of the first group that batches, so that it can be
    compiled ahead; a refusal is left for `train` to report."""
    for sig, items in self.by_sig.items():
      if not isinstance(sig, str):
        chunks, use_lanes = self._chunks(items)
        try:
          self.first = BatchedTrainer([it[1] for it in chunks[0]], lanes=use_lanes)
        except BatchRefused:
          pass
        return

  def compile_ahead(self):
    """Compiles the first program on a thread (returns at once); `train` waits for it."""
    if self.first is not None and self._thread is None:
      self.ahead = True

      def work():
        try:
          self.first.compile()
        except BaseException as e:  # noqa: BLE001 -- re-raised by train, in the caller's thread
          self._compile_error = e
      self._thread = threading.Thread(target=work, name='compile-ahead', daemon=True)
      self._thread.start()

  def _join(self):
    if self._thread is not None:
      self._thread.join()
      self._thread = None
      if self._compile_error is not None:
        e, self._compile_error = self._compile_error, None
        raise e

  def train(self, stop_requested=lambda: False, signal_name=lambda: None) -> Dict[int, RunResult]:
    self._join()
    results, on_result = self.results, self.on_result
    for sig, items in self.by_sig.items():
      if isinstance(sig, str):             # cannot batch: train each alone, as train.py would
        logging.warning('%d run(s) train alone: %s', len(items), sig)
        for i, t, ckpt, step, _ in items:
          t0 = time.time()
          summary = t.train(stop_requested=stop_requested)
          results[i] = _result(summary, t, ckpt, step, signal_name(), time.time() - t0)
          on_result(i, results[i])
        continue
      chunks, use_lanes = self._chunks(items)
      for c, chunk in enumerate(chunks):
        t0 = time.time()
        try:
          if self.first is not None and c == 0 and self.first.trainers[0] is chunk[0][1]:
            bt = self.first
          else:
            bt = BatchedTrainer([it[1] for it in chunk], lanes=use_lanes)
        except BatchRefused as e:        # refused before compiling: every run of the pack, one line each
          for i, *_ in chunk:
            results[i] = RunResult('failed', error=f'{type(e).__name__}: {e}')
            on_result(i, results[i])
          continue
        summaries = bt.train(stop_requested=stop_requested)
        wall = time.time() - t0 + (t0 - self.t_open) / max(len(self.opened), 1) * len(chunk)
        for k, (i, t, ckpt, step, _) in enumerate(chunk):
          if k in bt.failed:
            results[i] = RunResult('failed', error=f'{type(bt.failed[k]).__name__}: {bt.failed[k]}',
                                   wall_s=wall / len(chunk), lanes=bt.lanes)
          else:
            results[i] = dataclasses.replace(_result(summaries[k], t, ckpt, step, signal_name(), wall / len(chunk)),
                                             lanes=bt.lanes)
          on_result(i, results[i])
        logging.info('batched program of %d runs in %d lanes: %.1f s (compilation: %.1f s%s)',
                     len(chunk), bt.lanes, time.time() - t0, bt.compile_s or 0.0,
                     ', on a thread while the previous pack trained' if bt is self.first and self.ahead else '')
    return results

  def close(self):
    """Releases every opened run (checkpointers closed, workdir locks released); waits for a compile ahead."""
    if self._closed:
      return
    self._closed = True
    if self._thread is not None:
      self._thread.join()
    for _, _, ckpt, _, lock in self.opened:
      ckpt.close()
      lock.release()


def _result(summary, trainer, ckpt, step, sig, wall) -> RunResult:
  summary = run_lib.close_summary(summary, trainer, ckpt, step, sig)
  return RunResult('stopped' if trainer.stopped_early else 'done', summary=summary, wall_s=wall)


def _lane_bytes(t: loop.Trainer) -> int:
  c = t.config
  item = np.dtype(getattr(t.data, 'input_dtype', t.data.x.dtype)).itemsize
  batch = t.plan.cohort * t.plan.num_steps * c.client.batch_size * (int(np.prod(t.data.input_shape)) * item + 8)
  data_run = sum(int(np.asarray(t.driver.dev_data[k]).nbytes) for k in ('index', 'offsets', 'sizes'))
  return runs_lib.estimate_run_bytes(server_state=t.server_state,
                                     store_arrays=t.store.arrays if t.store is not None else None,
                                     batch_bytes=batch, data_run_bytes=data_run)
