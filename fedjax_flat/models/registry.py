"""Model registry: `config.model` name -> a builder returning a `Model` (models/base.py: pure init/apply).

Each model module registers its builders where the model is defined (`@register('name')`, with
`batch_stats=fn(model_kwargs) -> bool` when the model carries BatchNorm running statistics, and
`head=` the module paths of its classifier head: a tuple of name tuples or fn(model_kwargs) -> one, the
head/body split of models/partition.py, and `token_ids=True` when its input holds token ids, which mixed
precision must not cast); every module of this package is imported on the first lookup, so a
new model is its module + its test.
"""
from __future__ import annotations

import dataclasses

from fedjax_flat.models import base
from fedjax_flat.registry import Registry

MODELS = Registry('model', package='fedjax_flat.models')
register = MODELS.register


def names():
  return MODELS.names()


def get_model(name: str, num_classes: int, input_shape: tuple, *, compute_dtype: str = 'float32',
              **kwargs) -> base.Model:
  """The registered model; `compute_dtype` ('float32' | 'bfloat16', config.engine.compute_dtype): the one place
  mixed precision is applied (models/base.with_compute_dtype: float32 params, bfloat16 compute)."""
  if name not in MODELS:
    raise ValueError(f'model={name!r} is unknown; allowed: {names()}')
  model = MODELS.get(name)(num_classes=num_classes, input_shape=tuple(input_shape), **kwargs)
  head = declared_head(name, kwargs)
  model = dataclasses.replace(model, head=head) if head else model
  return base.with_compute_dtype(model, compute_dtype, cast_inputs=not MODELS.meta(name, 'token_ids'))


def compute_dtype(config) -> str:
  """A run config's `engine.compute_dtype` ('float32' when it has none): what the builders of the networks a
  run trains pass to get_model (the trainer, the centralized and source pre-training runs, the grouping passes)."""
  engine = config.get('engine') if hasattr(config, 'get') else None
  return (engine.get('compute_dtype', None) if engine is not None else None) or 'float32'


def declared_head(name: str, kwargs=None) -> tuple:
  """The module paths of the model's classifier head as its module declares them (() if it declares none)."""
  h = MODELS.meta(name, 'head') if name in MODELS else None
  if callable(h):
    h = h(dict(kwargs or {}))
  return tuple(tuple(p) for p in (h or ()))


def uses_batch_stats(name: str, kwargs) -> bool:
  """Whether the model carries BatchNorm running statistics in its params (known from the config alone)."""
  fn = MODELS.meta(name, 'batch_stats') if name in MODELS else None
  return bool(fn and fn(dict(kwargs or {})))
