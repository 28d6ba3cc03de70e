"""Layers shared by the models: a convolution with a backend-aware lowering, a Dense whose kernel gradient can skip
a transpose, PyTorch-style init.

'im2col' lowers depthwise convolutions (feature_group_count == input channels, any channel multiplier) to a
sum of shifted, channel-scaled copies; other grouped convolutions always use 'lax'.

Why two convolution lowerings: XLA:CPU runs a convolution's weight gradient 10-20x slower when it sits
inside a while loop (lax.scan / lax.map), jax issue #12868; see `../shared/reference/ecosystem_measurements.md`
section 4. 'im2col' builds the patches from shifted slices and does one matmul; it has the same parameters
and outputs as `nn.Conv` (up to float rounding) and runs at full speed inside loops. 'lax' is the native
convolution, best on GPU/TPU. 'auto' picks 'im2col' on CPU and 'lax' elsewhere.

Max pooling (`max_pool`): on XLA:CPU the gradient of `reduce_window` max-pool (select_and_scatter) is slow,
and so is JAX's gradient of a reshape + max (it splits ties, through a mask, a count and a division).
'reshape' pools non-overlapping windows as reshape + max, with a custom gradient that routes each output's
gradient to the FIRST maximal element of its window in row-major order: bit-for-bit the gradient of
`reduce_window` (and of torch's max_pool2d), ties included. Measured on the paper CNN's SGD step inside a
scan (benchmarks/speed/cnn_step.py, README.cnn_step.md): 1.26x the step with reduce_window pooling.

Dense's weight gradient (`grad_impl`): autodiff's transpose of `x @ k` computes dot(g, x) as [out, in] and
transposes it. Without a batch axis XLA folds that transpose into the dot; under the engine's batch-1 vmap (the
one-client-at-a-time CPU path, core/engine.py) it cannot, and the SGD update then reads the [out, in] gradient
with a stride of `in` floats. For the pfl CNN's fc128 (12544 x 128, B=10) that was ~10% of a round
(benchmarks/speed/README.pfl_round.md). 'direct' (a custom VJP) computes the same products straight into
[in, out]: on the machine measured the kernel gradient kept its bits, and so did a plain SGD-family step; a step
that reduces over the gradient (SAM's norm, per-tensor DP clipping) sums it in another memory order, which
changes fp32 rounding (tests/models/test_layers.py: equal to fp32 rounding; bit_identity.py). So 'auto' is 'xla'
(the bits of every earlier run) unless the process's CPU kernel path asks for 'direct' (`--cpu_path=dense_direct`,
cpu_paths.py). A custom VJP has no forward mode: `jax.jvp` / `jax.jacfwd` / `jax.linearize` of a model's output
raise under 'direct'; run them inside `autodiff_dense()`. The forward-over-reverse HVPs (analysis/hvp.py) and
`jax.hessian` work under both.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import flax.linen as nn

from fedjax_flat import cpu_paths


# im2col builds patches in two stages (columns, then rows) below this many input channels (measured:
# 3 channels faster, 64 slower; benchmarks/speed/README.cnn_step.md).
_TWO_STAGE_MAX_CIN = 16


def resolve_conv_impl(conv_impl: str) -> str:
  if conv_impl == 'auto':
    return 'im2col' if jax.default_backend() == 'cpu' else 'lax'
  if conv_impl not in ('lax', 'im2col'):
    raise ValueError(f"conv_impl={conv_impl!r}; allowed: 'auto', 'lax', 'im2col'")
  return conv_impl


GRAD_IMPLS = ('auto', 'xla', 'direct')
_AUTODIFF_DENSE = contextvars.ContextVar('fedjax_flat_autodiff_dense', default=False)


@contextlib.contextmanager
def autodiff_dense():
  """Traces Dense layers with autodiff's own VJP (forward-mode differentiable) instead of 'direct', e.g. around
  `jax.jvp(model.apply, ...)` under `--cpu_path=dense_direct`. Trace time only: the forward pass is the same."""
  token = _AUTODIFF_DENSE.set(True)
  try:
    yield
  finally:
    _AUTODIFF_DENSE.reset(token)


def resolve_grad_impl(grad_impl: str) -> str:
  """'auto': 'direct' when the CPU kernel path asks for it (on a CPU backend, outside `autodiff_dense()`), else
  'xla'. An explicit 'direct' also yields to `autodiff_dense()`."""
  if grad_impl not in GRAD_IMPLS:
    raise ValueError(f"grad_impl={grad_impl!r}; allowed: {', '.join(map(repr, GRAD_IMPLS))}")
  if _AUTODIFF_DENSE.get():
    return 'xla'
  if grad_impl == 'auto':
    wanted = cpu_paths.program_option('dense_grad', 'xla')
    return 'direct' if wanted == 'direct' and jax.default_backend() == 'cpu' else 'xla'
  return grad_impl


@jax.custom_vjp
def dense_matmul(x, kernel):
  """x [..., in] @ kernel [in, out], whose VJP writes the kernel's cotangent as [in, out] directly."""
  return x @ kernel


