"""The head/body split of a model as a declared parameter partition (FedRep, FedBABU, MOON).

A model declares the module paths of its classifier head when it registers (`@register(name, head=...)`,
models/registry.py; carried as `Model.head`); everything else is the body (the representation). From that
declaration alone:

  is_head_path(head)(path)       a leaf-path predicate (the same form FedBN's `select` takes:
                                 algorithms/wrappers/local_norm.with_local_norm keeps such leaves local)
  head_flags / head_mask         per-leaf booleans (tree_leaves order / a params-shaped pytree)
  merge(mask, a, b)              leaves of `a` where the mask is True, of `b` elsewhere
  representation(model, ...)     (logits, z): z = the input of the head's first call, the representation
                                 before the classifier (MOON's z), captured with Flax's method interception
                                 during the ordinary forward pass (no second pass, no change to the module)

BatchNorm models carry {'params', 'batch_stats'} (models/base.py): the leading collection name is skipped
when matching, so a head's running statistics (if any) belong to the head.
"""
from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

_COLLECTIONS = ('params', 'batch_stats')


def key_name(k) -> str:
  """The name of one key of a tree path (dict key, attribute name or sequence index)."""
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _names(path) -> tuple:
  names = tuple(key_name(k) for k in path)
  return names[1:] if names and names[0] in _COLLECTIONS else names


def require_head(model) -> tuple:
  """The model's declared head paths; a model without one cannot be split (one line naming the fix)."""
  head = tuple(getattr(model, 'head', ()) or ())
  if not head:
    raise ValueError(f'model {getattr(model, "name", model)!r} declares no classifier head; a head/body '
                     "algorithm needs one: declare it with @register(name, head=(('<module>',),))")
  return head


def is_head_path(head: Sequence[Sequence[str]]) -> Callable:
  """Predicate on a leaf path: True when the path starts with one of the declared head module paths."""
  prefixes = tuple(tuple(p) for p in head)

  def select(path) -> bool:
    names = _names(path)
    return any(names[:len(p)] == p for p in prefixes)
  return select


def head_flags(model, params) -> list:
  """Per-leaf flags in tree_leaves order: True for the head's leaves."""
  select = is_head_path(require_head(model))
  return [select(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def head_mask(model, params):
  """A params-shaped pytree of Python bools: True on the head, False on the body."""
  treedef = jax.tree_util.tree_structure(params)
  flags = head_flags(model, params)
  if not any(flags):
    raise ValueError(f'model {model.name!r}: its declared head {model.head} matches no parameter')
  if all(flags):
    raise ValueError(f'model {model.name!r}: its declared head {model.head} is the whole model (no body)')
  return jax.tree_util.tree_unflatten(treedef, flags)


def merge(mask, a, b):
  """Leaves of `a` where `mask` (a pytree of bools) is True, of `b` elsewhere (static choice per leaf)."""
  return jax.tree_util.tree_map(lambda m, x, y: x if m else y, mask, a, b)


def frozen(mask, params):
  """params with a stop_gradient on the leaves where mask is True: their gradient is exactly 0."""
  return jax.tree_util.tree_map(lambda m, x: jax.lax.stop_gradient(x) if m else x, mask, params)


def representation(model, params, x, **apply_kw):
  """(logits, z): the model's output and the input of its head (the representation before the classifier).

  Flax's `intercept_methods` sees every submodule call of the forward pass; the first call of a declared
  head module records its input. Works under jit/vmap/grad (the interception happens at trace time).
  """
  head = tuple(tuple(p) for p in require_head(model))
  captured = []

  def interceptor(next_fun, args, kwargs, context):
    if not captured and context.method_name == '__call__' and tuple(context.module.path) in head and args:
      captured.append(args[0])
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    logits = model.apply(params, x, **apply_kw)
  if not captured:
    raise ValueError(f'model {model.name!r}: its declared head {head} was never called in the forward pass')
  z = captured[0]      # in the compute dtype: float32 for the losses over it (MOON's similarities)
  return logits, jnp.reshape(z, (z.shape[0], -1)).astype(jnp.promote_types(z.dtype, jnp.float32))
