r"""pfl-research's CIFAR10 benchmark protocol (configs/pfl_cifar10.py): rounds/s of ours against the peers.

The protocol: 1000 users x 50 CIFAR10 images, 50 users per round, B=10, 1 local epoch (5 steps), client SGD
lr 0.1, server SGD lr 1, unweighted averaging, the pfl CNN (models/cnn.py PflCNN, dropout on), 1500 rounds.
Every stack gets the same data (the config's partition: one seeded permutation cut into users of 50) and the
same seed (0); each samples its 50 users per round uniformly from (seed, round) its own way. Variants:

  trainer                ours as a user runs it: `loop.Trainer(configs/pfl_cifar10.py)` (engine 'auto':
                         sequential clients on CPU; rounds_per_call 'auto'), `train(num_rounds=K)` per timed
                         call, evaluation left out of the timing (measured once, beside)
  trainer_<knob>         the same with one engine knob changed: rpc1 / rpcK (engine.rounds_per_call = 1 / K),
                         vmap / chunked / sequential (engine.strategy; chunked: --chunk clients per vmap)
  engine_<strategy>      the engine's one-round program alone on prebuilt batches (no sampling / gather)
  ours_<N>dev            the trainer in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=N
                         (the round's clients sharded over N host devices)
  ours_<N>dev_direct     the same under `--cpu_path=dense_direct` (Dense kernel gradients straight into
                         [in, out], models/layers.py; the same bits for this SGD protocol)
  torch                  the PyTorch reference pattern (benchmarks/peers/torch_peer.py: sequential users,
                         torch SGD, nn.Dropout, unweighted average), a subprocess; torch_1t the same with one
                         torch thread (on a loaded 2-core machine torch's OpenMP threads spin: measured 10x
                         slower with 2 threads than 1 there). x torch = against the faster of the two rows
  fedjax                 FedJAX 0.0.17's fed_avg (benchmarks/peers/fedjax_peer.py in .venv-fedjax; haiku CNN
                         with hk.dropout; FedJAX weights by examples, which with 50 images per user is uniform)

Everything is built and warmed up first, then timed interleaved (round-robin, --repeats, median) in one
invocation. Reported: rounds/s, examples/s (2,500 per round), s/round, ratios to torch and FedJAX (target of
issue 27 on a CPU: >= 1.5x torch, >= 3x FedJAX in rounds/s), and the 1500-round run extrapolated (training
rounds at the median rate; for ours also with the first call's compilation and 150 evaluations of the 10,000
test images). The data are random uint8 images in the CIFAR10 layout unless --data_dir holds the CIFAR10
files (throughput does not depend on pixel values).

  .venv/bin/python -m benchmarks.speed.pfl_cifar10 [--out=benchmarks/speed/pfl_cifar10_cpu] [--repeats=3]
      [--timed_rounds=5] [--variants=...] [--host_devices=2] [--peers=auto] [--data_dir=PATH] [--smoke]

writes PREFIX.json and PREFIX.md. --smoke: 40 users x 20 images of 8x8, cohort 4, B=4, one repeat: a check
of the script end to end (not a measurement). `--serve` is the subprocess side of the ours_<N>dev variants
(`python -m benchmarks.speed.pfl_cifar10 --serve`, from the repository root).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback

from absl import logging
import jax
import numpy as np

from benchmarks.paths import REPO
from benchmarks.speed import bench_util
from benchmarks.speed.peers import protocol
from fedjax_flat import cpu_paths
from fedjax_flat.config import families as config_strings
from fedjax_flat.data.transforms import augment as aug
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.sources import cifar
from fedjax_flat.training import trainers

CONFIG = os.path.join(REPO, 'configs', 'pfl_cifar10.py')
TRAINER_KNOBS = {'trainer': {}, 'trainer_rpc1': {'engine.rounds_per_call': 1},
                 'trainer_rpcK': {'engine.rounds_per_call': 'K'}, 'trainer_vmap': {'engine.strategy': 'vmap'},
                 'trainer_chunked': {'engine.strategy': 'chunked'},
                 'trainer_sequential': {'engine.strategy': 'sequential'}}
ENGINE = ('engine_vmap', 'engine_chunked', 'engine_sequential')
PEER_VARIANTS = {'torch': ('torch', {}), 'torch_1t': ('torch', {'threads': 1}), 'fedjax': ('fedjax', {})}
DEFAULT_VARIANTS = tuple(TRAINER_KNOBS) + ENGINE + ('ours_Ndev', 'ours_Ndev_direct') + tuple(PEER_VARIANTS)
DIRECT_PATH = 'dense_direct'     # the ours_<N>dev_direct rows: that CPU kernel path (fedjax_flat/cpu_paths.py)


def _args(argv):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--out', default=None, help='PREFIX of PREFIX.json / PREFIX.md')
  ap.add_argument('--repeats', type=int, default=None, help='timed repetitions per variant (default 3; smoke 1)')
  ap.add_argument('--timed_rounds', type=int, default=None, help='rounds per timed call K (default 5; smoke 2)')
  ap.add_argument('--variants', default=','.join(DEFAULT_VARIANTS),
                  help='comma list; ours_Ndev stands for one subprocess variant per --host_devices entry')
  ap.add_argument('--host_devices', default='2', help='device counts of the ours_<N>dev subprocesses')
  ap.add_argument('--chunk', type=int, default=10, help='clients per vmap chunk of the chunked variants')
  ap.add_argument('--conv_impl', default='auto', help="our convolution lowering: 'auto' (the default a user "
                  "gets: im2col on CPU) | 'lax' | 'im2col'")
  ap.add_argument('--peers', default='auto', help="torch,fedjax | auto (those installed) | none")
  ap.add_argument('--data_dir', default='', help='CIFAR10 files (default: random images in their layout)')
  ap.add_argument('--smoke', action='store_true', help='tiny sizes: checks the script end to end')
  a = ap.parse_args(argv)
  a.repeats = a.repeats or (1 if a.smoke else 3)
  a.timed_rounds = a.timed_rounds or (2 if a.smoke else 5)
  a.variants = [v for v in a.variants.split(',') if v]
  a.host_devices = [int(n) for n in a.host_devices.split(',') if n]
  bad = [v for v in a.variants if v not in DEFAULT_VARIANTS]
  if bad:
    ap.error(f'--variants: unknown {bad}; allowed: {",".join(DEFAULT_VARIANTS)}')
  a.out = a.out or os.path.join(bench_util.SPEED, f'pfl_cifar10_{jax.default_backend()}{"_smoke" if a.smoke else ""}')
  return a


# --- The problem: the config, its data, what the peers get. ---

def protocol_config(smoke: bool, overrides=None, conv_impl: str = 'auto'):
  """configs/pfl_cifar10.py (smoke: shrunk), with dotted `overrides` ({'engine.strategy': 'vmap'})."""
  c = config_strings.load_config(CONFIG)
  c.model_kwargs.conv_impl = conv_impl
  if smoke:
    c.data.num_clients, c.data.examples_per_client = 40, 20
    c.clients_per_round, c.client.batch_size = 4, 4
  c.progress_every_s = 1e9
  for path, v in (overrides or {}).items():
    node = c
    *head, last = path.split('.')
    for h in head:
      node = node[h]
    node[last] = v
  return c


def make_data(c, smoke: bool, data_dir: str = '') -> FederatedDataset:
  """The config's users: CIFAR10 files from data_dir, else random uint8 images (same layout, same partition)."""
  if data_dir:
    return data_registry.get_dataset('cifar10', **{**c.data.to_dict(), 'data_dir': data_dir})
  shape = (8, 8, 3) if smoke else (32, 32, 3)
  n_train, n_test = (c.data.num_clients * c.data.examples_per_client, 200) if smoke else (50000, 10000)
  rng = np.random.default_rng(c.data.seed)
  x = rng.integers(0, 256, (n_train,) + shape, dtype=np.uint8)
  y = rng.integers(0, 10, n_train).astype(np.int32)
  tx = rng.integers(0, 256, (n_test,) + shape, dtype=np.uint8)
  ty = rng.integers(0, 10, n_test).astype(np.int32)
  users = cifar.random_split(n_train, c.data.num_clients, c.data.examples_per_client, c.data.seed)
  return FederatedDataset.from_client_indices(x, y, users, tx, ty, num_classes=10, name='cifar10-layout random')


