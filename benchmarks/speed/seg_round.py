r"""One Cityscapes-sized client round of BiSeNetV2 on this machine: compile time, step time, peak memory.

The round program of the engine (core/engine.py: one client, `--steps` local steps of `--batch` crops of
`--crop`, FedAvg with client SGD momentum or SAM, the FedDrive loss: OHEM 25% + 4 booster heads), BiSeNetV2
(FedDrive variant, BatchNorm, 19 classes) with or without rematerialisation (`model_kwargs.remat`:
jax.checkpoint around every block) and with `client.microbatches` k (each batch as k micro-batches in a
checkpointed scan). Each configuration runs in its own subprocess:

  compile_s      lower + compile of the round program
  xla_temp_gb    XLA's buffer assignment for the compiled program (`Compiled.memory_analysis()`): temporaries
                 (activations kept for the backward pass, gradients, workspace); + args / outputs: what one
                 accelerator needs for the round, independent of the host
  round_s        wall time of one round after compilation (the first call), and per step
  peak_rss_gb    the process's peak resident memory (ru_maxrss) after the round

A configuration whose XLA temporaries exceed --max_gb is compiled and reported but not run (the machine is
shared). Synthetic inputs (random images, random labels with 10% void).

  .venv/bin/python -m benchmarks.speed.seg_round --crop=512x1024 --batch=8 --steps=2 --remat=0,1 --json=/tmp/s.json
  .venv/bin/python -m benchmarks.speed.seg_round --crop=128x256 --batch=2 --steps=2 --variants=im2col:1,lax:1,im2col:2
      (interleaved step times of several variants in one process: the ratios)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from benchmarks.paths import REPO


def worker(a) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from fedjax_flat.tasks import segmentation as seg_tasks
  from fedjax_flat.algorithms import registry as alg_registry
  from fedjax_flat.core import engine
  from fedjax_flat.models import registry as model_registry
  from fedjax_flat.config.default_config import default_config

  h, w = (int(v) for v in a.crop.split('x'))
  c = default_config()
  c.model = 'bisenetv2'
  c.client.optimizer, c.client.rho = a.optimizer, 0.01
  c.client.lr, c.client.momentum, c.client.weight_decay = 0.05, 0.9, 5e-4
  c.client.microbatches = a.microbatches
  m = model_registry.get_model('bisenetv2', 19, (h, w, 3), norm=a.norm, remat=bool(int(a.remat)),
                               conv_impl=a.conv_impl)
  task = seg_tasks.Segmentation()
  alg = alg_registry.build_algorithm(c, m, task=task)
  t0 = time.time()
  params = m.init(jax.random.key(0), jnp.zeros((1, h, w, 3)))
  init_s = time.time() - t0
  state = alg.server_init(params, jax.random.key(1))
  rng = np.random.default_rng(0)
  x = rng.normal(0, 1, (1, a.steps, a.batch, h, w, 3)).astype(np.float32)
  y = rng.integers(0, 19, (1, a.steps, a.batch, h, w)).astype(np.int32)
  y[rng.random(y.shape) < 0.1] = 255
  batches = {'x': jnp.asarray(x), 'y': jnp.asarray(y), 'mask': jnp.ones((1, a.steps, a.batch), jnp.float32)}
  del x, y
  fn = engine.make_round_fn(alg, chunk=1, unroll=True if a.unroll else 1, jit=True, donate=True)
  args = (state, batches, None, jax.random.split(jax.random.key(2), 1), jnp.ones((1,)), jnp.ones((1,), bool),
          jnp.int32(0))
  t0 = time.time()
  compiled = fn.lower(*args).compile()
  compile_s = time.time() - t0
  out = {'crop': a.crop, 'batch': a.batch, 'steps': a.steps, 'remat': bool(int(a.remat)), 'norm': a.norm,
         'optimizer': a.optimizer, 'conv_impl': a.conv_impl, 'unroll': bool(a.unroll),
         'microbatches': a.microbatches, 'init_s': init_s, 'compile_s': compile_s,
         'backend': jax.default_backend()}
  try:
    ma = compiled.memory_analysis()
    out['xla_temp_gb'] = ma.temp_size_in_bytes / 2**30
    out['xla_args_gb'] = ma.argument_size_in_bytes / 2**30
    out['xla_output_gb'] = ma.output_size_in_bytes / 2**30
  except Exception as e:  # noqa: BLE001 -- not every backend reports it
    out['xla_memory_analysis'] = f'unavailable: {e}'
  out['peak_rss_gb_after_compile'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  if out.get('xla_temp_gb', 0) > a.max_gb:
    out['skipped'] = f'XLA temporaries {out["xla_temp_gb"]:.1f} GB > --max_gb {a.max_gb}'
    return out
  t0 = time.time()
  res = compiled(*args)
  jax.block_until_ready(res)
  out['round_s'] = time.time() - t0
  out['step_s'] = out['round_s'] / a.steps
  out['loss'] = float(np.sum(np.asarray(res[2]['loss_sum'])) / max(float(np.sum(np.asarray(res[2]['count']))), 1))
  out['peak_rss_gb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  return out


def interleaved(a) -> dict:
  """Step time of several variants (--variants conv_impl:microbatches,...) compiled in ONE process, then run
  alternately --repeats times: the machine's load drift hits them alike, so the ratios are meaningful."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from fedjax_flat.tasks import segmentation as seg_tasks
  from fedjax_flat.algorithms import registry as alg_registry
  from fedjax_flat.core import engine
  from fedjax_flat.models import registry as model_registry
  from fedjax_flat.config.default_config import default_config

  h, w = (int(v) for v in a.crop.split('x'))
  rng = np.random.default_rng(0)
  x = rng.normal(0, 1, (1, a.steps, a.batch, h, w, 3)).astype(np.float32)
  y = rng.integers(0, 19, (1, a.steps, a.batch, h, w)).astype(np.int32)
  batches = {'x': jnp.asarray(x), 'y': jnp.asarray(y), 'mask': jnp.ones((1, a.steps, a.batch), jnp.float32)}
  runs = {}
  for v in a.variants.split(','):
    impl, k = v.split(':')
    c = default_config()
    c.client.lr, c.client.momentum, c.client.microbatches = 0.05, 0.9, int(k)
    m = model_registry.get_model('bisenetv2', 19, (h, w, 3), conv_impl=impl)
    alg = alg_registry.build_algorithm(c, m, task=seg_tasks.Segmentation())
    state = alg.server_init(m.init(jax.random.key(0), jnp.zeros((1, h, w, 3))), jax.random.key(1))
    fn = engine.make_round_fn(alg, chunk=1, jit=True, donate=False)
    args = (state, batches, None, jax.random.split(jax.random.key(2), 1), jnp.ones((1,)), jnp.ones((1,), bool),
            jnp.int32(0))
    compiled = fn.lower(*args).compile()
    jax.block_until_ready(compiled(*args))           # warm-up
    runs[v] = (compiled, args, [])
  for _ in range(a.repeats):
    for v, (compiled, args, times) in runs.items():
      t0 = time.time()
      jax.block_until_ready(compiled(*args))
      times.append((time.time() - t0) / a.steps)
  med = {v: float(np.median(t)) for v, (_, _, t) in runs.items()}
  base = a.variants.split(',')[0]
  return {'crop': a.crop, 'batch': a.batch, 'steps': a.steps, 'repeats': a.repeats,
          'uptime': os.popen('uptime').read().strip(),
          'step_s_median': med, 'ratio_to_first': {v: med[v] / med[base] for v in med},
          'step_s_all': {v: t for v, (_, _, t) in runs.items()}}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--crop', default='512x1024')
  ap.add_argument('--batch', type=int, default=8)
  ap.add_argument('--steps', type=int, default=2)
  ap.add_argument('--remat', default='0,1')
  ap.add_argument('--norm', default='bn')
  ap.add_argument('--optimizer', default='sgd')
  ap.add_argument('--conv_impl', default='auto', help="'auto' = im2col on CPU (lax: XLA:CPU's slow conv gradient)")
  ap.add_argument('--unroll', type=int, default=0, help='1: unroll the scan over local steps (engine.unroll)')
  ap.add_argument('--microbatches', default='1', help='client.microbatches, a comma list: one run each')
  ap.add_argument('--max_gb', type=float, default=10.0)
  ap.add_argument('--json', default='')
  ap.add_argument('--worker', action='store_true')
  ap.add_argument('--variants', default='', help='interleaved timing: conv_impl:microbatches,... in one process')
  ap.add_argument('--repeats', type=int, default=3)
  a = ap.parse_args()
  if a.variants:
    r = interleaved(a)
    print(json.dumps(r, indent=2))
    if a.json:
      with open(a.json, 'w') as f:
        json.dump(r, f, indent=2)
    return
  if a.worker:
    a.microbatches = int(a.microbatches)
    print('RESULT ' + json.dumps(worker(a)), flush=True)
    return
  results = []
  for remat, k in [(r, k) for r in a.remat.split(',') for k in a.microbatches.split(',')]:
    cmd = [sys.executable, '-m', 'benchmarks.speed.seg_round', '--worker', f'--crop={a.crop}', f'--batch={a.batch}',
           f'--steps={a.steps}',
           f'--remat={remat}', f'--norm={a.norm}', f'--optimizer={a.optimizer}', f'--conv_impl={a.conv_impl}',
           f'--max_gb={a.max_gb}', f'--unroll={a.unroll}', f'--microbatches={k}']
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'PYTHONPATH': REPO}, cwd=REPO)
    line = [l for l in p.stdout.splitlines() if l.startswith('RESULT ')]
    r = json.loads(line[-1][7:]) if line else {'remat': remat, 'error': p.stderr[-2000:]}
    print(json.dumps(r), flush=True)
    results.append(r)
  if a.json:
    with open(a.json, 'w') as f:
      json.dump({'uptime': os.popen('uptime').read().strip(), 'results': results}, f, indent=2)


if __name__ == '__main__':
  main()
