"""Initial model parameters from the config (`config.init`), applied before round 0 (never on resume).

  init.checkpoint: a fedjax_flat run directory (its config.json + checkpoints/) or that run's checkpoints/
      folder: the run's `init.model` ('global', 'swa', 'wima') at its newest checkpoint. Classifier: kept when
      the number of classes matches, re-initialized otherwise (init.reinit_classifier='auto').
  init.pretrained: a params file that `models/pretrained.load_pretrained` reads (.npz of '/'-joined keys, or
      flax msgpack), e.g. ImageNet MobileNetV2-GN weights converted offline for the Landmarks configs.
      With 'auto' the classifier is re-initialized there too when its shape differs (1000 ImageNet classes vs
      2,028); init.reinit_classifier='always' always re-initializes it, 'never' requires it to fit.

Every other leaf must match the model exactly (shape mismatch / missing / unexpected keys: one ValueError listing
them). The server state is rebuilt from the loaded params with the algorithm's server_init (optimizer state,
duals, SWA buffers start fresh), and so is the client-state store (FedBN's local normalization starts from them).
"""
from __future__ import annotations

import json
import os
from typing import Tuple

import jax

_MODELS = ('global', 'swa', 'wima')


def requested(config) -> bool:
  init = config.get('init')
  return init is not None and bool(init.get('checkpoint') or init.get('pretrained'))


def load_run(workdir: str, which: str = 'global', step=None) -> Tuple[object, object, int]:
  """(trainer, params, round) from a run directory's config.json and its newest checkpoint (or checkpoint
  `step`); builds the run's data and model, writes nothing."""
  import ml_collections
  from fedjax_flat.training import checkpoint, loop
  from fedjax_flat.config.default_config import default_config
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
  trainer = loop.Trainer(config, None, write_files=False)
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


def initial_params(config, model, params_init):
  """The params `config.init` asks for, fitted to `params_init` (the fresh initialization of this run's model)."""
  from fedjax_flat.models import pretrained
  init = config.init
  reinit = {'auto': 'auto', 'always': True, 'never': False}[init.get('reinit_classifier', 'auto')]
  key = init.get('classifier_key') or None
  if init.checkpoint:
    _, src, step = load_run(init.checkpoint, init.get('model', 'global'))
    return pretrained.fit_params(model, params_init, src, source=f'{run_dir_of(init.checkpoint)} (round {step})',
                                 reinit_classifier=reinit, classifier_key=key)
  return pretrained.fit_params(model, params_init, pretrained.read_params(init.pretrained), source=init.pretrained,
                               reinit_classifier=reinit, classifier_key=key)


def apply(trainer, config) -> None:
  """Replaces the trainer's round-0 server state (and client-state store) by ones built from `initial_params`.
  Mirrors Trainer.__init__ (training/loop.py): server_init with the same key, replicated when placed."""
  from fedjax_flat.core.client_state import make_client_state_store
  alg = trainer.algorithm
  fresh = jax.device_get(alg.eval_models(trainer.server_state)['global'][0])
  params = jax.tree_util.tree_map(jax.numpy.asarray, initial_params(config, trainer.model, fresh))
  state = alg.server_init(params, jax.random.fold_in(trainer.key, 1))
  trainer.server_state = trainer.placement.replicate(state) if trainer.placement is not None else state
  if trainer.store is not None:
    trainer.store = make_client_state_store(
        alg.client_state_init(params), trainer.data.num_clients, config.get('client_state_store', 'auto'),
        config.get('client_state_device_max_mb', 256) * 2**20)
