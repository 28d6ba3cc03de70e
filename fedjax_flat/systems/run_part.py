"""A run's systems part (`SystemsPart`): its messages, its virtual clock (config.system) and asynchronous steps.

The run plan (training/plan.py) is assembled from parts each feature owns; this is the systems one. It is built
once the plan knows the algorithm, the data, the cohort and the batch plan, and answers: the model-sized
messages of a round (`round_messages`, compressed uploads at their own bytes: systems/compress.py), the clock
(None without config.system; `clock_conflict` names what excludes it), round r's schedule and step limits
(`round_schedule`, `round_limits`) and an asynchronous algorithm's server steps (`async_steps`:
systems/events.py). Everything is a pure function of (config, round, clients), as the clock itself.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from fedjax_flat.errors import ConfigError
from fedjax_flat.optimizers import client as client_opt
from fedjax_flat.systems import clock as clock_lib
from fedjax_flat.systems import compress as compress_lib
from fedjax_flat.systems import events as events_lib


def message_bytes(messages: dict):
  """(bytes down, bytes up) of round_messages' counts: float32 params, compressed uploads at their own bytes."""
  down = clock_lib.BYTES_PER_PARAM * messages['down_params']
  return down, messages.get('up_bytes', clock_lib.BYTES_PER_PARAM * messages['up_params'])


