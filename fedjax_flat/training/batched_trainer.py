"""The runs program of one pack: R opened runs (training/batched.py opens them) trained in one compiled program
(core/runs.py), each writing its own workdir exactly as when run alone (`BatchedTrainer`):

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

import time
from typing import Callable, Dict, List, Optional, Sequence

from absl import logging
import jax
import numpy as np

from fedjax_flat import errors
from fedjax_flat.core import engine as engine_lib
from fedjax_flat.core import runs as runs_lib
from fedjax_flat.evaluation.evaluator import Evaluator
from fedjax_flat.training import driver as driver_lib
from fedjax_flat.training import loop
from fedjax_flat.training import packing


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
      why = packing.trainer_blocker(t)
      if why:
        raise ValueError(f'{t.workdir}: cannot run in a batched program: {why}')
    keys = {packing.pack_key(t.config) for t in self.trainers}
    sigs = {packing.signature(t) for t in self.trainers}
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
      alg = t0.plan.build(cfg, population=population)
      return engine_lib.make_round_fn(alg, chunk=t0.plan.chunk, unroll=base.engine.unroll,
                                      augment_fn=t0.plan.train_transform, jit=False)

    # Packs of one compatibility group (a grid split into several packs, a resumed remainder) reuse the
    # compiled program: same key, same shapes, same lanes -> same program, compiled once per process.
    program_key = (packing.pack_key(base), packing.signature(t0)[:-1], self.lanes, self.fields,
                   tuple(self.per_run_keys), tuple(str(d) for d in devices), self.has_clock, self.population_size,
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

