"""`analyze`: one call from (model, params, data) to a JSON-able Hessian report, for command-line tools."""
from __future__ import annotations

import math
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.analysis.data import make_fixed_batches, num_valid
from fedjax_flat.analysis.density import spectral_density
from fedjax_flat.analysis.eigen import (RESIDUAL_TOL, check_pairs, top_eigenpairs, top_eigenpairs_power,
                                        warn_unconverged)
from fedjax_flat.analysis.hvp import make_eval_fn, make_hvp, param_dim
from fedjax_flat.analysis.trace import hutchinson_trace


def _f(x) -> Optional[float]:
  x = float(x)
  return None if math.isnan(x) or math.isinf(x) else x


def _timed(fn):
  t = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - t


def analyze(model, params, x, y, *, batch_size: int = 100, top_k: int = 5, method: str = 'lanczos',
            num_iters: int = 20, tol: float = 1e-4, lanczos_steps: Optional[int] = None,
            lanczos_max_steps: Optional[int] = None, residual_tol: float = RESIDUAL_TOL,
            trace_probes: int = 0, density_probes: int = 0, density_steps: int = 50,
            max_examples: Optional[int] = None, init: str = 'normal', rng=None,
            with_density_arrays: bool = True, task=None, warn: bool = True) -> dict:
  """Hessian analysis of `params` on the fixed data (x, y): top eigenvalues, trace, spectral density.

  Args:
    model: a `fedjax_flat.models.Model`.
    params: parameter pytree.
    x: numpy inputs [n, ...] (a fixed subset: the thesis recipe uses the test split, no augmentation;
      `max_examples` keeps the first ones).
    y: int labels [n] of those inputs.
    batch_size: examples per HVP batch (memory knob; the result does not depend on it).
    top_k: number of top eigenvalues (thesis: 5; 50 for spectrum plots).
    method: 'lanczos' (default: the largest algebraic eigenvalues, Krylov space grown until every pair passes
      the residual test, `eigen.top_eigenpairs`) or 'power' (the thesis/FedGloSS protocol: deflated power
      iteration, largest |lambda|, `num_iters` steps; on a clustered spectrum its pairs often fail the test).
    num_iters: power steps per eigenpair (thesis: 20).
    tol: power-iteration early-stopping threshold (eigenthings: 1e-4).
    lanczos_steps: initial Krylov dimension (default max(80, 3 * top_k)); lanczos_max_steps: its limit
      (default 4x).
    residual_tol: a pair (u, lambda) is converged when ||Hu - lambda u|| <= residual_tol * max |lambda|.
    trace_probes: Hutchinson probes (0 = skip).
    density_probes: SLQ probes (0 = skip), each with `density_steps` Lanczos steps.
    rng: PRNG key (default PRNGKey(0)); split for eigen / trace / density.
    with_density_arrays: include the density grid and values (1000 points each) in the report.
    task: what the labels mean (fedjax_flat/tasks/base.py; the run's `trainer.task`); None = classification.
    warn: log a warning for eigenpairs that fail the residual test (False: the caller reports `converged` itself,
      as experiments/hessian.py does, so that it is said once).

  Returns:
    A JSON-able dict: 'eigenvalues' (descending), for every pair its 'rayleigh_quotients' (u.Hu),
    'residuals' (||Hu - lambda u||) and 'converged', 'all_converged' (False also logs a warning),
    'lambda_max', 'lambda_max_over_lambda_5' (None if top_k < 5), 'loss', 'accuracy', 'trace',
    'trace_stderr', optional 'density', sizes and settings, and 'timings' in seconds (first-call times
    include compilation).
  """
  if method not in ('power', 'lanczos'):
    raise ValueError(f"method={method!r}; allowed: 'power', 'lanczos'")
  rng = jax.random.PRNGKey(0) if rng is None else rng
  k_eig, k_trace, k_dens = jax.random.split(rng, 3)
  timings = {}
  t_all = time.perf_counter()

  batches = make_fixed_batches(x, y, batch_size, max_examples=max_examples)
  dim = param_dim(params)
  hvp = make_hvp(model, params, batches, task=task)
  eval_fn = make_eval_fn(model, batches, task=task)

  (loss, acc), timings['eval_first_call_s'] = _timed(lambda: eval_fn(params))
  v = jax.random.normal(jax.random.PRNGKey(1), (dim,), jnp.float32)
  _, timings['hvp_first_call_s'] = _timed(lambda: hvp(v))
  _, timings['hvp_s'] = _timed(lambda: hvp(v))

  report = {
      'num_params': dim, 'num_examples': num_valid(batches), 'num_batches': int(batches['y'].shape[0]),
      'batch_size': int(batch_size), 'method': method, 'top_k': int(top_k), 'loss': _f(loss),
      'accuracy': _f(acc),
  }
  t_eig = time.perf_counter()
  if method == 'power':
    lams, vecs, iters = top_eigenpairs_power(hvp, dim, top_k, num_iters=num_iters, tol=tol, rng=k_eig, init=init,
                                             return_num_iters=True)
    pairs = check_pairs(hvp, lams, vecs, tol=residual_tol)
    if warn:
      warn_unconverged(pairs, f'power iteration ({num_iters} steps)', more='num_iters (--num_iters)')
    report.update(num_iters=int(num_iters), tol=float(tol), power_iters=[int(i) for i in np.asarray(iters)])
  else:
    steps = int(lanczos_steps or max(80, 3 * top_k))
    pairs = top_eigenpairs(hvp, dim, top_k, num_steps=steps, max_steps=lanczos_max_steps, tol=residual_tol,
                           rng=k_eig, warn=warn)
    report.update(lanczos_steps=int(pairs.steps))
  timings['eigen_s'] = time.perf_counter() - t_eig
  lams = pairs.eigenvalues
  report['eigenvalues'] = [float(e) for e in lams]
  report['rayleigh_quotients'] = [float(e) for e in pairs.rayleigh_quotients]
  report['residuals'] = [float(e) for e in pairs.residuals]
  report['converged'] = [bool(c) for c in pairs.converged]
  report['all_converged'] = bool(pairs.converged.all())
  report['residual_tol'] = float(residual_tol)
  report['residual_scale'] = float(pairs.scale)
  report['lambda_max'] = float(lams[0])
  report['lambda_max_over_lambda_5'] = _f(lams[0] / lams[4]) if len(lams) >= 5 and lams[4] != 0 else None

  report['trace'] = report['trace_stderr'] = None
  if trace_probes > 0:
    (tr, se), timings['trace_s'] = _timed(lambda: hutchinson_trace(hvp, dim, trace_probes, k_trace))
    report.update(trace=_f(tr), trace_stderr=_f(se), trace_probes=int(trace_probes))
  if density_probes > 0:
    dens, timings['density_s'] = _timed(lambda: spectral_density(
        hvp, dim, num_probes=density_probes, num_steps=density_steps, rng=k_dens))
    d = {'probes': int(density_probes), 'steps': int(min(density_steps, dim)), 'sigma': float(dens.sigma)}
    if with_density_arrays:
      d.update(grid=[float(t) for t in dens.grid], density=[float(t) for t in dens.density])
    report['density'] = d
  timings['total_s'] = time.perf_counter() - t_all
  report['timings'] = {k: round(float(t), 4) for k, t in timings.items()}
  return report