def _dense_matmul_fwd(x, kernel):
  return x @ kernel, (x, kernel)


def _dense_matmul_bwd(res, g):
  x, kernel = res
  lead = tuple(range(x.ndim - 1))
  dx = jax.lax.dot_general(g, kernel, (((g.ndim - 1,), (1,)), ((), ())))       # g @ kernel.T, as autodiff's
  dk = jax.lax.dot_general(x, g, ((lead, lead), ((), ())))                     # x.T @ g: [in, out], no transpose
  return dx, dk


dense_matmul.defvjp(_dense_matmul_fwd, _dense_matmul_bwd)


def resolve_pool_impl(pool_impl: str, conv_impl: str = 'auto') -> str:
  """'auto' follows the convolution: 'reshape' where the conv lowers to im2col (CPU), else 'lax'."""
  if pool_impl == 'auto':
    return 'reshape' if resolve_conv_impl(conv_impl) == 'im2col' else 'lax'
  if pool_impl not in ('lax', 'reshape'):
    raise ValueError(f"pool_impl={pool_impl!r}; allowed: 'auto', 'lax', 'reshape'")
  return pool_impl


def _pool_windows(x, kh, kw):
  """x [..., H, W, C] -> [..., H//kh, kh, W//kw, kw, C] (VALID: a remainder row/column is dropped)."""
  h, w = x.shape[-3] // kh * kh, x.shape[-2] // kw * kw
  x = x[..., :h, :w, :]
  return x.reshape(x.shape[:-3] + (h // kh, kh, w // kw, kw, x.shape[-1]))


def _window_max_fwd(x, kh, kw):
  return jnp.max(_pool_windows(x, kh, kw), axis=(-4, -2))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _window_max(x, kh, kw):
  return _window_max_fwd(x, kh, kw)


@_window_max.defjvp
def _window_max_jvp(kh, kw, primals, tangents):
  # A custom JVP (not VJP) so that forward mode and second order (HVPs, Hessians) keep working; JAX
  # transposes this linear map for reverse mode into a broadcast + select, with no reduction.
  (x,), (tx,) = primals, tangents
  xw = _pool_windows(x, kh, kw)
  y = jnp.max(xw, axis=(-4, -2))
  # Index (row-major in the window) of the FIRST element equal to the max, one int8 per output, from
  # strided views: the tangent (and so the gradient) of each output goes to that element only.
  sel = _first_max_select(xw, y, kh, kw)
  ty = jnp.sum(jnp.where(sel, _pool_windows(tx, kh, kw), jnp.zeros((), tx.dtype)), axis=(-4, -2))
  return y, ty


def _first_max_select(xw, y, kh, kw):
  """[..., H, kh, W, kw, C] bool: True at the FIRST element (row-major in its window) equal to the window max y."""
  first = jnp.full(y.shape, kh * kw - 1, jnp.int8)
  for pos in reversed(range(kh * kw - 1)):
    first = jnp.where(xw[..., pos // kw, :, pos % kw, :] == y, jnp.int8(pos), first)
  shape = (1,) * (xw.ndim - 5) + (1, kh, 1, kw, 1)
  pos = (kw * jax.lax.broadcasted_iota(jnp.int8, shape, xw.ndim - 4)
         + jax.lax.broadcasted_iota(jnp.int8, shape, xw.ndim - 2))
  return pos == first[..., :, None, :, None, :]


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _relu_window_max(x, kh, kw):
  return jax.nn.relu(_window_max_fwd(x, kh, kw))


@_relu_window_max.defjvp
def _relu_window_max_jvp(kh, kw, primals, tangents):
  # max_pool(relu(x)) == relu(max_pool(x)) (relu is monotone), and its gradient is the window's first
  # maximum's when that maximum is > 0, else 0 (relu'(0) = 0, as jax.nn.relu): the same values and
  # gradients, bit for bit, as relu followed by the first-max pool, without the full-size ReLU and its mask.
  (x,), (tx,) = primals, tangents
  xw = _pool_windows(x, kh, kw)
  m = jnp.max(xw, axis=(-4, -2))
  sel = _first_max_select(xw, m, kh, kw)
  ty = jnp.sum(jnp.where(sel, _pool_windows(tx, kh, kw), jnp.zeros((), tx.dtype)), axis=(-4, -2))
  return jax.nn.relu(m), jnp.where(m > 0, ty, jnp.zeros((), ty.dtype))


def relu_max_pool(x, window: Sequence[int], *, pool_impl: str = 'auto', conv_impl: str = 'auto'):
  """max_pool(relu(x), window) (non-overlapping windows, VALID); with pool_impl 'reshape' one fused op.

  The same values and gradients as `max_pool(nn.relu(x), window)`; the fused form skips the full-size
  ReLU and its backward mask, yet measured SLOWER on the CPU step (0.44x SGD, 0.50x SAM of the two ops,
  benchmarks/README.cnn_step.md): the CNNs keep two ops unless `fused_relu_pool=True`.
  """
  window = tuple(window)
  if resolve_pool_impl(pool_impl, conv_impl) == 'reshape' and len(window) == 2:
    return _relu_window_max(x, window[0], window[1])
  return max_pool(jax.nn.relu(x), window, pool_impl=pool_impl, conv_impl=conv_impl)


def max_pool(x, window: Sequence[int], strides: Sequence[int] | None = None, *, pool_impl: str = 'auto',
             conv_impl: str = 'auto'):
  """Max pooling, NHWC, VALID padding. Same values and gradients as `nn.max_pool` (reduce_window).

  'reshape' is used for non-overlapping windows (strides == window); any other case falls back to
  `nn.max_pool`. `pool_impl='auto'` follows `conv_impl` (see `resolve_pool_impl`).
  """
  strides = tuple(strides or window)
  window = tuple(window)
  if resolve_pool_impl(pool_impl, conv_impl) == 'reshape' and strides == window and len(window) == 2:
    return _window_max(x, window[0], window[1])
  return nn.max_pool(x, window, strides=strides)


def torch_kernel_init():
  """PyTorch's default Linear/Conv init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  return nn.initializers.variance_scaling(1.0 / 3.0, 'fan_in', 'uniform')


def torch_bias_init(fan_in: int):
  bound = 1.0 / math.sqrt(fan_in)

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def _pad_same(x, kh, kw, stride):
  h, w = x.shape[-3], x.shape[-2]
  def amount(size, k, s):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2
  return jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [amount(h, kh, stride), amount(w, kw, stride), (0, 0)])


class Conv(nn.Module):
  """2D convolution, NHWC, with parameters named like `nn.Conv` ('kernel' [kh,kw,cin,cout], 'bias')."""
  features: int
  kernel_size: Sequence[int]
  strides: int = 1
  padding: str = 'VALID'           # 'VALID' or 'SAME'
  use_bias: bool = True
  feature_group_count: int = 1
  conv_impl: str = 'auto'
  torch_init: bool = False
  kernel_init: Any = None          # overrides the two defaults (e.g. BiSeNetV2's kaiming-normal fan-out)
  dtype: Any = None                # Flax's convention: the computation dtype (None: the input's, as mixed
  #                                  precision casts it; a dtype: the input cast here, Flax's native policy)

  @nn.compact
  def __call__(self, x):
    if self.dtype is not None:
      x = x.astype(self.dtype)
    kh, kw = self.kernel_size
    cin = x.shape[-1]
    groups = self.feature_group_count
    fan_in = kh * kw * cin // groups
    kinit = torch_kernel_init() if self.torch_init else nn.initializers.lecun_normal()
    kinit = self.kernel_init or kinit
    kernel = self.param('kernel', kinit, (kh, kw, cin // groups, self.features))
    bias = None
    if self.use_bias:
      binit = torch_bias_init(fan_in) if self.torch_init else nn.initializers.zeros_init()
      bias = self.param('bias', binit, (self.features,))
    impl = resolve_conv_impl(self.conv_impl)
    depthwise = groups == cin and groups != 1
    if impl == 'lax' or (groups != 1 and not depthwise):
      y = jax.lax.conv_general_dilated(
          x, kernel.astype(x.dtype), (self.strides, self.strides), self.padding,
          dimension_numbers=('NHWC', 'HWIO', 'NHWC'), feature_group_count=groups)
    elif depthwise:
      # Depthwise (BiSeNetV2's GE layers): a sum of kh*kw shifted, channel-scaled copies of the input; channel
      # c feeds outputs c*M .. c*M+M-1 (M = features / cin, lax's grouping). Elementwise ops only, so the
      # weight gradient stays fast inside loops (the lax grouped convolution has the while-loop slowdown too).
      if self.padding == 'SAME':
        x = _pad_same(x, kh, kw, self.strides)
      s = self.strides
      oh = (x.shape[-3] - kh) // s + 1
      ow = (x.shape[-2] - kw) // s + 1
      mult = self.features // cin
      k = kernel.reshape(kh, kw, self.features).astype(x.dtype)
      y = None
      for i in range(kh):
        for j in range(kw):
          xs = x[..., i:i + (oh - 1) * s + 1:s, j:j + (ow - 1) * s + 1:s, :]
          if mult > 1:
            xs = jnp.repeat(xs, mult, axis=-1)
          y = xs * k[i, j] if y is None else y + xs * k[i, j]
    else:
      if self.padding == 'SAME':
        x = _pad_same(x, kh, kw, self.strides)
      s = self.strides
      oh = (x.shape[-3] - kh) // s + 1
      ow = (x.shape[-2] - kw) // s + 1
      if kh == 1 and kw == 1:
        patches = x[..., ::s, ::s, :][..., :oh, :ow, :]
      elif cin < _TWO_STAGE_MAX_CIN:
        # Few channels (an image input): XLA:CPU copies every slice before concatenating, in chunks of cin
        # floats. Concatenating the kw column shifts first and then the kh row shifts of that moves chunks
        # of kw*cin floats: the same patch matrix (same numbers), 1.5x faster for the CNN's 3-channel conv.
        rows = jnp.concatenate([x[..., j:j + (ow - 1) * s + 1:s, :] for j in range(kw)], axis=-1)
        patches = jnp.concatenate([rows[..., i:i + (oh - 1) * s + 1:s, :, :] for i in range(kh)], axis=-1)
      else:
        patches = jnp.concatenate(
            [x[..., i:i + (oh - 1) * s + 1:s, j:j + (ow - 1) * s + 1:s, :]
             for i in range(kh) for j in range(kw)], axis=-1)
      y = patches @ kernel.reshape(kh * kw * cin, self.features).astype(x.dtype)
    if bias is not None:
      y = y + bias.astype(y.dtype)
    return y


class Dense(nn.Module):
  """Linear layer with parameters named like `nn.Dense` ('kernel' [in, out], 'bias')."""
  features: int
  torch_init: bool = False
  kernel_init: Any = None          # overrides the two defaults (e.g. the pfl CNN's Glorot-uniform)
  dtype: Any = None                # the computation dtype, as Conv's
  grad_impl: str = 'auto'          # the kernel gradient's form (module docstring): 'auto' | 'xla' | 'direct'

  @nn.compact
  def __call__(self, x):
    if self.dtype is not None:
      x = x.astype(self.dtype)
    fan_in = x.shape[-1]
    kinit = torch_kernel_init() if self.torch_init else nn.initializers.lecun_normal()
    kinit = self.kernel_init or kinit
    binit = torch_bias_init(fan_in) if self.torch_init else nn.initializers.zeros_init()
    kernel = self.param('kernel', kinit, (fan_in, self.features))
    bias = self.param('bias', binit, (self.features,))
    k = kernel.astype(x.dtype)
    y = dense_matmul(x, k) if resolve_grad_impl(self.grad_impl) == 'direct' else x @ k
    return y + bias.astype(x.dtype)
