"""What stacking a round's uploads costs (server.aggregator other than 'mean') against the streaming mean.

For each cohort C and aggregator, the FedAvg round program (core/engine.make_round_fn, one client at a time: the
CPU default 'sequential') is lowered from abstract inputs and compiled, nothing run; XLA's buffer assignment
(`Compiled.memory_analysis()`) gives the temporaries the program needs beside its arguments and outputs.
`extra_mb` = temp - the streaming mean's temp at the same C; `per_upload` = extra / (C x model bytes): the
copies of the cohort's uploads the aggregator holds at once (the stacked rows, sorted / flattened working copies).
algorithms/wrappers/robust.STACK_COPIES (the refusal's estimate) must stay at or above the measured ratio.

Model: the MLP on 28x28x1 inputs with one hidden layer of --hidden units (hidden=512: 407,050 parameters,
1.55 MB float32), 2 local steps of batch 8.

  .venv/bin/python -m benchmarks.speed.aggregation_memory                      # C = 10, 50, 200
  .venv/bin/python -m benchmarks.speed.aggregation_memory --cohorts=10,100 --hidden=2048 --json=/tmp/agg_mem.json
"""
from __future__ import annotations

import argparse
import json
import platform

import jax
import jax.numpy as jnp

from fedjax_flat.aggregators import AGGREGATORS
from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.wrappers import robust
from fedjax_flat.config.default_config import default_config
from fedjax_flat.core import engine
from fedjax_flat.models.registry import get_model

STEPS, BATCH, SHAPE, CLASSES = 2, 8, (28, 28, 1), 10


def measure(aggregator: str, cohort: int, hidden: int) -> dict:
  c = default_config()
  c.dataset, c.model, c.algorithm = 'synthetic', 'mlp', 'fedavg'
  c.server.aggregator = aggregator
  c.server.krum_f = 1
  model = get_model('mlp', CLASSES, SHAPE, hidden=(hidden,))
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1,) + SHAPE)))
  alg = registry.build_algorithm(c, model)
  fn = engine.make_round_fn(alg, chunk=1)
  state = jax.eval_shape(lambda p: alg.server_init(p, jax.random.key(1)), params)
  sds = jax.ShapeDtypeStruct
  batches = {'x': sds((cohort, STEPS, BATCH) + SHAPE, jnp.float32), 'y': sds((cohort, STEPS, BATCH), jnp.int32),
             'mask': sds((cohort, STEPS, BATCH), jnp.float32)}
  rngs = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), cohort))
  compiled = fn.lower(state, batches, None, rngs, sds((cohort,), jnp.float32), sds((cohort,), bool),
                      sds((), jnp.int32)).compile()
  ma = compiled.memory_analysis()
  model_bytes = robust.stacked_bytes(1, params)
  return {'aggregator': aggregator, 'cohort': cohort, 'params': sum(int(a.size) for a in jax.tree_util.tree_leaves(
      params)), 'model_mb': model_bytes / 2**20, 'stack_mb': cohort * model_bytes / 2**20,
      'temp_mb': ma.temp_size_in_bytes / 2**20, 'args_mb': ma.argument_size_in_bytes / 2**20,
      'out_mb': ma.output_size_in_bytes / 2**20}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--cohorts', default='10,50,200')
  ap.add_argument('--aggregators', default=','.join(AGGREGATORS))
  ap.add_argument('--hidden', type=int, default=512)
  ap.add_argument('--json', default='')
  a = ap.parse_args()
  rows = []
  for cohort in [int(x) for x in a.cohorts.split(',')]:
    base = None
    for agg in a.aggregators.split(','):
      r = measure(agg, cohort, a.hidden)
      if agg == 'mean':
        base = r['temp_mb']
      if base is not None:
        r['extra_mb'] = r['temp_mb'] - base
        r['per_upload'] = r['extra_mb'] / r['stack_mb']
      rows.append(r)
      print(f"C={cohort:4d} {agg:17s} temp {r['temp_mb']:9.1f} MB  stack C x model {r['stack_mb']:8.1f} MB  "
            + (f"extra over mean {r['extra_mb']:8.1f} MB = {r['per_upload']:.2f} x stack" if 'extra_mb' in r else ''),
            flush=True)
  out = {'backend': jax.default_backend(), 'machine': platform.processor() or platform.machine(),
         'jax': jax.__version__, 'hidden': a.hidden, 'stack_copies_estimate': robust.STACK_COPIES, 'rows': rows}
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(out, f, indent=1)


if __name__ == '__main__':
  main()
