"""SAM every k-th step: SAM's two passes on the steps t with t % k == 0, plain SGD's one pass otherwise.

The cheapest way to pay for sharpness-aware training (the "SAM every k steps" baseline of LookSAM,
Liu et al. CVPR 2022, Sec. 4). Same contract as `sam`: `update(g, state, params, grad_fn=)`, first in the chain.
On a SAM step it returns grad_fn(w + rho g / (||g|| + eps)); otherwise g unchanged.

The choice is a traced `lax.cond` on the step counter in the state, never Python control flow: a client's local
run stays one compiled scan. Under `vmap` over clients the cond lowers to a select (both branches computed) unless
all clients share the step counter; the declared cost is what the method needs, not what a batched simulator spends.
"""
from __future__ import annotations

from typing import Optional

import jax
import optax

from fedjax_flat.optimizers.sam import GradFn, SAMState, ScalarOrSchedule, sam


def passes(k: int) -> float:
  """AVERAGE forward+backward passes per step: 2 on one step in k, 1 on the others."""
  return 1.0 + 1.0 / k


def sam_every(rho: ScalarOrSchedule, k: int, *, eps: float = 1e-12) -> optax.GradientTransformationExtraArgs:
  """SAM on steps 0, k, 2k, ... (counted in `update` calls); the plain gradient on the others. k=1 is `sam`."""
  if isinstance(k, (int, float)) and (int(k) != k or k < 1):    # else a batched program's traced int32 k
    raise ValueError(f'sam_every: k={k!r} must be an integer >= 1')
  inner = sam(rho, eps=eps)

  def init_fn(params):
    return inner.init(params)

  def update_fn(updates, state, params=None, *, grad_fn: Optional[GradFn] = None, **extra_args):
    del extra_args
    # The inner SAM state is the same counter, so a rho schedule sees the step number either way.
    ascent = lambda: inner.update(updates, state, params, grad_fn=grad_fn)[0]  # noqa: E731
    new_updates = jax.lax.cond(state.count % k == 0, ascent, lambda: updates)
    return new_updates, SAMState(count=optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


__all__ = ['passes', 'sam_every']