class SystemsPart:
  """What a run's messages cost and when its clients answer. `algorithm`: the built FederatedAlgorithm (its
  phases, comm_down / comm_up, chain and asynchronous specs); `num_params`: () -> the model's parameter count
  (evaluated only when a message is sized); `host`: what keeps the clock away, {'stream': engine.stream_batches,
  'partial': clients sharded over several processes, 'val_source': host-built validation steps}."""

  def __init__(self, config, algorithm, data, *, cohort: int, num_steps: int, batch_plan,
               num_params: Callable[[], int], host: dict):
    self.config, self.algorithm, self.data = config, algorithm, data
    self.cohort, self.num_steps, self.batch_plan = cohort, num_steps, batch_plan
    self._num_params, self.host = num_params, host
    self.client_step_examples = None
    self.clock = self.make_clock() if clock_lib.enabled(config) else None

  def clock_conflict(self):
    """(field, value, why) of what keeps this run from its virtual clock: the system field the user set and what
    it conflicts with (None: no conflict)."""
    s = self.config.system
    field, value = clock_lib.switched_on(self.config)
    if self.algorithm.chain is not None:
      return field, value, (f'algorithm={self.config.algorithm!r} is a chain algorithm (FedSeq family: its lanes '
                            'are planned by training/chain_loop.py) and has no virtual clock; drop the system '
                            'section or choose another algorithm')
    if self.host['stream']:
      return field, value, ('engine.stream_batches=True and the virtual clock exclude each other (the clock '
                            'masks whole cohorts); set one of them off')
    if self.host['partial']:
      return field, value, ('clients sharded over several processes have no virtual clock; run on one process '
                            'or drop the system section')
    if self.host['val_source']:
      return field, value, ("the algorithm appends validation steps (FedSoup's val_source) that a deadline would "
                            'cut; drop the system section')
    if self.algorithm.asynchronous is not None:
      for name, off, now in (('deadline_s', 0.0, float(s.deadline_s)), ('availability', 'always', s.availability),
                             ('dropout', 0.0, float(s.dropout))):
        if now != off:
          return f'system.{name}', s[name], (
              f'algorithm={self.config.algorithm!r} is asynchronous: it has no rounds to close, so its clock '
              f'reads the speeds and bandwidths only; set system.{name}={off!r} or choose a synchronous '
              'algorithm (e.g. fedavg)')
    return None

  def make_clock(self):
    """The run's clock: the population's devices, a local step's passes, the bytes of a round's messages."""
    c, alg = self.config, self.algorithm
    conflict = self.clock_conflict()
    if conflict:
      raise ConfigError(*conflict)
    cc = c.client
    self.client_step_examples = [
        clock_lib.step_examples(int(n), cc.batch_size, epochs=cc.local_epochs, local_steps=cc.local_steps,
                                full_batches=self.batch_plan.full_batches, max_steps=self.batch_plan.max_steps)
        for n in np.asarray(self.data.client_sizes())]
    passes = alg.num_phases * client_opt.gradient_passes(cc) + alg.extra_passes
    # One client's bytes down / up from round_messages, the recorder's comm_bytes' source: one definition.
    down, up = message_bytes(self.round_messages(1))
    return clock_lib.make_clock(c, self.data.num_clients, passes=passes, bytes_down=down, bytes_up=up,
                                full_steps=self.client_step_examples)

  def round_schedule(self, r: int, ids) -> 'clock_lib.RoundSchedule':
    """Round r of the real clients `ids` on the virtual clock (who answers, steps that fit, seconds, bytes)."""
    ids = np.asarray(ids, np.int64)
    return clock_lib.schedule(self.clock, r, ids, [self.client_step_examples[k] for k in ids])

  def round_limits(self, r: int, ids):
    """(fit steps [cohort] int32, reports [cohort] bool, totals) of round r: what the round program masks with."""
    sched = self.round_schedule(r, ids)
    fit, reports = clock_lib.padded(sched, self.cohort, self.num_steps)
    totals = {'duration_s': sched.duration_s, 'bytes_down': sched.bytes_down, 'bytes_up': sched.bytes_up,
              'downloaded': int(np.sum(sched.available)), 'reported': int(np.sum(sched.reports))}
    return fit, reports, totals

  def async_steps(self):
    """An asynchronous algorithm's server steps (systems/events.simulate over config.rounds steps): who arrives
    at each, from which version, when. A client's duration is its download + all its local steps + upload on the
    clock (without config.system: 1 s each, arrivals in dispatch order)."""
    spec, c = self.algorithm.asynchronous, self.config
    conc = int(spec.concurrency) or int(c.clients_per_round)
    if not (spec.buffer <= conc and conc + spec.buffer <= self.data.num_clients):
      raise ConfigError('algo.concurrency', conc, f'needs algo.buffer={spec.buffer} <= concurrency and concurrency '
                        f'+ buffer <= the population {self.data.num_clients} (0: clients_per_round)')
    if self.clock is None:
      duration = lambda k: 1.0     # noqa: E731
    else:
      duration = lambda k: float(clock_lib.transfer_s(self.clock, np.array([k]))[0] + np.sum(    # noqa: E731
          self.client_step_examples[k]) * self.clock.passes / self.clock.devices.speed[k])
    return events_lib.simulate(duration, self.data.num_clients, conc, spec.buffer, int(c.rounds), int(c.seed))

  def compressed_upload_bytes(self) -> Optional[int]:
    """Bytes of one client's compressed upload (config.upload; systems/compress.upload_bytes, the clock's too), or
    None when uploads are not compressed."""
    c = self.config
    return compress_lib.upload_bytes(c.upload, self._num_params()) if compress_lib.enabled(c) else None

  def round_messages(self, n_clients: int, n_up: Optional[int] = None) -> dict:
    """Model-sized messages of a round (FederatedAlgorithm.comm_down / comm_up per phase): downloads to
    `n_clients` clients, uploads from `n_up` (default n_clients; with the virtual clock the clients whose upload
    reached the server: systems/clock.COMM_BYTES); with compressed uploads also 'up_bytes', the bytes those
    uploads really send (the recorder's comm_bytes count them instead of 4 x up_params)."""
    alg, p = self.algorithm, self._num_params()
    n_up = n_clients if n_up is None else n_up
    out = {'down_params': alg.comm_down * alg.num_phases * n_clients * p,
           'up_params': alg.comm_up * alg.num_phases * n_up * p}
    each = self.compressed_upload_bytes()
    if each is not None:
      out['up_bytes'] = alg.num_phases * n_up * each
    return out
