"""Every client evaluated (config.client_eval): each client's accuracy and loss on its own held-out examples, for a
given model and, with `personalize_steps=k`, after k local fine-tuning steps from it, and the distribution over the
clients (mean, std, p10, p90, worst, Gini).

Which clients: 'all', or an integer sample drawn from the run's seed once (the same clients at every evaluation).
Which examples: the client's own test split where the dataset has one (FederatedDataset.client_test_examples,
source 'own_split'), else as many pooled test examples as the client has training examples, drawn from the seed with
the client's training label distribution (each training label matched by a test example of that label, without
replacement within a label while the test set has enough; source 'label_matched'). Both are fixed for the run, so
a client's change across evaluations is the model's, not the draw's.

`ClientEvalProgram`: every client padded to the largest client's batches (masks); the global model's sums from the
clients stacked and vmapped in chunks of a fixed size (layout 'clients'), or from every client's non-empty batches
placed on the devices once and mapped B rows at a time (layout 'batches', several times faster on a CPU), kept by
'auto' only when its sums are the 'clients' layout's bits (checked at the first call): one compiled program per
layout serves every evaluation. An algorithm with personal models (Ditto's v_k, FedRep's heads, ...) also has
every client's own model evaluated on the same examples (`personal=`: the chunk's models stacked, a second
program). Fine-tuning: the client optimizer (config.client, fresh state, the client's learning rate) for k steps
of client.batch_size examples drawn from the client's training data (fixed per run), the PRNG key fold_in(seed, id).
"""
from __future__ import annotations

import math
import time
from typing import Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.data.batching import client_step_indices, make_eval_batches
from fedjax_flat.errors import ConfigError
from fedjax_flat.evaluation.evaluator import EVAL_AXIS, eval_mesh
from fedjax_flat.evaluation.personalized import finetune_steps
from fedjax_flat.optimizers.client import make_client_tx
from fedjax_flat.optimizers.schedules import client_hparams
from fedjax_flat.schema import LOG, Field, Int, Section, Test, is_number
from fedjax_flat.tasks import base as tasks_lib

tmap = jax.tree_util.tree_map
CHUNK = 32            # clients vmapped at once (memory: CHUNK x a client's padded batches)
SALT_SAMPLE, SALT_TEST, SALT_TUNE = 0xC11E, 0x7E57, 0xF1AE     # the seed's streams of this module


def _clients_why(v):
  if v in ('off', 'all') or (is_number(v, integer=True) and not isinstance(v, bool) and v >= 1):
    return None
  return "must be 'off', 'all' or an integer >= 1 (the number of clients sampled, e.g. --config.client_eval.clients=50)"


def _on(cfg) -> bool:
  ce = cfg.get('client_eval')
  return ce is not None and ce.clients != 'off'


# config.client_eval: declared with the code that reads it (config/schema.py collects it)
SECTION = Section('client_eval', (
    Field('clients', Test('off', why=_clients_why, what="'off' | 'all' | integer >= 1"),
          "'off'; 'all' clients; or N clients sampled from the seed once: each evaluated on its own held-out "
          'examples (evaluation/client_eval.py)', ref=True),
    Field('every', Int(0, lo=0), 'evaluate the clients every N rounds (at evaluation rounds); 0 = at every '
          'evaluation', when=_on, needs='client_eval.clients'),
    Field('personalize_steps', Int(0, lo=0), 'also after k local fine-tuning steps of the client optimizer from '
          'the evaluated model (0 = not)', when=_on, needs='client_eval.clients'),
), doc='every client evaluated on its own held-out examples (evaluation/client_eval.py)', optional=True,
   tags={LOG})
# LOG (runs-axis: left out of the compatibility key): each run's recorder evaluates its clients on the host at
# evaluation rounds with its own programs, so neither the round program nor the block schedule depends on the
# section; runs of a batched program may differ in it (tests/training/test_batched.py).


def select_clients(spec, num_clients: int, seed: int) -> np.ndarray:
  """The evaluated client ids, sorted: every client ('all'), or min(N, population) drawn without replacement from
  (seed, SALT_SAMPLE): a function of the seed alone, the same at every evaluation and on resume."""
  if spec == 'all':
    return np.arange(num_clients)
  k = min(int(spec), num_clients)
  rng = np.random.default_rng([int(seed), SALT_SAMPLE])
  return np.sort(rng.choice(num_clients, size=k, replace=False))


