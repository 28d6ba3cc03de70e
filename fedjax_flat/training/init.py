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

import jax

from fedjax_flat.run_dir import run_dir_of
from fedjax_flat.grouping.superclients import GroupingContext, fresh_params
from fedjax_flat.models import pretrained
from fedjax_flat.training.reload import load_run

_MODELS = ('global', 'swa', 'wima')


def requested(config) -> bool:
  init = config.get('init')
  return init is not None and bool(init.get('checkpoint') or init.get('pretrained'))


def initial_params(config, model, params_init):
  """The params `config.init` asks for, fitted to `params_init` (the fresh initialization of this run's model)."""
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
  """Replaces the trainer's round-0 server state (and client-state store) by those of `initial_params`
  (training/plan.RunPlan.initial_state: server_init with the run's key, replicated when placed)."""
  fresh = jax.device_get(trainer.algorithm.eval_models(trainer.server_state)['global'][0])
  params = jax.tree_util.tree_map(jax.numpy.asarray, initial_params(config, trainer.model, fresh))
  trainer.server_state, trainer.store = trainer.plan.initial_state(params)


def load_params(path: str):
  """grouping.probe_checkpoint's loader: (global params, round, run dir) of a run directory."""
  _, params, step = load_run(path)
  return params, step, run_dir_of(path)


def grouping_context(config, data=None, model=None) -> GroupingContext:
  """The grouping toolkit's context for a config: w_0 as this run starts from it (config.init included) and the
  loader of grouping.probe_checkpoint."""
  ctx = GroupingContext.from_config(config, data) if model is None else GroupingContext(model, data, config)
  params0 = fresh_params(config, ctx.model, ctx.data)
  if requested(config):
    params0 = jax.tree_util.tree_map(jax.numpy.asarray, initial_params(config, ctx.model, jax.device_get(params0)))
  return GroupingContext(ctx.model, ctx.data, config, params0=params0, load_run=load_params)
