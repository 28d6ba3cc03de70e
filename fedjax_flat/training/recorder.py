"""The recorder of a run: what a person reads and what a resume needs besides the server state.

It keeps the evaluation records (metrics.jsonl, metrics.csv, TensorBoard: training/writers.py), the train losses
since the last evaluation, the cumulative messages, the wall time across resumes; it prints progress (rounds/s,
ETA, metrics), evaluates at the configured rounds (the algorithm's eval models on the global test set, then the
run's evaluation plug-ins: training/evals/), asks the checkpointer to save (training/checkpoint.py), and at the
end writes summary.json / summary.md / metrics.png with every plug-in's entries. `boundary_after(r, end)` is the
next round whose end it must see, which bounds the driver's blocks.

`state_dict()` / `load_state_dict(d)` are what a checkpoint stores of it, so a resumed run writes the same records.
"""
from __future__ import annotations

import os
import time
from typing import Optional

from absl import logging
import jax
import numpy as np

from fedjax_flat.core import sharding as sharding_lib
from fedjax_flat.data import sampling
from fedjax_flat.tasks import base as tasks_lib
from fedjax_flat.training import writers
from fedjax_flat.training.evals import registry as evals


def plot_title(label: str, config, dataset: Optional[str] = None) -> str:
  """metrics.png's title: the algorithm, its client optimizer (FedAvg with SGD and with SAM clients are different
  runs) and the dataset (`dataset`: the run's data's own name, plan.dataset_name; default config.dataset)."""
  opt = config.client.get('optimizer') if 'client' in config else None
  return f'{label}' + (f' ({opt} clients)' if opt else '') + f' on {dataset or config.dataset}'