def has_own_split(data) -> bool:
  return getattr(data, 'client_test_offsets', None) is not None


def label_matched_indices(train_labels, test_labels, rng: np.random.Generator) -> np.ndarray:
  """Indices into the test set, one per training example, each of that example's label (the client's training label
  distribution exactly); without replacement within a label while the test set has enough of it. Labels absent
  from the test set are dropped."""
  train_labels, test_labels = np.asarray(train_labels).reshape(-1), np.asarray(test_labels).reshape(-1)
  out = []
  for c, count in zip(*np.unique(train_labels, return_counts=True)):
    pool = np.flatnonzero(test_labels == c)
    if len(pool):
      out.append(rng.choice(pool, size=int(count), replace=int(count) > len(pool)))
  return np.sort(np.concatenate(out)) if out else np.zeros((0,), np.int64)


def check_data(data) -> None:
  """One ConfigError line, before anything compiles, when the clients cannot be evaluated: no per-client test
  splits and test labels that are not class ids (segmentation masks, token sequences)."""
  if has_own_split(data):
    return
  test_y = np.asarray(data.test_examples()[1])
  if test_y.ndim != 1 or not np.issubdtype(test_y.dtype, np.integer):
    raise ConfigError('client_eval.clients', 'label_matched', f'dataset {getattr(data, "name", "?")!r} has no '
                      'per-client test splits and its labels are not class ids: leave client_eval.clients at off')


def client_eval_sets(data, ids, seed: int) -> Tuple[List[Tuple[np.ndarray, np.ndarray]], str]:
  """([(x, y) per client of `ids`], source): the clients' own test splits ('own_split') or label-matched pooled
  test examples ('label_matched', module docstring)."""
  if has_own_split(data):
    return [data.client_test_examples(int(k)) for k in ids], 'own_split'
    # (a dataset with per-client splits: those are the clients' held-out data)
  test_x, test_y = data.test_examples()
  test_y = np.asarray(test_y)
  if test_y.ndim != 1 or not np.issubdtype(test_y.dtype, np.integer):
    raise ConfigError('client_eval.clients', 'label_matched', f'dataset {getattr(data, "name", "?")!r} has no '
                      'per-client test splits and its labels are not class ids: leave client_eval.clients at off')
  sets = []
  for k in ids:
    _, y = data.client_examples(int(k))
    i = label_matched_indices(y, test_y, np.random.default_rng([int(seed), SALT_TEST, int(k)]))
    sets.append((test_x[i], test_y[i]))
  return sets, 'label_matched'


def _stack_padded(sets, batch_size: int, nb: int) -> Dict[str, np.ndarray]:
  """[K, nb, B, ...] eval batches, every client padded with all-padding batches to nb."""
  rows = []
  for x, y in sets:
    b = make_eval_batches(np.asarray(x), np.asarray(y), batch_size)
    pad = nb - b['mask'].shape[0]
    rows.append({k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for k, v in b.items()})
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def finetune_batches(data, ids, steps: int, batch_size: int, seed: int) -> Dict[str, np.ndarray]:
  """[K, steps, B, ...] training batches: `steps` full batches per client from its reshuffled training data
  (client_step_indices' local_steps stream; a client without examples: all masked)."""
  rows = []
  for k in ids:
    x, y = data.client_examples(int(k))
    pos, mask = client_step_indices(len(y), batch_size, steps, epochs=1, local_steps=steps,
                                    rng=np.random.default_rng([int(seed), SALT_TUNE, int(k)]))
    x, y = np.asarray(x), np.asarray(y)
    if len(y) == 0:
      pos = np.zeros_like(pos)
      x, y = np.zeros((1,) + x.shape[1:], x.dtype), np.zeros((1,) + y.shape[1:], y.dtype)
    rows.append({'x': x[pos], 'y': y[pos], 'mask': mask})
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def distribution(acc) -> Dict[str, float]:
  """clients_acc_{mean,std,p10,p90,worst,gini} of per-client accuracies (population std; numpy's linear
  percentiles; Gini = sum_ij |a_i - a_j| / (2 n^2 mean), 0 when every accuracy is 0)."""
  a = np.asarray(acc, np.float64)
  mean = float(np.mean(a))
  gini = float(np.abs(a[:, None] - a[None, :]).sum() / (2 * len(a) ** 2 * mean)) if mean > 0 else 0.0
  return {'acc_mean': mean, 'acc_std': float(np.std(a)), 'acc_p10': float(np.percentile(a, 10)),
          'acc_p90': float(np.percentile(a, 90)), 'acc_worst': float(np.min(a)), 'acc_gini': gini}


