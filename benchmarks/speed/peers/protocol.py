"""How the benchmarks talk to their peers: a peer is a subprocess speaking JSON lines on stdin/stdout.

Why subprocesses: the FedJAX peer needs its own venv (jax 0.4.23, benchmarks/speed/peers/make_fedjax_venv.sh), and
the torch peer's OpenMP threads would otherwise share a process (and spin-wait) next to XLA's. A peer stays
alive between calls, so the driver can time ours and the peers interleaved, round-robin.

Messages (one JSON object per line; every reply has "ok"):
  {"cmd": "setup", "name": N, "spec": {...}}  -> builds problem N, runs its warm-up rounds;
                                                 {"ok": true, "first_round_s": s, "warmup_s": s, ...}
  {"cmd": "run", "name": N, "rounds": k}      -> {"ok": true, "s": seconds of the k rounds (timed inside),
                                                  "peak_mem_bytes": the peer's peak (device) memory}
  {"cmd": "info"}                              -> versions, threads
  {"cmd": "quit"}
A whole run as its user runs it (benchmarks/speed/end_to_end.py): `python -m <peer> --whole_run=SPEC.json` builds
the problem, trains spec['rounds'] rounds, evaluates the server model on spec['test'] (a `write_problem` file of
one client) every spec['eval_every'] rounds with batches of spec['eval_batch'], and prints one JSON line (timings
and the evaluations' accuracies): `whole_run`; the driver side is `run_whole`.
A spec names the model ('cifar_cnn' | 'digits_cnn' | 'mlp' | 'resnet18_gn' | 'pfl_cnn'), num_classes, hidden
(mlp), the data file (`write_problem`), clients_per_round, batch_size, epochs, lr, weight_decay, optimizer
('sgd' | 'sam'), rho, seed; optionally weighting ('examples' | 'uniform': a client's weight in the server's
average) and dropout (pfl_cnn: False removes its dropout layers). This module needs only the standard library
and numpy (it runs in every venv).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np

SPEC_KEYS = ('model', 'num_classes', 'data', 'clients_per_round', 'batch_size', 'epochs', 'lr',
             'weight_decay', 'optimizer', 'rho', 'seed')


class PeerError(RuntimeError):
  pass


def write_problem(path: str, clients) -> None:
  """clients: a list of (x [n_k, ...] float32, y [n_k] int) -> one .npz (x, y concatenated; CSR offsets)."""
  xs = [np.asarray(x, np.float32) for x, _ in clients]
  ys = [np.asarray(y, np.int32) for _, y in clients]
  offsets = np.concatenate([[0], np.cumsum([len(y) for y in ys])]).astype(np.int64)
  np.savez(path, x=np.concatenate(xs), y=np.concatenate(ys), offsets=offsets)


def read_problem(path: str):
  """The clients of a `write_problem` file as a list of (x, y); checks what it reads (no pickles)."""
  with np.load(path, allow_pickle=False) as f:
    x, y, off = f['x'], f['y'], f['offsets']
  if (x.dtype != np.float32 or y.dtype != np.int32 or off.ndim != 1 or len(off) < 2 or off[0] != 0
      or off[-1] != len(x) or len(y) != len(x) or np.any(np.diff(off) <= 0)):
    raise PeerError(f'{path}: not a peer problem file (x float32, y int32, increasing offsets from 0 to N)')
  return [(x[a:b], y[a:b]) for a, b in zip(off[:-1], off[1:])]


def peak_rss_bytes() -> int:
  """This process's peak resident memory (the CPU stand-in for peak device memory)."""
  import resource
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def check_spec(spec: dict) -> dict:
  missing = [k for k in SPEC_KEYS if k not in spec]
  if missing:
    raise PeerError(f'spec lacks {missing}')
  if spec['optimizer'] not in ('sgd', 'sam', 'asam'):
    raise PeerError(f"spec optimizer={spec['optimizer']!r}; allowed: 'sgd', 'sam', 'asam'")
  return spec


def serve(setup, run, info) -> None:
  """The peer side: `setup(name, spec) -> dict`, `run(name, rounds) -> {'s': seconds, ...}`, `info() -> dict`.

  Stdout carries only the protocol: anything a library prints goes to stderr.
  """
  proto = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  for line in sys.stdin:
    if not line.strip():
      continue
    try:
      msg = json.loads(line)
      cmd = msg.get('cmd')
      if cmd == 'quit':
        reply = {'ok': True}
      elif cmd == 'setup':
        reply = {'ok': True, **setup(msg['name'], check_spec(msg['spec']))}
      elif cmd == 'run':
        reply = {'ok': True, **run(msg['name'], int(msg['rounds']))}
      elif cmd == 'info':
        reply = {'ok': True, **info()}
      else:
        reply = {'ok': False, 'error': f'unknown cmd {cmd!r}'}
    except Exception as e:  # the driver shows the peer's error; the peer stays up for the next command
      traceback.print_exc()
      reply = {'ok': False, 'error': f'{type(e).__name__}: {e}'}
    proto.write(json.dumps(reply) + '\n')
    proto.flush()
    if msg.get('cmd') == 'quit':
      return


