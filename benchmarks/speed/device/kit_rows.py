r"""The device kit's measuring side: one group's rows in one process (kit.py starts one such process per group).

  python -m benchmarks.speed.device.kit_rows --plan=PLAN.json --out=DIR --deadline=EPOCH_S

PLAN.json: the group's rows, in order (kit.plan). Each row is measured and its result appended at once to
DIR/rows.jsonl (one JSON object a line), so a group stopped at its budget keeps the rows it finished. Before a row
starts, a row that cannot start before the deadline (less than --reserve_s left) and every row after it are
written as skipped with the reason. The first line a process writes is its device record (`kind: device`).

Row kinds (kit.plan writes them):
  trainer        ours as a user runs it: `trainers.make_trainer(config, data=...)`, `train(num_rounds=K)` per timed
                 call (sampling, batch gather and the round in one program); the paper rows set engine.strategy,
                 the pfl rows take configs/pfl_cifar10.py with one knob. Evaluation is left out of the timing.
  torch          the PyTorch reference pattern (peers/torch_peer.py) as a subprocess, on CUDA when the
                 machine's torch has it, K rounds per timed call; skipped when torch is not importable.
  runs_one       one run alone (the trainer, engine.rounds_per_call = K): the "one at a time" of a sweep.
  runs_batched   R runs (seeds 0..R-1) in one program (training/batched.BatchedTrainer), K rounds per call.
Timing: the first call (compilation + K rounds), one warm-up call, then `repeats` timed calls (block_until_ready,
median); compile_s = first call - K x the median round. Peak device memory: jax's memory_stats()
['peak_bytes_in_use'] after the row (cumulative over the group's process: a row's own peak when it raised it;
None with the reason on a backend without the statistic), the torch peer's max_memory_allocated on CUDA.
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

from absl import logging
import jax
import jaxlib
import numpy as np

from benchmarks.speed import bench_util
from benchmarks.speed import pfl_cifar10
from benchmarks.speed.peers import protocol
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.training import batched_trainer
from fedjax_flat.training import loop
from fedjax_flat.training import trainers

NUM_CLASSES = 100          # the paper's CIFAR-100 rows
NOT_IN_CHECKOUT = ('not available in this checkout: config.engine.compute_dtype is missing (issue 34 part 2, '
                   'mixed precision, not merged here)')


def device_record() -> dict:
  d = jax.local_devices()[0]
  rec = {'kind': 'device', 'backend': jax.default_backend(), 'device_kind': d.device_kind,
         'devices': [str(x) for x in jax.devices()], 'jax': jax.__version__, 'python': sys.version.split()[0],
         'cpu': bench_util.cpu_model(), 'cpus': os.cpu_count(),
         'xla_python_client_preallocate': os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', ''),
         'compilation_cache': os.environ.get('JAX_COMPILATION_CACHE_DIR', '')}
  rec['jaxlib'] = getattr(jaxlib, '__version__', '')
  return rec


def device_peak():
  """(peak bytes in use on the first local device, None) or (None, why not)."""
  try:
    stats = jax.local_devices()[0].memory_stats()
  except Exception as e:  # noqa: BLE001 -- some backends raise instead of returning None
    return None, f'memory_stats() raised {type(e).__name__}'
  if not stats or 'peak_bytes_in_use' not in stats:
    return None, f'memory_stats() has no peak_bytes_in_use on the {jax.default_backend()} backend'
  return int(stats['peak_bytes_in_use']), None


def set_dtype(c, dtype: str):
  """Sets engine.compute_dtype; returns None, or why the row cannot run in this checkout."""
  if 'compute_dtype' not in c.engine:
    return None if dtype == 'float32' else NOT_IN_CHECKOUT   # float32 is what every checkout computes in
  c.engine.compute_dtype = dtype
  return None


# --- Problems: configs and data of the rows (cached per group process). ---

_DATA = {}


def paper_data(row):
  """pool x examples random float32 images and labels (throughput does not depend on the values): drawn as one
  float32 array, 10x faster than the learnable `synthetic` source at 100 x 500 (33 s of a group's budget)."""
  key = ('paper', row['pool'], row['examples'], tuple(row['input_shape']))
  if key not in _DATA:
    rng = np.random.default_rng(0)
    n = row['pool'] * row['examples']
    x = rng.standard_normal((n + 1,) + tuple(row['input_shape']), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, n + 1).astype(np.int32)
    users = np.split(np.arange(n), row['pool'])
    _DATA[key] = FederatedDataset.from_client_indices(x[:n], y[:n], users, x[n:], y[n:], num_classes=NUM_CLASSES,
                                                      name='random float32 images')
  return _DATA[key]


def pfl_data(c, smoke):
  key = ('pfl', smoke)
  if key not in _DATA:
    _DATA[key] = pfl_cifar10.make_data(c, smoke)
  return _DATA[key]


def paper_config(row, seed: int = 0):
  c = bench_util.round_config(row['model'], row['opt'], strategy=row['strategy'], conv=row['conv'],
                              clients=row['clients'], chunk=row['chunk'], batch=row['batch'])
  c.seed = seed
  c.data.num_clients = row['pool']
  c.data.examples_per_client = row['examples']
  c.rounds = 1000 * row['K']        # never the last round inside the timing
  c.eval_every = c.rounds           # no evaluation boundary splits a timed block
  c.progress_every_s = 1e9
  if row['kind'].startswith('runs'):
    c.engine.rounds_per_call = row['K']
  return c


def pfl_config(row):
  over = dict(row.get('overrides') or {})
  c = pfl_cifar10.protocol_config(row['smoke'], over, row['conv'])
  c.rounds = max(c.rounds, 1000 * row['K'])
  c.eval_every = c.rounds
  return c


# --- Timed callables: each returns seconds per round of one call of K rounds. ---

def _trainer_fn(c, data, k):
  t = trainers.make_trainer(c, None, data=data, write_files=False)
  bench_util.training_only(t)

  def fn():
    s = time.perf_counter()
    t.train(num_rounds=k)
    jax.block_until_ready(t.server_state)
    return (time.perf_counter() - s) / k
  note = f'strategy {t.plan.strategy}, rounds_per_call {t.plan.rounds_per_call}'
  return fn, note


def _batched_fn(row, data):
  ts = [loop.Trainer(paper_config(row, seed=i), None, data=data, shard_clients=False) for i in range(row['R'])]
  bt = batched_trainer.BatchedTrainer(ts)
  k = row['K']

  def fn():
    s = time.perf_counter()
    jax.block_until_ready(bt.dispatch(0, k))
    return (time.perf_counter() - s) / k
  return fn, f'{bt.lanes} lanes on {len(jax.local_devices())} device(s), strategy {ts[0].plan.strategy}'


class Peers:
  """The group's torch peer, started on first use (None when torch is not importable here)."""

  def __init__(self):
    self.set, self.why = None, None

  def get(self):
    if self.set is None and self.why is None:
      if 'torch' not in bench_util.available_peers():
        self.why = 'torch is not importable here'
      else:
        self.set = bench_util.PeerSet(['torch'])
    return self.set

  def close(self):
    if self.set is not None:
      self.set.close()


def _torch_fn(row, peers):
  ps = peers.get()
  if ps is None:
    return None, peers.why
  dev = 'cuda' if (ps.info['torch'].get('cuda') and jax.default_backend() == 'gpu') else 'cpu'
  if row['protocol'] == 'pfl':
    c = pfl_config(row)
    data = pfl_data(c, row['smoke'])
    path = os.path.join(ps.tmp.name, 'pfl.npz')
    if not os.path.exists(path):
      protocol.write_problem(path, [(pfl_cifar10.normalized(data.x[data.client_indices(u)]),
                                     data.y[data.client_indices(u)]) for u in range(data.num_clients)])
    spec = {**pfl_cifar10.peer_spec(c, path), 'device': dev}
  else:
    data = paper_data(row)
    path = ps.write_data(f"{row['model']}_{row['pool']}_{row['examples']}", data)
    spec = bench_util.spec_of(paper_config(row), path, num_classes=NUM_CLASSES, device=dev)
  fn0, setup = ps.variant('torch', row['id'], spec)
  k = row['K']
  fn = lambda: fn0(k)  # noqa: E731
  fn.last, fn.first_call_s = fn0.last, setup['first_round_s']
  return fn, f"torch {ps.info['torch'].get('torch')} on {dev}"


# --- One row. ---

def measure(row, peers, repeats: int) -> dict:
  out = {'id': row['id'], 'group': row['group'], 'kind': 'row'}
  t0 = time.perf_counter()
  try:
    if row['kind'] == 'torch':
      fn, note = _torch_fn(row, peers)
      if fn is None:
        return {**out, 'status': 'skipped', 'reason': note}
    else:
      if row['protocol'] == 'pfl':
        c = pfl_config(row)
        data = pfl_data(c, row['smoke'])
      else:
        c = paper_config(row)
        data = paper_data(row)
      why = set_dtype(c, row['dtype'])
      if why:
        return {**out, 'status': 'unavailable', 'reason': why}
      if row['kind'] == 'runs_batched':
        if row['dtype'] != 'float32':
          raise ValueError('runs rows measure float32 only')
        fn, note = _batched_fn(row, data)
      else:
        fn, note = _trainer_fn(c, data, row['K'])
    first = getattr(fn, 'first_call_s', None)
    if first is None:
      s = time.perf_counter()
      fn()
      first = time.perf_counter() - s
      fn()                                   # warm-up
    ts = [fn() for _ in range(repeats)]
    med = statistics.median(ts)
    k = row['K']
    res = {**out, 'status': 'ok', 's_per_round': med, 's_per_round_all': ts, 'first_call_s': first,
           'setup_s': time.perf_counter() - t0, 'note': note,
           'examples_per_s': row['examples_per_round'] * row.get('R', 1) / med, 'rounds_per_s': 1 / med}
    if row['kind'] == 'torch':
      res['peak_device_bytes'] = fn.last.get('peak_mem_bytes')
      res['peak_device_note'] = ('torch.cuda.max_memory_allocated' if 'cuda' in note
                                 else 'peak RSS of the torch peer (CPU)')
      res['compile_s'] = None
    else:
      res['compile_s'] = max(0.0, first - k * med)
      res['peak_device_bytes'], res['peak_device_note'] = device_peak()
    if row['kind'].startswith('runs'):
      res['run_rounds_per_s'] = row.get('R', 1) / med
    return res
  except Exception as e:  # one failing row (e.g. out of memory for vmap) must not stop the others
    traceback.print_exc(limit=4)
    return {**out, 'status': 'error', 'reason': f'{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ""}'}
  finally:
    gc.collect()


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--plan', required=True)
  ap.add_argument('--out', required=True)
  ap.add_argument('--deadline', type=float, required=True, help='epoch seconds: no row starts after it')
  ap.add_argument('--reserve_s', type=float, default=0.0, help='a row needs at least this long left to start')
  ap.add_argument('--repeats', type=int, default=3)
  a = ap.parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  with open(a.plan) as f:
    plan = json.load(f)
  path = os.path.join(a.out, 'rows.jsonl')

  def write(rec):
    with open(path, 'a') as f:
      f.write(json.dumps(rec) + '\n')
      f.flush()
      os.fsync(f.fileno())
  write(device_record())
  peers = Peers()
  try:
    for i, row in enumerate(plan):
      left = a.deadline - time.time()
      if left < a.reserve_s:
        for r in plan[i:]:
          write({'id': r['id'], 'group': r['group'], 'kind': 'row', 'status': 'skipped',
                 'reason': f'group budget: {max(left, 0):.0f} s left < {a.reserve_s:.0f} s needed to start a row'})
        break
      print(f"[kit] {row['id']} ({left:.0f} s left in the group)", file=sys.stderr, flush=True)
      res = measure(row, peers, a.repeats)
      write(res)
      print(f"[kit] {row['id']}: {res['status']} {res.get('s_per_round', res.get('reason', ''))}",
            file=sys.stderr, flush=True)
  finally:
    peers.close()


if __name__ == '__main__':
  main()
