r"""How much slower a round is than its local steps alone (issue 12 section 3: round-level overhead).

The paper CIFAR round (10 clients x 500 synthetic examples, B=64, E=1: 8 steps a client, the last one 52 of
64 valid) three ways, timed interleaved in one process (round-robin, `--repeats`, median):

  steps     the model's work alone: one jitted `lax.scan` of `local_step` over the same 10 x 8 batches, all
            full (no masks, no client boundaries, no aggregation): benchmarks/speed/cnn_step.py's program
  round     the engine's one-round program, default strategy (sequential on CPU), batches built beforehand
  trainer   `Trainer.train` one round per call (default path: sampling, batch gather, round in one program)

Overhead = time(round) / time(steps) - 1, per computed example (both compute 10 x 8 x 64 examples; 12 x 10
of them are padding in the round), in wall time and in this process's CPU time (steadier on a shared
machine). `--profile=DIR` also traces one call of `steps` and of `round` (jax.profiler, perfetto) and prints
the XLA ops that take the time.

  python -m benchmarks.speed.round_overhead [--repeats=5] [--opts=sgd,sam] [--json=PATH] [--profile=DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from absl import logging  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.speed import bench_util  # noqa: E402
from benchmarks.speed import cnn_step  # noqa: E402
from fedjax_flat.data import batching  # noqa: E402
from fedjax_flat.data.sources.builtin import synthetic  # noqa: E402
from fedjax_flat.models.layers import resolve_conv_impl, resolve_pool_impl  # noqa: E402
from fedjax_flat.training import trainers  # noqa: E402

NUM_CLASSES = 100


def _top_ops(trace_dir, top=40):
  """(op name, total ms, share) of the XLA ops in a jax.profiler perfetto trace, largest first."""
  import glob
  import gzip
  files = glob.glob(os.path.join(trace_dir, '**', 'perfetto_trace.json.gz'), recursive=True)
  if not files:
    return []
  with gzip.open(files[0]) as f:
    events = json.load(f)
  events = events.get('traceEvents', events) if isinstance(events, dict) else events
  tot = {}
  for ev in events:
    if ev.get('ph') == 'X' and 'dur' in ev and not ev.get('name', '').startswith(('$', 'Thunk', 'jit_')):
      tot[ev['name']] = tot.get(ev['name'], 0.0) + ev['dur'] / 1e3
  total = sum(tot.values()) or 1.0
  return [(k, v, v / total) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:top]]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--opts', default='sgd,sam')
  ap.add_argument('--clients', type=int, default=10)
  ap.add_argument('--examples_per_client', type=int, default=500)
  ap.add_argument('--json', default=None)
  ap.add_argument('--profile', default=None, help='write a jax.profiler trace of steps and round here; top ops')
  a = ap.parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  n, e = a.clients, a.examples_per_client
  data = synthetic(n, e, input_shape=(32, 32, 3), num_classes=NUM_CLASSES, test_size=1)
  s = batching.padded_num_steps(data.client_sizes(), cnn_step.B)
  rb = batching.make_round_batches(data, range(n), round_idx=0, seed=0, batch_size=cnn_step.B, num_steps=s)
  # The same images as the round's batches, every batch full (the padding rows get real examples).
  x = np.asarray(rb.x).reshape((n * s, cnn_step.B) + rb.x.shape[3:])
  y = np.asarray(rb.y).reshape((n * s, cnn_step.B))
  y = np.where(y < 0, 0, y).astype(np.int32)
  lowering = f"{resolve_conv_impl('auto')}+{resolve_pool_impl('auto')}"
  fns = {}
  for opt in [o for o in a.opts.split(',') if o]:
    step_fn = cnn_step.jax_variant(lowering, opt, x, y)

    def steps(f=step_fn):
      t = time.perf_counter()
      f()
      return time.perf_counter() - t
    fns[(opt, 'steps')] = steps
    fns[(opt, 'round')], _ = bench_util.engine_round_variant(
        bench_util.round_config('cifar_cnn', opt, clients=n), data, NUM_CLASSES)
    c = bench_util.round_config('cifar_cnn', opt, clients=n)
    c.rounds = c.eval_every = 1 + 4 * (a.repeats + 4)
    t = trainers.make_trainer(c, None, data=data, write_files=False)
    bench_util.training_only(t)

    def trainer(t=t):
      t0 = time.perf_counter()
      t.train(num_rounds=1)
      jax.block_until_ready(t.server_state)
      return time.perf_counter() - t0
    fns[(opt, 'trainer')] = trainer
  for fn in fns.values():   # compile + warm up
    fn()
    fn()
  up = [bench_util.uptime()]
  cpu = {}
  times = bench_util.interleave(fns, a.repeats, cpu_times=cpu)
  up.append(bench_util.uptime())
  med = {k: statistics.median(v) for k, v in times.items()}
  cmed = {k: statistics.median(v) for k, v in cpu.items()}
  computed = n * s * cnn_step.B
  res = {**bench_util.machine_info(), 'uptime': up, 'clients': n, 'examples_per_client': e, 'steps_per_client': s,
         'lowering': lowering, 'results': {}}
  print(f'uptime before: {up[0]}\nuptime after:  {up[1]}')
  print(f"{'opt':<5}{'variant':<9}{'s/round':>9}{'ex/s (computed)':>17}{'x steps':>9}{'cpu s':>9}{'cpu x steps':>13}")
  for (opt, v), m in med.items():
    r = res['results'].setdefault(opt, {})
    cm = cmed[(opt, v)]
    r[v] = {'s': m, 's_all': times[(opt, v)], 'computed_examples_per_s': computed / m,
            'valid_examples_per_s': n * e / m, 'overhead_vs_steps': m / med[(opt, 'steps')] - 1,
            'cpu_s': cm, 'cpu_s_all': cpu[(opt, v)], 'cpu_overhead_vs_steps': cm / cmed[(opt, 'steps')] - 1}
    print(f"{opt:<5}{v:<9}{m:>9.3f}{computed / m:>17.1f}{m / med[(opt, 'steps')]:>9.3f}{cm:>9.2f}"
          f"{cm / cmed[(opt, 'steps')]:>13.3f}")
  if a.profile:
    res['profile'] = {}
    for (opt, v), fn in fns.items():
      if v == 'trainer':
        continue
      d = os.path.join(a.profile, f'{opt}_{v}')
      with jax.profiler.trace(d, create_perfetto_trace=True):
        fn()
      res['profile'][f'{opt}/{v}'] = top = _top_ops(d)
      print(f'\n{opt} {v}: XLA ops by total time (perfetto trace in {d})')
      for name, ms, share in top[:15]:
        print(f'  {ms:9.1f} ms {100 * share:5.1f}%  {name}')
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(res, f, indent=2)
  return res


if __name__ == '__main__':
  main()
