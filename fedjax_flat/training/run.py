"""Entry point shared by experiments/train.py and tests: validate, lock, build, resume, train, checkpoint, write.

Resume is automatic: the newest valid checkpoint in WORKDIR/checkpoints is restored (training/checkpoint.py)
and metrics.jsonl is cut back to its round, so a preempted or killed job rerun with the same command
continues exactly where its last checkpoint was. `fresh=True` discards the workdir's checkpoints and metrics,
once the config has been validated against the data (a rejected config deletes nothing).
The workdir is locked for the whole run (training/workdir.py): a second run on it is refused.
SIGTERM / SIGINT (`handle_signals=True`): the current round finishes, a checkpoint is written, and `run`
returns normally with summary['stopped_by_signal'] set; a second SIGINT aborts the process at once (the
newest complete checkpoint stays valid, as after SIGKILL).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Optional

from absl import logging
import jax

from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import init as init_lib
from fedjax_flat.training import loop, trainers
from fedjax_flat.training import tracking as tracking_lib
from fedjax_flat.training import plan as plan_lib
from fedjax_flat.config import validate
from fedjax_flat.training import workdir as workdir_lib


class StopSignal:
  """Records SIGTERM/SIGINT; the run loop polls it after every round."""

  def __init__(self):
    self.signal_name: Optional[str] = None
    self._previous = {}

  def __call__(self) -> bool:
    return self.signal_name is not None

  def _handle(self, signum, frame):
    name = signal.Signals(signum).name
    if self.signal_name is not None and signum == signal.SIGINT:
      # Second Ctrl-C: abort now. Not a KeyboardInterrupt, which code that catches BaseException swallows
      # (orbax's wait for a checkpoint write does); dying by SIGINT is as safe as SIGKILL for the checkpoints.
      print('second SIGINT: aborting now (the newest complete checkpoint is kept)', file=sys.stderr, flush=True)
      signal.signal(signal.SIGINT, signal.SIG_DFL)
      os.kill(os.getpid(), signal.SIGINT)
      return
    self.signal_name = name
    logging.warning('received %s: finishing the current round, then writing a checkpoint and exiting '
                    '(Ctrl-C again to abort immediately)', name)

  def install(self):
    if threading.current_thread() is not threading.main_thread():
      return self
    for s in (signal.SIGTERM, signal.SIGINT):
      self._previous[s] = signal.signal(s, self._handle)
    return self

  def uninstall(self):
    for s, h in self._previous.items():
      signal.signal(s, h)
    self._previous = {}


def check_workdir(workdir: str) -> None:
  """The workdir (and its checkpoints/) can be written; ConfigError / CheckpointError otherwise."""
  workdir_lib.check_writable(workdir)


def run(config, workdir: str, *, fresh: bool = False, handle_signals: bool = False, data=None,
        stop_requested=None, tracking=None) -> dict:
  """summary.json's dict of the run (see `execute`)."""
  return execute(config, workdir, fresh=fresh, handle_signals=handle_signals, data=data,
                 stop_requested=stop_requested, tracking=tracking)[0]


def execute(config, workdir: str, *, fresh: bool = False, handle_signals: bool = False, data=None,
            stop_requested=None, tracking=None):
  """(summary, trainer) of the run in `workdir`: the trainer holds the final server state. A run that fails
  before it trains (a refusal against the data, an unreadable checkpoint, ...) leaves the workdir as it was
  (workdir.Snapshot: what it created is removed, nothing that was there before). `tracking`: a
  training/tracking.Spec (--tracker), checked here before anything is built."""
  validate.validate_config(config)          # before any data loading or compilation
  if jax.process_index() == 0:
    tracking_lib.check(tracking)            # a missing package or an unreachable tracking URI: exit 2 now
  lock = workdir_lib.WorkdirLock(workdir) if jax.process_index() == 0 else None
  before = workdir_lib.Snapshot(workdir) if lock is not None else None
  held = opened = False
  try:
    if lock is not None:
      lock.acquire()
      held = True
      workdir_lib.prepare(workdir)          # the run's own interrupted writes go first: they may fill the disk
    trainer, checkpointer, step = open_run(config, workdir, fresh=fresh, data=data, tracking=tracking)
    opened = True
    return _run_opened(trainer, checkpointer, step, handle_signals=handle_signals, stop_requested=stop_requested)
  finally:
    if held and not opened:
      before.restore(lock)                  # refused before training: the workdir as it was; releases the lock
    elif lock is not None:
      lock.release()


