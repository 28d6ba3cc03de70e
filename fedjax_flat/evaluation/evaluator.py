"""Jitted, batched evaluation: exact metrics over every valid unit of padded, masked batches.

What the metrics are is the task's (fedjax_flat/tasks/base.py): each batch gives additive sums (loss, correct,
count, or a confusion matrix), summed over the batches, then turned into metrics once.

`Evaluator` (the in-memory global test set, issue 39): the batches are placed once, sharded over the local
devices; one program per number of models evaluates every model of `evaluate_many` (global, SWA, WiMA) per batch
and adds the per-batch sums in batch order on the device (the single-device bits); `eval_batch_size='auto'`
times the candidates once (small batches on a CPU: benchmarks/speed/eval_rate.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_flat import devices as devices_lib
from fedjax_flat.tasks import base as tasks_lib
from fedjax_flat.tasks import retrieval as ret_tasks
from fedjax_flat.tasks import segmentation as seg_tasks
from fedjax_flat.data.batching import make_eval_batches
from fedjax_flat.core import batch_stats
from fedjax_flat.models import tiling
from fedjax_flat.evaluation.retrieval import RetrievalEvaluator


def make_eval_fn(model, preprocess=None, jit: bool = True, task=None):
  """eval(params, batches [nb, B, ...]) -> the task's metrics: {'loss', 'accuracy', 'count', ...}.

  Jitted unless jit=False. Classification: example-weighted loss and accuracy over the valid examples.
  """
  task = tasks_lib.get_task(task)

  def one(params, batch):
    x = batch['x'] if preprocess is None else preprocess(batch['x'])
    logits = model.apply(params, x, train=False)
    return task.eval_sums(logits, batch['y'], batch['mask'])

  def evaluate(params, batches):
    sums = jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), jax.lax.map(lambda b: one(params, b), batches))
    return task.eval_metrics(sums)
  if not jit:
    return evaluate

  whole = jax.jit(evaluate)
  per_batch = jax.jit(lambda params, batches: jax.lax.map(lambda b: one(params, b), batches))
  integer = {}

  def evaluate_exact(params, batches):
    # A task with integer counts (segmentation's confusion matrix): the batches' sums are added on the host
    # in int64, exact beyond int32 (and float32's 2^24) however many batches. Other tasks: one program.
    if 'any' not in integer:
      shapes = jax.eval_shape(per_batch, params, batches)
      integer['any'] = any(jnp.issubdtype(a.dtype, jnp.integer) for a in jax.tree_util.tree_leaves(shapes))
    if not integer['any']:
      return whole(params, batches)
    return host_metrics(task, jax.tree_util.tree_map(host_sum, jax.device_get(per_batch(params, batches))))
  return evaluate_exact


def host_metrics(task, sums):
  """task.eval_metrics of host-added sums: int64 counts enter as float64 (jax without x64 would truncate an
  int64 to int32); the ratios are then float32-exact (relative error < 1e-7) from exact counts."""
  return task.eval_metrics(jax.tree_util.tree_map(
      lambda a: np.asarray(a, np.float64) if np.issubdtype(np.asarray(a).dtype, np.integer) else a, sums))


def host_sum(a, axis=0):
  """Sum over `axis` on the host: int64 for integer counts, float64 for floats (an evaluation's additive
  statistics, added without the rounding of float32 or the overflow of int32)."""
  a = np.asarray(a)
  return np.sum(a, axis=axis, dtype=np.int64 if np.issubdtype(a.dtype, np.integer) else np.float64)


def host_add(a, b):
  """a + b of two pytrees of additive statistics, on the host (int64 / float64; a None: b)."""
  def one(x, y):
    y = np.asarray(jax.device_get(y))
    y = y.astype(np.int64 if np.issubdtype(y.dtype, np.integer) else np.float64)
    return y if x is None else x + y
  if a is None:
    return jax.tree_util.tree_map(lambda y: one(None, y), b)
  return jax.tree_util.tree_map(one, a, b)


# eval_batch_size='auto': the candidates timed once per run (evaluator.choose_batch_size). Small batches win on
# a CPU (the im2col convolution's patches stay in cache: benchmarks/speed/eval_rate.py), large ones on a GPU.
AUTO_BATCH_CANDIDATES = (8, 16, 32, 64, 128, 256, 512, 1024)
EVAL_AXIS = 'batches'      # the evaluation mesh's axis: the test batches are split along it
DEFAULT_BATCH_SIZE = 256     # what the other evaluators of an 'auto' run use (config.eval_batch_size's default)


def fixed_batch_size(value) -> int:
  """config.eval_batch_size as an int for the evaluators that do not measure ('auto' -> DEFAULT_BATCH_SIZE)."""
  return DEFAULT_BATCH_SIZE if value == 'auto' else int(value)


def eval_mesh(devices=None) -> Mesh:
  """A 1-D ('batches',) mesh over this process's devices (evaluation runs per host, on its local devices)."""
  return Mesh(np.array(list(jax.local_devices() if devices is None else devices), dtype=object), (EVAL_AXIS,))