class Peer:
  """The driver side: starts `python -m module --serve` in `cwd` (the repository root, where the peers' package
  is found), sends commands, raises PeerError on a failed one."""

  def __init__(self, python: str, module: str, env=None, cwd=None):
    self.name = module.rsplit('.', 1)[-1]
    self.proc = subprocess.Popen([python, '-m', module, '--serve'], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env={**os.environ, **(env or {})}, cwd=cwd)

  def call(self, **msg) -> dict:
    self.proc.stdin.write(json.dumps(msg) + '\n')
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise PeerError(f'{self.name} exited (code {self.proc.poll()}) during {msg.get("cmd")}')
    reply = json.loads(line)
    if not reply.get('ok'):
      raise PeerError(f'{self.name} {msg.get("cmd")} {msg.get("name", "")}: {reply.get("error")}')
    return reply

  def setup(self, name: str, spec: dict) -> dict:
    return self.call(cmd='setup', name=name, spec=check_spec(spec))

  def run(self, name: str, rounds: int) -> dict:
    return self.call(cmd='run', name=name, rounds=rounds)

  def close(self):
    if self.proc.poll() is None:
      try:
        self.call(cmd='quit')
      except (PeerError, OSError, ValueError):
        pass
      try:
        self.proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self.proc.kill()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


class ProblemServer:
  """The setup/run handlers every peer shares, over its problem class.

  make_problem(spec) -> an object with round(), sync(), peak_mem() and optionally warm_up() (run before the
  warm-up rounds, e.g. to compile every batch shape) and reset_peak().
  """

  def __init__(self, make_problem, info):
    self.make_problem, self.info, self.problems = make_problem, info, {}

  def setup(self, name, spec):
    p = self.problems[name] = self.make_problem(spec)
    t = time.perf_counter()
    p.round()
    p.sync()
    first = time.perf_counter() - t
    t = time.perf_counter()
    if hasattr(p, 'warm_up'):
      p.warm_up()
    for _ in range(int(spec.get('warmup_rounds', 1))):
      p.round()
    p.sync()
    return {'first_round_s': first, 'warmup_s': time.perf_counter() - t}

  def run(self, name, rounds):
    p = self.problems[name]
    if hasattr(p, 'reset_peak'):
      p.reset_peak()
    t = time.perf_counter()
    for _ in range(rounds):
      p.round()
    p.sync()
    return {'s': time.perf_counter() - t, 'peak_mem_bytes': p.peak_mem()}

  def serve(self):
    serve(self.setup, self.run, self.info)

  def check(self, models, optimizers=('sgd', 'sam')):
    """Two clients of random data per model: set-up and one timed round each, printed (the --check)."""
    import tempfile
    rng = np.random.default_rng(0)
    shapes = {'cifar_cnn': (32, 32, 3), 'resnet18_gn': (8, 8, 3), 'pfl_cnn': (8, 8, 3)}
    with tempfile.TemporaryDirectory() as tmp:
      for model in models:
        shape, nc = shapes.get(model, (8, 8, 1)), (100 if model == 'cifar_cnn' else 10)
        path = os.path.join(tmp, f'{model}.npz')
        write_problem(path, [(rng.standard_normal((n,) + shape), rng.integers(0, nc, n)) for n in (5, 3)])
        for opt in optimizers:
          spec = dict(model=model, num_classes=nc, data=path, clients_per_round=2, batch_size=2, epochs=1,
                      lr=0.01, weight_decay=4e-4, optimizer=opt, rho=0.05, seed=0)
          print(model, opt, self.setup(model + opt, spec), self.run(model + opt, 1))
    print(self.info())


def whole_run(make_problem, spec_path: str) -> dict:
  """The peer side of a whole run (module docstring): the problem is built, trained and evaluated as a user's
  script would, each phase timed; returns (and prints as one JSON line on stdout) the record."""
  t0 = time.perf_counter()
  with open(spec_path) as f:
    spec = json.load(f)
  (tx, ty), = read_problem(spec['test'])
  p = make_problem(check_spec(spec))
  rec = {'setup_s': time.perf_counter() - t0, 'rounds': int(spec['rounds']), 'round_s': [], 'evals': []}
  every = int(spec.get('eval_every', 0))
  for r in range(1, int(spec['rounds']) + 1):
    t = time.perf_counter()
    p.round()
    p.sync()
    rec['round_s'].append(time.perf_counter() - t)
    if every and (r % every == 0 or r == int(spec['rounds'])):
      t = time.perf_counter()
      acc, loss = p.evaluate(tx, ty, int(spec.get('eval_batch', 1000)))
      rec['evals'].append({'round': r, 's': time.perf_counter() - t, 'accuracy': float(acc), 'loss': float(loss)})
  rec['total_s'] = time.perf_counter() - t0
  print(json.dumps(rec), flush=True)
  return rec


def run_whole(python: str, module: str, spec: dict, spec_path: str, env=None, cwd=None) -> dict:
  """The driver side: one fresh `python -m module --whole_run=spec_path` process; its record plus 'wall_s' (from
  the spawn to the exit: the interpreter's start and the imports included)."""
  with open(spec_path, 'w') as f:
    json.dump(spec, f)
  t = time.perf_counter()
  proc = subprocess.run([python, '-m', module, f'--whole_run={spec_path}'], capture_output=True, text=True,
                        env={**os.environ, **(env or {})}, cwd=cwd)
  wall = time.perf_counter() - t
  if proc.returncode != 0:
    raise PeerError(f'{module} --whole_run exited {proc.returncode}: {proc.stderr.strip()[-500:]}')
  rec = json.loads(proc.stdout.strip().splitlines()[-1])
  rec['wall_s'] = wall
  return rec


def whole_run_arg(argv) -> str:
  """The SPEC.json of a `--whole_run=SPEC.json` argument ('' when absent)."""
  return next((a.split('=', 1)[1] for a in argv if a.startswith('--whole_run=')), '')