def normalized(x):
  """What our on-device preprocessing feeds the model (normalize='cifar10'), as float32 for the peers."""
  mean, std = aug.STATS['cifar10']
  return ((x.astype(np.float32) / 255.0 - np.float32(mean)) / np.float32(std)).astype(np.float32)


def peer_spec(c, path):
  return dict(model='pfl_cnn', num_classes=10, data=path, clients_per_round=c.clients_per_round,
              batch_size=c.client.batch_size, epochs=c.client.local_epochs, lr=c.client.lr,
              weight_decay=c.client.weight_decay, optimizer='sgd', rho=0.0, seed=c.seed,
              weighting=c.server.weighting, dropout=True, warmup_all_clients=False)


# --- Our variants. ---

class TrainerProblem:
  """A Trainer of the protocol; round() trains the next K rounds (one timed unit)."""

  def __init__(self, c, data, k: int):
    self.k = k
    c.rounds = max(c.rounds, 64 * k)         # never the last round inside the timing
    self.t = trainers.make_trainer(c, None, data=data, write_files=False)
    self.evaluate = bench_util.training_only(self.t)   # training rounds only, as every other variant

  def round(self):
    self.t.train(num_rounds=self.k)

  def sync(self):
    jax.block_until_ready(self.t.server_state)

  def peak_mem(self):
    return protocol.peak_rss_bytes()

  def eval_s(self) -> float:
    self.evaluate()
    t = time.perf_counter()
    self.evaluate()
    return time.perf_counter() - t


