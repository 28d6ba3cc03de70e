r"""Client strategies on an accelerator: vmap / chunked / sequential / Python loop / torch peer, with memory.

For the paper CNN and ResNet18-GN at 10 and 100 clients per round (500 synthetic 32x32x3 examples each,
B=64, E=1, SGD lr 0.01 wd 4e-4), one FedAvg round per variant:

  vmap / chunked / sequential   the engine's one-round program (core/engine.py), the backend's default conv
  loop                          a Python loop over clients and batches, one jitted step per batch (FedJAX's
                                default pattern on our stack)
  torch                         the PyTorch reference pattern (benchmarks/speed/peers/torch_peer.py, a subprocess;
                                on the GPU when the installed torch has CUDA, else on the CPU: the row says)

Each (model, clients) group is built, compiled and warmed up, then its variants are timed interleaved
(round-robin, --repeats, median). A variant that fails (e.g. out of memory for vmap of 100 ResNets) is
recorded with its error and the others go on. Memory: for our programs XLA's compiled buffer sizes
(arguments + outputs + temporaries: the program's peak), and the device's peak_bytes_in_use after the group
(GPU; cumulative over the process); for torch its max_memory_allocated on CUDA, else the peer's peak RSS.

  bash benchmarks/speed/accelerator.sh [--smoke] [--out=PREFIX] [--repeats=3] [--peers=auto]
  python -m benchmarks.speed.accelerator ...   (the same)

writes PREFIX.json and PREFIX.md (default benchmarks/speed/accelerator_<backend>). --smoke: tiny sizes (2-3 clients,
8 examples, B=4, 8x8 ResNet inputs, native convs: a check of the script, not a measurement) that run end to
end on a CPU in a few minutes (`--smoke --models=cifar_cnn --clients=3`: well under a minute).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback

import jax

from benchmarks.speed import bench_util

NUM_CLASSES = 100
STRATEGIES = ('vmap', 'chunked', 'sequential')
ALL_VARIANTS = STRATEGIES + ('loop', 'torch')


def _args(argv):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--smoke', action='store_true', help='tiny sizes: checks the script end to end on a CPU')
  ap.add_argument('--models', default='cifar_cnn,resnet18_gn')
  ap.add_argument('--clients', default=None, help='clients per round, comma list (default 10,100; smoke 2,3)')
  ap.add_argument('--examples_per_client', type=int, default=None, help='default 500 (smoke 8)')
  ap.add_argument('--batch', type=int, default=None, help='default 64 (smoke 4)')
  ap.add_argument('--chunk', type=int, default=None, help='clients per chunk of `chunked` (default 10; smoke 2)')
  ap.add_argument('--conv_impl', default=None, help="default 'auto' (smoke: 'lax', faster to compile)")
  ap.add_argument('--variants', default=','.join(ALL_VARIANTS))
  ap.add_argument('--repeats', type=int, default=None, help='default 3 (smoke 1)')
  ap.add_argument('--peers', default='auto', help="'auto' runs the torch row when torch is installed; 'none'")
  ap.add_argument('--out', default=None, help='PREFIX of PREFIX.json / PREFIX.md')
  a = ap.parse_args(argv)
  smoke = a.smoke
  a.clients = [int(c) for c in (a.clients or ('2,3' if smoke else '10,100')).split(',')]
  a.examples_per_client = a.examples_per_client or (8 if smoke else 500)
  a.batch = a.batch or (4 if smoke else 64)
  a.chunk = a.chunk or (2 if smoke else 10)
  a.conv_impl = a.conv_impl or ('lax' if smoke else 'auto')
  a.repeats = a.repeats or (1 if smoke else 3)
  a.models = [m for m in a.models.split(',') if m]
  a.variants = [v for v in a.variants.split(',') if v]
  bad = [v for v in a.variants if v not in ALL_VARIANTS]
  if bad:
    ap.error(f'--variants: unknown {bad}; allowed: {",".join(ALL_VARIANTS)}')
  a.out = a.out or os.path.join(bench_util.SPEED, f'accelerator_{jax.default_backend()}{"_smoke" if smoke else ""}')
  return a


def _input_shape(model, smoke):
  """32x32x3 (CIFAR); smoke runs give every model but the CIFAR CNN (whose fc1 needs 32x32) 8x8x3."""
  return (8, 8, 3) if (smoke and model != 'cifar_cnn') else (32, 32, 3)


def _device_peak():
  stats = jax.devices()[0].memory_stats() if jax.default_backend() != 'cpu' else None
  if stats and 'peak_bytes_in_use' in stats:
    return int(stats['peak_bytes_in_use'])
  return bench_util.protocol.peak_rss_bytes()


def _torch_device():
  try:
    import torch
    return 'cuda' if (jax.default_backend() == 'gpu' and torch.cuda.is_available()) else 'cpu'
  except ImportError:
    return 'cpu'


def run_group(a, model_name, clients, peer_set):
  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.models.registry import get_model
  shape = _input_shape(model_name, a.smoke)
  data = synthetic(clients, a.examples_per_client, input_shape=shape, num_classes=NUM_CLASSES, test_size=1)
  rows, fns = {}, {}
  for v in a.variants:
    if v == 'torch' and peer_set is None:
      continue
    row = rows[v] = {}
    try:
      t = time.perf_counter()
      if v in STRATEGIES:
        cfg = bench_util.round_config(model_name, strategy=v, conv=a.conv_impl, clients=clients, chunk=a.chunk,
                                      batch=a.batch)
        fn, mem = bench_util.engine_round_variant(cfg, data, NUM_CLASSES, compiled_memory=True)
        row.update(mem)
      elif v == 'loop':
        model = get_model(model_name, NUM_CLASSES, shape, conv_impl=a.conv_impl)
        fn, _ = bench_util.python_loop_variant(model, data, clients, batch=a.batch)
      else:
        cfg = bench_util.round_config(model_name, clients=clients, batch=a.batch)
        path = peer_set.write_data(f'{model_name}_{clients}', data)
        dev = _torch_device()
        fn, setup = peer_set.variant('torch', f'{model_name}_{clients}',
                                     bench_util.spec_of(cfg, path, num_classes=NUM_CLASSES, device=dev))
        row['device'] = dev
        row['first_call_s'] = setup['first_round_s']
      if v != 'torch':
        fn()                            # compile (+ first round)
        row['first_call_s'] = time.perf_counter() - t
        fn()
      fns[v] = fn
    except Exception as e:  # an out-of-memory vmap must not stop the other rows
      row['error'] = f'{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ""}'
      traceback.print_exc(limit=2)
      gc.collect()
  times = bench_util.interleave(fns, a.repeats)
  n_ex = clients * a.examples_per_client
  for v, ts in times.items():
    s = statistics.median(ts)
    rows[v].update({'s_per_round': s, 'examples_per_s': n_ex / s, 's_per_round_all': ts})
    if v == 'torch':
      rows[v]['peak_mem_bytes'] = fns[v].last.get('peak_mem_bytes')
  return {'model': model_name, 'clients': clients, 'examples_per_client': a.examples_per_client,
          'input_shape': list(shape), 'batch': a.batch, 'chunk': a.chunk, 'rows': rows,
          'device_peak_bytes_after_group': _device_peak()}


def _markdown(res):
  lines = [f"# Client strategies on {res['device_kind']} ({res['backend']}), jax {res['jax']}", '',
           f"uptime before: {res['uptime'][0]}  ", f"uptime after: {res['uptime'][1]}  ",
           f"{'SMOKE RUN (tiny sizes, not a measurement)  ' if res['smoke'] else ''}", '',
           '| model | clients | variant | examples/s | s/round | x sequential | first call s | program peak MiB |'
           ' note |', '|---|---:|---|---:|---:|---:|---:|---:|---|']
  for g in res['groups']:
    seq = g['rows'].get('sequential', {}).get('examples_per_s')
    for v, r in g['rows'].items():
      mib = (r.get('program_peak_bytes') or r.get('peak_mem_bytes') or 0) / 2**20
      if 'error' in r:
        lines.append(f"| {g['model']} | {g['clients']} | {v} | - | - | - | - | - | {r['error'][:80]} |")
        continue
      x = f"{r['examples_per_s'] / seq:.2f}" if seq else '-'
      note = f"torch on {r['device']}" if v == 'torch' else ''
      lines.append(f"| {g['model']} | {g['clients']} | {v} | {r['examples_per_s']:.1f} | {r['s_per_round']:.3f} | "
                   f"{x} | {r.get('first_call_s', float('nan')):.1f} | {mib:.0f} | {note} |")
  return '\n'.join(lines) + '\n'


def main(argv=None):
  a = _args(argv)
  peers = [p for p in bench_util.resolve_peers(a.peers) if p == 'torch'] if 'torch' in a.variants else []
  info = bench_util.machine_info()
  info['device_kind'] = jax.devices()[0].device_kind
  res = {**info, 'smoke': a.smoke, 'repeats': a.repeats, 'conv_impl': a.conv_impl, 'groups': [],
         'uptime': [bench_util.uptime()], 'gemm_gflops_2048': [bench_util.gemm_gflops()]}
  peer_set = bench_util.PeerSet(peers) if peers else None
  try:
    for m in a.models:
      for c in a.clients:
        print(f'{m}, {c} clients ...', file=sys.stderr, flush=True)
        res['groups'].append(run_group(a, m, c, peer_set))
        jax.clear_caches()
        gc.collect()
  finally:
    if peer_set is not None:
      res['peer_info'] = peer_set.info
      peer_set.close()
  res['uptime'].append(bench_util.uptime())
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  with open(a.out + '.json', 'w') as f:
    json.dump(res, f, indent=2)
  md = _markdown(res)
  with open(a.out + '.md', 'w') as f:
    f.write(md)
  print(md)
  print(f'wrote {a.out}.json and {a.out}.md')
  return res


if __name__ == '__main__':
  main()
