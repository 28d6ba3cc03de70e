"""The run: a plan, a round driver and a recorder around the run state.

  plan       training/plan.RunPlan: data, model, task, algorithm, transforms, client placement, batch plan, round
             path and evaluators, decided once from the config and the algorithm's declarations
  driver     training/driver.py: how the rounds execute (host-built rounds, or blocks of rounds in one program on
             the device copy of the data); divergence is reported with the round and the client ids
  recorder   training/recorder.Recorder: records, progress, evaluation plug-ins, checkpoints, summary

The run state is what the three share: the server state, the client-state store and the rounds completed.
Everything random derives from (config.seed, round, client id), so a run resumed at round r reproduces the
uninterrupted run exactly: the only state to save is the server state, the client-state store, the round counter
and the recorder's records (training/checkpoint.py). The chain algorithms plug their own plan and driver into
the same trainer (training/chain_loop.py); training/batched.py drives several trainers' drivers and recorders
through one runs program.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import jax

from fedjax_flat import devices
from fedjax_flat.training import writers
from fedjax_flat.training.driver import make_driver
from fedjax_flat.training.plan import RunPlan
from fedjax_flat.training.recorder import Recorder


class Trainer:
  """Builds a run from a config; `train()` runs its rounds. Usable from tests and notebooks.

  shard_clients: overrides config.engine.shard_clients (training/batched.py: the devices take runs instead).
  plan / driver: given by the chain trainer (training/chain_loop.py); by default the plan of `config` and the
  driver its round path chooses."""

  def __init__(self, config, workdir: Optional[str] = None, *, data=None, write_files: bool = True,
               shard_clients: Optional[bool] = None, plan: Optional[RunPlan] = None, driver=None):
    self.plan = plan if plan is not None else RunPlan(config, workdir, data=data, shard_clients=shard_clients)
    self.server_state, self.store = self.plan.initial_state()
    self.round = 0                       # rounds completed
    self.driver = driver if driver is not None else make_driver(self.plan)
    self.recorder = Recorder(self.plan, write_files=write_files)
    self.client_domains = None          # k-means client domains [K] when the config asks (training/trainers.py)
    self.client_planted_domains = None  # and each client's majority planted domain, before k-means relabelled it

  # What every part reads (the plan's and the recorder's).
  config = property(lambda self: self.plan.config)
  workdir = property(lambda self: self.plan.workdir)
  data = property(lambda self: self.plan.data)
  model = property(lambda self: self.plan.model)
  task = property(lambda self: self.plan.task)
  algorithm = property(lambda self: self.plan.algorithm)
  records = property(lambda self: self.recorder.records)
  stopped_early = property(lambda self: self.recorder.stopped_early)

  def train(self, num_rounds: Optional[int] = None, stop_requested=lambda: False) -> dict:
    """Rounds until config.rounds (or `num_rounds` more), or until `stop_requested()` after a block; the
    summary (summary.json's dict)."""
    end = self.begin_training(num_rounds)
    while self.round < end:
      r = self.round
      self.server_state, block = self.driver.step(self.server_state, self.store, r, self.block_length(r, end), end)
      if self.recorder.record(self, block, end, stop_requested):
        break
    return self.end_training()

  def begin_training(self, num_rounds: Optional[int] = None) -> int:
    """Starts this process's share of the run; returns the round to stop after (training/batched.py drives
    several trainers through begin_training / driver / recorder / end_training)."""
    end = self.recorder.begin(self.round, num_rounds)
    self.driver.begin(self.round)
    return end

  def block_length(self, r: int, end: int) -> int:
    """Rounds the driver runs from r before the host must see a round's end (evaluation, checkpoint)."""
    return self.driver.block_length(r, self.recorder.boundary_after(r, end))

  def evaluate(self) -> dict:
    return self.recorder.evaluate(self)

  def end_training(self) -> dict:
    return self.recorder.end(self)


# config.json's key for the process's device record (not a config field: loaders of config.json drop it).
DEVICES_KEY = 'host_devices'


def write_config(config, workdir):
  """WORKDIR/config.json: the config, plus the host-device choice of this process (fedjax_flat/devices.py)
  and the devices jax then saw, under `host_devices`."""
  os.makedirs(workdir, exist_ok=True)
  doc = json.loads(config.to_json_best_effort())
  doc[DEVICES_KEY] = {**devices.describe(), 'backend': jax.default_backend(), 'device_count': jax.device_count(),
                      'local_device_count': jax.local_device_count(), 'process_count': jax.process_count()}
  writers.atomic_write(os.path.join(workdir, 'config.json'), lambda f: f.write(json.dumps(doc, indent=2)))