def _timed(fn, k: int):
  def run():
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) / k
  return run


def trainer_variant(name, a, data):
  over = {p: (a.timed_rounds if v == 'K' else v) for p, v in TRAINER_KNOBS[name].items()}
  if over.get('engine.strategy') == 'chunked':
    over['engine.clients_per_chunk'] = a.chunk
  p = TrainerProblem(protocol_config(a.smoke, over, a.conv_impl), data, a.timed_rounds)

  def fn():
    p.round()
    p.sync()
  return _timed(fn, a.timed_rounds), p


def engine_variant(name, a, data, compiled_memory: bool = False):
  """The one-round program on round 0's batches of the first cohort (normalized float32, built beforehand).
  Returns (time_fn, XLA's buffer sizes when compiled_memory)."""
  strategy = name.split('_', 1)[1]
  c = protocol_config(a.smoke, {'engine.strategy': strategy, 'engine.clients_per_chunk': a.chunk,
                                'normalize': 'none'}, a.conv_impl)
  n = c.clients_per_round
  idx = [data.client_indices(k) for k in range(n)]
  flat = np.concatenate(idx)
  sub = FederatedDataset.from_client_indices(
      normalized(data.x[flat]), data.y[flat], np.split(np.arange(len(flat)), np.cumsum([len(i) for i in idx])[:-1]),
      normalized(data.test_x[:1]), data.test_y[:1], num_classes=10)
  return bench_util.engine_round_variant(c, sub, 10, compiled_memory=compiled_memory)


class SubprocessTrainer:
  """ours_<N>dev: the trainer in `python pfl_cifar10.py --serve` with N host devices (a protocol peer)."""

  def __init__(self, n_devices: int, cpu_path: str = 'default'):
    flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
             if not f.startswith('--xla_force_host_platform_device_count')]
    flags.append(f'--xla_force_host_platform_device_count={n_devices}')
    self.peer = protocol.Peer(sys.executable, 'benchmarks.speed.pfl_cifar10', cwd=REPO,
                              env={'XLA_FLAGS': ' '.join(flags + [cpu_paths.flags_of(cpu_path)]).strip(),
                                   cpu_paths.ENV: cpu_path})

  def variant(self, name, a):
    spec = dict(model='pfl_cnn', num_classes=10, data='', clients_per_round=0, batch_size=0, epochs=1, lr=0.0,
                weight_decay=0.0, optimizer='sgd', rho=0.0, seed=0, smoke=a.smoke, data_dir=a.data_dir,
                timed_rounds=a.timed_rounds, conv_impl=a.conv_impl)
    setup = self.peer.setup(name, spec)

    def run():
      return self.peer.run(name, 1)['s'] / a.timed_rounds
    return run, setup


