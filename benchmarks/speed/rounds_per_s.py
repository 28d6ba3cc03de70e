r"""Rounds per second of small federated problems: one round per call vs many rounds per compiled call.

Problems (digits, FedAvg, SGD, 1 local epoch):
  quickstart   configs/quickstart.py: digits CNN, 20 clients, 5 a round, B=16
  mlp6_full    6 clients (all every round), dense 64-32-10 MLP, full-batch local training (B = largest client)
  mlp6_b16     the same with B=16

Variants (built, compiled and warmed up first, then timed round-robin `--repeats` times, median):
  host_R1      engine.device_data=False: host sampling + numpy batches (prefetched), one round per call
               (the path of every run before rounds_per_call)
  dev_R<k>     data on the device, sampling/batching in the program, k rounds per call (k=1: one per call)
  auto         the default (engine.rounds_per_call='auto')
  loop_jit     FedJAX's default pattern on our stack: a Python loop over clients with numpy sampling /
               shuffling / batching and one jitted SGD step per batch, weighted average with tree ops on the
               host (same model, data, batch size, lr)
  fedjax       the FedJAX 0.0.17 peer itself (benchmarks/speed/peers/fedjax_peer.py in .venv-fedjax, a subprocess:
               fed_avg + UniformGetClientSampler, haiku models; `bash benchmarks/speed/peers/make_fedjax_venv.sh`)
  torch        the PyTorch reference pattern (benchmarks/speed/peers/torch_peer.py, a subprocess)
  (--peers=auto: the peers installed here; none: no peers)

Trainer variants time `Trainer.train(num_rounds=N)` with evaluation switched off (the training rounds only).
Host overhead (device variants): 1 - (time of the compiled block program alone, same rounds, back to back)
/ (time of train()), i.e. the share of a round's wall time spent outside the compiled program.
`--before=DIR` (a checkout of an older commit) adds the quickstart's end-to-end wall time (experiments/train.py,
process start to exit, compilation included) before vs now, interleaved.

`vs_fedjax` / `vs_torch` columns: rounds/s of the variant / the peer's, same process, interleaved.

  python -m benchmarks.speed.rounds_per_s [--rounds=200] [--repeats=3] [--json=PATH] [--before=DIR] [--peers=auto]
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py).
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from benchmarks.paths import REPO  # noqa: E402

from absl import app, flags, logging  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.speed import bench_util  # noqa: E402

from fedjax_flat.algorithms.local import make_loss  # noqa: E402
from fedjax_flat.training import trainers  # noqa: E402

_ROUNDS = flags.DEFINE_integer('rounds', 200, 'timed rounds per repetition (quickstart: a quarter)')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'timed repetitions per variant (median)')
_JSON = flags.DEFINE_string('json', None, 'write results as JSON here')
_BEFORE = flags.DEFINE_string('before', None, 'a checkout of an older commit: quickstart wall time before/now')
_PROBLEMS = flags.DEFINE_list('problems', ['quickstart', 'mlp6_full', 'mlp6_b16'], 'problems')
_RS = flags.DEFINE_list('rounds_per_call', ['1', '8', '32', '64'], 'R values of the dev_R<k> variants')
_PEERS = flags.DEFINE_string('peers', 'auto', 'torch,fedjax | auto (those installed) | none')


def _config(problem):
  from configs import quickstart
  c = quickstart.get_config()
  c.progress_every_s = 1e9
  if problem.startswith('mlp6'):
    c.data.num_clients = 6
    c.clients_per_round = 6
    c.model = 'mlp'
    c.model_kwargs.hidden = (32,)
    c.client.lr = 0.1
    c.client.weight_decay = 0.0
  return c


def _full_batch(c):
  from fedjax_flat.data import registry as data_registry
  data = data_registry.get_dataset(c.dataset, **c.data.to_dict())
  return int(np.max(data.client_sizes()))


def _trainer(problem, n_rounds, **engine):
  c = _config(problem)
  if problem == 'mlp6_full':
    c.client.batch_size = _full_batch(c)
  c.rounds = n_rounds
  c.eval_every = n_rounds
  for k, v in engine.items():
    c.engine[k] = v
  t = trainers.make_trainer(c, None, write_files=False)
  bench_util.training_only(t)        # training rounds only (the same for every variant)
  return t


class TrainerVariant:
  def __init__(self, problem, rounds, repeats, **engine):
    self.t = _trainer(problem, 1 + (repeats + 1) * rounds + 64, **engine)
    self.rounds = rounds
    self.t.train(num_rounds=1)                               # compile
    self.t.train(num_rounds=min(rounds, 32))                 # warm up (and 'auto' measures its round time)

  def time(self):
    t0 = time.perf_counter()
    self.t.train(num_rounds=self.rounds)
    return (time.perf_counter() - t0) / self.rounds

  def program_time(self):
    """Seconds per round of the compiled block program alone (device path), rounds back to back."""
    t = self.t
    if not t.plan.device_rounds:
      return None
    r, n_left = t.round, self.rounds
    t0 = time.perf_counter()
    while n_left > 0:
      n = min(t.plan.rounds_per_call, n_left)
      store = t.store.arrays if t.store is not None else None
      template = t.store.template if t.store is not None else None
      t.server_state, store, m = t.driver.block_fn(t.server_state, store, template, t.driver.dev_data, t.plan.key,
                                            jnp.asarray(r, jnp.int32), jnp.asarray(n, jnp.int32))
      if t.store is not None:
        t.store.arrays = store
      r += n
      n_left -= n
    jax.block_until_ready(m)
    dt = (time.perf_counter() - t0) / self.rounds
    t.round = r
    return dt


class LoopJitVariant:
  """FedJAX's default pattern: for each client, numpy batches, one jitted step per batch; host averaging."""

  def __init__(self, problem, rounds, repeats):
    c = _config(problem)
    if problem == 'mlp6_full':
      c.client.batch_size = _full_batch(c)
    t = _trainer(problem, 4)
    self.data, self.c, self.rounds, self.r = t.data, c, rounds, 0
    self.params = t.server_state['params']
    loss = make_loss(t.model)
    lr = c.client.lr

    @jax.jit
    def step(p, x, y):
      g = jax.grad(lambda q: loss(q, {'x': x, 'y': y, 'mask': jnp.ones(y.shape, jnp.float32)})[0])(p)
      return jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g)
    self.step = step
    self.run(2)

  def run(self, rounds):
    d, c = self.data, self.c
    for _ in range(rounds):
      rng = np.random.default_rng(self.r)
      ids = rng.choice(d.num_clients, c.clients_per_round, replace=False)
      total, acc = 0.0, None
      for k in ids:
        idx = d.client_indices(int(k))
        order = idx[rng.permutation(len(idx))]
        p = self.params
        for b in range(0, len(order), c.client.batch_size):
          sel = order[b:b + c.client.batch_size]
          p = self.step(p, d.x[sel], d.y[sel])
        w = float(len(idx))
        acc = (jax.tree_util.tree_map(lambda a: w * a, p) if acc is None
               else jax.tree_util.tree_map(lambda a, b: a + w * b, acc, p))
        total += w
      self.params = jax.tree_util.tree_map(lambda a: a / total, acc)
      self.r += 1
    jax.block_until_ready(self.params)

  def time(self):
    t0 = time.perf_counter()
    self.run(self.rounds)
    return (time.perf_counter() - t0) / self.rounds

  def program_time(self):
    return None


