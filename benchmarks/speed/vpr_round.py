r"""One FedVPR client round on this machine at MSLS resolution: compile time, XLA memory, round time, peak memory.

The engine's round program (core/engine.py, one client, `--steps` local steps) running FedAvg with the thesis'
client (Adam lr 1e-5) on `vpr_resnet18` (models/vpr.py: ResNet18 up to its third stage + GeM + L2, base width 64,
GroupNorm: configs/fedvpr.py's model) and the retrieval task's triplet loss with in-batch hard-negative mining
(tasks/retrieval.py: margin 0.1, the 5 hardest of `--candidates` negative candidates, the nearest of 2 positive
candidates). A step sees `--batch` query tuples of 1 + 2 + candidates images of `--size` (H x W; MSLS: 480 x 640).
Synthetic inputs (random images, every slot valid); a fresh init stands in for the ImageNet weights.

`--mining` picks the step's formulation (tasks/retrieval.py `cache_pass`): 'cache' mines from a gradient-free
forward pass over all slots and runs the loss's forward and backward on the 1 + 1 + 5 mined slots only; 'one'
mines inside one forward pass with gradient over every slot; 'both' (default) measures the two in the same
invocation, one after the other (their ratios are the comparable figures under a shared machine's load).

  compile_s      lower + compile of the round program
  xla_temp_gb    XLA's buffer assignment for the compiled program (activations kept for the backward pass,
                 gradients, workspace)
  round_s        wall time of one round after compilation, and per step
  round_est_s    step_s x the thesis' local iterations of a client of `--client_tuples` tuples,
                 min(floor(N_k / B), 2500)
  peak_rss_gb    the process's peak resident memory (ru_maxrss) after the round

A configuration whose XLA temporaries exceed --max_gb is compiled and reported but not run (shared machine).

  PYTHONPATH=. .venv/bin/python -m benchmarks.speed.vpr_round --size=480x640 --batch=4 --candidates=10 --steps=1
  PYTHONPATH=. .venv/bin/python -m benchmarks.speed.vpr_round --size=64x64 --batch=4 --candidates=10 --steps=2
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.speed import bench_util
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.config.default_config import default_config
from fedjax_flat.core import engine
from fedjax_flat.data import batching
from fedjax_flat.models.registry import get_model
from fedjax_flat.tasks import retrieval as ret


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--size', default='480x640')
  ap.add_argument('--batch', type=int, default=4)
  ap.add_argument('--candidates', type=int, default=10)
  ap.add_argument('--positives', type=int, default=2)
  ap.add_argument('--steps', type=int, default=1)
  ap.add_argument('--client_tuples', type=int, default=400, help='N_k for round_est_s')
  ap.add_argument('--max_gb', type=float, default=8.0)
  ap.add_argument('--mining', choices=('both', 'cache', 'one'), default='both')
  ap.add_argument('--json', default='')
  a = ap.parse_args()
  h, w = (int(v) for v in a.size.split('x'))
  t_slots = 1 + a.positives + a.candidates
  model = get_model('vpr_resnet18', 1, (t_slots, h, w, 3), norm='gn', base_width=64, gn_groups=2,
                    conv_impl='auto')
  cfg = default_config().client
  cfg.base_optimizer, cfg.lr, cfg.momentum, cfg.weight_decay = 'adam', 1e-5, 0.0, 0.0
  t0 = time.time()
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, t_slots, h, w, 3)))
  init_s = time.time() - t0
  rng = np.random.default_rng(0)
  kinds = np.array([ret.QUERY] + [ret.POSITIVE] * a.positives + [ret.NEGATIVE] * a.candidates, np.uint8)
  x = rng.integers(0, 256, (1, a.steps, a.batch, t_slots, h, w, 3), dtype=np.uint8)
  out = {'model': 'vpr_resnet18 (width 64, GroupNorm)', 'size': a.size, 'batch': a.batch,
         'images_per_step': a.batch * t_slots, 'steps': a.steps, 'init_s': round(init_s, 1),
         'backend': jax.default_backend(), 'cpus': os.cpu_count(), 'uptime': bench_util.uptime(),
         # load beyond this process's own (one busy core per usable CPU): the timings are then not speed claims
         'measured_under_load': os.getloadavg()[0] > (os.cpu_count() or 1) + 0.5}
  for name in (('cache', 'one') if a.mining == 'both' else (a.mining,)):
    task = ret.Retrieval(margin=0.1, num_negatives=5, cache_pass=name == 'cache')
    alg = fedavg(model, local_lib.make_loss(model, task=task), *client_parts(cfg), optax.sgd(1.0))
    state = alg.server_init(jax.tree_util.tree_map(jnp.copy, params), jax.random.PRNGKey(1))
    batches = {'x': jnp.asarray(x), 'y': jnp.asarray(np.broadcast_to(kinds, (1, a.steps, a.batch, t_slots))),
               'mask': jnp.ones((1, a.steps, a.batch), jnp.float32)}
    fn = engine.make_round_fn(alg, chunk=1, jit=True, donate=True)
    args = (state, batches, None, jax.random.split(jax.random.PRNGKey(2), 1), jnp.ones((1,)),
            jnp.ones((1,), bool), jnp.int32(0))
    run = {'images_with_gradient_per_step': a.batch * (min(2 + 5, t_slots) if name == 'cache' else t_slots),
           **bench_util.compile_and_run_round(fn, args, a.steps, a.max_gb)}
    if 'step_s' in run:
      steps = batching.steps_for_size(a.client_tuples, a.batch, 1, full_batches=True, max_steps=2500)
      run['round_est_s'] = {'client_tuples': a.client_tuples, 'local_iterations': steps,
                            'seconds': round(run['step_s'] * steps, 1)}
    out[f'{name}_pass'] = run
  if a.mining == 'both':
    c, o = out['cache_pass'], out['one_pass']
    for key in ('step_s', 'xla_temp_gb'):
      if c.get(key) and o.get(key):
        out[f'{key}_one_over_cache'] = round(o[key] / c[key], 2)
  bench_util.finish_round_report(out, a.json)


if __name__ == '__main__':
  main()