def _serve():
  """The subprocess side of ours_<N>dev: the protocol's setup / run over TrainerProblem."""
  logging.set_verbosity(logging.WARNING)

  def make(spec):
    c = protocol_config(bool(spec['smoke']), conv_impl=spec['conv_impl'])
    return TrainerProblem(c, make_data(c, bool(spec['smoke']), spec['data_dir']), int(spec['timed_rounds']))

  def info():
    return {'stack': 'fedjax_flat', 'devices': [str(d) for d in jax.devices()],
            'xla_flags': os.environ.get('XLA_FLAGS', '')}
  protocol.ProblemServer(make, info).serve()


# --- Report. ---

def _markdown(res):
  L = [f"# pfl-research CIFAR10 protocol: rounds/s, {res['cpu']} x{res['cpus']} ({res['backend']}), "
       f"jax {res['jax']}", '',
       f"{res['users']} users x {res['examples_per_client']}, cohort {res['cohort']}, B={res['batch']}, "
       f"{res['steps']} local steps; {res['rounds_per_timing']} rounds per timed call, median of "
       f"{res['repeats']}, interleaved; data: {res['data']}; devices in the driver: {res['devices']}  ",
       f"fp32 GEMM 2048^3: {res['gemm_gflops_2048'][0]:.0f} / {res['gemm_gflops_2048'][1]:.0f} GFLOP/s "
       f"(before / after)  ", f"uptime before: {res['uptime'][0]}  ", f"uptime after: {res['uptime'][1]}  ",
       'SMOKE RUN (tiny sizes, not a measurement)' if res['smoke'] else '', '',
       'x torch: against the faster torch row (torch / torch_1t); 1500 rounds: training rounds at the median rate',
       '',
       '| variant | rounds/s | examples/s | s/round | x torch | x fedjax | 1500 rounds (min) | first call s | note |',
       '|---|---:|---:|---:|---:|---:|---:|---:|---|']
  for v, r in res['rows'].items():
    if 'error' in r:
      L.append(f"| {v} | - | - | - | - | - | - | - | {r['error'][:90]} |")
      continue
    f = lambda key: f"{r[key]:.2f}" if key in r else '-'  # noqa: E731
    L.append(f"| {v} | {r['rounds_per_s']:.3f} | {r['examples_per_s']:.0f} | {r['s_per_round']:.3f} | "
             f"{f('x_torch')} | {f('x_fedjax')} | {r['wall_1500_s'] / 60:.1f} | "
             f"{r.get('first_call_s', float('nan')):.1f} | "
             f"{r.get('note', '')} |")
  t = res['rows'].get('trainer', {})
  if 'eval_s' in t:
    L += ['', f"Ours as a user runs it, the whole 1500-round run extrapolated: first call (compilation) "
              f"{t['first_call_s']:.1f} s + 1500 rounds at {t['s_per_round']:.3f} s + 150 evaluations of "
              f"{res['test_examples']} test images at {t['eval_s']:.2f} s = {t['wall_1500_with_eval_s'] / 60:.1f} min."]
  return '\n'.join(L) + '\n'