LAYOUTS = ('auto', 'clients', 'batches')


class ClientEvalProgram:
  """evaluate(params[, personal]) -> {'ids', 'n', 'acc', 'loss'[, 'ft_acc', 'ft_loss'][, 'personal_acc',
  'personal_loss']} (numpy, one entry per client of `ids`): the model on every client's eval set, and with
  steps > 0 after `steps` fine-tuning steps (module docstring).

  Two layouts compute the global model's sums. 'clients': a jitted program over a chunk of CHUNK clients vmapped
  (the model sees chunk x B rows at once), the chunks fed in turn. 'batches': every client's non-empty batches
  packed in one array placed once on the local devices, split over them (no all-padding batch, no per-call copy),
  the model mapped over them B rows at a time, the logits put back in the 'clients' layout and summed there in
  its shapes: ONE call per evaluation. On a CPU the model runs several times faster on B rows than on chunk x B
  (its activations stay in cache: benchmarks/speed/client_eval_rate.py), but a GEMM's rounding may depend on its
  row count, so 'auto' (the default) runs every candidate at the first call ('clients'; 'batches' on all local
  devices and, with several, on one), each compiled beforehand and timed once, and keeps the fastest whose sums
  are the 'clients' layout's bits for every client (`layout_check` says what was found; `devices` the count
  chosen). The fine-tuned and personal models (one model per client) stay vmapped over chunks of clients."""

  def __init__(self, model, data, ids, *, seed: int, batch_size: int = 256, preprocess=None, task=None,
               steps: int = 0, client_cfg=None, augment_fn=None, layout: str = 'auto'):
    if layout not in LAYOUTS:
      raise ValueError(f'layout={layout!r}; allowed: {LAYOUTS}')
    self.ids = np.asarray(ids)
    self.task = tasks_lib.get_task(task)
    sets, self.source = client_eval_sets(data, self.ids, seed)
    self.n = np.array([len(y) for _, y in sets], np.int64)
    max_n = max(int(self.n.max()), 1)
    self.batch_size = min(int(batch_size), max_n)
    self.nb = nb = max(1, math.ceil(max_n / self.batch_size))
    self.chunk = min(CHUNK, len(self.ids))
    pad = -len(self.ids) % self.chunk      # empty clients (mask 0) fill the last chunk
    self.eval_batches = self._pad_clients(_stack_padded(sets, self.batch_size, nb), pad)
    self.steps = int(steps)
    self.tune_batches = None
    if self.steps:
      tb = finetune_batches(data, self.ids, self.steps, int(client_cfg.batch_size), seed)
      self.tune_batches = self._pad_clients(tb, pad)
    self.keys = self._pad_clients({'k': np.asarray(self.ids, np.int32)}, pad)['k']
    self.layout, self.layout_check = layout, None
    self.devices = None
    self._packed = {}          # device count -> the 'batches' layout's arrays on those devices
    self._params_at = {}       # device count -> the params' sharding its program was compiled for
    self._sums_fn = self._sums(model, preprocess)
    self._programs = self._program(model, preprocess, client_cfg, augment_fn, seed)
    self.compiled = {}                       # name -> the compiled program (compiled once, at its first use)
    self.personal_fn = jax.jit(jax.vmap(self._sums_fn))   # compiled on the first personal call

  @staticmethod
  def _pad_clients(b, pad):
    return {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for k, v in b.items()} if pad else b

  def _pack(self, nb, mesh):
    """The 'batches' layout, placed on the device once: the non-empty batches' examples [T, B, ...]; each
    client's batch positions in them [chunks, chunk, nb] (position T: empty logits, for the all-padding batches);
    the labels and masks in the 'clients' layout [chunks, chunk, nb, B, ...] (small, unlike the examples)."""
    per_client = np.where(self.n > 0, -(-self.n // self.batch_size), 0)
    per_client = np.concatenate([per_client, np.zeros(len(self.keys) - len(self.n), np.int64)])
    total = int(per_client.sum())
    idx = np.full((len(self.keys), nb), total, np.int32)
    src = []
    for i, count in enumerate(per_client):
      idx[i, :count] = np.arange(len(src), len(src) + count)
      src.extend(i * nb + j for j in range(int(count)))
    x = self.eval_batches['x']
    x = x.reshape((-1,) + x.shape[2:])[np.asarray(src or [0], np.int64)]   # (no example anywhere: one batch)
    d = mesh.devices.size
    x = np.concatenate([x, np.zeros((-len(x) % d,) + x.shape[1:], x.dtype)])    # a multiple of the devices
    idx[idx == total] = len(x)          # the empty logits appended after the (padded) batches
    grid = lambda a: a.reshape((-1, self.chunk) + a.shape[1:])
    packed = {'x': x, 'idx': grid(idx), 'y': grid(self.eval_batches['y']), 'mask': grid(self.eval_batches['mask'])}
    return jax.device_put(packed, self._packed_shardings(mesh))

  @staticmethod
  def _packed_shardings(mesh):
    rep = NamedSharding(mesh, P())
    return {'x': NamedSharding(mesh, P(EVAL_AXIS)), 'idx': rep, 'y': rep, 'mask': rep}

  def _sums(self, model, preprocess):
    task = self.task

    def sums(params, batches):      # one client: its eval batches' additive sums
      def one(b):
        x = b['x'] if preprocess is None else preprocess(b['x'])
        return task.eval_sums(model.apply(params, x, train=False), b['y'], b['mask'])
      return tmap(lambda a: jnp.sum(a, axis=0), jax.lax.map(one, batches))
    return sums

  def _program(self, model, preprocess, client_cfg, augment_fn, seed):
    task, sums, steps = self.task, self._sums_fn, self.steps
    if steps:
      loss_fn = local_lib.make_loss(model, task=task)
      hparams = client_hparams(client_cfg.lr, client_cfg.rho)

    def tune(params, batches, cid):   # one client: `steps` client-optimizer steps from params
      return finetune_steps(params, batches, jax.random.fold_in(jax.random.key(seed), cid),
                            tx=make_client_tx(client_cfg, hparams), loss_fn=loss_fn, augment_fn=augment_fn)

    def tuned(params, eval_batches, tune_batches, cids):
      return jax.vmap(sums)(jax.vmap(tune, in_axes=(None, 0, 0))(params, tune_batches, cids), eval_batches)

    def clients(params, eval_batches, tune_batches, cids):     # one chunk of clients
      out = {'global': jax.vmap(sums, in_axes=(None, 0))(params, eval_batches)}
      if steps:
        out['tuned'] = tuned(params, eval_batches, tune_batches, cids)
      return out

    def batches(params, packed, mesh):     # every client's sums [chunks, chunk] of each metric
      def logits(params, xs):
        return jax.lax.map(lambda x: model.apply(params, x if preprocess is None else preprocess(x), train=False),
                           xs)
      if mesh.devices.size > 1:          # each device its share of the batches
        out = jax.shard_map(logits, mesh=mesh, in_specs=(P(), P(EVAL_AXIS)), out_specs=P(EVAL_AXIS),
                            check_vma=False)(params, packed['x'])
      else:
        out = logits(params, packed['x'])
      out = jnp.concatenate([out, jnp.zeros((1,) + out.shape[1:], out.dtype)])   # the all-padding batches'

      def client(lg, y, mask):     # the 'clients' layout's sums in its shapes: the same additions, in order
        return tmap(lambda a: jnp.sum(a, axis=0), jax.lax.map(lambda b: task.eval_sums(*b), (lg, y, mask)))
      return jax.lax.map(lambda c: jax.vmap(client)(out[c[0]], c[1], c[2]),
                         (packed['idx'], packed['y'], packed['mask']))
    return {'clients': clients, 'batches': batches, 'tuned': tuned}

  def _compiled(self, name, *args):
    if name not in self.compiled:
      self.compiled[name] = jax.jit(self._programs[name]).lower(*args).compile()
    return self.compiled[name]

  def _batches_program(self, d):
    """The 'batches' layout on the first d local devices, compiled (params replicated, batches split)."""
    name = f'batches{d}'
    if name not in self.compiled:
      mesh = eval_mesh(jax.local_devices()[:d])
      self._packed[d] = self._pack(self.nb, mesh)
      rep = self._params_at[d] = NamedSharding(mesh, P())
      fn = jax.jit(lambda params, packed: self._programs['batches'](params, packed, mesh),
                   in_shardings=(rep, self._packed_shardings(mesh)), out_shardings=rep)
      self.compiled[name] = fn.lower(self._params_spec, self._packed[d]).compile()
    return self.compiled[name]

  def _run(self, name, *args):
    return self._compiled(name, *args)(*args)

  def _chunk_args(self, s):
    sl = slice(s, s + self.chunk)
    tb = None if self.tune_batches is None else {k: v[sl] for k, v in self.tune_batches.items()}
    return {k: v[sl] for k, v in self.eval_batches.items()}, tb, self.keys[sl]

  def _by_clients(self, params):
    got = [jax.device_get(self._run('clients', params, *self._chunk_args(s)))
           for s in range(0, len(self.keys), self.chunk)]
    return {part: {m: np.concatenate([np.asarray(g[part][m]) for g in got]) for m in got[0][part]}
            for part in got[0]}

  def _by_batches(self, params, d=None):
    d = d or self.devices
    program = self._batches_program(d)
    # The caller's params may live on another mesh (the trainer's 'clients' mesh over every device): the program
    # was compiled for params replicated on its own d devices.
    g = jax.device_get(program(jax.device_put(params, self._params_at[d]), self._packed[d]))
    out = {'global': {m: np.asarray(v).reshape((-1,) + np.shape(v)[2:]) for m, v in g.items()}}
    if self.steps:
      got = [jax.device_get(self._run('tuned', params, *self._chunk_args(s)))
             for s in range(0, len(self.keys), self.chunk)]
      out['tuned'] = {m: np.concatenate([np.asarray(t[m]) for t in got]) for m in got[0]}
    return out

  def _choose(self, params):
    """'auto' at the first call: every candidate compiled, then each run once timed; the fastest whose sums equal
    the 'clients' layout's bit for bit kept. Returns the 'clients' layout's sums."""
    local = jax.local_device_count()
    cands = [local, 1] if local > 1 else [1]
    self._compiled('clients', params, *self._chunk_args(0))      # compiled outside the timing below
    for d in cands:
      self._batches_program(d)
    if self.steps:
      self._compiled('tuned', params, *self._chunk_args(0))
    t = time.perf_counter()
    ref = self._by_clients(params)
    times, same = {'clients': time.perf_counter() - t}, {}
    for d in cands:
      t = time.perf_counter()
      got = self._by_batches(params, d)
      times[f'batches{d}'] = time.perf_counter() - t
      same[f'batches{d}'] = all(np.array_equal(ref[p][m], got[p][m]) for p in ref for m in ref[p])
    best = min([k for k in same if same[k]] + ['clients'], key=times.get)
    self.layout = 'clients' if best == 'clients' else 'batches'
    self.devices = None if best == 'clients' else int(best[len('batches'):])
    self.layout_check = {'same_bits': same, 'seconds': times, 'layout': self.layout, 'devices': self.devices}
    for d in cands:         # the packed copies not chosen are not needed any more
      if d != self.devices:
        self._packed.pop(d, None)
        self.compiled.pop(f'batches{d}', None)
    return ref

  def __call__(self, params, personal=None) -> Dict[str, np.ndarray]:
    """personal: None, or fn(ids) -> the clients' own models stacked `[len(ids), ...]` (adds 'personal_acc',
    'personal_loss'; the padding clients of the last chunk repeat its first client's model)."""
    self._params_spec = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), params)
    if self.layout == 'batches' and self.devices is None:
      self.devices = jax.local_device_count()
    if self.layout == 'auto':
      got = self._choose(params)
    elif self.layout == 'batches':
      got = self._by_batches(params)
    else:
      got = self._by_clients(params)
    if personal is not None:
      parts = []
      for s in range(0, len(self.keys), self.chunk):
        ids = self.ids[s:s + self.chunk]
        ids = np.concatenate([ids, np.full(self.chunk - len(ids), ids[0])])
        eb = {k: v[s:s + self.chunk] for k, v in self.eval_batches.items()}
        parts.append(jax.device_get(self.personal_fn(personal(ids), eb)))
      got['personal'] = {m: np.concatenate([np.asarray(p[m]) for p in parts]) for m in parts[0]}
    k = len(self.ids)
    out = {'ids': self.ids, 'n': self.n}
    for name, prefix in (('global', ''), ('tuned', 'ft_'), ('personal', 'personal_')):
      if name not in got:
        continue
      s = {m: np.asarray(v, np.float64)[:k] for m, v in got[name].items()}
      count = np.maximum(s['count'], 1.0)
      out[prefix + 'acc'] = s['correct'] / count
      out[prefix + 'loss'] = s['loss_sum'] / count
    return out
