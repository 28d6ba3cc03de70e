"""What the throughput benchmarks share: the machine's record, the peers, interleaved timing.

Every figure of a table comes from one process that times all its variants round-robin (`interleave`), so
the machine's speed drift hits them alike; the record names the CPU, the load before and after, and the
fp32 GEMM rate measured in the same run (`machine_info`, `gemm_gflops`).
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.paths import REPO
from fedjax_flat import cpu_paths, devices
from benchmarks.speed.peers import protocol

SPEED = os.path.dirname(os.path.abspath(__file__))     # the default place of the speed benchmarks' results
FEDJAX_PYTHON = os.path.join(REPO, '.venv-fedjax', 'bin', 'python')
# The torch peer's own venv (benchmarks/speed/peers/make_torch_venv.sh): torch beside our stack would slow ours
# (tensorboardX imports torch when it is installed: 1.7 s at every start) and run the torch tests in the suite.
TORCH_PYTHON = os.path.join(REPO, '.venv-torch', 'bin', 'python')


def torch_python() -> str:
  """The interpreter of the torch peer: .venv-torch's, else this one (torch installed here)."""
  return TORCH_PYTHON if os.path.exists(TORCH_PYTHON) else sys.executable
PEERS = ('torch', 'fedjax')


def cpu_model() -> str:
  return cpu_paths.isa()['model']


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


ISA_CAP_ENV = ('ATEN_CPU_CAPABILITY', 'ONEDNN_MAX_CPU_ISA', 'MKL_ENABLE_INSTRUCTIONS')   # the torch peer's


def machine_info() -> dict:
  return {'cpu': cpu_model(), 'isa': cpu_paths.isa()['features'], 'cpus': os.cpu_count(), 'jax': jax.__version__,
          'backend': jax.default_backend(),
          'devices': [str(d) for d in jax.devices()], 'xla_flags': os.environ.get('XLA_FLAGS', ''),
          'host_devices': devices.describe(), 'kernel_path': cpu_paths.applied(),
          # instruction-set caps a run was given (XLA's caps only its own emitted loops: cpu_paths.max_isa)
          'isa_caps': {k: os.environ[k] for k in ISA_CAP_ENV if os.environ.get(k)}}


def available_peers() -> list:
  out = []
  try:
    import importlib.util
    if os.path.exists(TORCH_PYTHON) or importlib.util.find_spec('torch') is not None:
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
      fix = ('bash benchmarks/speed/peers/make_fedjax_venv.sh' if p == 'fedjax'
             else "pip install -e '.[peers]' (torch)")
      raise SystemExit(f'--peers: peer {p!r} is not installed here; run: {fix}')
  return want


def start_peer(name: str) -> protocol.Peer:
  if name == 'torch':
    return protocol.Peer(torch_python(), 'benchmarks.speed.peers.torch_peer', cwd=REPO)
  return protocol.Peer(FEDJAX_PYTHON, 'benchmarks.speed.peers.fedjax_peer', cwd=REPO)


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
              seed=c.seed, hidden=list(c.model_kwargs.get('hidden', (64,))))   # models/registry.py's MLP default
  spec.update(extra)
  return spec


def medians_and_ratios(wall: dict, cpu: dict, base: str, cpu_per: float = 1.0):
  """(median wall s, median CPU s / cpu_per, wall ratios, CPU ratios) of each interleaved variant, the ratios
  to the `base` variant's: what an overhead benchmark reports (cpu_per: e.g. the rounds of a timed call)."""
  med = {k: statistics.median(v) for k, v in wall.items()}
  med_cpu = {k: statistics.median(v) / cpu_per for k, v in cpu.items()}
  return (med, med_cpu, {k: v / med[base] for k, v in med.items()},
          {k: v / med_cpu[base] for k, v in med_cpu.items()})


def training_only(trainer):
  """Leaves evaluation out of `trainer.train`; returns the evaluation, callable alone (`evaluate()` -> its dict).

  The recorder, not `Trainer.evaluate`, evaluates at each evaluation round and at the end of every
  `train(num_rounds=K)` call: replacing `trainer.evaluate` (what these benchmarks once did) left one evaluation
  of the whole test set inside every timed call (pfl_cifar10: 10,000 images in each call of 3 rounds).
  """
  evaluate = trainer.recorder.evaluate
  trainer.recorder.evaluate = lambda _trainer: {}
  return lambda: evaluate(trainer)


