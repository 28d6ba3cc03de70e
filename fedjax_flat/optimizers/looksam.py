"""LookSAM (Liu et al., "Towards Efficient and Scalable Sharpness-Aware Minimization", CVPR 2022, Alg. 1).

Every k-th step (t % k == 0) it computes the SAM gradient g_s = grad L(w + rho g / ||g||) (two passes) and keeps
the component of g_s orthogonal to the plain gradient g:

    g_v = g_s - ||g_s|| cos(theta) g / ||g||  =  g_s - (<g, g_s> / ||g||^2) g          (stored in the state)

and returns g_s. On the other steps only the plain gradient g is computed (one pass) and it returns

    g_s = g + alpha * ||g|| / ||g_v|| * g_v.

Norms are global over all leaves with eps in each denominator (a zero g or g_v gives no NaN). alpha = 0 is
`sam_every`; k = 1 is `sam` exactly (every step is a SAM step and its g_s is returned unchanged). The paper's
Adaptive LookSAM (its Sec. 3.3, layer-wise scaling for large-batch LAMB training) is not the ASAM |w| scaling;
an ASAM form of LookSAM is not defined by the paper and is not offered here.

The choice is a traced `lax.cond` on the step counter in the state (g_v travels in the state too), so a client's
local run is one compiled scan.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.optimizers.sam import GradFn, SAMState, ScalarOrSchedule, sam


class LookSAMState(NamedTuple):
  """count: `update` calls so far; g_v: the orthogonal part of the last SAM gradient (zeros before the first)."""
  count: jax.Array
  g_v: Any


def passes(k: int) -> float:
  """AVERAGE forward+backward passes per step: 2 on one step in k, 1 on the others."""
  return 1.0 + 1.0 / k


def _vdot(a, b) -> jax.Array:
  return sum(jnp.vdot(x.astype(jnp.float32), y.astype(jnp.float32))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def looksam(rho: ScalarOrSchedule, k: int, alpha: float, *, eps: float = 1e-12
            ) -> optax.GradientTransformationExtraArgs:
  """LookSAM: the SAM gradient every k steps, the plain gradient plus alpha ||g|| / ||g_v|| g_v in between."""
  if isinstance(k, (int, float)) and (int(k) != k or k < 1):    # else a batched program's traced int32 k
    raise ValueError(f'looksam: k={k!r} must be an integer >= 1')
  inner = sam(rho, eps=eps)

  def init_fn(params):
    return LookSAMState(count=jnp.zeros([], jnp.int32), g_v=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None, *, grad_fn: Optional[GradFn] = None, **extra_args):
    del extra_args
    g = updates

    def sam_step():
      g_s = inner.update(g, SAMState(count=state.count), params, grad_fn=grad_fn)[0]
      coef = _vdot(g, g_s) / (_vdot(g, g) + eps)
      g_v = jax.tree.map(lambda s, p: (s - coef * p).astype(s.dtype), g_s, g)
      return g_s, jax.tree.map(lambda v, old: v.astype(old.dtype), g_v, state.g_v)

    def reuse_step():
      scale = alpha * optax.tree.norm(g) / (optax.tree.norm(state.g_v) + eps)
      return jax.tree.map(lambda p, v: (p + scale * v).astype(p.dtype), g, state.g_v), state.g_v

    new_updates, g_v = jax.lax.cond(state.count % k == 0, sam_step, reuse_step)
    return new_updates, LookSAMState(count=optax.safe_increment(state.count), g_v=g_v)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
