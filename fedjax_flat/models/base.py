"""The model contract: pure `init` / `apply` functions around a Flax module.

The engine never touches module objects. A model is a `Model` holding two pure functions:

  init(rng, sample_x) -> params                      (a pytree: the module's 'params' collection)
  apply(params, x, *, train=False, rng=None, with_activations=False)
      -> logits                                       (with_activations=False)
      -> (logits, activations)                        (with_activations=True; a list of hidden
                                                       post-activation outputs, for MAN)

Modules mark hidden activations with `self.sow('intermediates', 'act', y)`; `from_flax` collects them in
order without a second forward pass. Most models here have no mutable state (GroupNorm, not BatchNorm), so
`params` is the whole trainable state, which is what federated averaging needs.

BatchNorm models (`from_flax(..., batch_stats=True)`, e.g. BiSeNetV2-BN) keep the contract pure by carrying
the running statistics INSIDE the params pytree: params = {'params': trainable, 'batch_stats': running
mean/var}. So every algorithm, server optimizer, SWA/WiMA buffer and checkpoint sees one pytree, and:

  apply(params, x, *, train, rng, with_activations, mask=None, batch_norm=None, with_batch_stats=False)
    mask [B]            valid examples: batch statistics are computed over them only (padding excluded)
    batch_norm          None: batch statistics in training, running ones otherwise; 'batch': normalize with
                        the batch's own statistics also at evaluation (a test-time policy, core/batch_stats.py)
    with_batch_stats    also return the updated running statistics: (out, new_batch_stats). Training
                        (algorithms/local.py) writes them into params after each optimizer step, so the
                        optimizer's update of those leaves (their gradient is exactly 0 in training mode;
                        weight decay, corrections) is discarded and they follow the BatchNorm formula
                        mean <- m * mean + (1 - m) * batch_mean (Flax's biased batch variance).
Which leaves are statistics, how the server averages them and the BN policies (FedAvg / SiloBN / FedBN):
core/batch_stats.py.

Mixed precision (`with_compute_dtype(model, 'bfloat16')`, config.engine.compute_dtype; registry.get_model applies
it): parameters stay float32 and every consumer (optimizers, aggregation, checkpoints) sees float32; each apply
function casts the trainable parameters and a floating input to bfloat16, so every matmul / convolution /
activation runs in bfloat16 (what Flax's `dtype=bfloat16, param_dtype=float32` does, for every layer of every
model at once, Flax's and ours: layers.Conv / Dense follow their input's dtype), and its floating outputs
(logits, sown activations) come back float32: the tasks' losses and metrics are reduced in float32. The gradient
of the float32 parameters is float32 (a cast's transpose). Flax's normalization layers compute their statistics
in float32 from bfloat16 inputs; BatchNorm running statistics ('batch_stats') are never cast. `float32_model`
undoes it (the Hessian tools). 'float32' is the model unchanged: bit-identical to a model built without it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import flax.linen as nn

Params = Any


@dataclasses.dataclass(frozen=True)
class Model:
  name: str
  init: Callable[..., Params]
  apply: Callable[..., Any]
  num_classes: int
  input_shape: tuple  # per-example shape, e.g. (32, 32, 3)
  batch_stats: bool = False   # params = {'params', 'batch_stats'} (BatchNorm running statistics)
  bn_momentum: float = 0.9    # BatchNorm models: running = m * running + (1 - m) * batch statistic
  head: tuple = ()            # module paths of the classifier head, e.g. (('Dense_1',),): models/partition.py
  compute_dtype: str = 'float32'   # 'bfloat16': mixed precision (with_compute_dtype)

  # The fields holding apply-like functions fn(params, x, ...) that mixed precision wraps (subclasses with
  # more entry points, e.g. models/fedcg.DomainModel, list theirs).
  APPLY_FIELDS: ClassVar[tuple] = ('apply',)


def _collect_acts(intermediates) -> list:
  """Flattens sown activations into a list, in definition order."""
  leaves = jax.tree_util.tree_leaves(intermediates)
  return list(leaves)


def fast_init(init_fn):
  """init_fn(rng, x) jitted and fed an 'rbg' key derived from `rng` (deterministically).

  Why: a network with hundreds of initializers (BiSeNetV2: 301 leaves) compiles for minutes on CPU with the
  default threefry PRNG, whose hash XLA unrolls per draw (measured on the loaded 2-core machine: eager init
  144 s, jitted 110 s, jitted with rbg 29 s; benchmarks/studies/README.segmentation.md). The values differ from a
  threefry init but are a pure function of `rng`.
  """
  jitted = jax.jit(init_fn)

  def init(rng, sample_x):
    data = jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else jnp.asarray(rng)
    rbg = jax.random.wrap_key_data(jnp.tile(data.astype(jnp.uint32).reshape(-1)[:2], 2), impl='rbg')
    return jitted(rbg, sample_x)
  return init


def from_flax(module: nn.Module, name: str, num_classes: int, input_shape: tuple,
              batch_stats: bool = False, rbg_init: bool = False) -> Model:
  """Wraps a Flax module whose __call__(x, train: bool) returns logits.

  batch_stats=True: a BatchNorm module whose __call__(x, train, *, use_running_average, mask) keeps running
  statistics in the 'batch_stats' collection (see the module docstring).
  rbg_init=True: `fast_init` (large networks on CPU).
  """
  if batch_stats:
    model = _from_flax_bn(module, name, num_classes, input_shape)
    return dataclasses.replace(model, init=fast_init(model.init)) if rbg_init else model

  def init(rng, sample_x):
    variables = module.init({'params': rng, 'dropout': rng}, sample_x, train=False)
    return variables['params']

  def apply(params, x, *, train=False, rng=None, with_activations=False):
    rngs = {'dropout': rng} if rng is not None else None
    if with_activations:
      logits, state = module.apply({'params': params}, x, train=train, rngs=rngs,
                                   mutable=['intermediates'])
      return logits, _collect_acts(state.get('intermediates', {}))
    return module.apply({'params': params}, x, train=train, rngs=rngs)

  return Model(name=name, init=fast_init(init) if rbg_init else init, apply=apply, num_classes=num_classes,
               input_shape=tuple(input_shape))


def _from_flax_bn(module: nn.Module, name: str, num_classes: int, input_shape: tuple) -> Model:
  # The same network with BatchNorm momentum 0: its "updated running statistics" are the batch's own moments
  # (core/batch_stats.adapt_statistics). Modules expose their momentum as the field `bn_momentum`.
  moments_module = module.clone(bn_momentum=0.0) if hasattr(module, 'bn_momentum') else None

  def init(rng, sample_x):
    variables = module.init({'params': rng, 'dropout': rng}, sample_x, train=False)
    return {'params': variables['params'], 'batch_stats': variables['batch_stats']}

  def apply(params, x, *, train=False, rng=None, with_activations=False, mask=None, batch_norm=None,
            with_batch_stats=False, batch_moments=False):
    if batch_norm not in (None, 'batch', 'running'):
      raise ValueError(f"batch_norm={batch_norm!r}; allowed: None, 'batch', 'running'")
    use_batch = train if batch_norm is None else batch_norm == 'batch'
    mutable = (['batch_stats'] if use_batch else []) + (['intermediates'] if with_activations else [])
    rngs = {'dropout': rng} if rng is not None else None
    bn_mask = None if mask is None else jnp.reshape(mask, (-1,) + (1,) * (x.ndim - 1)) > 0
    net = module
    if batch_moments:    # (out, this batch's per-layer {'mean', 'var'}) instead of updated running stats
      if moments_module is None or not use_batch:
        raise ValueError('batch_moments=True needs batch_norm="batch" (or train) and a module with bn_momentum')
      net, with_batch_stats = moments_module, True
    out = net.apply(params, x, train=train, use_running_average=not use_batch, mask=bn_mask, rngs=rngs,
                    mutable=mutable or False)
    logits, state = out if mutable else (out, {})
    res = (logits, _collect_acts(state.get('intermediates', {}))) if with_activations else logits
    if with_batch_stats:
      return res, state.get('batch_stats', params['batch_stats'])
    return res

  return Model(name=name, init=init, apply=apply, num_classes=num_classes, input_shape=tuple(input_shape),
               batch_stats=True, bn_momentum=float(getattr(module, 'bn_momentum', 0.9)))


COMPUTE_DTYPES = ('float32', 'bfloat16')


def _floating(a) -> bool:
  return hasattr(a, 'dtype') and jnp.issubdtype(a.dtype, jnp.floating)


def _cast(tree, dtype):
  return jax.tree_util.tree_map(lambda a: a.astype(dtype) if _floating(a) else a, tree)


def _at_least_float32(tree):
  return jax.tree_util.tree_map(
      lambda a: a.astype(jnp.float32) if _floating(a) and jnp.finfo(a.dtype).bits < 32 else a, tree)


def _mixed(fn: Callable, dtype, *, cast_inputs: bool, batch_stats: bool) -> Callable:
  """fn(params, x, ...) computed in `dtype`: trainable params and a floating x cast, floating outputs float32."""

  def mixed(params, x, *args, **kwargs):
    if batch_stats and isinstance(params, dict) and 'batch_stats' in params:
      low = {**params, 'params': _cast(params['params'], dtype)}     # running statistics stay float32
    else:
      low = _cast(params, dtype)
    return _at_least_float32(fn(low, _cast(x, dtype) if cast_inputs else x, *args, **kwargs))

  mixed.float32_fn = fn
  return mixed


def with_compute_dtype(model: Model, compute_dtype: str, *, cast_inputs: bool = True) -> Model:
  """The model computing in `compute_dtype` with float32 parameters (module docstring); 'float32': unchanged.

  cast_inputs=False: the input is not cast (token ids held in a float array: bfloat16 holds integers exactly
  only up to 256); the model's first layer (an embedding) then produces the compute dtype.
  """
  if compute_dtype not in COMPUTE_DTYPES:
    raise ValueError(f'compute_dtype={compute_dtype!r}; allowed: {list(COMPUTE_DTYPES)}')
  model = float32_model(model)
  if compute_dtype == 'float32':
    return model
  dtype = jnp.dtype(compute_dtype)
  fns = {f: _mixed(getattr(model, f), dtype, cast_inputs=cast_inputs, batch_stats=model.batch_stats)
         for f in model.APPLY_FIELDS if getattr(model, f) is not None}
  return dataclasses.replace(model, compute_dtype=compute_dtype, **fns)


def float32_model(model: Model) -> Model:
  """The float32 model of a mixed-precision one (the same model, or any object with an `apply`, when it is
  float32 already)."""
  if getattr(model, 'compute_dtype', 'float32') == 'float32':
    return model
  fns = {}
  for f in model.APPLY_FIELDS:
    fn = getattr(model, f)
    if fn is not None:
      if not hasattr(fn, 'float32_fn'):
        raise ValueError(f'model {model.name!r}: its {f} was replaced after mixed precision was applied; take '
                         'float32_model(model) before wrapping it')
      fns[f] = fn.float32_fn
  return dataclasses.replace(model, compute_dtype='float32', **fns)


def num_params(params: Params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))


def num_param_arrays(model: Model) -> int:
  """L: the model's parameter arrays (its init traced, nothing allocated)."""
  sample_x = jnp.zeros((1,) + tuple(model.input_shape), jnp.float32)
  return len(jax.tree_util.tree_leaves(jax.eval_shape(model.init, jax.random.PRNGKey(0), sample_x)))


def num_trainable_params(params: Params) -> int:
  """Parameters without BatchNorm running statistics (what PyTorch's `model.parameters()` counts)."""
  if isinstance(params, dict) and 'batch_stats' in params and 'params' in params:
    return num_params(params['params'])
  return num_params(params)
