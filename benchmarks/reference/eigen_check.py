"""Are the Hessian tool's eigenvalues eigenvalues? The CIFAR CNN at a random point (its top spectrum is
clustered), on fixed random images: the thesis power iteration (20 deflated steps), the tool's default
(checked Lanczos, analysis/eigen.top_eigenpairs) and an ARPACK reference (scipy eigsh, float64 iteration on
the same float32 HVP, tol 1e-7), each pair with its residual ||Hu - lambda u|| (analysis/eigen.check_pairs).

  .venv/bin/python -m benchmarks.reference.eigen_check [--examples=100] [--k=5] [--seed=0]
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat import analysis
from fedjax_flat.models.registry import get_model


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--examples', type=int, default=100)
  ap.add_argument('--k', type=int, default=5)
  ap.add_argument('--seed', type=int, default=0)
  args = ap.parse_args()
  from scipy.sparse.linalg import LinearOperator, eigsh
  model = get_model('cifar_cnn', 10, (32, 32, 3))
  rng = np.random.RandomState(args.seed)
  x = rng.randn(args.examples, 32, 32, 3).astype(np.float32)
  y = rng.randint(0, 10, args.examples).astype(np.int32)
  params = model.init(jax.random.key(args.seed), jnp.zeros((1, 32, 32, 3)))
  batches = analysis.make_fixed_batches(x, y, min(100, args.examples))
  hvp = analysis.make_hvp(model, params, batches)
  dim = analysis.param_dim(params)
  count = [0]

  def counted(v):
    count[0] += 1
    return hvp(v)
  rows = []

  def record(name, fn):
    count[0] = 0
    t = time.perf_counter()
    vals, vecs = fn()
    secs, used = time.perf_counter() - t, count[0]
    pairs = analysis.check_pairs(hvp, vals, vecs)
    rows.append((name, pairs, used, secs))
    print(f'{name}: {np.round(pairs.eigenvalues, 4).tolist()} residuals {np.round(pairs.residuals, 5).tolist()} '
          f'converged {pairs.converged.tolist()} ({used} HVPs, {secs:.0f} s)', flush=True)

  key = jax.random.PRNGKey(args.seed)

  def power():
    vals, vecs, iters = analysis.top_eigenpairs_power(hvp, dim, args.k, num_iters=20, rng=key, return_num_iters=True)
    count[0] = int(np.sum(iters))
    return vals, vecs
  record('power, 20 steps (thesis)', power)

  def lanczos():
    p = analysis.top_eigenpairs(hvp, dim, args.k, rng=key)
    count[0] = p.steps + args.k          # Lanczos steps + the residual checks
    return p.eigenvalues, p.eigenvectors
  record('checked Lanczos (default)', lanczos)

  def arpack():
    op = LinearOperator((dim, dim), dtype=np.float64,
                        matvec=lambda v: np.asarray(counted(jnp.asarray(v, jnp.float32)), np.float64))
    vals, vecs = eigsh(op, k=args.k, which='LA', tol=1e-7)
    order = np.argsort(-vals)
    return vals[order], jnp.asarray(vecs[:, order].T, jnp.float32)
  record('ARPACK reference (eigsh LA)', arpack)
  ref = rows[-1][1].eigenvalues
  print(f'\nCIFAR CNN ({dim} parameters) at a random point, {args.examples} random images; reference '
        f'lambda_1..{args.k} = {np.round(ref, 4).tolist()}\n')
  print('| method | eigenvalues | max abs error vs reference | max residual | converged | HVPs | s |')
  print('|---|---|---|---|---|---|---|')
  for name, p, used, secs in rows:
    err = np.max(np.abs(np.sort(p.eigenvalues)[::-1] - ref))
    print(f'| {name} | {", ".join(f"{v:.4f}" for v in p.eigenvalues)} | {err:.2e} | {p.residuals.max():.2e} | '
          f'{int(p.converged.sum())}/{len(p.converged)} | {used if used else "-"} | {secs:.0f} |')


if __name__ == '__main__':
  main()
