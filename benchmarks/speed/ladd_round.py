r"""One LADD client round on this machine: compile time, XLA memory, round time, peak memory.

The round program of the engine (core/engine.py, one client, `--steps` local steps of `--batch` crops of `--crop`)
running LADD (algorithms/ladd.py: self-training with the cluster teacher's pseudo-labels + lambda_KD x KD to the
frozen pre-trained model, i.e. one backward and three forward passes per step; `--clusters` clusters, classifier
cluster-specific) with client SGD momentum 0.9, on `--model` (the release's `deeplabv3_mobilenetv2`, 19 classes;
or `seg_cnn`). The release's crop is 512 x 1024 (H x W), batch 16. Synthetic inputs (random images); the
params are a fresh init standing in for the pre-trained model.

  compile_s      lower + compile of the round program
  xla_temp_gb    XLA's buffer assignment for the compiled program (temporaries: activations kept for the
                 backward pass, gradients, workspace)
  round_s        wall time of one round after compilation, and per step
  peak_rss_gb    the process's peak resident memory (ru_maxrss) after the round

A configuration whose XLA temporaries exceed --max_gb is compiled and reported but not run (shared machine).

  PYTHONPATH=. .venv/bin/python -m benchmarks.speed.ladd_round --crop=512x1024 --batch=2 --steps=1
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
from fedjax_flat.algorithms import ladd
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.config.default_config import default_config
from fedjax_flat.core import engine
from fedjax_flat.core.batch_stats import average_batch_stats
from fedjax_flat.models.registry import get_model


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--crop', default='512x1024')
  ap.add_argument('--batch', type=int, default=2)
  ap.add_argument('--steps', type=int, default=1)
  ap.add_argument('--model', default='deeplabv3_mobilenetv2')
  ap.add_argument('--clusters', type=int, default=4)
  ap.add_argument('--lambda_kd', type=float, default=20.0)
  ap.add_argument('--max_gb', type=float, default=10.0)
  ap.add_argument('--json', default='')
  a = ap.parse_args()
  h, w = (int(v) for v in a.crop.split('x'))
  kw = {'width': 16} if a.model == 'seg_cnn' else {}
  model = get_model(a.model, 19, (h, w, 3), **kw)
  cfg = default_config().client
  cfg.lr, cfg.momentum, cfg.weight_decay = 0.01, 0.9, 0.0
  t0 = time.time()
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, h, w, 3)))
  init_s = time.time() - t0
  server_tx = average_batch_stats(optax.sgd(1.0)) if model.batch_stats else optax.sgd(1.0)
  alg = ladd.ladd(model, *client_parts(cfg), server_tx,
                  num_clusters=a.clusters, pretrained=params, cluster_layers='cls', lambda_kd=a.lambda_kd)
  state = alg.server_init(params, jax.random.PRNGKey(1))
  rng = np.random.default_rng(0)
  batches = {'x': jnp.asarray(rng.normal(0, 1, (1, a.steps, a.batch, h, w, 3)).astype(np.float32)),
             'y': jnp.zeros((1, a.steps, a.batch, h, w), jnp.uint8),
             'mask': jnp.ones((1, a.steps, a.batch), jnp.float32)}
  fn = engine.make_round_fn(alg, chunk=1, jit=True, donate=True)
  args = (state, batches, ladd.initial_client_states(np.array([1])), jax.random.split(jax.random.PRNGKey(2), 1),
          jnp.ones((1,)), jnp.ones((1,), bool), jnp.int32(0))
  out = {'model': a.model, 'crop': a.crop, 'batch': a.batch, 'steps': a.steps, 'clusters': a.clusters,
         'init_s': round(init_s, 1), **bench_util.compile_and_run_round(fn, args, a.steps, a.max_gb),
         'backend': jax.default_backend(), 'cpus': os.cpu_count(), 'uptime': bench_util.uptime()}
  bench_util.finish_round_report(out, a.json)


if __name__ == '__main__':
  main()
