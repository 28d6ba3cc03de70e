"""Hessian benchmark: HVP time and top-k eigenvalue time (deflated power iteration) for the CIFAR CNN.

Setup (defaults): 'cifar_cnn' with 10 classes (797,962 parameters), `num_examples` random 32x32x3 inputs with
random labels, fixed padded batches of `batch_size`, exact weighted-mean-loss HVP (forward-over-reverse,
`lax.scan` over batches), then top-5 eigenpairs with 20 power steps each (tol 1e-4, as the thesis/FedGloSS).
Each conv lowering in `--conv_impls` is measured: 'im2col' (shift-im2col matmul, fast inside XLA loops on
CPU) and 'lax' (native convolution, slow inside loops on XLA:CPU: jax#12868). `--hvp_modes` adds the HVP
with the batch loop unrolled in Python ('python': `make_hvp(..., unroll=True)`, no XLA while loop; for 'lax'
only unless `--python_hvp_for_im2col`). The eigen solve always runs the HVP inside its own while loop.

  .venv/bin/python -m benchmarks.speed.hessian_bench                       # im2col + lax HVP, im2col eigen
  .venv/bin/python -m benchmarks.speed.hessian_bench --conv_impls=lax --hvp_modes=python --eigen_impls=
  .venv/bin/python -m benchmarks.speed.hessian_bench --eigen_impls=im2col,lax --json=/tmp/hessian.json  # hours

Timings: 'first' calls include compilation; HVP steady-state is the median of `--repeats` calls; "CPU" is
process CPU time (all threads), which is less sensitive to other processes on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat import analysis
from fedjax_flat.models.registry import get_model


_CPU = {}


def _timed(fn, key=None):
  """Runs fn, returns (output, wall seconds); with `key`, records process CPU seconds in _CPU[key].

  CPU seconds (all threads of this process) are less sensitive than wall time to other processes sharing
  the machine; on an idle 2-core machine wall ~ CPU / 2 for well-parallelized XLA work.
  """
  c, t = time.process_time(), time.perf_counter()
  out = jax.block_until_ready(fn())
  wall = time.perf_counter() - t
  if key is not None:
    _CPU[key] = time.process_time() - c
  return out, wall


def bench_impl(impl: str, args, x, y, run_eigen: bool) -> dict:
  model = get_model(args.model, args.num_classes, x.shape[1:], conv_impl=impl)
  params = model.init(jax.random.PRNGKey(args.seed), x[:1])
  dim = analysis.param_dim(params)
  batches = analysis.make_fixed_batches(x, y, args.batch_size)
  v = jax.random.normal(jax.random.PRNGKey(1), (dim,), jnp.float32)
  row = {'conv_impl': impl, 'num_params': dim, 'num_examples': int(x.shape[0]),
         'batch_size': args.batch_size}

  eval_fn = analysis.make_eval_fn(model, batches)
  _, row['eval_first_s'] = _timed(lambda: eval_fn(params))
  _, row['eval_s'] = _timed(lambda: eval_fn(params))

  modes = [m for m in args.hvp_modes.split(',') if m]
  if impl == 'im2col' and 'python' in modes and not args.python_hvp_for_im2col:
    modes.remove('python')
  variants = [({'scan': 'hvp', 'python': 'hvp_unrolled'}[m], {'scan': 1, 'python': True}[m]) for m in modes]
  for name, unroll in variants:
    hvp = analysis.make_hvp(model, params, batches, unroll=unroll)
    _, row[f'{name}_first_s'] = _timed(lambda: hvp(v))
    walls, cpus = [], []
    for _ in range(args.repeats):
      walls.append(_timed(lambda: hvp(v), 'hvp')[1])
      cpus.append(_CPU['hvp'])
    row[f'{name}_s'] = float(np.median(walls))
    row[f'{name}_cpu_s'] = float(np.median(cpus))
    print(f'  [{impl}] {name}: first {row[f"{name}_first_s"]:.2f}s, steady {row[f"{name}_s"]:.2f}s '
          f'(cpu {row[f"{name}_cpu_s"]:.2f}s)', flush=True)

  if run_eigen:
    hvp = analysis.make_hvp(model, params, batches)
    (lams, _, iters), row['eigen_s'] = _timed(lambda: analysis.top_eigenpairs_power(
        hvp, dim, args.top_k, num_iters=args.num_iters, tol=args.tol, rng=jax.random.PRNGKey(2),
        return_num_iters=True), 'eigen')
    row['eigen_cpu_s'] = _CPU['eigen']
    row['eigen_hvps'] = int(np.sum(iters))
    row['eigen_s_per_hvp'] = row['eigen_s'] / max(row['eigen_hvps'], 1)
    row['power_iters'] = [int(i) for i in np.asarray(iters)]
    row['eigenvalues'] = [float(e) for e in np.asarray(lams)]
    print(f'  [{impl}] top-{args.top_k}: {row["eigen_s"]:.1f}s (cpu {row["eigen_cpu_s"]:.1f}s) '
          f'for {row["eigen_hvps"]} HVPs, '
          f'eigenvalues {np.round(np.asarray(lams), 4).tolist()}', flush=True)
  return row


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--model', default='cifar_cnn')
  p.add_argument('--num_classes', type=int, default=10)
  p.add_argument('--num_examples', type=int, default=1000)
  p.add_argument('--batch_size', type=int, default=100)
  p.add_argument('--top_k', type=int, default=5)
  p.add_argument('--num_iters', type=int, default=20)
  p.add_argument('--tol', type=float, default=1e-4, help='power-iteration early stop (0 = always num_iters)')
  p.add_argument('--repeats', type=int, default=3, help='steady-state HVP calls (median)')
  p.add_argument('--conv_impls', default='im2col,lax')
  p.add_argument('--eigen_impls', default='im2col', help='conv impls for which the eigen solve is timed')
  p.add_argument('--hvp_modes', default='scan,python',
                 help="standalone HVP variants: 'scan' (lax.scan over batches, what the solvers use) and "
                      "'python' (make_hvp(unroll=True): Python-unrolled batches, no XLA while loop)")
  p.add_argument('--python_hvp_for_im2col', action=argparse.BooleanOptionalAction, default=False,
                 help="also time the 'python' HVP variant for im2col")
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--json', default='', help='write the results to this path')
  args = p.parse_args(argv)

  rng = np.random.RandomState(args.seed)
  x = rng.rand(args.num_examples, 32, 32, 3).astype(np.float32)
  y = rng.randint(0, args.num_classes, args.num_examples).astype(np.int32)
  impls = [s for s in args.conv_impls.split(',') if s]
  eigen_impls = set(s for s in args.eigen_impls.split(',') if s)
  print(f'jax {jax.__version__} on {jax.default_backend()} ({os.cpu_count()} CPUs), model={args.model}, '
        f'{args.num_examples} examples in batches of {args.batch_size}', flush=True)
  rows = [bench_impl(impl, args, x, y, impl in eigen_impls) for impl in impls]

  print()
  print('| conv_impl | params | eval first / steady (s) | HVP first (s) | HVP steady (s) '
        '| HVP steady CPU (s) | HVP unrolled first / steady (s) | top-k power (s) | top-k CPU (s) | HVPs '
        '| s/HVP in loop |')
  print('|---|---|---|---|---|---|---|---|---|---|---|')
  for r in rows:
    unr = (f"{r['hvp_unrolled_first_s']:.2f} / {r['hvp_unrolled_s']:.2f}" if 'hvp_unrolled_s' in r else '-')
    scan = (f"{r['hvp_first_s']:.2f} | {r['hvp_s']:.2f} | {r['hvp_cpu_s']:.2f}" if 'hvp_s' in r else '- | - | -')
    eig = (f"{r['eigen_s']:.1f}", f"{r['eigen_cpu_s']:.1f}", str(r['eigen_hvps']), f"{r['eigen_s_per_hvp']:.2f}") \
        if 'eigen_s' in r else ('-', '-', '-', '-')
    print(f"| {r['conv_impl']} | {r['num_params']:,} | {r['eval_first_s']:.2f} / {r['eval_s']:.2f} "
          f"| {scan} | {unr} | {' | '.join(eig)} |")
  if args.json:
    meta = {'load_average': os.getloadavg(), 'jax': jax.__version__, 'backend': jax.default_backend(),
            'cpus': os.cpu_count(),
            'machine': platform.processor() or platform.machine(), 'args': vars(args)}
    with open(args.json, 'w') as f:
      json.dump({'meta': meta, 'rows': rows}, f, indent=2)
    print(f'wrote {args.json}')


if __name__ == '__main__':
  main()