def make_sharded_eval_fn(model, preprocess, task, mesh: Mesh, num_batches: int):
  """evaluate(params tuple, batches [nb', B, ...] sharded over the mesh) -> a tuple of the task's metrics, one per
  model, in one jitted program: each device maps over its block of batches with every model per batch (the data
  are read once for all models); the per-batch sums are all-gathered and summed in batch order on every device,
  which is exactly the single-device program's sum (`make_eval_fn`): the same bits on any device count.
  num_batches: the real batches (the first ones); the rest (padding up to a multiple of the devices) are dropped
  before the sum."""
  sharded = mesh.devices.size > 1

  def per_batch(params_tuple, batch):
    x = batch['x'] if preprocess is None else preprocess(batch['x'])
    return tuple(task.eval_sums(model.apply(p, x, train=False), batch['y'], batch['mask']) for p in params_tuple)

  def local(params_tuple, batches):
    sums = jax.lax.map(lambda b: per_batch(params_tuple, b), batches)
    if sharded:
      sums = jax.lax.all_gather(sums, EVAL_AXIS, tiled=True)
    return jax.tree_util.tree_map(lambda a: jnp.sum(a[:num_batches], axis=0), sums)

  def evaluate(params_tuple, batches):
    if sharded:
      sums = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(EVAL_AXIS)), out_specs=P(), check_vma=False)(
          params_tuple, batches)
    else:
      sums = local(params_tuple, batches)
    return tuple(task.eval_metrics(s) for s in sums)
  rep = NamedSharding(mesh, P())
  return jax.jit(evaluate, in_shardings=(rep, NamedSharding(mesh, P(EVAL_AXIS))), out_shardings=rep)


def place_batches(x, y, batch_size: int, mesh: Mesh):
  """The whole split as padded batches [nb', B, ...] on the mesh, sharded along the batch count (nb' = nb padded
  with all-padding batches to a multiple of the devices); returns (batches, nb)."""
  b = make_eval_batches(np.asarray(x), np.asarray(y), batch_size)
  nb = b['mask'].shape[0]
  pad = -nb % mesh.devices.size
  if pad:
    b = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for k, v in b.items()}
  return jax.device_put(b, NamedSharding(mesh, P(EVAL_AXIS))), nb


