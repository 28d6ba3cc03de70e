"""A finished (or running) run, reloaded read-only: its trainer, the params of one of its models, the round.

What the analysis tools (experiments/hessian.py), `config.init.checkpoint` (training/init.py) and
`grouping.probe_checkpoint` start from. Nothing is written; a live run's checkpoints are only read.
"""
from __future__ import annotations

import json
import os
from typing import Tuple

import jax
import ml_collections

from fedjax_flat.config.default_config import default_config
from fedjax_flat.config.run_dir import run_dir_of
from fedjax_flat.training import checkpoint, trainers


def load_run(workdir: str, which: str = 'global', step=None) -> Tuple[object, object, int]:
  """(trainer, params, round) from a run directory's config.json and its newest checkpoint (or checkpoint
  `step`); builds the run's data and model, writes nothing."""
  workdir = run_dir_of(workdir)
  cfg_path = os.path.join(workdir, 'config.json')
  if not os.path.exists(cfg_path):
    raise FileNotFoundError(f'{cfg_path} not found: expected a directory written by experiments/train.py')
  with open(cfg_path) as f:
    saved = json.load(f)
  config = default_config()   # fields added since the run was written keep their defaults

  def merge(node, d):
    for k, v in d.items():
      if isinstance(v, dict) and k in node and isinstance(node[k], ml_collections.ConfigDict):
        merge(node[k], v)
      else:
        with node.ignore_type():
          node[k] = v
  merge(config, saved)
  if config.get('init') is not None:     # the source's own initialisation is in its checkpoint already
    config.init.checkpoint = ''
    config.init.pretrained = ''
  trainer = trainers.make_trainer(config, None, write_files=False)
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints'), read_only=True)   # the run may be live
  try:
    step = ckpt.restore_latest(trainer) if step is None else ckpt.restore_step(trainer, int(step))
  finally:
    ckpt.close()
  if step is None:
    raise FileNotFoundError(f'no checkpoint in {workdir}/checkpoints (runs write one at the end)')
  models = trainer.algorithm.eval_models(trainer.server_state)
  if which not in models:
    raise ValueError(f'model {which!r}: the run {workdir} has models {sorted(models)}')
  params, active = models[which]
  if not bool(active):
    raise ValueError(f'model {which!r} of {workdir} is not active at round {step} (e.g. SWA had not started)')
  return trainer, jax.device_get(params), step
