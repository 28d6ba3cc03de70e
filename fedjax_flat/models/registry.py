"""Model registry: `config.model` name -> a builder returning a `Model` (models/base.py: pure init/apply).

Each model module registers its builders where the model is defined (`@register('name')`, with
`batch_stats=fn(model_kwargs) -> bool` when the model carries BatchNorm running statistics); every module of
this package is imported on the first lookup, so a new model is its module + its test.
"""
from __future__ import annotations

from fedjax_flat.models import base
from fedjax_flat.registry import Registry

MODELS = Registry('model', package='fedjax_flat.models')
register = MODELS.register


def names():
  return MODELS.names()


def get_model(name: str, num_classes: int, input_shape: tuple, **kwargs) -> base.Model:
  if name not in MODELS:
    raise ValueError(f'model={name!r} is unknown; allowed: {names()}')
  return MODELS.get(name)(num_classes=num_classes, input_shape=tuple(input_shape), **kwargs)


def uses_batch_stats(name: str, kwargs) -> bool:
  """Whether the model carries BatchNorm running statistics in its params (known from the config alone)."""
  fn = MODELS.meta(name, 'batch_stats') if name in MODELS else None
  return bool(fn and fn(dict(kwargs or {})))
