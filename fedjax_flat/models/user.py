"""A user's own model through the front door: `ff.register_model(name, module)`, Flax Linen or Flax NNX.

    class MLP(nnx.Module):                                   # NNX: built eagerly from its rngs
      def __init__(self, num_classes, input_shape, *, rngs):
        self.hidden = nnx.Linear(math.prod(input_shape), 32, rngs=rngs)
        self.out = nnx.Linear(32, num_classes, rngs=rngs)
      def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))

    ff.register_model('mlp', MLP)                            # then config.model = 'mlp'
    ff.register_model('linen_mlp', LinenMLP)                 # a Linen class (or instance) the same way

`module` is one of
  - a class or function: called with what its signature names of num_classes, input_shape, rngs and the
    config.model_kwargs (all of them when it takes **kwargs), once per model the run builds; it returns a Linen
    or an NNX module. An NNX one takes `rngs` (an nnx.Rngs of the run's init key: the seed picks its values);
  - a Linen module instance (num_classes is then its own);
  - an NNX module instance: its values are the initial params of every run and seed.

Either way the rest of the library sees what a built-in model is (models/base.Model: pure init / apply over a
params pytree). A Linen module is models/base.from_flax's (`__call__(x, train)`; a `__call__(x)` without train
is called without it). An NNX module is split ONCE (nnx.split -> graphdef, the nnx.Param state and the rest, e.g.
its dropout streams); init returns the Param state as a plain nested dict of arrays, and apply merges a copy
of the graph with the given params and calls it, so nothing is mutated and every call is a pure function of
(params, x, rng). apply's `train` is passed to a `__call__` that takes it, else sets the module's mode
(Module.train() / .eval(): Dropout's `deterministic`); `rng` reseeds its RNG streams; with_activations
collects what the module sows as nnx.Intermediate (nnx.capture; in path order). NNX BatchNorm (nnx.BatchStat)
is refused in one line: a BatchNorm model is a Linen module with `batch_stats=True` (models/base.py).

`register_model(name, module, *, batch_stats=False, head=(), token_ids=False, replace=False)`: the
declarations of models/registry.register.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import flax.linen as nn
from flax import nnx

from fedjax_flat.errors import BadInputError
from fedjax_flat.models import base
from fedjax_flat.models import registry as model_registry


def register_model(name: str, module: Any, *, batch_stats: bool = False, head=(), token_ids: bool = False,
                   replace: bool = False):
  """Registers `module` (module docstring) as model `name`; returns `module`. A name taken by another
  definition is refused (registry.DuplicateName) unless replace=True."""
  if not isinstance(name, str) or not name:
    raise BadInputError(f'register_model(name={name!r}): the name is a non-empty string (config.model)')
  if not (isinstance(module, (nn.Module, nnx.Module)) or callable(module)):
    raise BadInputError(f'register_model({name!r}, {module!r}): a Flax Linen or NNX module, its class, or a '
                        'function returning one')

  def build(num_classes: int, input_shape: tuple, **kwargs) -> base.Model:
    return as_model(name, module, num_classes, tuple(input_shape), batch_stats=batch_stats, **kwargs)

  # the same user object registered twice (a notebook cell re-run) is the same definition
  build.__wrapped__ = module if callable(module) and hasattr(module, '__qualname__') else type(module)
  meta = {'batch_stats': (lambda kw: True)} if batch_stats else {}
  model_registry.register(name, head=tuple(head) or None, token_ids=token_ids, replace=replace, **meta)(build)
  return module


def _takes(fn, name: str) -> bool:
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False
  return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def _call_factory(name: str, factory: Callable, args: dict):
  try:
    params = inspect.signature(factory).parameters
  except (TypeError, ValueError):
    params = {}
  if any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return factory(**args)
  named = {k: v for k, v in args.items() if k in params}
  extra = sorted(set(args) - set(named) - {'num_classes', 'input_shape', 'rngs'})
  if extra:       # a model_kwargs field the model does not take would be silently ignored
    raise BadInputError(f'model {name!r}: config.model_kwargs {extra} are not arguments of {factory!r}: remove them')
  return factory(**named)


def as_model(name: str, module: Any, num_classes: int, input_shape: tuple, *, batch_stats: bool = False,
             **kwargs) -> base.Model:
  """The pure Model of a registered Linen / NNX module, class or factory (module docstring)."""
  if isinstance(module, (nn.Module, nnx.Module)):
    if kwargs:
      raise BadInputError(f'model {name!r} is a module instance: config.model_kwargs {sorted(kwargs)} cannot change '
                          'it; register its class or a function to take them')
    built = module
  else:
    args = {'num_classes': num_classes, 'input_shape': input_shape, **kwargs}
    nnx_factory = _takes(module, 'rngs')
    if nnx_factory:
      args['rngs'] = nnx.Rngs(0)         # the one concrete instance split once; init builds from the run's key
    built = _call_factory(name, module, args)
    if nnx_factory and isinstance(built, nnx.Module):
      return from_nnx(built, name, num_classes, input_shape,
                      make=lambda rng: _call_factory(name, module, {**args, 'rngs': nnx.Rngs(rng)}))
  if isinstance(built, nnx.Module):
    return from_nnx(built, name, num_classes, input_shape)
  if isinstance(built, nn.Module):
    return from_linen(built, name, num_classes, input_shape, batch_stats=batch_stats)
  raise BadInputError(f'model {name!r}: {module!r} returned {type(built).__name__}, not a Flax Linen or NNX module'
                      ' (an NNX module is built from `rngs`: take rngs in its signature)')


def from_linen(module: nn.Module, name: str, num_classes: int, input_shape: tuple, *,
               batch_stats: bool = False) -> base.Model:
  """base.from_flax for a module whose __call__ takes `train`; otherwise the same init / apply calling it
  without (one function in training and evaluation)."""
  if batch_stats or _takes(module.__call__, 'train'):
    return base.from_flax(module, name, num_classes, input_shape, batch_stats=batch_stats)

  def init(rng, sample_x):
    return module.init({'params': rng, 'dropout': rng}, sample_x)['params']

  def apply(params, x, *, train=False, rng=None, with_activations=False):
    del train
    rngs = {'dropout': rng} if rng is not None else None
    if with_activations:
      logits, state = module.apply({'params': params}, x, rngs=rngs, mutable=['intermediates'])
      return logits, jax.tree_util.tree_leaves(state.get('intermediates', {}))
    return module.apply({'params': params}, x, rngs=rngs)

  return base.Model(name=name, init=init, apply=apply, num_classes=num_classes, input_shape=tuple(input_shape))


def from_nnx(module: nnx.Module, name: str, num_classes: int, input_shape: tuple, *,
             make: Callable = None) -> base.Model:
  """The pure Model of an NNX module (module docstring). `make(rng) -> module`: init builds the initial values
  from the run's key; None: init returns `module`'s own values whatever the key."""
  if jax.tree_util.tree_leaves(nnx.state(module, nnx.BatchStat)):
    raise BadInputError(f'model {name!r}: NNX BatchNorm (nnx.BatchStat) is not supported; use GroupNorm / '
                        'LayerNorm, or a Linen module registered with batch_stats=True')
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)      # ONCE: the structure every call merges into
  own = nnx.to_pure_dict(params)
  takes_train = _takes(type(module).__call__, 'train')
  # its RNG streams (Dropout's), each reseeded from the apply's key: a module built with nnx.Rngs(0) has the
  # stream 'default' only, one built with nnx.Rngs(dropout=...) 'dropout'
  streams = sorted({node.tag for _, node in nnx.iter_graph(module) if isinstance(node, nnx.RngStream)})

  def init(rng, sample_x):
    del sample_x       # an NNX module knows its shapes when it is built
    if make is None:
      return jax.tree_util.tree_map(jnp.array, own)      # a copy: nothing aliases the registered instance
    return nnx.to_pure_dict(nnx.state(make(rng), nnx.Param))

  def apply(params, x, *, train=False, rng=None, with_activations=False):
    # copy=True: fresh Variables in the caller's trace (the split's own belong to no trace and may not change)
    m = nnx.merge(graphdef, params, rest, copy=True)
    if rng is not None and streams:
      nnx.reseed(m, **{tag: jax.random.fold_in(rng, i) for i, tag in enumerate(streams)})
    if takes_train:
      out, acts = nnx.capture(lambda mod: mod(x, train=train), nnx.Intermediate)(m)
    else:
      m.train() if train else m.eval()
      out, acts = nnx.capture(lambda mod: mod(x), nnx.Intermediate)(m)
    if with_activations:
      return out, jax.tree_util.tree_leaves(nnx.to_pure_dict(acts))
    return out

  return base.Model(name=name, init=init, apply=apply, num_classes=num_classes, input_shape=tuple(input_shape))
