r"""The paper CIFAR-100 CNN's client step on CPU, per lowering, against the PyTorch reference step.

One command, every variant in one process, timed interleaved (round-robin, `--repeats` times, median), so
the machine's speed drift hits them alike:

  torch                  the FedSAM reference pattern: the same CNN in torch (NCHW, oneDNN convs), torch SGD
                         with weight decay; SAM as the reference minimizer (ascent step, second grad, restore)
  <conv>+<pool>          ours: the library's CifarCNN (models/cnn.py) with `conv_impl`/`pool_impl`, the
                         library's loss and client optimizer (algorithms/local.py, optimizers/client.py),
                         `--steps` local steps in one `lax.scan`, as the engine runs them

Each call runs `--steps` steps of B=64 (SGD with weight decay 4e-4, lr 0.01; SAM rho 0.05). Reported:
examples/s, ratio to torch, model GFLOP/s (analytic: forward + 2x backward, no input gradient for the first
conv; SAM counts two passes) and the fp32 GEMM rate of the machine (2048^3 through XLA) as the ceiling.

  .venv/bin/python -m benchmarks.speed.cnn_step [--repeats=7] [--steps=8] [--opts=sgd,sam]
      [--variants=im2col+reshape,im2col+lax,lax+lax] [--no_torch] [--json=PATH]

`lax+lax` (native conv, reduce_window pool) inside a scan hits jax#12868 (10-20x slower): it is left out of
the default variants; name it in --variants to see it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.speed.bench_util import cpu_model, gemm_gflops
from fedjax_flat.algorithms.local import LocalState, local_step, make_loss
from fedjax_flat.core import engine
from fedjax_flat.models.registry import get_model
from fedjax_flat.models.layers import resolve_conv_impl, resolve_pool_impl
from fedjax_flat.optimizers.client import make_client_tx
from fedjax_flat.config.default_config import default_config

B, NUM_CLASSES, LR, WD, RHO = 64, 100, 0.01, 4e-4, 0.05


def model_flops_per_example() -> float:
  """Forward + backward FLOPs of one example (backward = 2x forward, minus conv1's input gradient)."""
  conv1 = 2 * 28 * 28 * 64 * (5 * 5 * 3)
  conv2 = 2 * 10 * 10 * 64 * (5 * 5 * 64)
  dense = 2 * (1600 * 384 + 384 * 192 + 192 * NUM_CLASSES)
  fwd = conv1 + conv2 + dense
  return 3 * fwd - conv1


def make_data(steps, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((steps, B, 32, 32, 3)).astype(np.float32)
  y = rng.integers(0, NUM_CLASSES, (steps, B)).astype(np.int32)
  return x, y


def local_steps(model, opt: str, lr: float, wd: float, rho: float, batch: int, batch1: bool = False):
  """One client's local steps as the engine runs them: the library's loss and client optimizer, `local_step` in one
  `lax.scan` over [steps, batch, ...] inputs; returns the jitted fn(params, xs, ys) -> the final params.
  batch1: each step under a vmap over an axis of size 1, as the engine's one-client CPU path runs it
  (core/engine.under_batch1); off, the plain scan of the earlier kernel tables."""
  loss_fn = make_loss(model)
  cfg = default_config().client
  cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.rho, cfg.momentum = opt, lr, wd, rho, 0.0
  hp = {'lr': jnp.float32(lr), 'rho': jnp.float32(rho)}

  @jax.jit
  def run(params, xs, ys):
    tx = make_client_tx(cfg, hp)
    local = LocalState(params, tx.init(params), params)

    def step(local, b):
      return local_step(local, b, None, loss_fn=loss_fn, tx=tx)[0]

    def body(local, b):
      b = {'x': b[0], 'y': b[1], 'mask': jnp.ones((batch,), jnp.float32)}
      return (engine.under_batch1(step) if batch1 else step)(local, b), None
    return jax.lax.scan(body, local, (xs, ys))[0].params
  return run


def jax_variant(variant: str, opt: str, x, y):
  conv, pool, *rest = variant.split('+')     # a third part 'fused': ReLU and pool as one op
  model = get_model('cifar_cnn', NUM_CLASSES, (32, 32, 3), conv_impl=conv, pool_impl=pool,
                    fused_relu_pool=rest == ['fused'])
  params = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  run = local_steps(model, opt, LR, WD, RHO, B)
  xs, ys = jnp.asarray(x), jnp.asarray(y)
  return lambda: jax.block_until_ready(run(params, xs, ys))


def torch_variant(opt: str, x, y, threads=None):
  """The torch reference step (benchmarks/speed/peers/torch_peer.py), in this process."""
  import torch       # optional (the `peers` extra): imported only when the torch row runs

  from benchmarks.speed.peers import torch_peer
  if threads:
    torch.set_num_threads(threads)
  torch.manual_seed(0)
  net = torch_peer.build_net('cifar_cnn', NUM_CLASSES, (32, 32, 3))
  sgd = torch.optim.SGD(net.parameters(), lr=LR, weight_decay=WD)
  xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3)))
  yt = torch.from_numpy(y.astype(np.int64))
  rho = RHO if opt == 'sam' else 0.0

  def run():
    for s in range(xt.shape[0]):
      torch_peer.local_step(net, sgd, xt[s], yt[s], rho)
  return run


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--repeats', type=int, default=7)
  ap.add_argument('--steps', type=int, default=8, help='local steps per timed call (one lax.scan)')
  ap.add_argument('--opts', default='sgd,sam')
  ap.add_argument('--variants', default='im2col+reshape,im2col+lax',
                  help='conv_impl+pool_impl pairs; the model default is auto+auto')
  ap.add_argument('--no_torch', action='store_true')
  ap.add_argument('--torch_threads', type=int, default=0, help='0: torch default')
  ap.add_argument('--json', default=None)
  args = ap.parse_args(argv)

  x, y = make_data(args.steps)
  opts = [o for o in args.opts.split(',') if o]
  variants = [v for v in args.variants.split(',') if v]
  default = f"{resolve_conv_impl('auto')}+{resolve_pool_impl('auto')}"
  fns = {}
  for opt in opts:
    if not args.no_torch:
      fns[(opt, 'torch')] = torch_variant(opt, x, y, args.torch_threads)
    for v in variants:
      fns[(opt, v)] = jax_variant(v, opt, x, y)
  compile_s = {}
  for k, fn in fns.items():   # compile + warm-up
    t = time.perf_counter()
    fn()
    compile_s[k] = time.perf_counter() - t
    fn()
  gemm = gemm_gflops()
  uptime_before = subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()
  times = {k: [] for k in fns}
  for _ in range(args.repeats):
    for k, fn in fns.items():
      t = time.perf_counter()
      fn()
      times[k].append(time.perf_counter() - t)
  uptime_after = subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()
  gemm_after = gemm_gflops()

  n_ex = args.steps * B
  flops = model_flops_per_example()
  rows = {}
  for (opt, v), ts in times.items():
    eps = n_ex / statistics.median(ts)
    passes = 2 if opt == 'sam' else 1
    rows.setdefault(opt, {})[v] = {
        'examples_per_s': eps, 'gflops': eps * flops * passes / 1e9,
        's_per_call_median': statistics.median(ts), 's_per_call_all': ts, 'first_call_s': compile_s[(opt, v)]}
  for opt, r in rows.items():
    if 'torch' in r:
      for v in r:
        r[v]['ratio_vs_torch'] = r[v]['examples_per_s'] / r['torch']['examples_per_s']

  cpu = cpu_model()
  print(f'CPU {cpu} x{os.cpu_count()}, jax {jax.__version__}, fp32 GEMM 2048^3: {gemm:.0f} / {gemm_after:.0f} '
        f'GFLOP/s (before / after); {args.steps} steps x B={B} per call; default lowering {default}')
  print(f'uptime before: {uptime_before}\nuptime after:  {uptime_after}')
  print(f"{'opt':<5}{'variant':<26}{'examples/s':>12}{'x torch':>9}{'GFLOP/s':>9}{'% GEMM':>8}{'first call s':>14}")
  for opt, r in rows.items():
    for v, m in r.items():
      mark = ' (default)' if v == default else ''
      print(f"{opt:<5}{(v + mark):<26}{m['examples_per_s']:>12.1f}{m.get('ratio_vs_torch', float('nan')):>9.3f}"
            f"{m['gflops']:>9.1f}{100 * m['gflops'] / gemm:>7.0f}%{m['first_call_s']:>14.1f}")
  res = {'cpu': cpu, 'cpus': os.cpu_count(), 'jax': jax.__version__, 'gemm_gflops_2048': [gemm, gemm_after],
         'uptime': [uptime_before, uptime_after], 'steps_per_call': args.steps, 'batch': B,
         'model_flops_per_example_sgd': flops, 'default_variant': default, 'results': rows,
         'xla_flags': os.environ.get('XLA_FLAGS', '')}
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(res, f, indent=2)
  return res


if __name__ == '__main__':
  main()
