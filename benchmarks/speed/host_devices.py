r"""One host CPU device vs one per core (fedjax_flat/devices.py), interleaved in one invocation, with the torch peer.

XLA fixes its host device count when it starts, so every device setting is its own live subprocess (this
script with --serve, speaking benchmarks/peers/protocol.py's JSON lines), set up (built, compiled, warmed up)
first, then all are timed round-robin `--repeats` times (median), with the torch peer in the same rotation:

  problems   cnn_sgd, cnn_sam   the paper CIFAR-100 CNN round: 10 clients x 500 synthetic 32x32x3 images, B=64,
                                E=1, lr 0.01, wd 4e-4 (SAM rho 0.05); `Trainer.train` one round per timed call
             quickstart         configs/quickstart.py (digits CNN, 20 clients, 5 a round, B=16), `--rounds` rounds
                                per timed call (the device path runs them in blocks of rounds)
  settings   1dev               FEDJAX_FLAT_HOST_DEVICES=1 (XLA's single device: the old default)
             auto               the binaries' default: one device per usable core, one intra-op thread each
             Ndev_eigen1        N devices with --xla_cpu_multi_thread_eigen=false (a per-device thread setting)
             auto_host          auto, with engine.device_data=False (host batches, one round per call)
             auto_noshard       auto's N devices, engine.shard_clients=False (one device computes)
  (--settings picks; --overrides_<setting> is not offered: edit SETTINGS below for a new variant)

Writes JSON (--json) and a Markdown table (--md): examples/s (CNN) or rounds/s (quickstart) per setting, the
ratio to 1dev and to torch, the worker's CPU seconds per round (all threads: on a loaded machine the steadier
figure; equal CPU time on 2 devices means the round parallelises without overhead), machine record (CPU,
uptime before/after, fp32 GEMM rate of this process).

  python -m benchmarks.speed.host_devices [--repeats=5] [--problems=cnn_sgd,cnn_sam,quickstart]
      [--settings=1dev,auto] [--rounds=20] [--cnn_examples=500] [--peers=auto] [--json=PATH] [--md=PATH]
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from fedjax_flat import devices

if __name__ == '__main__' and '--serve' in sys.argv:
  devices.configure_host_devices()     # a worker: its environment (set by the driver) decides

from benchmarks.paths import REPO  # noqa: E402
CORES = devices.usable_cores()

# setting -> (environment of the worker, config overrides)
SETTINGS = {
    '1dev': ({devices.ENV: '1'}, {}),
    'auto': ({devices.ENV: 'auto'}, {}),
    'Ndev_eigen1': ({'XLA_FLAGS': f'{devices.COUNT_FLAG}={CORES} {devices.THREAD_FLAG}=false'}, {}),
    'auto_host': ({devices.ENV: 'auto'}, {'engine.device_data': False}),
    'auto_noshard': ({devices.ENV: 'auto'}, {'engine.shard_clients': False}),
}
CNN_CLIENTS, CNN_EXAMPLES, CNN_CLASSES = 10, 500, 100


def _set(c, dotted, value):
  node = c
  *path, last = dotted.split('.')
  for p in path:
    node = node[p]
  with node.ignore_type():
    node[last] = value


def _problem(name, overrides, examples=CNN_EXAMPLES):
  """(config, data, examples per round) of a problem."""
  from benchmarks.speed import bench_util
  from fedjax_flat.data import registry as data_registry
  from fedjax_flat.data.sources.builtin import synthetic
  if name.startswith('cnn_'):
    c = bench_util.round_config('cifar_cnn', name.split('_')[1], clients=CNN_CLIENTS)
    data = synthetic(CNN_CLIENTS, examples, input_shape=(32, 32, 3), num_classes=CNN_CLASSES, test_size=1)
  elif name == 'quickstart':
    import importlib.util
    spec = importlib.util.spec_from_file_location('quickstart', os.path.join(REPO, 'configs', 'quickstart.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()
    data = data_registry.get_dataset(c.dataset, **c.data.to_dict())
  else:
    raise ValueError(f'unknown problem {name!r}')
  for k, v in overrides.items():
    _set(c, k, v)
  c.rounds = 10 ** 6
  c.eval_every = 10 ** 6
  c.progress_every_s = 1e9
  return c, data


# --- worker side ---------------------------------------------------------------------------------------------

_TRAINERS = {}


def _setup(name, spec):
  import jax
  from benchmarks.speed import bench_util   # imports jax: in the worker, after its device count is set
  from fedjax_flat.training import loop
  c, data = _problem(spec['problem'], spec.get('overrides', {}), spec.get('examples', CNN_EXAMPLES))
  t = loop.Trainer(c, None, data=data, write_files=False)
  bench_util.training_only(t)          # training rounds only
  _TRAINERS[name] = t
  t0 = time.perf_counter()
  t.train(num_rounds=spec['rounds'])
  jax.block_until_ready(t.server_state)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  t.train(num_rounds=spec['rounds'])
  jax.block_until_ready(t.server_state)
  return {'first_round_s': first, 'warmup_s': time.perf_counter() - t0, 'devices': jax.device_count(),
          'sharded': t.plan.mesh is not None, 'device_rounds': bool(t.plan.device_rounds),
          'rounds_per_call': t.plan.rounds_per_call, 'host_devices': devices.describe()}


def _run(name, rounds):
  import jax
  t = _TRAINERS[name]
  t0, c0 = time.perf_counter(), time.process_time()
  t.train(num_rounds=rounds)
  jax.block_until_ready(t.server_state)
  return {'s': time.perf_counter() - t0, 'cpu_s': time.process_time() - c0}


def _info():
  import jax
  return {'jax': jax.__version__, 'devices': [str(d) for d in jax.devices()],
          'xla_flags': os.environ.get('XLA_FLAGS', ''), 'host_devices': devices.describe()}


def serve():
  from benchmarks.speed.peers import protocol
  protocol.serve(_setup, _run, _info)


# --- driver side ---------------------------------------------------------------------------------------------

def main():
  import argparse
  ap = argparse.ArgumentParser()
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--problems', default='cnn_sgd,cnn_sam,quickstart')
  ap.add_argument('--settings', default='1dev,auto')
  ap.add_argument('--rounds', type=int, default=20, help='quickstart rounds per timed call')
  ap.add_argument('--cnn_examples', type=int, default=CNN_EXAMPLES, help='examples per client (CNN problems)')
  ap.add_argument('--peers', default='auto', help='torch | auto (if installed) | none')
  ap.add_argument('--json', default=None)
  ap.add_argument('--md', default=None)
  a = ap.parse_args()
  os.environ[devices.ENV] = '1'      # the driver itself: one device (it only measures the GEMM rate)
  devices.configure_host_devices([])
  from benchmarks.speed import bench_util
  problems = a.problems.split(',')
  settings = a.settings.split(',')
  for s in settings:
    if s not in SETTINGS:
      raise SystemExit(f'--settings: unknown {s!r}; allowed: {", ".join(SETTINGS)}')
  peers = [p for p in bench_util.resolve_peers(a.peers) if p == 'torch']
  workers = {}
  fns, setup, units = {}, {}, {}
  peer_set = bench_util.PeerSet(peers)
  try:
    for s in settings:
      env, _ = SETTINGS[s]
      clean = {k: v for k, v in os.environ.items()
               if k not in ('XLA_FLAGS', devices.ENV, devices.APPLIED_ENV, 'JAX_NUM_CPU_DEVICES')}
      workers[s] = _start_worker({**clean, **env})   # protocol.Peer merges os.environ: a clean env here
    data_path = None
    for prob in problems:
      rounds = a.rounds if prob == 'quickstart' else 1
      for s in settings:
        spec = {**_spec_keys(prob), 'problem': prob, 'overrides': SETTINGS[s][1], 'rounds': rounds,
                'examples': a.cnn_examples}
        print(f'setting up {prob} / {s} ...', file=sys.stderr, flush=True)
        setup[(prob, s)] = workers[s].setup(f'{prob}', spec)
        fns[(prob, s)] = _timer(workers[s], prob, rounds, (prob, s))
        units[(prob, s)] = rounds
      if prob.startswith('cnn_') and 'torch' in peers:
        from fedjax_flat.data.sources.builtin import synthetic
        if data_path is None:
          data = synthetic(CNN_CLIENTS, a.cnn_examples, input_shape=(32, 32, 3), num_classes=CNN_CLASSES,
                           test_size=1)
          data_path = peer_set.write_data('cifar', data)
        c = bench_util.round_config('cifar_cnn', prob.split('_')[1], clients=CNN_CLIENTS)
        fns[(prob, 'torch')], setup[(prob, 'torch')] = peer_set.variant(
            'torch', prob, bench_util.spec_of(c, data_path, num_classes=CNN_CLASSES))
        units[(prob, 'torch')] = 1
    info = bench_util.machine_info()
    up = [bench_util.uptime()]
    gemm = [bench_util.gemm_gflops()]
    times = bench_util.interleave(fns, a.repeats)
    gemm.append(bench_util.gemm_gflops())
    up.append(bench_util.uptime())
  finally:
    for w in workers.values():
      w.close()
    peer_set.close()

  per_round = {k: statistics.median(v) / units[k] for k, v in times.items()}
  rows = []
  for prob in problems:
    ex = CNN_CLIENTS * a.cnn_examples if prob.startswith('cnn_') else None
    base = per_round.get((prob, '1dev'))
    torch_s = per_round.get((prob, 'torch'))
    for (p, s), sec in per_round.items():
      if p != prob:
        continue
      st = setup.get((p, s), {})
      rows.append({'problem': p, 'setting': s, 's_per_round': sec, 'rounds_per_s': 1 / sec,
                   'examples_per_s': ex / sec if ex else None,
                   'x_1dev': base / sec if base else None, 'x_torch': torch_s / sec if torch_s else None,
                   'devices': st.get('devices'), 'sharded': st.get('sharded'),
                   'device_rounds': st.get('device_rounds'), 'first_call_s': st.get('first_round_s'),
                   'cpu_s_per_round': (statistics.median(CPU_S[(p, s)]) / units[(p, s)]) if (p, s) in CPU_S else None,
                   'all_s': times[(p, s)]})
  res = {'rows': rows, 'repeats': a.repeats, 'cnn_examples_per_client': a.cnn_examples,
         'quickstart_rounds_per_call': a.rounds, 'uptime': up,
         'gemm_gflops_2048': gemm, 'cores': CORES, **info,
         'workers': {s: setup.get((problems[0], s), {}).get('host_devices') for s in settings}}
  md = _markdown(res)
  print(md)
  if a.json:
    with open(a.json, 'w') as f:
      json.dump(res, f, indent=2)
  if a.md:
    with open(a.md, 'w') as f:
      f.write(md)


def _start_worker(env):
  from benchmarks.speed.peers import protocol
  import subprocess
  p = protocol.Peer.__new__(protocol.Peer)
  p.name = 'host_devices worker'
  p.proc = subprocess.Popen([sys.executable, '-m', 'benchmarks.speed.host_devices', '--serve'], cwd=REPO,
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
  return p


def _spec_keys(prob):
  """The peer protocol's required spec keys (the workers read only problem / overrides / rounds)."""
  return {'model': 'cifar_cnn' if prob.startswith('cnn_') else 'digits_cnn', 'num_classes': 0, 'data': '',
          'clients_per_round': 0, 'batch_size': 0, 'epochs': 1, 'lr': 0.0, 'weight_decay': 0.0,
          'optimizer': 'sam' if prob == 'cnn_sam' else 'sgd', 'rho': 0.0, 'seed': 0}