def main(argv=None):
  a = _args(argv)
  logging.set_verbosity(logging.WARNING)
  c0 = protocol_config(a.smoke)
  data = make_data(c0, a.smoke, a.data_dir)
  installed = bench_util.resolve_peers(a.peers)
  peers = sorted({PEER_VARIANTS[v][0] for v in a.variants if v in PEER_VARIANTS and PEER_VARIANTS[v][0] in installed})
  a.variants = [v for v in a.variants if v not in PEER_VARIANTS or PEER_VARIANTS[v][0] in peers]
  k = a.timed_rounds
  fns, rows, extra = {}, {}, {}
  peer_set = bench_util.PeerSet(peers)
  subs = []
  try:
    path = None
    if peers:
      path = os.path.join(peer_set.tmp.name, 'pfl.npz')
      protocol.write_problem(path, [(normalized(data.x[data.client_indices(u)]), data.y[data.client_indices(u)])
                                    for u in range(data.num_clients)])
    names = []
    for v in a.variants:
      if v in ('ours_Ndev', 'ours_Ndev_direct'):
        names += [f'ours_{n}dev' + v[len('ours_Ndev'):] for n in a.host_devices]
      else:
        names.append(v)
    for v in names:
      print(f'building {v} ...', file=sys.stderr, flush=True)
      row = rows[v] = {}
      try:
        t = time.perf_counter()
        if v in TRAINER_KNOBS:
          fn, prob = trainer_variant(v, a, data)
          extra[v] = prob
          row['note'] = (f'strategy {prob.t.plan.strategy}, rounds_per_call {prob.t.plan.rounds_per_call}, '
                         f'{jax.device_count()} device(s)')
        elif v in ENGINE:
          fn, _ = engine_variant(v, a, data)
        elif v.startswith('ours_'):
          n_dev, _, direct = v[len('ours_'):].partition('dev')
          sub = SubprocessTrainer(int(n_dev), DIRECT_PATH if direct else 'default')
          subs.append(sub)
          fn, setup = sub.variant(v, a)
          row['first_call_s'] = setup['first_round_s']
          row['note'] = (f"{len(sub.peer.call(cmd='info')['devices'])} host devices, clients sharded"
                         + (f', --cpu_path={DIRECT_PATH}' if direct else ''))
        else:
          peer, extra_spec = PEER_VARIANTS[v]
          spec = {**peer_spec(c0, path), 'warmup_rounds': 1, **extra_spec}
          fn0, setup = peer_set.variant(peer, v, spec)
          fn = lambda fn0=fn0: fn0(k)  # noqa: E731   # K rounds per timed call, seconds per round
          row['first_call_s'] = setup['first_round_s']
        if 'first_call_s' not in row:     # compile + warm-up (subprocesses did theirs at set-up)
          fn()
          row['first_call_s'] = (time.perf_counter() - t)
          fn()
        fns[v] = fn
        print(f'  {v}: first call {row["first_call_s"]:.1f} s ({bench_util.uptime()})', file=sys.stderr, flush=True)
      except Exception as e:  # one variant that fails must not stop the others; the row says why
        row['error'] = f'{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ""}'
        traceback.print_exc(limit=3)
    info = bench_util.machine_info()
    gemm = [bench_util.gemm_gflops()]
    up = [bench_util.uptime()]
    times = bench_util.interleave(fns, a.repeats)
    up.append(bench_util.uptime())
    gemm.append(bench_util.gemm_gflops())
    for v, prob in extra.items():
      if v == 'trainer':
        rows[v]['eval_s'] = prob.eval_s()
  finally:
    peer_set.close()
    for s in subs:
      s.peer.close()

  ex = c0.clients_per_round * c0.data.examples_per_client
  for v, ts in times.items():
    s = statistics.median(ts)
    rows[v].update({'s_per_round': s, 'rounds_per_s': 1 / s, 'examples_per_s': ex / s, 's_per_round_all': ts,
                    'wall_1500_s': 1500 * s})
  ref = {'torch': min((rows[v]['s_per_round'] for v in ('torch', 'torch_1t') if 's_per_round' in rows.get(v, {})),
                      default=None),
         'fedjax': rows.get('fedjax', {}).get('s_per_round')}
  for v, r in rows.items():
    for p, s in ref.items():
      if 's_per_round' in r and s:
        r[f'x_{p}'] = s / r['s_per_round']
  t = rows.get('trainer', {})
  if 'eval_s' in t and 's_per_round' in t:
    t['wall_1500_with_eval_s'] = t['first_call_s'] + 1500 * t['s_per_round'] + 150 * t['eval_s']
  res = {**info, 'smoke': a.smoke, 'repeats': a.repeats, 'rounds_per_timing': k, 'uptime': up,
         'gemm_gflops_2048': gemm, 'users': data.num_clients, 'examples_per_client': c0.data.examples_per_client,
         'cohort': c0.clients_per_round, 'batch': c0.client.batch_size,
         'steps': -(-c0.data.examples_per_client // c0.client.batch_size), 'test_examples': len(data.test_y),
         'data': a.data_dir or 'random uint8 images, CIFAR10 layout', 'peer_info': peer_set.info, 'rows': rows,
         'command': 'python -m benchmarks.speed.pfl_cifar10 ' + ' '.join(argv if argv is not None else sys.argv[1:])}
  return bench_util.write_report(a.out, res, _markdown)


if __name__ == '__main__':
  if '--serve' in sys.argv:
    _serve()
  else:
    main()
