"""Top Hessian eigenpairs: deflated power iteration (pytorch-hessian-eigenthings) and Lanczos.

`hvp` is any callable v -> H v on flat float32 vectors of length `dim` (e.g. `hvp.make_hvp(...)`, or a plain
function in tests). Everything runs in one jitted XLA program per (operator, shapes) with `lax.fori_loop`
/ `lax.while_loop`, so compile time does not grow with the number of iterations.

Power iteration vs Lanczos:
  * `top_eigenpairs_power` finds the eigenvalues of largest **magnitude** |lambda| (one at a time, with
    deflation). If the Hessian has negative curvature larger in magnitude than some positive eigenvalue, the
    returned set differs from the largest *algebraic* eigenvalues. This is the method of the thesis / FedGloSS
    (20 steps, tol 1e-4, k = 5); results are sorted by descending value, as eigenthings does.
  * `top_eigenpairs_lanczos` returns the largest **algebraic** Ritz values of a Krylov space of `num_steps`
    (with full re-orthogonalization), usually far more accurate per HVP.

Neither returns a certificate by itself: 20 power steps on a clustered top spectrum return mixtures of
eigenvectors, and deflating with them produces numbers that are no eigenvalue at all. `check_pairs` tests
every returned pair (u, lambda) against H itself: the Rayleigh quotient u.Hu and the residual ||Hu - lambda u||.
Some eigenvalue of H lies within the residual of lambda (symmetric H, unit u), so a pair is `converged` when
the residual is <= tol * max|lambda| over the returned pairs. `top_eigenpairs` (what `analyze` and
experiments/hessian.py use) runs Lanczos, doubles the Krylov dimension while a pair fails the test (up to
`max_steps`), and returns the diagnostics; pairs still failing are marked, never silently reported.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

from absl import logging
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from fedjax_flat.analysis._util import as_partial


def _default_rng(rng):
  return jax.random.PRNGKey(0) if rng is None else rng


def _start_vector(key, dim, init: str):
  if init == 'normal':
    return jax.random.normal(key, (dim,), jnp.float32)
  if init == 'uniform':  # torch.rand, as pytorch-hessian-eigenthings
    return jax.random.uniform(key, (dim,), jnp.float32)
  if init == 'rademacher':
    return jax.random.rademacher(key, (dim,), jnp.float32)
  raise ValueError(f"init={init!r}; allowed: 'normal', 'uniform', 'rademacher'")


@functools.partial(jax.jit, static_argnames=('dim', 'k', 'init', 'orthogonalize'))
def _power_impl(op, rng, tol, num_iters, *, dim, k, init, orthogonalize):
  # tol and num_iters are traced: changing them does not recompile.
  tol = jnp.asarray(tol, jnp.float32)

  def one_pair(i, carry):
    us, lams, iters = carry

    def project_out(v):
      return v - us.T @ (us @ v)  # rows of `us` not found yet are zero

    def deflated(v):
      # H_i v = H v - sum_j lambda_j (u_j . v) u_j
      return op(v) - us.T @ (lams * (us @ v))

    v = _start_vector(jax.random.fold_in(rng, i), dim, init)
    if orthogonalize:
      v = project_out(v)
    v = v / jnp.maximum(jnp.linalg.norm(v), 1e-30)

    def cond(state):
      j, _, _, err = state
      return (j < num_iters) & (err >= tol)

    def body(state):
      j, v, lam_prev, _ = state
      if orthogonalize:
        v = project_out(v)
        v = v / jnp.maximum(jnp.linalg.norm(v), 1e-30)
      w = deflated(v)
      lam = jnp.vdot(v, w)                      # Rayleigh quotient of the unit vector v
      wn = jnp.linalg.norm(w)
      v_new = jnp.where(wn > 0, w / jnp.maximum(wn, 1e-30), v)
      # eigenthings: error = |(lam - lam_prev) / lam|, with lam_prev = 0 before the first step.
      err = jnp.abs(lam - lam_prev) / jnp.maximum(jnp.abs(lam), 1e-30)
      err = jnp.where(wn > 0, err, 0.0)          # H_i v = 0: v is in the null space; stop
      return j + 1, v_new, lam, err

    init_state = (jnp.zeros((), jnp.int32), v, jnp.zeros((), jnp.float32), jnp.asarray(jnp.inf, jnp.float32))
    j, v, lam, _ = lax.while_loop(cond, body, init_state)
    return us.at[i].set(v), lams.at[i].set(lam), iters.at[i].set(j)

  carry0 = (jnp.zeros((k, dim), jnp.float32), jnp.zeros((k,), jnp.float32), jnp.zeros((k,), jnp.int32))
  us, lams, iters = lax.fori_loop(0, k, one_pair, carry0)
  order = jnp.argsort(-lams)
  return lams[order], us[order], iters[order]


def top_eigenpairs_power(hvp: Callable, dim: int, k: int = 5, num_iters: int = 20, tol: float = 1e-4,
                         rng=None, *, init: str = 'normal', orthogonalize: bool = False,
                         return_num_iters: bool = False):
  """Deflated power iteration (pytorch-hessian-eigenthings `deflated_power_iteration`).

  For i = 1..k: start from a fresh random unit vector, iterate v <- H_i v / ||H_i v|| with the deflated
  operator H_i v = H v - sum_{j<i} lambda_j (u_j . v) u_j, at most `num_iters` times, stopping early when
  |lambda_t - lambda_{t-1}| / |lambda_t| < tol (inside a `lax.while_loop`); lambda_t = v_t . H_i v_t.

  Finds the k eigenvalues of largest MAGNITUDE (not the largest algebraic ones when the Hessian has
  significant negative curvature). Each pair starts from a fresh random vector (eigenthings reuses the
  previous eigenvector, which the deflated operator nearly annihilates; a fresh start is equivalent up to
  round-off and better conditioned).

  Args:
    hvp: v -> H v on flat float32 vectors of length `dim`.
    dim: the vector dimension (number of parameters).
    k: number of eigenpairs.
    num_iters: maximum power steps per eigenpair (the thesis uses 20).
    tol: relative eigenvalue-change threshold for early stopping (eigenthings: 1e-4; 0 disables).
    rng: PRNG key for the start vectors (default PRNGKey(0)).
    init: start-vector distribution: 'normal', 'uniform' (torch.rand, eigenthings) or 'rademacher'.
    orthogonalize: also Gram-Schmidt the iterate against the eigenvectors found so far at every step
      (PyHessian style); more robust when earlier eigenvectors are inaccurate.
    return_num_iters: also return the number of power steps used per eigenpair.

  Returns:
    (eigenvalues [k], eigenvectors [k, dim]) sorted by descending eigenvalue; with `return_num_iters`,
    a third array [k] of steps used (in the same order).
  """
  if k > dim:
    raise ValueError(f'k={k} > dim={dim}')
  lams, us, iters = _power_impl(as_partial(hvp), _default_rng(rng), jnp.float32(tol), jnp.int32(num_iters),
                                dim=int(dim), k=int(k), init=init, orthogonalize=bool(orthogonalize))
  return (lams, us, iters) if return_num_iters else (lams, us)


class LanczosResult(NamedTuple):
  alphas: jax.Array  # [m] diagonal of the tridiagonal matrix T
  betas: jax.Array   # [m - 1] off-diagonal of T (0 where the iteration broke down and restarted)
  basis: jax.Array   # [m, dim] orthonormal Lanczos vectors (rows)


@functools.partial(jax.jit, static_argnames=('dim', 'm'))
def _lanczos_impl(op, rng, v0, *, dim, m):
  if v0 is None:
    v0 = jax.random.normal(jax.random.fold_in(rng, 2**31 - 1), (dim,), jnp.float32)
  v0 = v0 / jnp.linalg.norm(v0)
  basis = jnp.zeros((m + 1, dim), jnp.float32).at[0].set(v0)
  alphas = jnp.zeros((m,), jnp.float32)
  betas = jnp.zeros((m,), jnp.float32)

  def body(i, carry):
    basis, alphas, betas, scale = carry
    v = basis[i]
    w = op(v)
    alpha = jnp.vdot(v, w)
    beta_prev = jnp.where(i > 0, betas[jnp.maximum(i - 1, 0)], 0.0)
    w = w - alpha * v - beta_prev * basis[jnp.maximum(i - 1, 0)]
    # Full re-orthogonalization against all previous vectors (twice: "twice is enough").
    w = w - basis.T @ (basis @ w)
    w = w - basis.T @ (basis @ w)
    beta = jnp.linalg.norm(w)
    scale = jnp.maximum(scale, jnp.abs(alpha) + beta)
    # Breakdown (an invariant subspace was found): continue with a random vector orthogonal to the basis
    # and a zero coupling, so T becomes block diagonal and later Ritz values stay exact (PyHessian).
    broke = beta <= 1e-6 * scale
    r = jax.random.normal(jax.random.fold_in(rng, i), (dim,), jnp.float32)
    r = r - basis.T @ (basis @ r)
    r = r - basis.T @ (basis @ r)
    nxt = jnp.where(broke, r / jnp.maximum(jnp.linalg.norm(r), 1e-30), w / jnp.maximum(beta, 1e-30))
    beta = jnp.where(broke, 0.0, beta)
    return basis.at[i + 1].set(nxt), alphas.at[i].set(alpha), betas.at[i].set(beta), scale

  basis, alphas, betas, _ = lax.fori_loop(0, m, body, (basis, alphas, betas, jnp.zeros((), jnp.float32)))
  return LanczosResult(alphas, betas[:m - 1], basis[:m])


def lanczos(hvp: Callable, dim: int, num_steps: int, rng=None, *, v0=None) -> LanczosResult:
  """Lanczos tridiagonalization with full re-orthogonalization, in one `lax.fori_loop`.

  Args:
    hvp: v -> H v on flat vectors of length `dim`.
    dim: vector dimension.
    num_steps: Krylov dimension m (capped at `dim`).
    rng: PRNG key (start vector if `v0` is None, and restart vectors on breakdown).
    v0: optional start vector (normalized here), e.g. a Rademacher probe for SLQ.

  Returns:
    LanczosResult(alphas [m], betas [m-1], basis [m, dim]) with basis H basis^T = T = tridiag(betas, alphas,
    betas) up to round-off. Memory: m * dim float32 for the basis.
  """
  m = int(min(num_steps, dim))
  v0 = None if v0 is None else jnp.asarray(v0, jnp.float32)
  return _lanczos_impl(as_partial(hvp), _default_rng(rng), v0, dim=int(dim), m=m)


def tridiagonal(alphas: jax.Array, betas: jax.Array) -> jax.Array:
  """The symmetric tridiagonal matrix T from its diagonal and off-diagonal."""
  return jnp.diag(alphas) + jnp.diag(betas, 1) + jnp.diag(betas, -1)


def top_eigenpairs_lanczos(hvp: Callable, dim: int, k: int = 5, num_steps: int = 50, rng=None):
  """Largest-algebraic Ritz pairs from `num_steps` Lanczos steps.

  Returns (eigenvalues [k] descending, eigenvectors [k, dim]), the Ritz values theta of T and the Ritz
  vectors basis^T s. Extreme Ritz values converge first; use num_steps >~ 3k-10k for the top k.
  """
  if k > min(num_steps, dim):
    raise ValueError(f'k={k} > number of Lanczos steps {min(num_steps, dim)}')
  res = lanczos(hvp, dim, num_steps, rng)
  return _ritz_pairs(res.alphas, res.betas, res.basis, k=int(k))


@functools.partial(jax.jit, static_argnames=('k',))
def _ritz_pairs(alphas, betas, basis, *, k):
  m = alphas.shape[0]
  theta, s = jnp.linalg.eigh(tridiagonal(alphas, betas))
  idx = jnp.arange(m - 1, m - 1 - k, -1)
  vecs = (basis.T @ s[:, idx]).T
  vecs = vecs / jnp.linalg.norm(vecs, axis=1, keepdims=True)
  return theta[idx], vecs


# A pair is converged when ||H u - lambda u|| <= RESIDUAL_TOL * max |lambda| (float32 HVPs reach ~1e-5).
RESIDUAL_TOL = 1e-3


class CheckedPairs(NamedTuple):
  eigenvalues: np.ndarray        # [k] as the solver returned them (descending)
  eigenvectors: jax.Array        # [k, dim]
  rayleigh_quotients: np.ndarray  # [k] u.Hu with the true H (u normalized)
  residuals: np.ndarray          # [k] ||H u - lambda u||: some eigenvalue of H is within this of lambda
  converged: np.ndarray          # [k] bool: residual <= tol * scale
  scale: float                   # max |lambda| over the returned pairs
  tol: float
  steps: Optional[int] = None    # Lanczos: the Krylov dimension that produced them


def check_pairs(hvp: Callable, values, vecs, *, tol: float = RESIDUAL_TOL, steps: Optional[int] = None
                ) -> CheckedPairs:
  """Rayleigh quotient and residual of every (value, vector) pair, with one HVP each.

  The HVP is called as it is (`make_hvp`'s is jitted: its own compiled program, shared with any other direct
  call of the same shapes), not inside a new jitted loop, which would compile it again.
  """
  rq, res = [], []
  for lam, u in zip(jnp.asarray(values, jnp.float32), jnp.asarray(vecs, jnp.float32)):
    u = u / jnp.linalg.norm(u)
    w = hvp(u)
    rq.append(float(jnp.vdot(u, w)))
    res.append(float(jnp.linalg.norm(w - lam * u)))
  vals = np.asarray(values, np.float64)
  res = np.asarray(res, np.float64)
  scale = float(np.max(np.abs(vals))) if vals.size else 0.0
  conv = np.isfinite(res) & (res <= tol * max(scale, np.finfo(np.float32).tiny))
  return CheckedPairs(vals, vecs, np.asarray(rq, np.float64), res, conv, scale, float(tol), steps)


def top_eigenpairs(hvp: Callable, dim: int, k: int = 5, *, num_steps: int = 80, max_steps: Optional[int] = None,
                   tol: float = RESIDUAL_TOL, rng=None, warn: bool = True) -> CheckedPairs:
  """The k largest algebraic eigenpairs by Lanczos, each checked against H (`check_pairs`).

  Starts with a Krylov space of `num_steps`; while some pair fails the residual test, doubles it (a new
  compiled program per size), up to `max_steps` (default 4 * num_steps; capped at `dim`). Memory: steps * dim
  float32 for the Lanczos basis. Pairs that still fail are returned with converged=False and (`warn`) a warning;
  a caller that reports them itself (experiments/hessian.py) passes warn=False, so it is said once.
  """
  max_steps = int(min(max_steps or 4 * num_steps, dim))
  m = int(min(max(num_steps, k), max_steps))
  while True:
    vals, vecs = top_eigenpairs_lanczos(hvp, dim, k, m, rng)
    out = check_pairs(hvp, vals, vecs, tol=tol, steps=m)
    if out.converged.all() or m >= max_steps:
      break
    m = min(2 * m, max_steps)
  if warn:
    warn_unconverged(out, f'Lanczos with {m} steps', more='num_steps (--lanczos_steps)')
  return out


def warn_unconverged(pairs: CheckedPairs, method: str, more: str) -> bool:
  """Logs a warning naming the pairs that fail the residual test and `more`, the setting that gives the method
  more steps (Lanczos: num_steps, power iteration: num_iters); True if there are any."""
  bad = np.flatnonzero(~pairs.converged)
  if bad.size:
    logging.warning('%s: %d of %d eigenpairs did not converge (||Hu - lambda u|| > %g * %.4g): %s; their values '
                    'need not be eigenvalues (more steps: %s)', method, bad.size, len(pairs.converged),
                    pairs.tol, pairs.scale, ', '.join(f'lambda_{i + 1}={pairs.eigenvalues[i]:.5g} (residual '
                                                      f'{pairs.residuals[i]:.3g})' for i in bad), more)
  return bool(bad.size)