CPU_S = {}      # (problem, setting) -> the worker's CPU seconds per timed call (all its threads)


def _timer(worker, name, rounds, key):
  def fn():
    r = worker.run(name, rounds)
    CPU_S.setdefault(key, []).append(r['cpu_s'])
    return r['s']
  return fn


def _markdown(res):
  lines = [f"CPU {res['cpu']} x{res['cpus']} ({res['cores']} usable), jax {res['jax']}; fp32 GEMM 2048^3 "
           f"{res['gemm_gflops_2048'][0]:.0f} / {res['gemm_gflops_2048'][1]:.0f} GFLOP/s (before / after, one "
           f"device)", '', f"uptime before: `{res['uptime'][0]}`", '', f"uptime after: `{res['uptime'][1]}`", '',
           f"median of {res['repeats']}, interleaved; quickstart timed {res['quickstart_rounds_per_call']} rounds "
           f"per call; CNN rounds {CNN_CLIENTS} clients x {res['cnn_examples_per_client']} examples, B=64", '',
           '| problem | setting | devices | sharded | device path | examples/s | rounds/s | x 1dev | x torch '
           '| CPU s/round |', '|---|---|---:|---|---|---:|---:|---:|---:|---:|']
  f = lambda v, p=2: '-' if v is None else f'{v:.{p}f}'
  for r in res['rows']:
    lines.append(f"| {r['problem']} | {r['setting']} | {r['devices'] or '-'} | {r['sharded']} | "
                 f"{r['device_rounds']} | {f(r['examples_per_s'], 1)} | {f(r['rounds_per_s'], 2)} | "
                 f"{f(r['x_1dev'])} | {f(r['x_torch'])} | {f(r['cpu_s_per_round'], 3)} |")
  return '\n'.join(lines) + '\n'


if __name__ == '__main__':
  if '--serve' in sys.argv:
    serve()
  else:
    main()
