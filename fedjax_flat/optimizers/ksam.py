"""K-SAM's subset ascent (Ni et al. 2022, "K-SAM: Sharpness-Aware Minimization at the Speed of SGD"): SAM whose
ascent (perturbation) gradient comes from the k examples of the minibatch with the highest loss.

    l_i      = the per-example loss at w (the first forward pass), i valid in the batch's mask
    S        = the k = max(1, round(fraction n)) valid examples with the largest l_i (n valid examples; ties: the
               lower index), a mask over the fixed-size batch, never a new shape
    g_S      = grad (1 / |S|) sum_{i in S} l_i(w)                        the ascent gradient on the subset
    e        = rho g_S / (||g_S||_2 + eps)                                SAM's perturbation (one global norm)
    returns    grad L_B(w + e)                                            the descent gradient on the whole batch

Which part of K-SAM this is: the paper takes BOTH of SAM's gradients on the top-k examples; here only the ascent
is on the subset (the issue's 'ascent on a subset of the batch') and the descent stays on the full batch, so the
update is SAM's with a cheaper perturbation; `fraction` = 1 is SAM exactly (the subset is the whole mask). The
paper defines no adaptive (ASAM) form, so there is none here.

Contract: like `sam`, first in the chain, `update(g, state, params, grad_fn=, example_losses_fn=,
example_grad_fn=)`; algorithms/local.local_step passes example_losses_fn(p) -> (l [B], mask [B]) (the gradient
of the batch's loss sum with respect to the example mask: each example's loss, one cheap backward through the
sum) and example_grad_fn(p, weights [B]) -> the gradient of the batch's mean loss over the examples weighted by
`weights` (the loss with the mask replaced). `g` itself is not used (XLA drops its backward pass). With a
BatchNorm model the mask also weighs the batch statistics, so that derivative adds each example's effect on them
to its loss (the ranking is then approximate).

Cost (systems/clock.py): 1 + fraction forward+backward passes a step (the descent's full pass and the ascent's
pass over a fraction of the batch), the declared cost of the method; the selection forward at w is the one the
step's loss metrics need anyway. A simulator computes the subset's pass over the masked full-size batch.
"""
from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import optax

from fedjax_flat.optimizers.sam import GradFn, ScalarOrSchedule, sam


def passes(fraction) -> float:
  """Forward+backward passes of one step: the full descent pass and the ascent on a fraction of the batch."""
  return 1.0 + float(fraction)


def top_loss_mask(losses, mask, fraction):
  """The mask [B] of the k = max(1, round(fraction n)) valid examples with the largest loss (n = sum(mask))."""
  valid = mask > 0
  n = jnp.sum(valid.astype(jnp.float32))
  k = jnp.maximum(1.0, jnp.round(jnp.asarray(fraction, jnp.float32) * n))
  score = jnp.where(valid, losses.astype(jnp.float32), -jnp.inf)
  order = jnp.argsort(-score, stable=True)
  rank = jnp.zeros(score.shape, jnp.int32).at[order].set(jnp.arange(score.shape[0], dtype=jnp.int32))
  return (valid & (rank < k)).astype(jnp.float32)


def ksam(rho: ScalarOrSchedule, fraction, *, eps: float = 1e-12) -> optax.GradientTransformationExtraArgs:
  """SAM with the ascent gradient on the top-`fraction` highest-loss examples of the batch (see the module)."""
  inner = sam(rho, eps=eps)

  def init_fn(params):
    return inner.init(params)

  def update_fn(updates, state, params=None, *, grad_fn: Optional[GradFn] = None, example_losses_fn=None,
                example_grad_fn=None, **extra_args):
    del updates, extra_args
    if example_losses_fn is None or example_grad_fn is None:
      raise ValueError('ksam needs `example_losses_fn` and `example_grad_fn` (algorithms/local.local_step passes '
                       'them): the per-example losses and the gradient over a subset of the batch')
    losses, mask = example_losses_fn(params)
    g_subset = example_grad_fn(params, top_loss_mask(losses, mask, fraction))
    return inner.update(g_subset, state, params, grad_fn=grad_fn)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


__all__ = ['ksam', 'passes', 'top_loss_mask']
