r"""Client strategies on an accelerator: vmap / chunked / sequential / Python loop / torch peer, with memory.

For the paper CNN and ResNet18-GN at 10 and 100 clients per round (500 synthetic 32x32x3 examples each,
B=64, E=1, SGD lr 0.01 wd 4e-4), one FedAvg round per variant:

  vmap / chunked / sequential   the engine's one-round program (core/engine.py), the backend's default conv
  loop                          a Python loop over clients and batches, one jitted step per batch (FedJAX's
                                default pattern on our stack)
  torch                         the PyTorch reference pattern (benchmarks/speed/peers/torch_peer.py, a subprocess;
                                on the GPU when the installed torch has CUDA, else on the CPU: the row says)

and pfl-research's CIFAR10 protocol (configs/pfl_cifar10.py, benchmarks/pfl_cifar10.py: 1000 users x 50, 50 per
round, B=10, 5 steps, the pfl CNN with dropout, lr 0.1, unweighted averaging), where per-step overhead decides:

  vmap / chunked / sequential   the engine's one-round program on the first cohort's batches
  trainer                       ours as a user runs it (loop.Trainer of the config: engine 'auto',
                                rounds_per_call 'auto'), K rounds per timed call
  torch                         the torch peer with the protocol (nn.Dropout, unweighted average)

Each (model, clients) group is built, compiled and warmed up, then its variants are timed interleaved
(round-robin, --repeats, median). A variant that fails (e.g. out of memory for vmap of 100 ResNets) is
recorded with its error and the others go on. Memory: for our programs XLA's compiled buffer sizes
(arguments + outputs + temporaries: the program's peak), and the device's peak_bytes_in_use after the group
(GPU; cumulative over the process); for torch its max_memory_allocated on CUDA, else the peer's peak RSS.

  bash benchmarks/speed/accelerator.sh [--smoke] [--out=PREFIX] [--repeats=3] [--peers=auto] [--protocols=paper,pfl]
  python -m benchmarks.speed.accelerator ...   (the same)

writes PREFIX.json and PREFIX.md (default benchmarks/speed/accelerator_<backend>). --smoke: tiny sizes (2-3 clients,
8 examples, B=4, 8x8 ResNet inputs, native convs; pfl: 40 users x 20 of 8x8, 4 per round, B=4: a check of the
script, not a measurement) that run end to end on a CPU in a few minutes (`--smoke --models=cifar_cnn
--clients=3 --protocols=paper`: well under a minute).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import traceback
import types

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

import jax  # noqa: E402

from benchmarks.speed import bench_util  # noqa: E402
from benchmarks.speed import pfl_cifar10  # noqa: E402

NUM_CLASSES = 100
STRATEGIES = ('vmap', 'chunked', 'sequential')
ALL_VARIANTS = STRATEGIES + ('loop', 'torch')
PROTOCOLS = ('paper', 'pfl')
PFL_VARIANTS = STRATEGIES + ('trainer', 'torch')


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
  ap.add_argument('--protocols', default=','.join(PROTOCOLS),
                  help='paper: --models x --clients groups; pfl: the pfl-research CIFAR10 protocol group')
  ap.add_argument('--pfl_timed_rounds', type=int, default=None, help='trainer rounds per timed call (default 5; '
                  'smoke 2)')
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
  a.protocols = [p for p in a.protocols.split(',') if p]
  if set(a.protocols) - set(PROTOCOLS):
    ap.error(f'--protocols: unknown {sorted(set(a.protocols) - set(PROTOCOLS))}; allowed: {",".join(PROTOCOLS)}')
  a.pfl_timed_rounds = a.pfl_timed_rounds or (2 if smoke else 5)
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
  _time_rows(fns, rows, clients * a.examples_per_client, a.repeats)
  return {'model': model_name, 'clients': clients, 'examples_per_client': a.examples_per_client,
          'input_shape': list(shape), 'batch': a.batch, 'chunk': a.chunk, 'rows': rows,
          'device_peak_bytes_after_group': _device_peak()}


def _time_rows(fns, rows, n_ex, repeats):
  times = bench_util.interleave(fns, repeats)
  for v, ts in times.items():
    s = statistics.median(ts)
    rows[v].update({'s_per_round': s, 'examples_per_s': n_ex / s, 's_per_round_all': ts})
    if v == 'torch':
      rows[v]['peak_mem_bytes'] = getattr(fns[v], 'last', {}).get('peak_mem_bytes')


def run_pfl_group(a, peer_set):
  """pfl-research's CIFAR10 protocol (benchmarks/pfl_cifar10.py's problem): engine strategies, the trainer,
  the torch peer; every row times whole rounds (the trainer K per call)."""
  k = a.pfl_timed_rounds
  opts = types.SimpleNamespace(smoke=a.smoke, chunk=10, timed_rounds=k, conv_impl=a.conv_impl)
  c = pfl_cifar10.protocol_config(a.smoke, conv_impl=a.conv_impl)
  data = pfl_cifar10.make_data(c, a.smoke)
  rows, fns = {}, {}
  for v in PFL_VARIANTS:
    if v == 'torch' and peer_set is None:
      continue
    row = rows[v] = {}
    try:
      t = time.perf_counter()
      if v in STRATEGIES:
        fn, mem = pfl_cifar10.engine_variant(f'engine_{v}', opts, data, compiled_memory=True)
        row.update(mem)
      elif v == 'trainer':
        fn, prob = pfl_cifar10.trainer_variant('trainer', opts, data)
        row['note'] = f'strategy {prob.t.plan.strategy}, rounds_per_call {prob.t.plan.rounds_per_call}'
      else:
        path = os.path.join(peer_set.tmp.name, 'pfl.npz')
        protocol = bench_util.protocol
        protocol.write_problem(path, [(pfl_cifar10.normalized(data.x[data.client_indices(u)]),
                                       data.y[data.client_indices(u)]) for u in range(data.num_clients)])
        dev = _torch_device()
        fn0, setup = peer_set.variant('torch', 'pfl', {**pfl_cifar10.peer_spec(c, path), 'device': dev})
        fn = lambda fn0=fn0: fn0(k)  # noqa: E731
        fn.last = fn0.last
        row['device'] = dev
        row['first_call_s'] = setup['first_round_s']
      if v != 'torch':
        fn()
        row['first_call_s'] = time.perf_counter() - t
        fn()
      fns[v] = fn
    except Exception as e:  # an out-of-memory variant must not stop the other rows
      row['error'] = f'{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ""}'
      traceback.print_exc(limit=2)
      gc.collect()
  n_ex = c.clients_per_round * c.data.examples_per_client
  _time_rows(fns, rows, n_ex, a.repeats)
  for r in rows.values():
    if 's_per_round' in r:
      r['rounds_per_s'] = 1 / r['s_per_round']
  return {'model': 'pfl_cnn', 'protocol': 'pfl', 'clients': c.clients_per_round,
          'examples_per_client': c.data.examples_per_client, 'input_shape': list(data.input_shape),
          'batch': c.client.batch_size, 'chunk': opts.chunk, 'rows': rows,
          'device_peak_bytes_after_group': _device_peak()}


def _markdown(res):
  lines = [f"# Client strategies on {res['device_kind']} ({res['backend']}), jax {res['jax']}", '',
           f"uptime before: {res['uptime'][0]}  ", f"uptime after: {res['uptime'][1]}  ",
           f"{'SMOKE RUN (tiny sizes, not a measurement)  ' if res['smoke'] else ''}", '',
           'pfl_cnn rows: pfl-research\'s CIFAR10 protocol (B=10, 5 steps; smoke: B=4); x torch there = its rounds/s '
           'over the torch row\'s.', '',
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
      note = f"torch on {r['device']}" if v == 'torch' else r.get('note', '')
      torch_eps = g['rows'].get('torch', {}).get('examples_per_s')
      if g.get('protocol') == 'pfl' and torch_eps and v != 'torch':
        note = (note + '; ' if note else '') + f"x torch {r['examples_per_s'] / torch_eps:.2f}"
      lines.append(f"| {g['model']} | {g['clients']} | {v} | {r['examples_per_s']:.1f} | {r['s_per_round']:.3f} | "
                   f"{x} | {r.get('first_call_s', float('nan')):.1f} | {mib:.0f} | {note} |")
  return '\n'.join(lines) + '\n'


def main(argv=None):
  a = _args(argv)
  peers = ([p for p in bench_util.resolve_peers(a.peers) if p == 'torch']
           if ('torch' in a.variants or 'pfl' in a.protocols) else [])
  info = bench_util.machine_info()
  info['device_kind'] = jax.devices()[0].device_kind
  res = {**info, 'smoke': a.smoke, 'repeats': a.repeats, 'conv_impl': a.conv_impl, 'groups': [],
         'uptime': [bench_util.uptime()], 'gemm_gflops_2048': [bench_util.gemm_gflops()]}
  peer_set = bench_util.PeerSet(peers) if peers else None
  try:
    for m in (a.models if 'paper' in a.protocols else []):
      for c in a.clients:
        print(f'{m}, {c} clients ...', file=sys.stderr, flush=True)
        res['groups'].append(run_group(a, m, c, peer_set))
        jax.clear_caches()
        gc.collect()
    if 'pfl' in a.protocols:
      print('pfl-research CIFAR10 protocol ...', file=sys.stderr, flush=True)
      res['groups'].append(run_pfl_group(a, peer_set))
      jax.clear_caches()
      gc.collect()
  finally:
    if peer_set is not None:
      res['peer_info'] = peer_set.info
      peer_set.close()
  res['uptime'].append(bench_util.uptime())
  return bench_util.write_report(a.out, res, _markdown)


if __name__ == '__main__':
  main()