def interleave(fns: dict, repeats: int, progress: bool = True, cpu_times: dict | None = None) -> dict:
  """fns: name -> callable returning seconds per unit. Round-robin `repeats` times; name -> list of seconds.

  cpu_times (a dict to fill): this process's CPU seconds per call, name -> list. On a shared machine the
  CPU time of in-process variants is far steadier than the wall time (meaningless for peer subprocesses).
  """
  times = {k: [] for k in fns}
  for r in range(repeats):
    for k, fn in fns.items():
      c = time.process_time()
      times[k].append(fn())
      if cpu_times is not None:
        cpu_times.setdefault(k, []).append(time.process_time() - c)
    if progress:
      print(f'  repeat {r + 1}/{repeats} done ({uptime()})', file=sys.stderr, flush=True)
  return times


# --- Our variants of one round, generic over the model (round_throughput.py, accelerator.py). ---

def round_config(model: str, opt: str = 'sgd', *, strategy: str = 'auto', conv: str = 'auto', clients: int = 10,
                 chunk: int = 5, batch: int = 64):
  """The paper CIFAR setting: lr 0.01, wd 4e-4, B=64, E=1, SAM rho 0.05."""
  from fedjax_flat.config.default_config import default_config
  c = default_config()
  c.model = model
  c.model_kwargs.conv_impl = conv
  c.client.lr = 0.01
  c.client.weight_decay = 4e-4
  c.client.batch_size = batch
  c.client.optimizer = opt
  c.client.rho = 0.05
  c.clients_per_round = clients
  c.engine.strategy = strategy
  c.engine.clients_per_chunk = chunk
  return c


def engine_round_variant(config, data, num_classes: int, *, compiled_memory: bool = False):
  """The engine's one-round program on round 0's batches (built beforehand). Returns (time_fn, memory info).

  time_fn() -> seconds of one round. Memory (compiled_memory=True): XLA's buffer sizes of the compiled
  program (arguments, outputs, temporaries), the per-program peak that device-wide counters cannot split.
  """
  from fedjax_flat.algorithms import registry
  from fedjax_flat.core import engine
  from fedjax_flat.data import batching
  from fedjax_flat.models.registry import compute_dtype, get_model
  c = config
  shape = tuple(data.input_shape)
  model = get_model(c.model, num_classes, shape, compute_dtype=compute_dtype(c), **c.model_kwargs.to_dict())
  alg = registry.build_algorithm(c, model)
  params = model.init(jax.random.key(0), jnp.zeros((1,) + shape))
  n, strategy, chunk = c.clients_per_round, c.engine.strategy, c.engine.clients_per_chunk
  cohort = engine.padded_cohort(strategy, n, chunk)
  fn = engine.make_round_fn(alg, chunk=engine.chunk_size(strategy, cohort, chunk), donate=False)
  b = c.client.batch_size
  s = batching.padded_num_steps(data.client_sizes(), b)
  rb = batching.make_round_batches(data, range(n), round_idx=0, seed=0, batch_size=b, num_steps=s,
                                   pad_clients_to=cohort)
  args = (jax.device_put(rb.as_dict()), None,
          jax.vmap(lambda k: jax.random.fold_in(jax.random.key(1), k))(jnp.arange(cohort)),
          jnp.asarray(rb.num_examples), jnp.asarray(rb.client_ids >= 0), jnp.int32(0))
  state = alg.server_init(params, jax.random.key(2))   # a run key (DP's noise key derives from it)
  mem = {}
  if compiled_memory:   # compile ahead of time (once) and run that executable
    fn = fn.lower(state, *args).compile()
    m = fn.memory_analysis()
    if m is not None:
      mem = {'argument_bytes': int(m.argument_size_in_bytes), 'output_bytes': int(m.output_size_in_bytes),
             'temp_bytes': int(m.temp_size_in_bytes),
             'program_peak_bytes': int(m.argument_size_in_bytes + m.output_size_in_bytes
                                       + m.temp_size_in_bytes - m.alias_size_in_bytes)}

  def run():
    t = time.perf_counter()
    out = fn(state, *args)
    jax.block_until_ready(out[0])
    return time.perf_counter() - t
  return run, mem


