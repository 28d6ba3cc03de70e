r"""Gradient inversion of one client's upload (Geiping et al. 2020, "Inverting Gradients"), and the image metrics
PSNR and SSIM that score a reconstruction against the true batch.

The attacker knows the model parameters w the client started from, the client's upload and the labels (or infers
them from the last layer's bias gradient, `infer_labels`: iDLG, Zhao et al. 2020). An upload is one gradient
g = grad_w L(w; x, y), the delta of ONE local SGD step, delta = -lr (g + wd w), turned back into g by
`gradient_from_delta` (exact for that step), or the delta of SEVERAL steps of the client's own optimizer
(`local_update`: SAM's or ASAM's ascent, momentum and weight decay included; Geiping et al.'s "weight update"
setting, their Section 5, where the attacker knows the optimizer, the step count and the batch split).
Dummy images x' are optimised with Adam on

  R(x') = sum_layers [1 - cos(U(w; x', y)_l, u_l)] + tv_weight * TV(x'),

U the upload as a function of the images (`batch_gradient`, or `local_update` unrolled over its steps) and u the
upload observed, clipped to the image range after every step. grad_x R differentiates through grad_w L:
second-order autodiff (jax.grad of a function that calls jax.grad; through SAM's ascent point too). A
differentially private upload is observed as `dp_observed` makes it: clipped (the cosine does not see a
rescaling) plus the Gaussian noise the DP adversary sees. TV is the mean absolute difference of neighbouring pixels.
Geiping et al. use one cosine over all parameters; the per-layer sum (`per_layer=True`, the default) keeps a
small layer's direction from being drowned by the largest one. The step size drops 10x at 3/8, 5/8 and 7/8 of
the steps, as in their release.

PSNR = 10 log10(R^2 / MSE) per image, R the data range. SSIM (Wang et al. 2004) with a Gaussian window
(sigma 1.5, 11 wide, shrunk to the largest odd width that fits a small image), K1 = 0.01, K2 = 0.03,
'valid' filtering, statistics E[x^2] - mu^2 as in the paper, the map's mean over positions and channels.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_flat.privacy import mechanism as mech
from fedjax_flat.tasks import base as tasks_lib


def psnr(x, y, data_range: float = 1.0) -> jax.Array:
  """Peak signal-to-noise ratio in dB of each image of x [N, ...] against y [N, ...]: 10 log10(R^2 / MSE)."""
  x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
  mse = jnp.mean((x - y).reshape(x.shape[0], -1) ** 2, axis=1)
  # an exact reconstruction is capped at 100 dB instead of inf, so means over images stay finite
  return 10.0 * jnp.log10(data_range ** 2 / jnp.maximum(mse, 1e-10 * data_range ** 2))


def gaussian_window(size: int, sigma: float = 1.5) -> np.ndarray:
  """The normalised 1D Gaussian of `size` taps (odd) the SSIM window is the outer product of."""
  r = np.arange(size, dtype=np.float64) - (size - 1) / 2
  w = np.exp(-r ** 2 / (2 * sigma ** 2))
  return (w / w.sum()).astype(np.float32)


def ssim_window_size(height: int, width: int, win_size: int = 11) -> int:
  """The window width used on an H x W image: `win_size`, or the largest odd width that fits."""
  size = min(int(win_size), int(height), int(width))
  return size if size % 2 else size - 1


def _filter_valid(x, w):
  """'valid' separable filtering of [N, H, W, C] by the 1D window w along H then W."""
  k = w.shape[0]
  h, wd = x.shape[1] - k + 1, x.shape[2] - k + 1
  x = sum(w[j] * x[:, j:j + h] for j in range(k))
  return sum(w[j] * x[:, :, j:j + wd] for j in range(k))


def ssim(x, y, data_range: float = 1.0, *, win_size: int = 11, sigma: float = 1.5, k1: float = 0.01,
         k2: float = 0.03) -> jax.Array:
  """Structural similarity of each image of x [N, H, W, C] (or [N, H, W]) against y, in [-1, 1] (module
  docstring for the definition)."""
  x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
  if x.ndim == 3:
    x, y = x[..., None], y[..., None]
  size = ssim_window_size(x.shape[1], x.shape[2], win_size)
  w = jnp.asarray(gaussian_window(size, sigma))
  c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
  mx, my = _filter_valid(x, w), _filter_valid(y, w)
  sxx = _filter_valid(x * x, w) - mx * mx
  syy = _filter_valid(y * y, w) - my * my
  sxy = _filter_valid(x * y, w) - mx * my
  s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
  return jnp.mean(s.reshape(s.shape[0], -1), axis=1)


def total_variation(x) -> jax.Array:
  """Anisotropic total variation of [N, H, W, C] images: the mean |difference| of vertical and horizontal
  neighbours (Geiping et al.'s TV term)."""
  return (jnp.mean(jnp.abs(x[:, 1:] - x[:, :-1])) + jnp.mean(jnp.abs(x[:, :, 1:] - x[:, :, :-1])))


def _mean_loss(apply: Callable, task, params, x, y):
  logits = apply(params, x, train=False)
  total, count = task.loss_sums(logits, y, jnp.ones(y.shape[:1], jnp.float32))
  return total / jnp.maximum(count, 1.0)


def batch_gradient(apply: Callable, params, x, y, task=None):
  """grad_w of the task's mean loss over the batch (x, y) at params: what one client's SGD step uses."""
  task = tasks_lib.get_task(task)
  return jax.grad(lambda p: _mean_loss(apply, task, p, x, y))(params)


def local_update(apply: Callable, params, x, y, tx, task=None, *, steps: int = 1, batch_size: int = 0):
  """The delta w_S - w_0 a client uploads after `steps` steps of its optimizer `tx` on the batch (x, y).

  tx: the client's optax optimizer with fixed hyperparameters, called as update(g, state, params, grad_fn=) the way
  optimizers/client.py builds it (`make_client_tx(config.client, {'lr', 'rho'})`: SAM / ASAM read `grad_fn`, the
  gradient on the step's own minibatch). Step s trains on the (s mod n/b)-th slice of `batch_size` examples in
  order (0: the whole batch every step), so S steps over n images with batch b are S b / n local epochs.
  Differentiable in x: the attacker's model of the upload.
  """
  task = tasks_lib.get_task(task)
  n = x.shape[0]
  b = int(batch_size) or n
  if n % b:
    raise ValueError(f'batch_size={b} must divide the {n} images')
  xs = jnp.reshape(jnp.asarray(x), (n // b, b) + tuple(x.shape[1:]))
  ys = jnp.reshape(jnp.asarray(y), (n // b, b) + tuple(y.shape[1:]))

  def step(carry, i):
    p, state = carry
    xb, yb = xs[i % (n // b)], ys[i % (n // b)]
    grad_fn = jax.grad(lambda q: _mean_loss(apply, task, q, xb, yb))
    updates, state = tx.update(grad_fn(p), state, p, grad_fn=grad_fn)
    return (optax.apply_updates(p, updates), state), None

  (p, _), _ = jax.lax.scan(step, (params, tx.init(params)), jnp.arange(int(steps)))
  return jax.tree_util.tree_map(jnp.subtract, p, params)


@dataclasses.dataclass(frozen=True)
class ClientUpload:
  """What a client uploads as a function of its images: `upload(params, x, y)`. tx None: the batch gradient;
  else `local_update` with tx, steps and batch_size. Hashable (frozen): the inversion program is compiled once per
  model and optimizer, whatever the parameters."""
  apply: Callable
  task: Any = None
  tx: Any = None
  steps: int = 1
  batch_size: int = 0

  def __call__(self, params, x, y):
    if self.tx is None:
      return batch_gradient(self.apply, params, x, y, self.task)
    return local_update(self.apply, params, x, y, self.tx, self.task, steps=self.steps, batch_size=self.batch_size)


def dp_observed(upload, key: jax.Array, clip: float, noise_std: float, *, per_layer: bool = False,
                per_tensor: bool = False):
  """A DP client's upload as an observer sees it: clipped to `clip` (privacy/mechanism.clip, the run's rule) plus
  N(0, noise_std^2) per coordinate (`noise_std` 0: the clipped upload alone, what a server without secure
  aggregation receives in central mode)."""
  clipped, _ = mech.clip(upload, clip, per_layer, per_tensor)
  if not noise_std:
    return clipped
  return jax.tree_util.tree_map(jnp.add, clipped, mech.gaussian(key, clipped, noise_std))


def gradient_from_delta(delta, lr: float, params=None, weight_decay: float = 0.0):
  """The gradient g of a one-step SGD upload delta = -lr (g + weight_decay w): g = -delta / lr - wd w."""
  g = jax.tree_util.tree_map(lambda d: -jnp.asarray(d, jnp.float32) / lr, delta)
  if weight_decay:
    g = jax.tree_util.tree_map(lambda a, w: a - weight_decay * w, g, params)
  return g


def infer_labels(bias_grad, n: int) -> np.ndarray:
  """iDLG's labels from the last layer's bias gradient [K]: with cross-entropy it is mean_i (p_i - onehot(y_i)),
  negative only at the batch's labels (exactly so for one example); the n most negative classes, sorted."""
  return np.sort(np.argsort(np.asarray(bias_grad))[:n]).astype(np.int32)


def cosine_distance(grads, target, per_layer: bool = True) -> jax.Array:
  """sum_l [1 - cos(grads_l, target_l)] over the parameter leaves (per_layer) or 1 - cos over all of them."""
  a, b = jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(target)
  dots = jnp.stack([jnp.vdot(u, v) for u, v in zip(a, b)])
  na = jnp.stack([jnp.vdot(u, u) for u in a])
  nb = jnp.stack([jnp.vdot(v, v) for v in b])
  tiny = 1e-12
  if per_layer:
    # a layer whose true gradient is zero carries no signal: it is left out rather than counted as 1
    live = nb > tiny
    cos = dots / jnp.sqrt(jnp.maximum(na, tiny) * jnp.maximum(nb, tiny))
    return jnp.sum(jnp.where(live, 1.0 - cos, 0.0))
  return 1.0 - jnp.sum(dots) / jnp.sqrt(jnp.maximum(jnp.sum(na), tiny) * jnp.maximum(jnp.sum(nb), tiny))


@functools.partial(jax.jit, static_argnames=('upload', 'steps', 'per_layer', 'image_range'))
def _invert(upload, params, target, labels, x0, lr, tv_weight, *, steps, per_layer, image_range):
  lo, hi = image_range

  def objective(x):
    u = upload(params, x, labels)     # a function of x: grad_x goes through grad_w (and the local steps)
    cos = cosine_distance(u, target, per_layer)
    return cos + tv_weight * total_variation(x), cos

  schedule = optax.piecewise_constant_schedule(
      lr, {int(steps * 3 / 8): 0.1, int(steps * 5 / 8): 0.1, int(steps * 7 / 8): 0.1})
  opt = optax.adam(schedule)

  def step(carry, _):
    x, state, skipped = carry
    (_, cos), grad = jax.value_and_grad(objective, has_aux=True)(x)
    # Unrolled through several local steps, the second-order terms of an out-of-distribution dummy can overflow
    # (inf - inf): such entries do not move this step rather than turn the images into NaN.
    finite = jnp.isfinite(grad)
    # Geiping et al. step on the gradient's sign: the cosine's gradient is tiny and badly scaled
    updates, state = opt.update(jnp.where(finite, jnp.sign(grad), 0.0), state, x)
    x = jnp.clip(optax.apply_updates(x, updates), lo, hi)
    return (x, state, skipped + jnp.any(~finite).astype(jnp.int32)), cos

  (x, _, skipped), history = jax.lax.scan(step, (x0, opt.init(x0), jnp.int32(0)), None, length=steps)
  final = objective(x)[1]
  return x, jnp.append(history, final), skipped


def invert_upload(upload: Callable, params, target, labels, x_shape: Tuple[int, ...], key: jax.Array, *,
                  steps: int = 2000, lr: float = 0.1, tv_weight: float = 1e-2, per_layer: bool = True,
                  image_range: Tuple[float, float] = (0.0, 1.0)) -> Dict[str, Any]:
  """Reconstructs the batch whose upload at `params` is `target` (module docstring).

  upload(params, x, labels) -> the upload pytree, hashable (a `ClientUpload`); labels [N] (known or
  `infer_labels`); x_shape (N, H, W, C); the dummies start uniform in `image_range` from `key`. Returns {'x':
  [N, H, W, C] reconstruction, 'cosine': [steps + 1] the cosine term before each step and at the end,
  'nonfinite_steps': the steps whose image gradient overflowed somewhere (those entries did not move)}.
  """
  lo, hi = float(image_range[0]), float(image_range[1])
  x0 = jax.random.uniform(key, tuple(x_shape), jnp.float32, lo, hi)
  target = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), target)
  x, history, skipped = _invert(upload, params, target, jnp.asarray(labels), x0, jnp.float32(lr),
                                jnp.float32(tv_weight), steps=int(steps), per_layer=bool(per_layer),
                                image_range=(lo, hi))
  return {'x': x, 'cosine': history, 'nonfinite_steps': int(skipped)}


def invert_gradients(apply: Callable, params, target_grads, labels, x_shape: Tuple[int, ...], key: jax.Array, *,
                     steps: int = 2000, lr: float = 0.1, tv_weight: float = 1e-2, per_layer: bool = True,
                     image_range: Tuple[float, float] = (0.0, 1.0), task=None) -> Dict[str, Any]:
  """`invert_upload` of a gradient upload: apply(params, x, train=False) -> logits; target_grads the observed
  gradient (or `gradient_from_delta` of a one-step delta)."""
  return invert_upload(ClientUpload(apply, tasks_lib.get_task(task)), params, target_grads, labels, x_shape, key,
                       steps=steps, lr=lr, tv_weight=tv_weight, per_layer=per_layer, image_range=image_range)


def match_order(recon, truth) -> np.ndarray:
  """The permutation of the reconstructed images that best matches the true ones by MSE (greedy): a batch's
  gradient does not say which image is which."""
  recon, truth = np.asarray(recon), np.asarray(truth)
  n = len(truth)
  cost = ((recon.reshape(n, 1, -1) - truth.reshape(1, n, -1)) ** 2).mean(-1)   # [recon, truth]
  order = np.full(n, -1)
  free = set(range(n))
  for t in np.argsort(cost.min(0)):
    r = min(free, key=lambda i: cost[i, t])
    order[t] = r
    free.remove(r)
  return order


def score_reconstruction(recon, truth, image_range: Tuple[float, float] = (0.0, 1.0),
                         key: Optional[jax.Array] = None) -> Dict[str, Any]:
  """PSNR / SSIM per image of the reconstruction (matched to the truth's order), and of a uniform random image
  in the range as the floor a reconstruction must beat."""
  lo, hi = float(image_range[0]), float(image_range[1])
  data_range = hi - lo
  truth = jnp.asarray(truth, jnp.float32)
  recon = jnp.asarray(recon, jnp.float32)[match_order(recon, truth)]
  rand = jax.random.uniform(jax.random.key(0) if key is None else key, truth.shape, jnp.float32, lo, hi)
  out = {'psnr': psnr(recon, truth, data_range), 'ssim': ssim(recon, truth, data_range),
         'psnr_random': psnr(rand, truth, data_range), 'ssim_random': ssim(rand, truth, data_range),
         'x': recon}
  return {k: np.asarray(v) for k, v in out.items()}