class PeerVariant:
  """A peer subprocess running the same problem (benchmarks/peers): rounds timed inside the peer."""

  def __init__(self, peer_set, peer, problem, rounds, data_path, num_classes):
    c = _config(problem)
    if problem == 'mlp6_full':
      c.client.batch_size = _full_batch(c)
    spec = bench_util.spec_of(c, data_path, num_classes=num_classes)
    self.fn, self.setup = peer_set.variant(peer, problem, spec)
    self.rounds = rounds

  def time(self):
    return self.fn(self.rounds)

  def program_time(self):
    return None


def _quickstart_wall(repo, wd):
  t0 = time.perf_counter()
  subprocess.run([sys.executable, os.path.join(repo, 'experiments', 'train.py'),
                  f'--config={os.path.join(repo, "configs", "quickstart.py")}', f'--workdir={wd}', '--fresh'],
                 check=True, cwd=repo, capture_output=True, env={**os.environ, 'PYTHONPATH': repo})
  wall = time.perf_counter() - t0
  with open(os.path.join(wd, 'summary.json')) as f:
    s = json.load(f)
  return wall, s['wall_time_s'], s['final_test_accuracy']


def main(_):
  logging.set_verbosity(logging.WARNING)
  peers = bench_util.resolve_peers(_PEERS.value)
  peer_set = bench_util.PeerSet(peers)
  try:
    return _main(peer_set, peers)
  finally:
    peer_set.close()