def python_loop_variant(model, data, clients: int, *, batch: int = 64, lr: float = 0.01, wd: float = 4e-4):
  """FedJAX's default pattern on our stack: a Python loop over clients and batches, one jitted SGD step per
  batch. Returns (loop time_fn (seconds per round), single-step time_fn (seconds per step of one batch))."""
  import optax
  from fedjax_flat.algorithms.local import make_loss
  from fedjax_flat.data import batching
  loss = make_loss(model)
  tx = optax.chain(optax.add_decayed_weights(wd), optax.sgd(lr))
  params = model.init(jax.random.key(0), jnp.zeros((1,) + tuple(data.input_shape)))

  @jax.jit
  def step(p, o, b):
    g = jax.grad(lambda q: loss(q, b)[0])(p)
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o

  s = batching.padded_num_steps(data.client_sizes(), batch)
  rb = batching.make_round_batches(data, range(clients), round_idx=0, seed=0, batch_size=batch, num_steps=s)
  batches = [[jax.device_put({k: v[c, t] for k, v in rb.as_dict().items()}) for t in range(s)]
             for c in range(clients)]

  def loop_fn():
    t = time.perf_counter()
    outs = []
    for c in range(clients):
      p, o = params, tx.init(params)
      for b in batches[c]:
        p, o = step(p, o, b)
      outs.append(p)
    jax.block_until_ready(outs)
    return time.perf_counter() - t

  full, o0 = batches[0][0], tx.init(params)

  def single(reps=8):
    t = time.perf_counter()
    for _ in range(reps):
      jax.block_until_ready(step(params, o0, full))
    return (time.perf_counter() - t) / reps
  return loop_fn, single


def compile_and_run_round(fn, args, steps: int, max_gb: float) -> dict:
  """One client round program (core/engine.make_round_fn) compiled and, when XLA's temporaries fit in
  `max_gb`, run once: compile_s, xla_temp_gb / xla_args_gb (memory_analysis), then round_s, step_s and
  whether the round's outputs are finite, or `skipped` with why."""
  t0 = time.time()
  compiled = fn.lower(*args).compile()
  out = {'compile_s': round(time.time() - t0, 1)}
  try:
    ma = compiled.memory_analysis()
    out['xla_temp_gb'] = round(ma.temp_size_in_bytes / 2**30, 3)
    out['xla_args_gb'] = round(ma.argument_size_in_bytes / 2**30, 3)
  except Exception as e:  # noqa: BLE001 -- not every backend reports it
    out['xla_memory_analysis'] = f'unavailable: {e}'
  if out.get('xla_temp_gb', 0) > max_gb:
    out['skipped'] = f'XLA temporaries {out["xla_temp_gb"]} GB > --max_gb {max_gb}'
    return out
  t0 = time.time()
  res = compiled(*args)
  jax.block_until_ready(res)
  out['round_s'] = round(time.time() - t0, 2)
  out['step_s'] = round(out['round_s'] / steps, 2)
  out['finite'] = bool(np.all(np.asarray(res[2]['finite'])))
  return out


def finish_round_report(out: dict, json_path: str = '') -> dict:
  """A round benchmark's report: the process's peak resident memory added (peak_rss_gb), printed as JSON and
  written to json_path when given."""
  out['peak_rss_gb'] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
  print(json.dumps(out, indent=1))
  if json_path:
    with open(json_path, 'w') as f:
      json.dump(out, f, indent=1)
  return out


def write_report(out: str, res: dict, markdown) -> dict:
  """OUT.json (the measurements) and OUT.md (`markdown(res)`, also printed): what a benchmark leaves to read."""
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out + '.json', 'w') as f:
    json.dump(res, f, indent=2, default=str)
  md = markdown(res)
  with open(out + '.md', 'w') as f:
    f.write(md)
  print(md)
  print(f'wrote {out}.json and {out}.md')
  return res
