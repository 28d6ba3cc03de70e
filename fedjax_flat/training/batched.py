"""R runs trained as packs (`run_batch`, `open_batch`), each run writing its own workdir exactly as when run alone.

`run_batch(specs)` opens every run as training/run.py does (workdir lock, resume from its checkpoints or
fresh, config.json), groups the runs that can share a program (training/packing.py: same compatibility key,
same batch plan and data shapes, same resumed round), and drives each group with a `BatchedTrainer`
(training/batched_trainer.py), split by the memory budget. A sweep opens pack p+1 and compiles its program on a
thread while pack p trains (`OpenedBatch.compile_ahead`). A run that cannot share a program trains alone, as
train.py would, after one log line.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Dict, Optional, Sequence

from absl import logging
import jax

from fedjax_flat.core import runs as runs_lib
from fedjax_flat.data import registry as data_registry
from fedjax_flat.config import validate
from fedjax_flat.training import batched_trainer
from fedjax_flat.training import packing
from fedjax_flat.training import run as run_lib
from fedjax_flat.training import tracking as tracking_lib
from fedjax_flat.training import workdir as workdir_lib


@dataclasses.dataclass
class RunSpec:
  name: str                 # how messages name the run (the sweep's cell/seed)
  config: object            # the run's ConfigDict, as train.py builds it
  workdir: str
  tracking: Optional[tracking_lib.Spec] = None   # --tracker: its tracked run (named `name`)
  data: Optional[object] = None   # the run's in-memory dataset (training/shadows.py: a LiRA shadow's own half);
                                  # None: loaded from its config (once per data config)



@dataclasses.dataclass
class RunResult:
  status: str               # 'done' | 'stopped' | 'failed' | 'busy' (its workdir is held by a live process)
  lanes: int = 0            # lanes of the program that ran it (0: trained alone in this process)
  summary: Optional[dict] = None
  error: Optional[str] = None
  wall_s: float = 0.0


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
  packing.check_one_pack(specs)
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
      data = spec.data
      if data is None:
        data_key = repr(sorted(spec.config.data.to_dict().items())) + spec.config.dataset
        if data_key not in data_cache:
          data_cache[data_key] = data_registry.get_dataset(spec.config.dataset, **spec.config.data.to_dict())
        data = data_cache[data_key]
      # Clients are not sharded: the devices take the runs axis instead (core/runs.py).
      trainer, ckpt, step = run_lib.open_run(spec.config, spec.workdir, fresh=fresh, data=data,
                                             trainer_kwargs=({'shard_clients': False}
                                                             if packing.batch_blocker(spec.config) is None and not alone
                                                             else None),
                                             tracking=(dataclasses.replace(spec.tracking, name=spec.name)
                                                       if spec.tracking is not None else None))
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
    self.first: Optional[batched_trainer.BatchedTrainer] = None
    self._thread: Optional[threading.Thread] = None
    self._compile_error: Optional[BaseException] = None
    self.ahead = False                   # compile_ahead was called
    self._closed = False
    if packing.align_plans([item[1] for item in opened]):
      logging.info('runs with other client sizes (data grid) share the largest batch plan of their pack')
    self.by_sig: Dict[object, list] = {}
    for item in opened:
      sig = packing.trainer_blocker(item[1]) or (packing.ALONE if alone else packing.signature(item[1]))
      self.by_sig.setdefault(sig, []).append(item)

  def _chunks(self, items):
    """The items of one program split by the memory budget, and the lanes each chunk's program has."""
    per = packing.lane_bytes(items[0][1])
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
          self.first = batched_trainer.BatchedTrainer([it[1] for it in chunks[0]], lanes=use_lanes)
        except batched_trainer.BatchRefused:
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
          try:
            summary = t.train(stop_requested=stop_requested)
          except Exception as e:  # noqa: BLE001 -- as a diverged lane: this run failed, the others go on
            results[i] = RunResult('failed', error=f'{type(e).__name__}: {e}', wall_s=time.time() - t0)
          else:
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
            bt = batched_trainer.BatchedTrainer([it[1] for it in chunk], lanes=use_lanes)
        except batched_trainer.BatchRefused as e:    # refused before compiling: every run of the pack, one line each
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
    for _, trainer, ckpt, _, lock in self.opened:
      ckpt.close()
      if trainer.recorder.tracker is not None:
        trainer.recorder.tracker.close('FAILED')   # no-op for a run that finished (its tracked run ended then)
      lock.release()


def _result(summary, trainer, ckpt, step, sig, wall) -> RunResult:
  summary = run_lib.close_summary(summary, trainer, ckpt, step, sig)
  return RunResult('stopped' if trainer.stopped_early else 'done', summary=summary, wall_s=wall)
