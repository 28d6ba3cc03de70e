"""What the throughput benchmarks share: the machine's record, the peers, interleaved timing.

Every figure of a table comes from one process that times all its variants round-robin (`interleave`), so
the machine's speed drift hits them alike; the record names the CPU, the load before and after, and the
fp32 GEMM rate measured in the same run (`machine_info`, `gemm_gflops`).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, os.path.join(BENCH, 'peers'))
import protocol  # noqa: E402

FEDJAX_PYTHON = os.path.join(REPO, '.venv-fedjax', 'bin', 'python')
PEERS = ('torch', 'fedjax')


def cpu_model() -> str:
  try:
    return [l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')][0]
  except (OSError, IndexError):
    return ''


def uptime() -> str:
  return subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()


def gemm_gflops(n: int = 2048, repeats: int = 5) -> float:
  """fp32 GEMM rate of the default device through XLA (the ceiling the model FLOP rates are read against)."""
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda a, b: a @ b)
  jax.block_until_ready(f(a, a))
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(f(a, a))
    ts.append(time.perf_counter() - t)
  return 2 * n ** 3 / statistics.median(ts) / 1e9


def machine_info() -> dict:
  return {'cpu': cpu_model(), 'cpus': os.cpu_count(), 'jax': jax.__version__, 'backend': jax.default_backend(),
          'devices': [str(d) for d in jax.devices()], 'xla_flags': os.environ.get('XLA_FLAGS', '')}


def available_peers() -> list:
  out = []
  try:
    import importlib.util
    if importlib.util.find_spec('torch') is not None:
      out.append('torch')
  except (ImportError, ValueError):
    pass
  if os.path.exists(FEDJAX_PYTHON):
    out.append('fedjax')
  return out


def resolve_peers(arg: str) -> list:
  """'auto' -> the peers installed here; 'none' -> []; else a comma list, each of which must be installed."""
  if arg == 'auto':
    return available_peers()
  want = [p for p in arg.split(',') if p and p != 'none']
  for p in want:
    if p not in PEERS:
      raise SystemExit(f'--peers: unknown peer {p!r}; allowed: {", ".join(PEERS)}, auto, none')
    if p not in available_peers():
      fix = ('bash benchmarks/peers/make_fedjax_venv.sh' if p == 'fedjax'
             else "pip install -e '.[peers]' (torch)")
      raise SystemExit(f'--peers: peer {p!r} is not installed here; run: {fix}')
  return want


def start_peer(name: str) -> protocol.Peer:
  if name == 'torch':
    return protocol.Peer(sys.executable, os.path.join(BENCH, 'peers', 'torch_peer.py'))
  return protocol.Peer(FEDJAX_PYTHON, os.path.join(BENCH, 'peers', 'fedjax_peer.py'))


class PeerSet:
  """The peers of one benchmark run, each a live subprocess; problem files in a temporary directory."""

  def __init__(self, names):
    self.tmp = tempfile.TemporaryDirectory(prefix='peers_')
    self.peers = {n: start_peer(n) for n in names}
    self.info = {n: p.call(cmd='info') for n, p in self.peers.items()}

  def write_data(self, key: str, data, ids=None) -> str:
    """The clients of a FederatedDataset (all, or `ids`) as a peer problem file."""
    path = os.path.join(self.tmp.name, f'{key}.npz')
    ids = range(data.num_clients) if ids is None else ids
    clients = [(data.x[data.client_indices(k)], data.y[data.client_indices(k)]) for k in ids]
    protocol.write_problem(path, clients)
    return path

  def variant(self, peer: str, name: str, spec: dict):
    """Sets the problem up in the peer (compiles, warms up); returns (time_fn, setup reply)."""
    p = self.peers[peer]
    reply = p.setup(name, spec)
    last = {}

    def time_round(rounds=1):
      r = p.run(name, rounds)
      last.update(r)
      return r['s'] / rounds
    time_round.last = last
    return time_round, reply

  def close(self):
    for p in self.peers.values():
      p.close()
    self.tmp.cleanup()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def spec_of(config, data_path: str, **extra) -> dict:
  """A peer spec from one of our configs (the same model, data, batch size, optimizer)."""
  c = config
  spec = dict(model=c.model, num_classes=extra.pop('num_classes'), data=data_path,
              clients_per_round=c.clients_per_round, batch_size=c.client.batch_size, epochs=c.client.local_epochs,
              lr=c.client.lr, weight_decay=c.client.weight_decay, optimizer=c.client.optimizer, rho=c.client.rho,
              seed=c.seed, hidden=list(c.model_kwargs.get('hidden', (32,))))
  spec.update(extra)
  return spec


def interleave(fns: dict, repeats: int, progress: bool = True) -> dict:
  """fns: name -> callable returning seconds per unit. Round-robin `repeats` times; name -> list of seconds."""
  times = {k: [] for k in fns}
  for r in range(repeats):
    for k, fn in fns.items():
      times[k].append(fn())
    if progress:
      print(f'  repeat {r + 1}/{repeats} done ({uptime()})', file=sys.stderr, flush=True)
  return times