def choose_batch_size(model, x, y, preprocess=None, task=None, mesh: Mesh = None, params=None,
                      candidates=AUTO_BATCH_CANDIDATES, sample: int = 0, clock=time.perf_counter) -> dict:
  """The evaluation batch size with the most images/s, measured once: each candidate (at most the examples per
  device) evaluates the same sample of the test set (`sample` examples; default 1024 per device) after one
  warm-up call (the best of two timed calls); ascending, stopping once a candidate falls below 0.8x the best rate
  (on a CPU the rate falls with the batch: a few candidates are timed). Returns {'batch_size', 'images_per_s':
  {B: rate}, 'sample'}. params: the model's (default: init)."""
  task = tasks_lib.get_task(task)
  mesh = eval_mesh() if mesh is None else mesh
  d = mesh.devices.size
  n = len(y)
  per_device = max(1, -(-n // d))
  cands = sorted({min(int(c), per_device) for c in candidates})
  m = min(n, sample or 1024 * d)
  xs, ys = np.asarray(x)[:m], np.asarray(y)[:m]
  if params is None:
    params = model.init(jax.random.key(0), jnp.asarray(xs[:1]) if preprocess is None else preprocess(xs[:1]))
  rates = {}
  for bs in cands:
    batches, nb = place_batches(xs, ys, bs, mesh)
    fn = make_sharded_eval_fn(model, preprocess, task, mesh, nb)
    jax.block_until_ready(fn((params,), batches))          # compilation, not timed
    best = float('inf')
    for _ in range(2):
      t = clock()
      jax.block_until_ready(fn((params,), batches))
      best = min(best, clock() - t)
    rates[bs] = m / max(best, 1e-9)
    if rates[bs] < 0.8 * max(rates.values()):
      break
  return {'batch_size': max(rates, key=rates.get), 'images_per_s': rates, 'sample': m}


def choose_layout(model, x, y, preprocess=None, task=None, mesh: Mesh = None, params=None, **kw) -> dict:
  """'auto': the batch size (choose_batch_size) on every device of the mesh and, on a CPU with several host
  devices, on one device too (host devices share the cores and their caches: measured, one device evaluated the
  paper CNN 1.6x faster than two at their best batch sizes, benchmarks/README.md "Issue 39"). The device count
  does not change the metrics (make_sharded_eval_fn), so the fastest layout is taken. Returns choose_batch_size's
  dict of the chosen layout plus 'devices' and 'by_devices' ({D: {B: images/s}})."""
  mesh = eval_mesh() if mesh is None else mesh
  layouts = [mesh]
  if mesh.devices.size > 1 and mesh.devices.flat[0].platform == 'cpu':
    layouts.append(eval_mesh(list(mesh.devices.flat)[:1]))
  kw.setdefault('sample', min(len(y), 1024 * mesh.devices.size))     # the same images for every layout
  best, by = None, {}
  for m in layouts:
    c = choose_batch_size(model, x, y, preprocess, task, m, params=params, **kw)
    c['devices'] = int(m.devices.size)
    by[c['devices']] = c['images_per_s']
    if best is None or c['images_per_s'][c['batch_size']] > best['images_per_s'][best['batch_size']]:
      best = c
  return {**best, 'by_devices': by}


# 'auto' choices measured on this machine, kept beside XLA's persistent cache (one JSON file, written atomically):
# a run of the same model, test set and devices reads its choice instead of measuring again (seconds to a
# minute: every candidate compiles). Another process racing a write loses at most its own entry.
CHOICES_FILE = 'fedjax_flat_eval_batch.json'


def choice_key(model, params, x, y, task, mesh) -> str:
  """What an 'auto' choice depends on: the model and its parameter shapes, the test set's shapes, the task,
  the devices and the candidates (and jax's version)."""
  shapes = [(tuple(a.shape), str(a.dtype)) for a in jax.tree_util.tree_leaves(params)]
  dev = [(d.platform, getattr(d, 'device_kind', ''), ) for d in mesh.devices.flat]
  text = repr((getattr(model, 'name', ''), shapes, x.shape, str(x.dtype), y.shape, str(y.dtype), type(task).__name__,
               dev, AUTO_BATCH_CANDIDATES, jax.__version__))
  return hashlib.sha256(text.encode()).hexdigest()[:24]


def _choices_path() -> str:
  cache = devices_lib.compilation_cache()
  return os.path.join(cache.dir, CHOICES_FILE) if cache is not None and cache.dir else ''


def read_choice(path: str, key: str):
  """The stored choice for key (None: none, or an unreadable file: measured again)."""
  try:
    with open(path) as f:
      got = json.load(f).get(key)
  except (OSError, ValueError, AttributeError):
    return None
  return got if isinstance(got, dict) and isinstance(got.get('batch_size'), int) else None


def write_choice(path: str, key: str, choice: dict) -> None:
  """Adds key -> choice to the file (a temporary file renamed over it: a reader never sees half a file)."""
  try:
    with open(path) as f:
      table = json.load(f)
    table = table if isinstance(table, dict) else {}
  except (OSError, ValueError):
    table = {}
  table[key] = {k: v for k, v in choice.items() if k != 'source'}
  try:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.eval_batch_')
    with os.fdopen(fd, 'w') as f:
      json.dump(table, f)
    os.replace(tmp, path)
  except OSError:       # a read-only cache: the choice is measured again next time
    pass


class Evaluator:
  """Holds the fixed test batches on the device(s) once; evaluates any params with one compiled program.

  The batches are sharded over this process's devices along the batch count (`devices`: default every local
  device); the metrics are reduced on the devices and equal the single-device program's bit for bit
  (make_sharded_eval_fn). batch_size='auto': chosen by measurement at the first evaluation (choose_layout: the
  batch size, and on a CPU one device or all, with the params evaluated), recorded in `batch_choice`.
  `evaluate_many({name: params})` evaluates several models (global, SWA, WiMA, ...) in one pass over the data:
  one program per number of models.
  """

  def __init__(self, model, x, y, batch_size=DEFAULT_BATCH_SIZE, preprocess=None, task=None, devices=None):
    self.model, self.preprocess, self.task = model, preprocess, tasks_lib.get_task(task)
    self.mesh = eval_mesh(devices)
    self._x, self._y = np.asarray(x), np.asarray(y)
    self.batch_choice = None
    self.batch_size = None if batch_size == 'auto' else int(batch_size)
    self._fns = {}           # number of models -> the compiled evaluation
    self._batches = None
    self._integer = None
    if self.batch_size is not None:
      self._place()

  def _place(self):
    self._batches, self.num_batches = place_batches(self._x, self._y, self.batch_size, self.mesh)

  @property
  def batches(self):
    """The placed test batches [nb', B, ...] (all-padding batches at the end up to a multiple of the devices)."""
    return self._batches

  @batches.setter
  def batches(self, value):
    """New data (make_eval_batches' layout; evaluation/corruption.py): the programs are kept when the number of
    batches is the same."""
    nb = int(value['mask'].shape[0])
    pad = -nb % self.mesh.devices.size
    if pad:
      value = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for k, v in value.items()}
    if nb != getattr(self, 'num_batches', nb):
      self._fns = {}
    self._batches = jax.device_put(value, NamedSharding(self.mesh, P(EVAL_AXIS)))
    self.num_batches = nb

  def _ready(self, params):
    if self.batch_size is None:    # 'auto': measured once, with the first params evaluated (or read: CHOICES_FILE)
      path = _choices_path()
      key = choice_key(self.model, params, self._x, self._y, self.task, self.mesh)
      stored = read_choice(path, key) if path else None
      if stored is not None and stored.get('devices', 0) <= self.mesh.devices.size:
        self.batch_choice = {**stored, 'source': f'read from {path}'}
      else:
        self.batch_choice = {**choose_layout(self.model, self._x, self._y, self.preprocess, self.task, self.mesh,
                                             params=params), 'source': 'measured'}
        if path:
          write_choice(path, key, self.batch_choice)
      self.batch_size = self.batch_choice['batch_size']
      if self.batch_choice['devices'] != self.mesh.devices.size:
        self.mesh = eval_mesh(list(self.mesh.devices.flat)[:self.batch_choice['devices']])
      self._place()
    if self._integer is None:
      # A task with integer counts (a confusion matrix) keeps the host's int64 sums (make_eval_fn's exact path).
      shapes = jax.eval_shape(lambda p, b: self.task.eval_sums(
          self.model.apply(p, b['x'] if self.preprocess is None else self.preprocess(b['x']), train=False),
          b['y'], b['mask']), params, jax.tree_util.tree_map(lambda a: a[0], self._batches))
      self._integer = any(jnp.issubdtype(a.dtype, jnp.integer) for a in jax.tree_util.tree_leaves(shapes))

  def evaluate_many(self, models: dict) -> dict:
    """{name: params} -> {name: metrics}, every model over the same batches in one program (host values:
    scalars as floats, arrays as lists); each model's metrics equal evaluating it alone."""
    names = list(models)
    if not names:
      return {}
    self._ready(models[names[0]])
    if self._integer:
      if 'exact' not in self._fns:
        self._fns['exact'] = make_eval_fn(self.model, self.preprocess, task=self.task)
      res = [self._fns['exact'](models[k], self._batches) for k in names]
    else:
      m = len(names)
      if m not in self._fns:
        self._fns[m] = make_sharded_eval_fn(self.model, self.preprocess, self.task, self.mesh, self.num_batches)
      res = self._fns[m](tuple(models[k] for k in names), self._batches)
    out = {}
    for name, metrics in zip(names, jax.device_get(list(res))):
      out[name] = {k: float(v) if np.ndim(v) == 0 else np.asarray(v).tolist() for k, v in metrics.items()}
    return out

  def __call__(self, params):
    """Scalar metrics as floats; array-valued ones (per-class IoU, ...) as lists."""
    return self.evaluate_many({'_': params})['_']

  def _cache_size(self) -> int:
    """Compiled evaluation programs so far (compile-counter tests)."""
    return sum(f._cache_size() for f in self._fns.values() if hasattr(f, '_cache_size'))


class LegacyEvaluator:
  """The evaluation before the sharded path (one device, one model per call): kept callable as the reference of
  the tests and the 'before' of benchmarks/speed/eval_rate.py."""

  def __init__(self, model, x, y, batch_size: int = DEFAULT_BATCH_SIZE, preprocess=None, task=None):
    self.batches = jax.device_put(make_eval_batches(np.asarray(x), np.asarray(y), batch_size))
    self.fn = make_eval_fn(model, preprocess, task=task)

  def __call__(self, params):
    out = {}
    for k, v in jax.device_get(self.fn(params, self.batches)).items():
      out[k] = float(v) if np.ndim(v) == 0 else np.asarray(v).tolist()
    return out


class ClientEvaluator:
  """The global model on each sampled client's own training data (one compiled program per run).

  Every client is padded to the population's largest client, so the shape never changes across rounds.
  Returns per-client accuracy/loss and their example-weighted and plain means.

  The examples are `client_examples(k)`: for data over an item store with a pool draw (FedVPR's tuples) the
  first `count` pool columns of every tuple (FederatedDataset.take), a fixed candidate subset, deliberately not
  redrawn: a monitoring metric over the same examples at every evaluation of a client, so its change across
  rounds is the model's, not the draw's (training redraws: data/batching.py, training/centralized.py).
  """

  def __init__(self, model, data, batch_size: int = 256, preprocess=None, task=None):
    self.data = data
    max_n = int(np.max(data.client_sizes()))
    self.batch_size = min(batch_size, max(max_n, 1))
    self.nb = max(1, -(-max_n // self.batch_size))
    self.fn = jax.jit(jax.vmap(make_eval_fn(model, preprocess, jit=False, task=task), in_axes=(None, 0)))

  def _client_batches(self, k):
    x, y = self.data.client_examples(k)
    b = make_eval_batches(np.asarray(x), np.asarray(y), self.batch_size)
    pad = self.nb - b['mask'].shape[0]
    return {key: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for key, v in b.items()}

  def __call__(self, params, client_ids):
    rows = [self._client_batches(int(k)) for k in client_ids]
    stacked = {key: np.stack([r[key] for r in rows]) for key in rows[0]}
    res = jax.device_get(self.fn(params, stacked))
    n = res['count']
    return {'client_accuracy': res['accuracy'], 'client_loss': res['loss'], 'client_count': n,
            'clients_mean_accuracy': float(np.mean(res['accuracy'])),
            'clients_weighted_accuracy': float(np.sum(res['accuracy'] * n) / max(np.sum(n), 1.0)),
            'clients_mean_loss': float(np.mean(res['loss']))}


def per_count(tree) -> int:
  """The leading (batch) length of a pytree of stacked per-batch arrays."""
  return int(np.shape(jax.tree_util.tree_leaves(tree)[0])[0])


def _pad_batch(x, y, batch_size: int):
  """One fixed-shape batch {'x', 'y', 'mask'} of up to batch_size examples (zero padding, mask 0)."""
  b = make_eval_batches(np.asarray(x), np.asarray(y), batch_size)
  return [{k: v[i] for k, v in b.items()} for i in range(b['mask'].shape[0])]


class HeldOutEvaluator:
  """The task's metrics over held-out test clients, per group of test clients and pooled.

  Groups: the test clients of `data.test_client_names` grouped by name (FedDrive: 'seen' / 'unseen' IDDA
  clients, the unseen-city Cityscapes client), each group's metrics prefixed '<name>_' (so the run records
  `test_seen_miou`, `test_unseen_miou`, ...); the unprefixed metrics pool every test example (sums of the
  additive statistics: a pooled confusion matrix, not a mean of mIoUs). Without test clients (or with
  by_client=False) the global test set is one group, reported unprefixed only.

  BatchNorm test-time policy (core/batch_stats.py): 'running' (the model's statistics), 'batch' (each batch
  of `bn_batch_size` normalized with its own statistics, padding excluded), 'client' (each test client's
  statistics pooled over all its images first: one extra pass per client and evaluation).

  Batches: a source with `test_batches(batch_size, client)` (out-of-memory test sets, decoded on the host)
  is streamed at every evaluation; in-memory data are batched once, stacked on the device, and each test
  client's batch sums come from one program (lax.map), added on the host in batch order. Every batch has one
  shape (the last one padded), so each program compiles once per run.
  """

  def __init__(self, model, data, *, task=None, batch_size: int = 8, preprocess=None, bn_policy: str = 'running',
               bn_batch_size: int = 8, by_client: bool = True):
    self.model, self.data, self.preprocess = model, data, preprocess
    self.task = tasks_lib.get_task(task)
    self.bn_policy = bn_policy if getattr(model, 'batch_stats', False) else 'running'
    self.batch_size = bn_batch_size if self.bn_policy == 'batch' else batch_size
    names = list(getattr(data, 'test_client_names', None) or [])
    n_test = int(getattr(data, 'num_test_clients', 0) or 0)
    self.groups = []     # (name or None, [test client ids] or [None] = the global test set)
    if by_client and n_test and len(names) == n_test:
      for name in dict.fromkeys(names):
        self.groups.append((str(name), [j for j in range(n_test) if names[j] == name]))
    else:
      self.groups.append((None, [None]))
    self._stacked = {}    # in-memory test clients: their padded batches on the device, stacked
    bn = getattr(model, 'batch_stats', False)
    batch_norm = 'batch' if self.bn_policy == 'batch' else None
    task_ = self.task

    def sums(params, batch):
      x = batch['x'] if preprocess is None else preprocess(batch['x'])
      kw = {'mask': batch['mask'], 'batch_norm': batch_norm} if bn else {}
      return task_.eval_sums(model.apply(params, x, train=False, **kw), batch['y'], batch['mask'])
    self.sums_fn = jax.jit(sums)
    # In-memory batches: every batch's sums in one program (lax.map over the stacked batches, one transfer per
    # test client), added on the host in batch order as before: the same int64 / float64 sums, no per-batch sync.
    self.map_fn = jax.jit(lambda params, stacked: jax.lax.map(lambda b: sums(params, b), stacked))
    if self.bn_policy == 'client':
      self.moments_fn = jax.jit(batch_stats.make_raw_moments_fn(model, preprocess))

  def batches(self, client):
    """Fixed-shape padded batches of one test client (None: the global test set)."""
    if hasattr(self.data, 'test_batches'):
      def stream():
        for x, y in self.data.test_batches(self.batch_size, client):
          yield from _pad_batch(x, y, self.batch_size)
      return stream()
    if client not in self._stacked:      # one device copy, stacked [nb, B, ...]; the batches are views of it
      x, y = self.data.test_examples() if client is None else self.data.test_client_examples(client)
      self._stacked[client] = jax.device_put(make_eval_batches(np.asarray(x), np.asarray(y), self.batch_size))
    stacked = self._stacked[client]
    return [jax.tree_util.tree_map(lambda a, i=i: a[i], stacked) for i in range(stacked['mask'].shape[0])]

  def __call__(self, params):
    add = host_add       # on the host, int64 counts: a confusion matrix exact over any number of batches
    out, pooled = {}, None
    for name, clients in self.groups:
      group = None
      for j in clients:
        p = params
        if self.bn_policy == 'client':
          p = batch_stats.adapt_statistics(self.model, params, self.batches(j), moments_fn=self.moments_fn)
        for b in self.batch_sums(p, j):
          group = add(group, b)
      pooled = add(pooled, group)
      if name is not None:
        out.update({f'{name}_{k}': v for k, v in self._host(host_metrics(self.task, group)).items()})
    out.update(self._host(host_metrics(self.task, pooled)))
    return out

  def batch_sums(self, params, client):
    """The task's sums of each batch of one test client, in batch order: host arrays from one program for
    in-memory data, one call per batch for streamed data."""
    if hasattr(self.data, 'test_batches'):      # streamed
      return (self.sums_fn(params, b) for b in self.batches(client))
    if client not in self._stacked:
      self.batches(client)
    per = jax.device_get(self.map_fn(params, self._stacked[client]))
    return [jax.tree_util.tree_map(lambda a, i=i: a[i], per) for i in range(per_count(per))]

  def predictions(self, params, n: int = 4):
    """[(group name, image, true labels, predicted labels)] for up to n test images, spread over the groups
    (the first images of each group's first test client), predicted as the evaluation predicts them."""
    out = []
    per_group = max(1, -(-n // len(self.groups)))
    for name, clients in self.groups:
      p = params
      if self.bn_policy == 'client':
        p = batch_stats.adapt_statistics(self.model, params, self.batches(clients[0]), moments_fn=self.moments_fn)
      taken = 0
      for b in self.batches(clients[0]):
        pred = np.asarray(jax.device_get(self._predict(p, b)))
        for i in np.flatnonzero(np.asarray(b['mask']) > 0):
          if taken >= per_group or len(out) >= n:
            break
          out.append((name or 'test', np.asarray(b['x'][i]), np.asarray(b['y'][i]), pred[i]))
          taken += 1
        if taken >= per_group or len(out) >= n:
          break
    return out

  def _predict(self, params, batch):
    if not hasattr(self, '_predict_fn'):
      bn = getattr(self.model, 'batch_stats', False)
      batch_norm = 'batch' if self.bn_policy == 'batch' else None

      def predict(params, batch):
        x = batch['x'] if self.preprocess is None else self.preprocess(batch['x'])
        kw = {'mask': batch['mask'], 'batch_norm': batch_norm} if bn else {}
        logits = tasks_lib.resize_to_labels(self.model.apply(params, x, train=False, **kw), batch['y'])
        return jnp.argmax(logits, -1)
      self._predict_fn = jax.jit(predict)
    return self._predict_fn(params, batch)

  @staticmethod
  def _host(metrics):
    """Scalars as floats; array-valued metrics (per-class IoU) as lists, NaN -> None (valid JSON)."""
    res = {}
    for k, v in jax.device_get(metrics).items():
      if np.ndim(v) == 0:
        res[k] = float(v)
      else:
        res[k] = [None if not np.isfinite(e) else float(e) for e in np.asarray(v, np.float64).ravel()]
    return res


def make_validation_evaluator(config, model, data, task, preprocess=None):
  """The validation clients' evaluator of a retrieval run (thesis 6.3: 12 clients held out), or None when the
  data hold none: a `RetrievalEvaluator` over data.val_x / val_y grouped by data.val_client, so that every
  validation client's queries are matched against its own database only (evaluation/retrieval.py)."""
  if not isinstance(task, ret_tasks.Retrieval) or getattr(data, 'val_x', None) is None:
    return None
  vx, vy = np.asarray(data.val_x), np.asarray(data.val_y)
  if not len(vy) or not np.any(vy[:, 2] == ret_tasks.QUERY_ROLE):     # no validation client (val_clients=0)
    return None
  groups = getattr(data, 'val_client', None)
  if groups is None:
    raise ValueError(f'dataset {data.name!r} has validation images (val_x) but no val_client (the validation '
                     'client of each image)')
  return RetrievalEvaluator(model, vx, vy, fixed_batch_size(config.eval_batch_size), preprocess=preprocess, task=task,
                            groups=groups)


def make_evaluator(config, model, data, task, preprocess=None, local_batch_stats: bool = False):
  """The run's test-set evaluator: `Evaluator` (in-memory global test set), or for segmentation tasks and
  BatchNorm models a `HeldOutEvaluator` (test-client groups, streamed batches, the BN test-time policy and
  the evaluation resolution of config.segmentation / config.bn); for retrieval tasks a `RetrievalEvaluator`
  (Recall@K of the test queries against the test database). local_batch_stats: the algorithm keeps BatchNorm
  statistics on the clients (FederatedAlgorithm.local_batch_stats: the 'auto' test policy is then 'batch')."""
  if isinstance(task, ret_tasks.Retrieval):
    tx, ty = data.test_examples()
    return RetrievalEvaluator(model, tx, ty, fixed_batch_size(config.eval_batch_size), preprocess=preprocess, task=task)
  seg = isinstance(task, seg_tasks.Segmentation)
  if not (seg or getattr(model, 'batch_stats', False)):
    tx, ty = data.test_examples()
    return Evaluator(model, tx, ty, config.eval_batch_size, preprocess=preprocess, task=task)
  sc = config.get('segmentation')
  if seg and sc is not None:
    model = tiling.for_evaluation(model, sc.eval_mode, scale=sc.eval_scale, tile=tuple(sc.eval_tile),
                                  overlap=sc.eval_overlap)
  bn = config.get('bn')
  policy = batch_stats.resolve_test_policy(bn.test_policy if bn is not None else 'auto', local_batch_stats)
  return HeldOutEvaluator(model, data, task=task, batch_size=fixed_batch_size(config.eval_batch_size),
                             preprocess=preprocess, bn_policy=policy,
                             bn_batch_size=bn.test_batch_size if bn is not None else 8,
                             by_client=bool(sc.by_test_client) if (seg and sc is not None) else False)