def open_run(config, workdir, *, fresh: bool = False, data=None, trainer_kwargs=None, tracking=None):
  """The trainer of a locked workdir, resumed from its newest checkpoint (or fresh), config.json written, its
  tracked run (`tracking`: a tracking.Spec) started or continued and caught up with the restored records.

  Returns (trainer, checkpointer, resumed round or None); the caller closes the checkpointer. Also used by
  training/batched.py, which opens every run of a batched program this way.
  """
  checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, 'checkpoints'), keep=config.keep_checkpoints,
                                       every=config.checkpoint_every,
                                       keep_rounds=tuple(config.get('keep_rounds', ())))
  try:
    if not fresh:
      checkpointer.check_config(config, plan_lib.algo_defaults(config))   # refused before anything is built
    # loads the data and validates the config against them
    trainer = trainers.make_trainer(config, workdir, data=data, grouping_context=init_lib.grouping_context,
                                    **(trainer_kwargs or {}))
    trainer.recorder.checkpointer = checkpointer
    if fresh:
      checkpointer.clear()                  # only now: a config rejected above deleted nothing
    step = None if fresh else checkpointer.restore_latest(trainer)
    if step is None and trainer.recorder.writer is not None:
      trainer.recorder.writer.load_existing(0)       # no checkpoint: metrics from an earlier attempt are dropped
    if step is None and init_lib.requested(config):   # a fresh run only: a resumed one has its own params
      init_lib.apply(trainer, config)
      logging.info('initial params from %s', config.init.checkpoint or config.init.pretrained)
    if step is not None:
      logging.info('resumed from %s/%d (round %d of %d)', checkpointer.directory, step, step, config.rounds)
    if jax.process_index() == 0:
      loop.write_config(config, workdir)
      trainer.recorder.tracker = tracking_lib.open_run(tracking, workdir, config, trainer.recorder.records,
                                                       fresh=fresh)
  except BaseException:
    checkpointer.close()
    raise
  return trainer, checkpointer, step


def close_summary(summary: dict, trainer, checkpointer, step, signal_name: Optional[str]) -> dict:
  """The run-level entries of summary.json's dict that `run` returns."""
  summary['resumed_from_round'] = step
  summary['stopped_by_signal'] = signal_name if (signal_name and trainer.stopped_early) else None
  summary['checkpoint'] = (os.path.join(checkpointer.directory, str(checkpointer.last_saved))
                           if checkpointer.last_saved is not None else None)
  summary['checkpoint_save_s'] = list(checkpointer.save_times)
  tracker = getattr(trainer.recorder, 'tracker', None)
  if tracker is not None:   # the tracked run ends with the summary and files; a stopped one is continued on resume
    tracker.finish(summary, summary['checkpoint'], 'KILLED' if trainer.stopped_early else 'FINISHED')
  return summary


def _run_opened(trainer, checkpointer, step, *, handle_signals, stop_requested):
  stopper = None
  try:
    # Installed until the final checkpoint is on disk: a SIGTERM while it is written must not kill it.
    stopper = StopSignal().install() if handle_signals else None
    polls = [p for p in (stopper, stop_requested) if p is not None]
    summary = trainer.train(stop_requested=lambda: any(p() for p in polls))
    return close_summary(summary, trainer, checkpointer, step,
                         stopper.signal_name if (stopper and stopper()) else None), trainer
  finally:
    checkpointer.close()
    if getattr(trainer.recorder, 'tracker', None) is not None:
      trainer.recorder.tracker.close('FAILED')     # no-op after finish: the run raised before its summary
    if stopper is not None:
      stopper.uninstall()
