"""SAM (Foret et al. 2021) as an optax gradient transformation that replaces the gradient.

One call to `update` is one SAM step. The caller passes g = grad L_B(w) as `updates` and
`grad_fn` (p -> grad L_B(p) on the SAME minibatch B) as an extra argument. The transform computes

    e  = rho * g / (||g||_2 + eps)        # ONE global L2 norm over all leaves
    g2 = grad_fn(w + e)

and returns g2 as the new updates. It goes FIRST in an `optax.chain`:

    tx = optax.chain(sam(0.05), optax.add_decayed_weights(4e-4), optax.sgd(0.01, momentum=0.9))
    g = grad_fn(params)
    updates, state = tx.update(g, state, params, grad_fn=grad_fn)
    params = optax.apply_updates(params, updates)

Why this design:

* Gradient-replacing transform, first in the chain. Everything after SAM (weight decay, momentum,
  learning rate, clipping, the FedGloSS/FedDyn correction terms) sees the SAM gradient and the
  UNPERTURBED params w. That is the FedSAM reference code (`minimizers.SAM`): it moves to w + e,
  computes the second gradient, moves back to w, then runs the torch SGD step, whose weight decay
  uses w. Any optax client optimizer can sit behind SAM unchanged.
* `grad_fn` as an extra arg (`GradientTransformationExtraArgs`), like `optax.contrib.sam` with
  `opaque_mode=True`. The optimizer never sees the model, the batch or the loss, so the engine can
  build it inside `jit` (for example from a per-round traced `rho`) and close `grad_fn` over
  the current minibatch. Transforms in the chain that don't take extra args ignore `grad_fn`
  (optax wraps them with `with_extra_args_support`), and `sam` itself ignores any other extra args.
* Why not use `optax.contrib.sam` itself:
  - Its default transparent mode alternates calls: an odd call returns the ascent step and an
    even call returns the descent step. So one client "step" would be two optimizer calls and two
    `apply_updates`. The params would also sit at w + e between calls, which breaks per-step
    accounting, proximal terms and the FedAvg average.
  - Its opaque mode does the right thing, but it wraps the outer optimizer instead of composing in
    a chain, and its `grad_fn` has the signature (params, i).
  - `optax.contrib.normalize` divides by ||g|| with no epsilon, so a zero gradient (a saturated
    minibatch, a frozen leaf, or rho warm-up from a converged model) gives 0/0 = NaN. Here
    ||g|| + eps is used, so a zero gradient gives e = 0 and the plain gradient. rho = 0 gives
    e = 0 exactly, so `grad_fn(params)` is returned bit-for-bit.

`rho` may be a Python float, a (possibly traced) jnp scalar, or a schedule `count -> rho`. The
schedule is evaluated at the number of `update` calls made so far, which the state always holds
(so the state pytree has the same structure whatever kind of `rho` is used).

ASAM (`asam.py`) shares this implementation through `_sharpness_aware`, with a per-leaf
preconditioner T_w.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import optax

# Forward+backward passes of one SAM step (g at w, then g at w + e): the virtual clock's step cost (systems/).
PASSES = 2

Params = Any
ScalarOrSchedule = Union[float, jax.Array, Callable[[jax.Array], jax.Array]]
GradFn = Callable[[Params], Params]
# (params) -> pytree of per-leaf scale T (jax arrays or Python floats), same structure as params.
ScaleFn = Callable[[Params], Params]


class SAMState(NamedTuple):
  """State of `sam` / `asam`: the number of `update` calls so far (used by rho schedules)."""
  count: jax.Array


def _rho_at(rho: ScalarOrSchedule, count: jax.Array) -> jax.Array:
  if callable(rho):
    return jnp.asarray(rho(count))
  return jnp.asarray(rho)


def _sharpness_aware(rho: ScalarOrSchedule, eps: float, scale_fn: Optional[ScaleFn],
                     name: str) -> optax.GradientTransformationExtraArgs:
  """Shared SAM/ASAM core.

  With T = scale_fn(params) (T = 1 everywhere if scale_fn is None):
    g' = T * g;  e = rho * T * g' / (||g'||_2 + eps);  returns grad_fn(params + e).
  """

  def init_fn(params):
    del params
    return SAMState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, *, grad_fn: Optional[GradFn] = None, **extra_args):
    del extra_args  # other transforms' extra args (e.g. a batch) are not ours
    if grad_fn is None:
      raise ValueError(
          f'{name} needs `grad_fn`: call `update(grads, state, params, grad_fn=grad_fn)` where '
          '`grad_fn(p)` returns the loss gradient at `p` on the same minibatch that produced '
          '`grads`. It is used to compute the gradient at the perturbed point w + e.')
    if params is None:
      raise ValueError(f'{name} needs `params` (the point w at which `updates` was computed).')

    rho_t = _rho_at(rho, state.count)
    if scale_fn is None:
      scaled_g = updates
    else:
      scale = scale_fn(params)
      scaled_g = jax.tree.map(lambda t, g: t * g, scale, updates)
    # ONE global L2 norm over all leaves, plus eps: a zero gradient gives e = 0, not NaN. Computed in at least
    # float32 whatever the gradient's dtype (mixed precision: the ascent radius must not carry bfloat16 rounding;
    # the gradients of float32 params are float32 already, so this is a no-op there).
    denom = optax.tree.norm(jax.tree.map(lambda g: g.astype(jnp.promote_types(g.dtype, jnp.float32)), scaled_g)) + eps
    factor = rho_t / denom
    if scale_fn is None:
      perturbation = jax.tree.map(lambda g: factor * g, scaled_g)
    else:
      perturbation = jax.tree.map(lambda t, g: factor * (t * g), scale, scaled_g)
    perturbed = jax.tree.map(lambda p, e: p + e.astype(p.dtype), params, perturbation)
    new_updates = grad_fn(perturbed)
    return new_updates, SAMState(count=optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def sam(rho: ScalarOrSchedule, *, eps: float = 1e-12) -> optax.GradientTransformationExtraArgs:
  """Sharpness-Aware Minimization as a gradient-replacing transform (put it first in a chain).

  Args:
    rho: neighbourhood radius. A Python float, a jnp scalar (it may be traced, e.g. when the
      optimizer is built inside `jit`), or a schedule `count -> rho` of the number of updates.
    eps: added to the global gradient norm, so a zero gradient gives no NaN.

  Returns:
    A `GradientTransformationExtraArgs`. Its `update(updates, state, params, *, grad_fn, **_)`
    takes g = grad L_B(params) and returns grad_fn(params + rho * g / (||g||_2 + eps)).
  """
  return _sharpness_aware(rho, eps, None, 'sam')
