"""Adaptive SAM (ASAM, Kwon et al. 2021), in the FedSAM reference-code form (`minimizers.ASAM`).

With the element-wise operator T_w = |w| + eta on "weight" leaves and T_w = 1 elsewhere:

    g' = T * g
    e  = rho * T * g' / (||g'||_2 + eps)    # = rho T^2 g / ||T g||, ONE global norm over all leaves
    returns grad_fn(w + e)

The reference code applies T to PyTorch parameters whose name contains 'weight': conv and linear
weights and GroupNorm/BatchNorm scales. In Flax those leaves are named 'kernel' and 'scale'. So
by default T applies to leaves whose last path key is 'kernel' or 'scale', and biases (and
anything else) are not scaled. `adaptive_predicate(path, leaf) -> bool` overrides this choice.

ASAM's eta is an offset inside T_w, not a learning rate. With eta = 0, the perturbed loss
L(w + e) is invariant to rescalings of the weights that leave the function unchanged, for example
W1 -> a W1 and W2 -> W2 / a in f(x) = W2 W1 x.

The design (a gradient-replacing transform first in the chain, `grad_fn` as an extra arg, an
epsilon in the norm) is the same as `sam`; see `fedjax_flat.optimizers.sam`.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.optimizers.sam import ScalarOrSchedule, _sharpness_aware

Predicate = Callable[[Any, Any], bool]

ADAPTIVE_LEAF_NAMES = ('kernel', 'scale')
# Forward+backward passes of one ASAM step (as SAM's: the gradient at w, then at the adaptive ascent point).
PASSES = 2


def _key_name(key) -> Optional[str]:
  """The name of one pytree path entry (dict key or attribute name), or None for indices."""
  if isinstance(key, jax.tree_util.DictKey):
    return str(key.key)
  if isinstance(key, jax.tree_util.GetAttrKey):
    return key.name
  return None


def default_adaptive_predicate(path, leaf) -> bool:
  """True for leaves named 'kernel' or 'scale' (torch 'weight': conv/dense kernels, norm scales)."""
  del leaf
  if not path:
    return False
  return _key_name(path[-1]) in ADAPTIVE_LEAF_NAMES


def asam(rho: ScalarOrSchedule, eta: float = 0.01, *, eps: float = 1e-12,
         adaptive_predicate: Optional[Predicate] = None
         ) -> optax.GradientTransformationExtraArgs:
  """Adaptive SAM as a gradient-replacing transform (put it first in a chain).

  Args:
    rho: neighbourhood radius: a float, a (possibly traced) jnp scalar, or a schedule of the
      update count.
    eta: ASAM's offset in T_w = |w| + eta (not a learning rate).
    eps: added to the global norm ||T g||_2, so a zero gradient gives no NaN.
    adaptive_predicate: `(path, leaf) -> bool` selects the leaves that get T_w = |w| + eta. All
      other leaves get T = 1. Defaults to `default_adaptive_predicate` ('kernel' and 'scale').

  Returns:
    A `GradientTransformationExtraArgs` with the same `update(..., grad_fn=...)` contract as `sam`.
  """
  predicate = default_adaptive_predicate if adaptive_predicate is None else adaptive_predicate

  def scale_fn(params):
    def leaf_scale(path, w):
      if predicate(path, w):
        return jnp.abs(w) + eta
      return 1.0
    return jax.tree_util.tree_map_with_path(leaf_scale, params)

  return _sharpness_aware(rho, eps, scale_fn, 'asam')