def _main(peer_set, peers):
  out = {'uptime': open('/proc/loadavg').read().split()[:3], 'uptime_line': bench_util.uptime(),
         'backend': jax.default_backend(), 'devices': str(jax.devices()), 'cpu': bench_util.cpu_model(),
         'gemm_gflops_2048': bench_util.gemm_gflops(), 'peer_info': peer_set.info, 'problems': {}}
  for problem in _PROBLEMS.value:
    rounds = max(_ROUNDS.value // 4, 10) if problem == 'quickstart' else _ROUNDS.value
    variants = {'host_R1': TrainerVariant(problem, rounds, _REPEATS.value, device_data=False)}
    for r in _RS.value:
      variants[f'dev_R{r}'] = TrainerVariant(problem, rounds, _REPEATS.value, rounds_per_call=int(r))
    variants['auto'] = TrainerVariant(problem, rounds, _REPEATS.value)
    variants['loop_jit'] = LoopJitVariant(problem, rounds, _REPEATS.value)
    if peers:
      data = variants['loop_jit'].data
      path = peer_set.write_data(problem, data)
      for peer in peers:
        variants[peer] = PeerVariant(peer_set, peer, problem, rounds, path, data.num_classes)
    times = {k: [] for k in variants}
    prog = {k: [] for k in variants}
    for _ in range(_REPEATS.value):
      for k, v in variants.items():
        times[k].append(v.time())
        p = v.program_time()
        if p is not None:
          prog[k].append(p)
    res = {}
    for k in variants:
      s = statistics.median(times[k])
      res[k] = {'s_per_round': s, 'rounds_per_s': 1.0 / s}
      if prog[k]:
        ps = statistics.median(prog[k])
        res[k]['program_s_per_round'] = ps
        res[k]['host_overhead_pct'] = 100.0 * max(0.0, 1.0 - ps / s)
    for k in res:
      res[k]['vs_loop_jit'] = res[k]['rounds_per_s'] / res['loop_jit']['rounds_per_s']
      res[k]['vs_host_R1'] = res[k]['rounds_per_s'] / res['host_R1']['rounds_per_s']
      for peer in peers:
        res[k][f'vs_{peer}'] = res[k]['rounds_per_s'] / res[peer]['rounds_per_s']
    out['problems'][problem] = {'timed_rounds': rounds, 'variants': res,
                                'auto_rounds_per_call': variants['auto'].t.plan.rounds_per_call}
    print(f'\n{problem} ({rounds} rounds x {_REPEATS.value}, median)')
    print(f'{"variant":10s} {"rounds/s":>10s} {"vs loop_jit":>12s} {"vs host_R1":>11s}'
          + ''.join(f' {"vs " + p:>10s}' for p in peers) + f' {"host ovh %":>11s}')
    for k, v in res.items():
      ovh = f'{v["host_overhead_pct"]:.1f}' if 'host_overhead_pct' in v else '-'
      print(f'{k:10s} {v["rounds_per_s"]:10.1f} {v["vs_loop_jit"]:12.2f} {v["vs_host_R1"]:11.2f}'
            + ''.join(f' {v["vs_" + p]:10.2f}' for p in peers) + f' {ovh:>11s}')
    del variants
  if _BEFORE.value:
    walls = {'before': [], 'now': []}
    with tempfile.TemporaryDirectory() as tmp:
      for i in range(2):
        for name, repo in (('before', _BEFORE.value), ('now', REPO)):
          walls[name].append(_quickstart_wall(repo, os.path.join(tmp, f'{name}{i}')))
    out['quickstart_end_to_end'] = {
        k: {'process_wall_s': statistics.median(w[0] for w in v), 'train_wall_s': statistics.median(w[1] for w in v),
            'final_test_accuracy': [w[2] for w in v]} for k, v in walls.items()}
    print('\nquickstart end to end (experiments/train.py, 100 rounds, median of 2, interleaved)')
    for k, v in out['quickstart_end_to_end'].items():
      print(f'{k:7s} process {v["process_wall_s"]:.1f} s  training loop {v["train_wall_s"]:.1f} s  '
            f'acc {v["final_test_accuracy"]}')
  out['uptime_after'] = open('/proc/loadavg').read().split()[:3]
  out['uptime_line_after'] = bench_util.uptime()
  print(json.dumps(out, indent=1))
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(out, f, indent=1)


if __name__ == '__main__':
  app.run(main)
