"""Alignment of updates with the Hessian's top eigenvectors: how much of an update lies in the sharp directions.

For an update v (a client's Delta_k or the aggregate, analysis/drift.py) and the top-k eigenvectors u_1..u_k of
the loss Hessian at the global model (orthonormal rows of U, Lanczos: eigen.top_eigenpairs), the fraction
||U v||^2 / ||v||^2 in [0, 1] of v's squared norm in their span. A random direction in dimension d has k/d of it
in expectation, so a value far above k/d says the update moves along the sharpest curvature (what SAM-type
clients are meant to avoid); 0 for a zero update.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_flat.analysis.eigen import CheckedPairs, top_eigenpairs


def subspace_fraction(vectors, basis) -> jax.Array:
  """||U v||^2 / ||v||^2 for each row v of `vectors` [K, dim] (or one [dim] vector) and orthonormal rows U of
  `basis` [k, dim]; 0 where v = 0."""
  v = jnp.asarray(vectors, jnp.float32)
  u = jnp.asarray(basis, jnp.float32)
  proj = jnp.sum((v @ u.T) ** 2, axis=-1)
  sq = jnp.sum(v * v, axis=-1)
  return jnp.where(sq > 0, proj / jnp.where(sq > 0, sq, 1.0), 0.0)


def top_subspace(hvp: Callable, dim: int, k: int, *, rng=None, num_steps: int = 40) -> CheckedPairs:
  """The top-k (largest algebraic) eigenpairs of the operator from ONE Lanczos run of `num_steps` (a fixed cost:
  not grown while a pair fails the residual test, so `converged` says which pairs are eigenpairs to tolerance),
  eigenvectors re-orthonormalized (QR): the Ritz vectors are orthonormal up to rounding, and the fraction above
  assumes they are."""
  pairs = top_eigenpairs(hvp, dim, k=k, num_steps=num_steps, max_steps=num_steps, rng=rng, warn=False)
  q, _ = jnp.linalg.qr(jnp.asarray(pairs.eigenvectors, jnp.float32).T)
  return pairs._replace(eigenvectors=q.T)
