"""K-SAM (Ni et al. 2022, "K-SAM: Sharpness-Aware Minimization at the Speed of SGD"): SAM whose gradients come from
the k examples of the minibatch with the highest loss.

    l_i      = the per-example loss at w (the first forward pass), i valid in the batch's mask
    S        = the k = max(1, round(fraction n)) valid examples with the largest l_i (n valid examples; ties: the
               lower index), a mask over the fixed-size batch, never a new shape
    g_S      = grad (1 / |S|) sum_{i in S} l_i(w)                        the ascent gradient on the subset
    e        = rho g_S / (||g_S||_2 + eps)                                SAM's perturbation (one global norm)
    returns    grad (1 / |S|) sum_{i in S} l_i(w + e)   descent='subset'  the descent gradient on the subset too
               grad L_B(w + e)                          descent='full'    the descent gradient on the whole batch

descent='subset' (client.ksam_descent, the default) is the paper's rule: BOTH of SAM's gradients on the top-k
examples (S is chosen once, at w). descent='full' keeps the descent on the whole batch (only the ascent on the
subset: SAM with a cheaper perturbation; this package's K-SAM before issue 48, and the rule
benchmarks/studies/README.flat_cost.md's K-SAM numbers were measured with). `fraction` = 1 is SAM exactly in
both (the subset is the whole mask). The paper defines no adaptive (ASAM) form, so there is none here.

Contract: like `sam`, first in the chain, `update(g, state, params, grad_fn=, example_losses_fn=,
example_grad_fn=)`; algorithms/local.local_step passes example_losses_fn(p) -> (l [B], mask [B]) (the gradient
of the batch's loss sum with respect to the example mask: each example's loss, one cheap backward through the
sum) and example_grad_fn(p, weights [B]) -> the gradient of the batch's mean loss over the examples weighted by
`weights` (the loss with the mask replaced). `g` itself is not used (XLA drops its backward pass). With a
BatchNorm model the mask also weighs the batch statistics, so that derivative adds each example's effect on them
to its loss (the ranking is then approximate), and the subset's gradients normalize with the subset's statistics.

Cost (systems/clock.py), forward+backward passes a step, the declared cost of the method:
  'subset'  1/3 + (5/3) fraction: the forward over the batch that ranks the losses (a forward is about 1/3 of a
            forward+backward: the backward costs about two forwards), the ascent's backward over the subset (its
            forward is part of the ranking pass) and the descent's forward+backward over the subset (2 at
            fraction 1, SAM's cost);
  'full'    1 + fraction: the descent's full pass and the ascent's pass over a fraction of the batch (the
            selection forward at w counted as the one the step's loss metrics need anyway; unchanged).
A simulator computes the subset's passes over the masked full-size batch.
"""
from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import optax

from fedjax_flat.optimizers.sam import GradFn, ScalarOrSchedule, sam


DESCENTS = ('subset', 'full')
FORWARD_SHARE = 1.0 / 3.0     # a forward pass as a share of a forward+backward pass (backward ~ two forwards)


def passes(fraction, descent: str = 'subset') -> float:
  """Forward+backward passes of one step (see the module docstring's Cost)."""
  if descent == 'full':
    return 1.0 + float(fraction)
  return FORWARD_SHARE + (2.0 - FORWARD_SHARE) * float(fraction)


def top_loss_mask(losses, mask, fraction):
  """The mask [B] of the k = max(1, round(fraction n)) valid examples with the largest loss (n = sum(mask))."""
  valid = mask > 0
  n = jnp.sum(valid.astype(jnp.float32))
  k = jnp.maximum(1.0, jnp.round(jnp.asarray(fraction, jnp.float32) * n))
  score = jnp.where(valid, losses.astype(jnp.float32), -jnp.inf)
  order = jnp.argsort(-score, stable=True)
  rank = jnp.zeros(score.shape, jnp.int32).at[order].set(jnp.arange(score.shape[0], dtype=jnp.int32))
  return (valid & (rank < k)).astype(jnp.float32)


def ksam(rho: ScalarOrSchedule, fraction, descent: str = 'subset', *, eps: float = 1e-12
         ) -> optax.GradientTransformationExtraArgs:
  """SAM with the ascent gradient (and with descent='subset', the paper's rule, the descent gradient too) on the
  top-`fraction` highest-loss examples of the batch (see the module)."""
  if descent not in DESCENTS:
    raise ValueError(f'ksam: descent={descent!r}; allowed: {DESCENTS}')
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
    subset = top_loss_mask(losses, mask, fraction)
    g_subset = example_grad_fn(params, subset)
    # S is chosen once, at w: the descent at w + e reuses it (the paper does not re-rank at the perturbed point)
    descent_fn = grad_fn if descent == 'full' else (lambda p: example_grad_fn(p, subset))
    return inner.update(g_subset, state, params, grad_fn=descent_fn)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


__all__ = ['DESCENTS', 'ksam', 'passes', 'top_loss_mask']
