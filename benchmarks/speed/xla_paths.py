r"""XLA:CPU's kernel paths on the CNN client steps, each in its own process, timed interleaved beside torch.

XLA_FLAGS are read once, when a process opens its CPU backend, so every path (a set of flags) is a live worker
subprocess (`--serve`, the peers' JSON-lines protocol, benchmarks/speed/peers/protocol.py); the driver builds
every (workload, conv lowering) in every worker first, then times them round-robin (`--repeats`, median), the
torch peer (the same steps in the FedSAM / pfl reference pattern, oneDNN convolutions) in the same rounds.

Workloads (one client's local steps in one `lax.scan`, as the engine runs them; the library's model, loss and
client optimizer). `--form=engine` (the default) runs each step under the engine's batch-1 vmap, as its one-client
CPU path does (core/engine.py step_batch1); `--form=scan` is the plain scan of the tables before 2026-12-08, which
the engine does not run (under it XLA folds the Dense gradient's transpose that the engine's form pays for):
  paper     the FedSAM paper's CIFAR-100 CNN (cifar_cnn), 8 steps of B=64, SGD lr 0.01 wd 4e-4 (and SAM rho 0.05)
  pfl       pfl-research's CIFAR10 CNN (pfl_cnn, dropout off), 5 steps of B=10, SGD lr 0.1
  digits    the quickstart's digits CNN (digits_cnn, 8x8x1), 8 steps of B=32, SGD lr 0.05
Each with conv_impl im2col (the CPU default) and lax (native convolution: the op a library path could take).

Paths (`PATHS`): the default, oneDNN (`--xla_cpu_use_onednn`, its custom call, its dot fusion), XNNPACK off /
its fusions, YNNPACK off / with convolutions, the legacy (non-fusion-emitter) code generator. A flag the
installed jaxlib rejects, or a compilation failure, is reported as such.

Results equal to fp32 rounding: every path's parameters after one call are compared with the default path's
(same init, same data): `max_rel_diff` = max |a - b| / max |b| over the parameters.

  .venv/bin/python -m benchmarks.speed.xla_paths [--repeats=5] [--workloads=paper,pfl,digits]
      [--paths=default,onednn,...] [--convs=im2col,lax] [--peers=auto] [--out=benchmarks/speed/xla_paths_cpu]
      [--smoke]

writes PREFIX.json and PREFIX.md. `--record` also keeps the winner for this machine (fedjax_flat/cpu_paths.py),
which `cpu_path='auto'` then applies.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.paths import REPO
from benchmarks.speed import bench_util, cnn_step
from benchmarks.speed.peers import protocol
from fedjax_flat import cpu_paths
from fedjax_flat.models.registry import get_model

SPEED = os.path.dirname(os.path.abspath(__file__))

# name -> (workload model, classes, input shape, batch, steps, lr, weight decay, model kwargs)
WORKLOADS = {
    'paper': ('cifar_cnn', 100, (32, 32, 3), 64, 8, 0.01, 4e-4, {}),
    'pfl': ('pfl_cnn', 10, (32, 32, 3), 10, 5, 0.1, 0.0, {'dropout': False}),
    'digits': ('digits_cnn', 10, (8, 8, 1), 32, 8, 0.05, 0.0, {}),
}
PATHS = cpu_paths.CANDIDATES
FORMS = {'engine': "under the engine's batch-1 vmap", 'scan': 'plain scan'}
# How each library's ops show in XLA:CPU's compiled HLO text (fusion kinds / custom-call targets).
LIBRARY_MARKS = {'onednn': '__onednn', 'xnnpack': '__xnn_fusion', 'ynnpack': '__ynn_fusion'}


def _spec(workload, opt, conv, data, form='engine'):
  model, classes, shape, b, steps, lr, wd, kw = WORKLOADS[workload]
  return {'model': model, 'num_classes': classes, 'data': data, 'clients_per_round': 1, 'batch_size': b,
          'epochs': 1, 'lr': lr, 'weight_decay': wd, 'optimizer': opt, 'rho': 0.05 if opt == 'sam' else 0.0,
          'seed': 0, 'weighting': 'uniform', 'dropout': bool(kw.get('dropout', True)), 'conv_impl': conv,
          'shape': list(shape), 'steps': steps, 'model_kwargs': kw, 'form': form}


# ---------------------------------------------------------------------------------------------------------
# The worker: one process per path (its XLA_FLAGS set by the driver before it starts).

class _JaxSteps:
  def __init__(self, spec, out):
    (x, y), = protocol.read_problem(spec['data'])
    b, steps, shape = int(spec['batch_size']), int(spec['steps']), tuple(spec['shape'])
    xs = jnp.asarray(x[:b * steps].reshape((steps, b) + shape))
    ys = jnp.asarray(y[:b * steps].reshape(steps, b))
    model = get_model(spec['model'], int(spec['num_classes']), shape, conv_impl=spec['conv_impl'],
                      **spec['model_kwargs'])
    params = model.init(jax.random.key(0), jnp.zeros((1,) + shape))
    run = cnn_step.local_steps(model, spec['optimizer'], spec['lr'], spec['weight_decay'], spec['rho'] or 0.05, b,
                               batch1=spec.get('form', 'engine') == 'engine')

    # Which library ops the compiled step holds: a path whose flags leave this at zero did not engage.
    text = run.lower(params, xs, ys).compile().as_text()
    self.library_ops = {lib: text.count(mark) for lib, mark in LIBRARY_MARKS.items()}
    self.call = lambda: jax.block_until_ready(run(params, xs, ys))
    t = time.perf_counter()
    final = self.call()
    self.first_s = time.perf_counter() - t
    self.call()
    leaves = jax.tree_util.tree_leaves(final)
    np.save(out, np.concatenate([np.asarray(l, np.float64).ravel() for l in leaves]), allow_pickle=False)


def serve():
  problems = {}

  def setup(name, spec):
    try:
      p = problems[name] = _JaxSteps(spec, spec['out'])
    except Exception as e:   # a path that fails to compile: reported, the worker stays up
      return {'failed': f'{type(e).__name__}: {str(e).splitlines()[0][:300]}'}
    return {'first_round_s': p.first_s, 'library_ops': p.library_ops}

  def run(name, rounds):
    fn = problems[name].call
    t = time.perf_counter()
    for _ in range(rounds):
      fn()
    return {'s': time.perf_counter() - t, 'peak_mem_bytes': protocol.peak_rss_bytes()}

  def info():
    return {'jax': jax.__version__, 'xla_flags': os.environ.get('XLA_FLAGS', ''),
            'devices': [str(d) for d in jax.devices()]}
  protocol.serve(setup, run, info)


# ---------------------------------------------------------------------------------------------------------
# The driver.

def _start(path_name):
  # The worker applies nothing itself; a program path (cpu_paths.PROGRAM) is read from ENV when it traces.
  env = {'XLA_FLAGS': cpu_paths.flags_of(path_name),
         cpu_paths.ENV: path_name if path_name in cpu_paths.PROGRAM else 'default'}
  peer = protocol.Peer(sys.executable, 'benchmarks.speed.xla_paths', env=env, cwd=REPO)
  try:
    return peer, peer.call(cmd='info')
  except protocol.PeerError as e:
    return None, {'failed': f'worker did not start (flag rejected by this jaxlib?): {e}'}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--serve', action='store_true', help=argparse.SUPPRESS)
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--workloads', default='paper,pfl,digits')
  ap.add_argument('--opts', default='sgd,sam', help='sam runs on the paper workload only')
  ap.add_argument('--paths', default=','.join(PATHS))
  ap.add_argument('--convs', default='im2col,lax')
  ap.add_argument('--form', default='engine', choices=('engine', 'scan'),
                  help="engine: each step under the engine's batch-1 vmap (its one-client CPU path); scan: plain scan")
  ap.add_argument('--peers', default='auto')
  ap.add_argument('--calls', type=int, default=0, help='calls per timed sample (0: about 0.5 s of the default)')
  ap.add_argument('--out', default=os.path.join(SPEED, 'xla_paths_cpu'))
  ap.add_argument('--record', action='store_true', help='keep the winning path for this machine (cpu_path=auto)')
  ap.add_argument('--smoke', action='store_true', help='digits, two paths, one repeat: the script end to end')
  args = ap.parse_args(argv)
  if args.serve:
    return serve()
  if args.smoke:
    args.workloads, args.paths, args.opts, args.repeats, args.convs = 'digits', 'default,xnn_off', 'sgd', 1, 'im2col'
  if args.record and args.repeats < 3:
    raise SystemExit(f'--record with --repeats={args.repeats}: a path kept for this machine needs >= 3 repeats')
  paths = [p for p in args.paths.split(',') if p]
  for p in paths:
    if p not in PATHS:
      raise SystemExit(f'--paths: unknown path {p!r}; known: {", ".join(PATHS)}')
  workloads = [w for w in args.workloads.split(',') if w]
  convs = [c for c in args.convs.split(',') if c]
  peers = [p for p in bench_util.resolve_peers(args.peers) if p == 'torch'] if not args.smoke else []
  tmp = tempfile.TemporaryDirectory(prefix='xla_paths_')
  problems = []   # (workload, opt, conv) -> the spec
  for w in workloads:
    _, classes, shape, b, steps, *_ = WORKLOADS[w]
    rng = np.random.default_rng(0)
    data = os.path.join(tmp.name, f'{w}.npz')
    protocol.write_problem(data, [(rng.standard_normal((b * steps,) + shape).astype(np.float32),
                                   rng.integers(0, classes, b * steps).astype(np.int32))])
    for opt in [o for o in args.opts.split(',') if o]:
      if opt == 'sam' and w != 'paper':
        continue
      for conv in convs:
        problems.append(((w, opt, conv), _spec(w, opt, conv, data, args.form)))
      if peers:
        problems.append(((w, opt, 'torch'), _spec(w, opt, 'im2col', data, args.form)))

  record = {'machine': bench_util.machine_info(), 'isa': cpu_paths.isa(), 'uptime_start': bench_util.uptime(),
            'gemm_gflops_start': bench_util.gemm_gflops(), 'paths': {p: cpu_paths.flags_of(p) for p in paths},
            'form': args.form,
            'workloads': {w: WORKLOADS[w][:7] for w in workloads}}
  workers, status = {}, {}
  for p in paths:                         # built one path at a time: compilations do not overlap
    print(f'[xla_paths] {p}: building', file=sys.stderr, flush=True)
    peer, info = _start(p)
    status[p] = info
    if peer is None:
      continue
    workers[p] = peer
    for key, spec in problems:
      if key[2] == 'torch':
        continue
      out = os.path.join(tmp.name, f'{p}_{"_".join(key)}.npy')
      r = peer.call(cmd='setup', name='|'.join(key), spec={**spec, 'out': out})
      status.setdefault('setup', {})[f'{p}|{"|".join(key)}'] = r
  if peers:
    workers['torch'] = bench_util.start_peer('torch')
    for key, spec in problems:
      if key[2] == 'torch':
        workers['torch'].setup('|'.join(key), {**spec, 'warmup_rounds': 1})

  # Which (path, problem) pairs run; and equality with the default path.
  runs, equal = [], {}
  for key, _ in problems:
    name = '|'.join(key)
    if key[2] == 'torch':
      runs.append(('torch', name))
      continue
    for p in workers:
      if p == 'torch':
        continue
      r = status['setup'][f'{p}|{name}']
      if 'failed' in r:
        equal[f'{p}|{name}'] = {'failed': r['failed']}
        continue
      runs.append((p, name))
      ref = os.path.join(tmp.name, f'default_{"_".join(key)}.npy')      # the same lowering
      mine = os.path.join(tmp.name, f'{p}_{"_".join(key)}.npy')
      if os.path.exists(ref):
        a, b = np.load(mine, allow_pickle=False), np.load(ref, allow_pickle=False)
        equal[f'{p}|{name}'] = {'max_rel_diff': float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)),
                                'bit_equal': bool(np.array_equal(a, b))}
      equal.setdefault(f'{p}|{name}', {})['library_ops'] = r.get('library_ops', {})

  calls = {}
  for p, name in runs:                    # calls per sample: ~0.5 s of each
    s = workers[p].call(cmd='run', name=name, rounds=1)['s']
    calls[(p, name)] = args.calls or max(1, int(round(0.5 / max(s, 1e-4))))
  times = {k: [] for k in runs}
  for r in range(args.repeats):
    for k in runs:
      p, name = k
      times[k].append(workers[p].call(cmd='run', name=name, rounds=calls[k])['s'] / calls[k])
    print(f'[xla_paths] repeat {r + 1}/{args.repeats} ({bench_util.uptime()})', file=sys.stderr, flush=True)
  record.update({'uptime_end': bench_util.uptime(), 'gemm_gflops_end': bench_util.gemm_gflops()})
  for w in workers.values():
    w.call(cmd='quit')

  rows = {}
  for (p, name), ts in times.items():
    w, opt, conv = name.split('|')
    b, steps = WORKLOADS[w][3], WORKLOADS[w][4]
    rows.setdefault(f'{w}|{opt}', {})[f'{p}|{conv}' if p != 'torch' else 'torch'] = {
        'examples_per_s': b * steps / statistics.median(ts), 's_per_call_all': ts,
        **equal.get(f'{p}|{name}', {})}
  for k, r in rows.items():
    for col, v in r.items():
      base = r.get(f"default|{col.split('|')[-1]}", {}).get('examples_per_s')
      if base and col != 'torch':
        v['x_default'] = v['examples_per_s'] / base
      if 'torch' in r:
        v['x_torch'] = v['examples_per_s'] / r['torch']['examples_per_s']
  record.update({'status': {p: status[p] for p in paths}, 'failed': {k: v['failed'] for k, v in equal.items()
                                                                      if 'failed' in v}, 'results': rows})
  winner = cpu_paths.choose(rows, paths)
  record['winner'] = winner
  with open(args.out + '.json', 'w') as f:
    json.dump(record, f, indent=1)
  md = markdown(record, paths, convs)
  with open(args.out + '.md', 'w') as f:
    f.write(md)
  print(md)
  if args.record:
    print(f'[xla_paths] kept for this machine: {cpu_paths.keep(winner)}', file=sys.stderr)
  return record


def markdown(rec, paths, convs) -> str:
  m = rec['machine']
  out = [f"# XLA:CPU kernel paths: {m['cpu']} x{m['cpus']} ({', '.join(rec['isa']['features']) or 'baseline'}), "
         f"jax {m['jax']}", '',
         f"GEMM 2048^3 fp32: {rec['gemm_gflops_start']:.0f} / {rec['gemm_gflops_end']:.0f} GFLOP/s (start / end); "
         f"uptime start `{rec['uptime_start']}`, end `{rec['uptime_end']}`.", '',
         f'Client steps: {FORMS[rec.get("form", "scan")]} (`--form`).', '',
         'examples/s (x the default path, same lowering; x torch); `bits =`: parameters bit-identical to the default '
         "path's; `!`: not within 1e-5 of them; [library ops in the compiled step: one:/xnn:/ynn: count]",
         '']
  for k, r in rec['results'].items():
    out.append(f'## {k}' + (f" (torch {r['torch']['examples_per_s']:.1f} ex/s)" if 'torch' in r else ''))
    out += ['', '| path | ' + ' | '.join(convs) + ' |', '|---|' + '---:|' * len(convs)]
    for p in paths:
      cells = []
      for c in convs:
        v = r.get(f'{p}|{c}')
        if v is None:
          cells.append(rec['failed'].get(f'{p}|{k}|{c}', 'failed')[:40] if p in rec['status'] else 'no worker')
          continue
        bad = '' if v.get('max_rel_diff', 0.0) <= 1e-5 else ' !'
        same = ', bits =' if v.get('bit_equal') and p != 'default' else ''
        libs = ' '.join(f'{lib[:3]}:{n}' for lib, n in v.get('library_ops', {}).items() if n)
        cells.append(f"{v['examples_per_s']:.1f} ({v.get('x_default', float('nan')):.2f}x; "
                     f"{v.get('x_torch', float('nan')):.2f}x torch{same}){bad} [{libs or 'no library op'}]")
      out.append(f'| {p} | ' + ' | '.join(cells) + ' |')
    out.append('')
  out += [f"Winner for this machine (>= {cpu_paths.MARGIN:.2f}x the default on every workload, equal within "
          f"1e-5): **{rec['winner']}**", '']
  bad = {p: s['failed'] for p, s in rec['status'].items() if isinstance(s, dict) and 'failed' in s}
  if bad:
    out += ['Paths that did not start: ' + '; '.join(f'{p}: {e[:120]}' for p, e in bad.items()), '']
  return '\n'.join(out)


if __name__ == '__main__':
  main()