class Recorder:

  def __init__(self, plan, *, write_files: bool = True):
    selected = evals.selected(plan)      # the run's evaluation plug-ins, chosen once
    for ev in selected:                  # a plug-in's rules against the loaded data, before anything compiles
      if ev.check is not None:
        ev.check(plan)
    self.plan = plan
    self.config = plan.config
    self.workdir = plan.workdir
    self.is_writer = jax.process_index() == 0          # multi-host: only process 0 writes files
    self.writer = (writers.MetricsWriter(plan.workdir) if (plan.workdir and write_files and self.is_writer)
                   else None)
    self.records = []
    self.pending_train_losses = []       # train losses of the rounds since the last evaluation
    self.comm_total = {'down_params': 0.0, 'up_params': 0.0}
    # Compressed uploads (config.upload): the bytes they really send, counted in comm_bytes instead of 4 x up_params.
    self.compressed = plan.systems.compressed_upload_bytes() is not None
    if self.compressed:
      self.comm_total['up_bytes'] = 0.0
    # The virtual clock's cumulative seconds and bytes (config.system; training/evals/system.py), None without.
    self.system_total = ({'virtual_time_s': 0.0, 'bytes_down': 0.0, 'bytes_up': 0.0, 'reports': 0}
                         if plan.clock is not None else None)
    self.last_clients = None             # the real clients of the last round (config.eval_clients)
    # What the task calls its accuracy and its headline metric (R@1, mIoU): the console, summary and plots say it.
    self.metric_names = tasks_lib.metric_names(plan.task)
    self.round_log = plan.algorithm.round_log   # the algorithm's schedule values per round, or None
    self.elapsed_offset = 0.0            # wall time of the run before this process (resume)
    self.checkpointer = None             # a checkpoint.Checkpointer saves every checkpoint_every rounds
    self.stopped_early = False
    self.tracker = None                  # training/tracking.Tracker with --tracker (MLflow / W&B), else None
    self.plugin_state = {}               # what evaluation plug-ins build once (their evaluators), by plug-in
    self._evaluations = selected
    self._t0 = self._last_progress = time.time()
    self._start_round = 0

  # What a checkpoint keeps.
  def state_dict(self) -> dict:
    d = {'records': list(self.records), 'pending_train_losses': [float(x) for x in self.pending_train_losses],
         'comm_total': dict(self.comm_total), 'elapsed_s': float(self.elapsed_s())}
    if self.system_total is not None:
      d['system_total'] = dict(self.system_total)
    return d

  def load_state_dict(self, d: dict):
    self.records = list(d['records'])
    self.pending_train_losses = list(d.get('pending_train_losses', []))
    self.comm_total = dict(d['comm_total'])
    if self.compressed and 'up_bytes' not in self.comm_total:   # a checkpoint from before up_bytes was counted
      self.comm_total['up_bytes'] = (self.comm_total['up_params'] / max(self.plan.num_params, 1)
                                     * self.plan.systems.compressed_upload_bytes())
    self.elapsed_offset = float(d.get('elapsed_s', 0.0))
    if self.system_total is not None and 'system_total' in d:
      self.system_total = dict(d['system_total'])

  def resumed(self, trainer) -> None:
    """After a checkpoint is restored (and metrics.jsonl reconciled with it): the plug-ins' `resumed` hooks may
    correct the restored records (e.g. an epsilon an older version under-reported); the files follow."""
    changed = [e.name for e in self.evaluations() if e.resumed is not None and e.resumed(trainer, self.records)]
    if changed and self.writer is not None:
      self.writer.records = [dict(r) for r in self.records]
      self.writer._rewrite()  # pylint: disable=protected-access

  def elapsed_s(self) -> float:
    """Wall time of the whole run, across resumes."""
    return self.elapsed_offset + (time.time() - self._t0)

  # The run's schedule.
  def begin(self, round_: int, num_rounds: Optional[int] = None) -> int:
    """Starts this process's share of the run at round `round_`; returns the round to stop after."""
    c = self.config
    end = c.rounds if num_rounds is None else min(c.rounds, round_ + num_rounds)
    self._t0 = self._last_progress = time.time()
    self._start_round = round_
    return end

  def is_evaluation_round(self, block_end: int, end: int) -> bool:
    c = self.config
    return (block_end % c.eval_every == 0 or block_end == end
            or block_end > c.rounds - c.get('eval_every_last', 0))

  def boundary_after(self, r: int, end: int) -> int:
    """The first round > r whose end must be seen by the host: evaluation, checkpoint, the last round."""
    c = self.config
    nxt = lambda every: (r // every + 1) * every if every > 0 else end
    b = min(end, nxt(c.eval_every))
    if end > c.rounds - c.get('eval_every_last', 0):
      b = min(b, max(r + 1, c.rounds - c.get('eval_every_last', 0) + 1))
    if self.checkpointer is not None:
      kept = [k for k in getattr(self.checkpointer, 'keep_rounds', ()) if k > r]   # config.keep_rounds
      b = min(b, nxt(self.checkpointer.every), *kept or [end])
    return max(b, r + 1)

  # After every block of rounds.
  def record(self, trainer, block: list, end: int, stop_requested=lambda: False) -> bool:
    """After a block of rounds (the driver's results): train losses, messages, evaluation and metrics at
    evaluation rounds, progress, checkpoint. Advances trainer.round. Returns True when the run stops here."""
    c = self.config
    train_losses = self.pending_train_losses
    for res in block:                  # every round's train loss, as with one round per call
      train_losses.append(res['train_loss'])
      for k, v in res['messages'].items():
        self.comm_total[k] += v
      if 'system' in res:              # the virtual clock: the round's seconds and the bytes really sent
        t, sysr = self.system_total, res['system']
        t['virtual_time_s'] += sysr['duration_s']
        t['bytes_down'] += sysr['bytes_down']
        t['bytes_up'] += sysr['bytes_up']
        t['reports'] += sysr['reported']
      self.last_clients = res['clients']
    # `train_loss` (console, metrics.jsonl, TensorBoard alike): the mean client training loss of the rounds
    # since the previous evaluation, so the console never shows one round's value under the same name.
    window_loss = float(np.mean(train_losses))
    trainer.round = block_end = trainer.round + len(block)
    rps = (block_end - self._start_round) / max(time.time() - self._t0, 1e-9)
    elapsed = self.elapsed_s()
    if self.is_evaluation_round(block_end, end):
      logged = self.round_log(block_end - 1) if self.round_log is not None else {}   # schedules (FedGloSS)
      rec = {'round': block_end, **self.evaluate(trainer), 'train_loss': window_loss, **logged,
             'elapsed_s': elapsed, 'rounds_per_s': rps,
             'comm_down_params': self.comm_total['down_params'], 'comm_up_params': self.comm_total['up_params'],
             **self.comm_bytes()}
      train_losses.clear()
      self.records.append(rec)
      if self.writer:
        self.writer.write(rec)
      if self.tracker is not None:
        self.tracker.log_record(rec)
    if time.time() - self._last_progress >= c.progress_every_s or block_end == end:
      self._last_progress = time.time()
      eta = (end - block_end) / max(rps, 1e-9)
      latest = self.records[-1] if self.records else {}
      logging.info('round %d/%d  %.2f rounds/s  ETA %.0fs  train_loss %.4f  test %s %s', block_end, c.rounds,
                   rps, eta, window_loss, self.metric_names['accuracy'],
                   f"{latest.get('test_accuracy', float('nan')):.4f}")
    stop = bool(stop_requested())
    placement = self.plan.placement
    if placement is not None and placement.multi_process:
      stop = sharding_lib.any_process(stop)   # every host stops after the same round
    if self.checkpointer is not None:
      self.checkpointer.maybe_save(trainer, final=stop or block_end == end)
    if stop:
      self.stopped_early = block_end < end
    return stop

  def comm_bytes(self) -> dict:
    """`comm_bytes`: bytes sent so far (systems/clock.COMM_BYTES: downloads to the online sampled clients + uploads
    that reached the server; float32 messages, compressed uploads at the bytes they send, with
    `comm_up_bytes` and its float32 equivalent `comm_up_bytes_uncompressed` beside it)."""
    t = self.comm_total
    if not self.compressed:
      return {'comm_bytes': 4.0 * (t['down_params'] + t['up_params'])}
    return {'comm_bytes': 4.0 * t['down_params'] + t['up_bytes'], 'comm_up_bytes': t['up_bytes'],
            'comm_up_bytes_uncompressed': 4.0 * t['up_params']}

  # Evaluation.
  def evaluations(self) -> list:
    """The evaluation plug-ins this run selects (training/evals/), once."""
    return self._evaluations

  def evaluate(self, trainer) -> dict:
    """The algorithm's eval models on the global test set (and the validation clients), then the plug-ins."""
    p, out = self.plan, {}
    view = (lambda x: x) if p.placement is None else p.placement.local_view
    models = {n: view(x) for n, (x, active) in p.algorithm.eval_models(trainer.server_state).items() if bool(active)}
    many = getattr(p.evaluator, 'evaluate_many', None)     # every model in one pass over the test set
    results = many(models) if many is not None else {n: p.evaluator(x) for n, x in models.items()}
    for name, params in models.items():
      res = results[name]
      prefix = '' if name == 'global' else f'{name}/'
      out[prefix + 'test_accuracy'] = res['accuracy']
      out[prefix + 'test_loss'] = res['loss']
      for k, v in res.items():   # task-specific metrics (e.g. mIoU) beside loss and accuracy
        if k not in ('accuracy', 'loss', 'count'):
          out[f'{prefix}test_{k}'] = v
      if p.val_evaluator is not None:    # the validation clients, each against its own database
        res = p.val_evaluator(params)
        out.update({f'{prefix}val_{k}': v for k, v in res.items() if k != 'count'})
    for ev in self.evaluations():       # the run's periodic plug-ins (training/evals/: routed, clients, ...)
      if ev.periodic is not None:
        out.update(ev.periodic(trainer))
    return out

  # The end.
  def end(self, trainer) -> dict:
    if self.checkpointer is not None:
      self.checkpointer.wait()
    return self.finish(trainer, time.time() - self._t0, trainer.round - self._start_round)

  def comm_summary(self) -> dict:
    """summary.json's totals: messages in params, bytes (compressed uploads at what they send, plus the float32
    equivalent comm_total_bytes_uncompressed)."""
    t = self.comm_total
    if not self.compressed:
      return {'comm_total_params': t, 'comm_total_bytes': 4.0 * sum(t.values())}
    params = {'down_params': t['down_params'], 'up_params': t['up_params']}
    return {'comm_total_params': params, 'comm_total_bytes': 4.0 * t['down_params'] + t['up_bytes'],
            'comm_total_bytes_uncompressed': 4.0 * sum(params.values())}

  def finish(self, trainer, wall, rounds_run) -> dict:
    """wall / rounds_run: this process only (a resumed run reports its own speed, not rounds since 0). What a
    run reports beyond its records comes from its evaluation plug-ins (training/evals/), each declared by the
    config and the algorithm's eval models."""
    c, p = self.config, self.plan
    # the first of the algorithm's reported models (WiMA, then SWA) that was evaluated, else the global one
    reported = evals.reported_model(p.algorithm.reported_models, self.records)
    summary = writers.summarize(self.records, c.summary_last_k, {
        'experiment': os.path.basename(self.workdir.rstrip('/')) if self.workdir else 'run',
        'algorithm': p.algorithm.label, 'dataset': getattr(p, 'dataset_name', c.dataset), 'model': c.model,
        'rounds_completed': trainer.round, 'rounds_planned': c.rounds, 'wall_time_s': wall,
        'rounds_this_process': rounds_run, 'wall_time_total_s': self.elapsed_offset + wall,
        'rounds_per_s': (rounds_run / wall) if wall > 0 else 0.0, 'num_params': p.num_params,
        'reported_model': reported, 'strategy': p.strategy, 'backend': jax.default_backend(),
        'rounds_per_call': p.rounds_per_call, 'device_data': p.device_rounds,
        'sampling_procedure': sampling.procedure(c.get('sampler', 'auto'), p.data.num_clients),
        'metric_names': self.metric_names,
        **self.comm_summary(),
        'summary_last_k': c.summary_last_k})
    for ev in self.evaluations():
      if ev.final is not None:
        ev.final(trainer, summary, reported)
    if self.workdir and self.writer:
      writers.write_summary(self.workdir, summary)
      writers.plot_metrics(self.records, os.path.join(self.workdir, 'metrics.png'),
                           title=plot_title(p.algorithm.label, c, getattr(p, 'dataset_name', None)),
                           accuracy_name=self.metric_names['accuracy'])
      self.writer.close()
    return summary
