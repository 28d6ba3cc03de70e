"""Round batching: the sampled clients' data as padded [clients, steps, batch, ...] arrays with masks.

Shapes are fixed per run so that one compiled round program serves every round (no recompilation when
client sizes vary): the step count S is derived from the *population* (largest client, or a fixed
`local_steps`), rounded up to a bucket; shorter clients get fully masked steps, which leave their params
and optimizer state unchanged; a partial last batch is masked so the loss averages valid examples only.

Each client's order is reshuffled every local epoch from a key derived from (seed, round, client id), so
a resumed run reproduces the same batches and the batches do not depend on which other clients were
sampled. `shuffle=False` (config.data.shuffle) keeps each client's examples in stored order every epoch, to
compare against reference code batch by batch.

One definition of the order: `step_positions` (traceable JAX, fixed shapes from a `BatchPlan`) gives every
client's [S, B] positions and mask. The host (`make_round_batches`, numpy gather) and the compiled
multi-round program (`gather_round_device`, core/rounds.py: data kept on the device) both call it, so the two
paths cannot drift (tests/core/test_rounds.py). The stream changed with data/sampling.PROCEDURE 'jax-...-v1'
(numpy's PCG64 before). `client_step_indices` (numpy) remains for the personalized validation steps.

Data with an item store (data/federated.py: x holds indices into `data.store`): the gathered index rows pass
through `draw_columns` when the dataset draws columns from a pool (`plan.draw`), then `federated.lookup` maps
them to items, on the host and in the compiled round alike. The draw of the example at (step s, slot j) of a
client's round is keyed by (seed, round, client, s, j) (`draw_keys`): a fresh sample of every example's pool
at every visit, the same on both paths.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.data import sampling
from fedjax_flat.data.federated import lookup

DRAW_STREAM = 0xD7A3       # fold_in tag of the pool draws (batches of data with `draw`)


def steps_for_size(n: int, batch_size: int, epochs: int, *, full_batches: bool = False, max_steps: int = 0) -> int:
  """A client's local steps in epoch mode: epochs x ceil(n / B) (the last batch partial), or with
  full_batches epochs x floor(n / B) (the remainder left out: the FedVPR thesis' rule), capped at max_steps
  (0: no cap). The thesis' local iterations min(floor(|D_k| / B), 2500) = (1 epoch, full_batches, 2500)."""
  if n <= 0:
    return 0
  per_epoch = n // batch_size if full_batches else int(math.ceil(n / batch_size))
  steps = epochs * per_epoch
  return min(steps, int(max_steps)) if max_steps else steps


def bucket_steps(steps: int, policy: str = 'exact') -> int:
  """'exact' keeps S; 'pow2' rounds up to a power of two (bounded number of distinct shapes)."""
  if policy == 'exact' or steps <= 1:
    return max(int(steps), 1)
  if policy == 'pow2':
    return 1 << (int(steps) - 1).bit_length()
  raise ValueError(f"step bucketing policy={policy!r}; allowed: 'exact', 'pow2'")


def padded_num_steps(client_sizes: np.ndarray, batch_size: int, *, epochs: int = 1, local_steps: int = 0,
                     bucketing: str = 'exact', full_batches: bool = False, max_steps: int = 0) -> int:
  """The run's fixed S: local_steps if set, else the step count of the population's largest client."""
  if local_steps:
    return int(local_steps)
  return bucket_steps(steps_for_size(int(np.max(client_sizes)), batch_size, epochs, full_batches=full_batches,
                                     max_steps=max_steps), bucketing)


@dataclasses.dataclass
class RoundBatches:
  x: np.ndarray            # [C, S, B, *input_shape]
  y: np.ndarray            # [C, S, B, *label_shape] int32 (uint8 when the data store uint8: label_dtype)
  mask: np.ndarray         # [C, S, B] float32, 1 = real example
  num_examples: np.ndarray  # [C] float32: the client's dataset size N_k (FedAvg weight); 0 for padding
  client_ids: np.ndarray   # [C] int32 (-1 for padding clients)
  client: Optional[np.ndarray] = None   # [C, S] int32 client id of every step (BatchPlan.with_client), or None
  reports: Optional[np.ndarray] = None  # [C] bool: whose upload counts (the virtual clock), None: every real client
  system: Optional[dict] = None         # the round's virtual-clock totals (seconds, bytes), None without a clock

  def as_dict(self):
    d = {'x': self.x, 'y': self.y, 'mask': self.mask}
    if self.client is not None:
      d['client'] = self.client
    return d


def step_limit(mask, fit):
  """mask [C, S, B] with each client's steps from fit[c] on emptied (numpy or jnp alike): partial local work is
  a mask, never a new shape, so a deadline recompiles nothing."""
  xp = np if isinstance(mask, np.ndarray) else jnp
  keep = xp.arange(mask.shape[1])[None, :] < xp.asarray(fit)[:, None]
  return mask * keep[:, :, None].astype(mask.dtype)


def limit_steps(rb: 'RoundBatches', fit, reports, system=None) -> 'RoundBatches':
  """The round's batches with each client's steps past fit[c] masked and `reports` / `system` attached."""
  return dataclasses.replace(rb, mask=step_limit(rb.mask, fit), reports=np.asarray(reports, bool), system=system)


def round_inputs_valid(rb: 'RoundBatches'):
  """(weights N_k [C], valid [C] bool) the round program aggregates with: real clients, and with a virtual clock
  only those that report (the others weigh 0 and are not counted)."""
  valid = rb.client_ids >= 0
  if rb.reports is None:
    return rb.num_examples, valid
  valid = valid & rb.reports
  return np.where(valid, rb.num_examples, 0.0).astype(np.float32), valid


def label_dtype(dtype) -> np.dtype:
  """Batched labels keep uint8 (label maps with 255 = void: 4x less host memory and transfer than int32);
  every other integer label is int32 (class ids beyond 255, tokens)."""
  return np.dtype(np.uint8) if np.dtype(dtype) == np.uint8 else np.dtype(np.int32)


def client_steps(client_ids, num_steps: int):
  """[C, S] int32: each row's client id repeated over its steps (-1 for padding clients), the `client` entry
  of the round batches when a step's transform needs to know whose data it has (style transfer's own-client
  exclusion, data/transforms/style_transfer.py)."""
  ids = np.asarray(client_ids, np.int32)
  return np.ascontiguousarray(np.broadcast_to(ids[:, None], (ids.shape[0], num_steps)))


def client_rng(seed: int, round_idx: int, client_id: int) -> np.random.Generator:
  return np.random.default_rng([int(seed), int(round_idx), int(client_id), 0xB47C])


def client_step_indices(n: int, batch_size: int, num_steps: int, *, epochs: int, local_steps: int,
                        rng: np.random.Generator, shuffle: bool = True):
  """Per-step example positions (into the client's own examples) and masks, shape [S, B].

  shuffle=False: every epoch visits the examples in stored order (0..n-1); `rng` is unused.
  """
  perm = rng.permutation if shuffle else np.arange
  pos = np.zeros((num_steps, batch_size), np.int64)
  mask = np.zeros((num_steps, batch_size), np.float32)
  if n == 0:
    return pos, mask
  if local_steps:
    # A fixed number of full batches drawn from a stream of reshuffled epochs.
    need = local_steps * batch_size
    stream = np.concatenate([perm(n) for _ in range(int(math.ceil(need / n)))])[:need]
    pos[:local_steps] = stream.reshape(local_steps, batch_size)
    mask[:local_steps] = 1.0
    return pos, mask
  per_epoch = int(math.ceil(n / batch_size))
  s = 0
  for _ in range(epochs):
    order = perm(n)
    for b in range(per_epoch):
      chunk = order[b * batch_size:(b + 1) * batch_size]
      pos[s, :len(chunk)] = chunk
      mask[s, :len(chunk)] = 1.0
      s += 1
  if s > num_steps:
    raise ValueError(f'client with {n} examples needs {s} steps > padded steps {num_steps}')
  return pos, mask


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """The static shapes of a run's batch positions (one compiled program for every round)."""
  batch_size: int
  num_steps: int
  epochs: int
  local_steps: int
  shuffle: bool
  max_size: int          # the population's largest client: permutation length
  num_perms: int         # permutations drawn per client (epochs; or enough for the local_steps stream)
  with_client: bool = False   # the batches carry 'client' [C, S] (the train transform asks: `needs_client`)
  full_batches: bool = False  # epoch mode: floor(n / B) full batches per epoch, the remainder left out
  max_steps: int = 0          # epoch mode: at most this many steps per client and round (0: no cap)
  draw: Optional[tuple] = None   # (fixed, count): the data's pool draw (data/federated.py), None: no draw


def batch_plan(client_sizes, *, batch_size: int, num_steps: int, epochs: int = 1, local_steps: int = 0,
               shuffle: bool = True, with_client: bool = False, full_batches: bool = False,
               max_steps: int = 0, draw=None) -> BatchPlan:
  sizes = np.asarray(client_sizes, np.int64)
  max_size = max(int(sizes.max()) if sizes.size else 1, 1)
  if local_steps:
    # The stream of local_steps * B positions walks through ceil(need / n) epochs of an n-example client.
    pos_sizes = sizes[sizes > 0]
    min_size = int(pos_sizes.min()) if pos_sizes.size else 1
    num_perms = int(math.ceil(local_steps * batch_size / min_size))
  else:
    num_perms = int(epochs)
  return BatchPlan(int(batch_size), int(num_steps), int(epochs), int(local_steps), bool(shuffle), max_size,
                   max(num_perms, 1), bool(with_client), bool(full_batches) and not local_steps,
                   0 if local_steps else int(max_steps), None if draw is None else (int(draw[0]), int(draw[1])))


def step_positions(plan: BatchPlan, key, n):
  """Positions (into the client's own examples) and mask, int32 / float32 [S, B], of an n-example client.

  Traceable (n may be traced). Epoch mode: each epoch a fresh permutation cut into ceil(n/B) batches, the last
  one partial (masked); steps after epochs * ceil(n/B) are fully masked. With plan.full_batches an epoch is
  floor(n/B) full batches (the remainder unused; a client with n < B trains no step), and with plan.max_steps
  the steps from max_steps on are masked: min(floor(n/B), 2500) local iterations in one compiled shape.
  local_steps mode: local_steps full batches from a stream of reshuffled epochs. shuffle=False: stored order
  every epoch.
  """
  s_steps, b = plan.num_steps, plan.batch_size
  if plan.shuffle:
    perms = jax.vmap(lambda e: sampling.random_permutation(jax.random.fold_in(key, e), n, plan.max_size))(
        jnp.arange(plan.num_perms))
  else:
    perms = jnp.broadcast_to(jnp.arange(plan.max_size, dtype=jnp.int32), (plan.num_perms, plan.max_size))
  n = jnp.asarray(n, jnp.int32)
  safe_n = jnp.maximum(n, 1)
  s = jnp.arange(s_steps, dtype=jnp.int32)[:, None]
  j = jnp.arange(b, dtype=jnp.int32)[None, :]
  if plan.local_steps:
    t = s * b + j
    e, i = t // safe_n, t % safe_n
    valid = (n > 0) & (s < plan.local_steps) & (t >= 0)
  else:
    per_epoch = safe_n // b if plan.full_batches else (safe_n + b - 1) // b
    e, i = s // jnp.maximum(per_epoch, 1), (s % jnp.maximum(per_epoch, 1)) * b + j
    valid = (n > 0) & (per_epoch > 0) & (e < plan.epochs) & (i < n)
    if plan.max_steps:
      valid = valid & (s < plan.max_steps)
  e = jnp.clip(e, 0, plan.num_perms - 1)
  i = jnp.clip(i, 0, plan.max_size - 1)
  pos = jnp.where(valid, perms[e, i], 0)
  return pos, valid.astype(jnp.float32)


def round_positions(plan: BatchPlan, key, round_idx, client_ids, sizes):
  """[C, S, B] positions and masks of a round's clients (ids -1 / size 0: all masked). Traceable."""
  base = jax.random.fold_in(jax.random.fold_in(key, sampling.BATCH_STREAM), round_idx)
  keys = jax.vmap(lambda k: jax.random.fold_in(base, k))(jnp.maximum(client_ids, 0))
  sizes = jnp.where(client_ids >= 0, sizes, 0)
  return jax.vmap(lambda k, n: step_positions(plan, k, n))(keys, sizes)


_round_positions_jit = jax.jit(round_positions, static_argnums=(0,))


def host_round_positions(plan: BatchPlan, seed, round_idx: int, client_ids, sizes):
  """The same positions as numpy (the host path runs the traceable definition jitted)."""
  ids = np.asarray(client_ids, np.int32)
  pos, mask = _round_positions_jit(plan, sampling.seed_key(seed), jnp.asarray(round_idx, jnp.int32),
                                   jnp.asarray(ids), jnp.asarray(np.asarray(sizes, np.int32)))
  return np.asarray(pos).astype(np.int64), np.asarray(mask)


def draw_keys(key, round_idx, client_ids, num_steps: int, batch_size: int):
  """[C, S, B] keys of the pool draws: (seed, round, client, step, slot). Traceable."""
  base = jax.random.fold_in(jax.random.fold_in(key, DRAW_STREAM), round_idx)
  s = jnp.arange(num_steps * batch_size, dtype=jnp.int32)
  return jax.vmap(lambda c: jax.vmap(lambda i: jax.random.fold_in(jax.random.fold_in(base, c), i))(s))(
      jnp.maximum(client_ids, 0)).reshape(client_ids.shape[0], num_steps, batch_size)


def draw_columns(draw, keys, x, y):
  """x, y [..., K(, ...)] -> [..., fixed + count(, ...)]: the first `fixed` columns, then `count` columns drawn
  uniformly without replacement from the pool x[..., fixed:] >= 0 (keys [...]: one per example). When the pool
  holds fewer than `count` entries, every entry is used and the rest are empty (-1). Traceable.

  The draw is the `count` smallest of one uniform number per pool entry (empty entries get 2, past every real
  one): top_k, not a sort of the pool."""
  fixed, count = draw
  pool = x[..., fixed:]
  u = jax.vmap(lambda k: jax.random.uniform(k, (pool.shape[-1],)))(keys.reshape(-1)).reshape(pool.shape)
  _, sel = jax.lax.top_k(-jnp.where(pool >= 0, u, 2.0), count)
  cols = jnp.concatenate([jnp.broadcast_to(jnp.arange(fixed, dtype=sel.dtype), sel.shape[:-1] + (fixed,)),
                          fixed + sel], axis=-1)
  ycols = cols.reshape(cols.shape + (1,) * (y.ndim - cols.ndim))
  return jnp.take_along_axis(x, cols, axis=-1), jnp.take_along_axis(y, ycols, axis=cols.ndim - 1)


def drawn_rows(draw, keys, rows, y, valid):
  """Index rows [..., K] and their labels as a batch uses them: with `draw` the pool drawn (`draw_columns`, keys
  [...]), then the rows of masked examples (valid [...] False) empty (-1) and their labels 0. Traceable: the one
  definition of the rounds' device gather and the centralized runner's store batches."""
  if draw is not None:
    rows, y = draw_columns(draw, keys, rows, y)
  rows = jnp.where(valid[..., None], rows, -1)
  y = jnp.where(valid.reshape(valid.shape + (1,) * (y.ndim - valid.ndim)), y, jnp.zeros((), y.dtype))
  return rows, y


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _host_draw(draw, num_steps, batch_size, key, round_idx, client_ids, x, y):
  keys = draw_keys(key, round_idx, client_ids, num_steps, batch_size)
  return draw_columns(draw, keys, x, y)


def device_data(data):
  """An in-memory FederatedDataset's training arrays on the device, for `gather_round_device`."""
  out = {'x': jnp.asarray(data.x), 'y': jnp.asarray(np.asarray(data.y, label_dtype(data.y.dtype))),
         'index': jnp.asarray(np.asarray(data.client_index, np.int32)),
         'offsets': jnp.asarray(np.asarray(data.client_offsets[:-1], np.int32)),
         'sizes': jnp.asarray(np.asarray(data.client_sizes(), np.int32))}
  if data.indexed:     # x holds int32 indices into the store
    out['x'] = jnp.asarray(np.asarray(data.x, np.int32))
    out['store'] = jnp.asarray(data.store)
  return out


def gather_round_device(plan: BatchPlan, arrays, key, round_idx, client_ids):
  """Traceable: the round's batches {x, y, mask} [C, S, B, ...] (+ 'client' [C, S] with plan.with_client)
  and weights N_k [C] from device arrays.

  Same positions as `make_round_batches` (one definition); masked entries are zeros, as on the host.
  """
  safe = jnp.maximum(client_ids, 0)
  sizes = jnp.where(client_ids >= 0, arrays['sizes'][safe], 0)
  pos, mask = round_positions(plan, key, round_idx, client_ids, sizes)
  flat = arrays['index'][arrays['offsets'][safe][:, None, None] + pos]
  valid = mask > 0
  x = arrays['x'][flat]
  y = arrays['y'][flat]
  if 'store' in arrays:          # index rows -> (drawn columns) -> items; masked entries all empty (-1)
    keys = (None if plan.draw is None
            else draw_keys(key, round_idx, client_ids, plan.num_steps, plan.batch_size))
    x, y = drawn_rows(plan.draw, keys, x, y, valid)
    x = lookup(arrays['store'], x, jnp)
  x = jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - valid.ndim)), x, jnp.zeros((), x.dtype))
  y = jnp.where(valid.reshape(valid.shape + (1,) * (y.ndim - valid.ndim)), y, jnp.zeros((), y.dtype))
  out = {'x': x, 'y': y, 'mask': mask}
  if plan.with_client:
    out['client'] = jnp.broadcast_to(client_ids[:, None].astype(jnp.int32), mask.shape[:2])
  return out, sizes.astype(jnp.float32)


def make_round_batches(data, client_ids: Sequence[int], *, round_idx: int, seed: int, batch_size: int,
                       num_steps: int, epochs: int = 1, local_steps: int = 0,
                       pad_clients_to: Optional[int] = None, shuffle: bool = True,
                       plan: Optional[BatchPlan] = None) -> RoundBatches:
  """Gathers the sampled clients' examples into padded arrays (host numpy).

  `data` is a `ClientDataSource` (data/federated.py: a FederatedDataset, an out-of-memory source, or a source of
  index rows into an item store: `indexed`, `item_store(k)`, `draw`, `slots`): the batcher reads client k's
  examples at the drawn positions through `data.rows(k, positions)`. `plan` (from the population's sizes,
  `batch_plan`) is derived from `data.client_sizes()` when not given.
  """
  if plan is None:
    plan = batch_plan(data.client_sizes(), batch_size=batch_size, num_steps=num_steps, epochs=epochs,
                      local_steps=local_steps, shuffle=shuffle, draw=data.draw)
  ids = [int(c) for c in client_ids]
  c_total = max(len(ids), pad_clients_to or 0)
  indexed = data.indexed         # examples are index rows into an item store (data/federated.py)
  input_shape = tuple(data.input_shape)
  xs = np.zeros((c_total, num_steps, batch_size) + input_shape, data.input_dtype)
  y_dtype = label_dtype(data.label_dtype)
  ys = np.zeros((c_total, num_steps, batch_size) + tuple(data.label_shape), y_dtype)
  ms = np.zeros((c_total, num_steps, batch_size), np.float32)
  nums = np.zeros((c_total,), np.float32)
  out_ids = np.full((c_total,), -1, np.int32)
  sizes = np.asarray(data.client_sizes())
  if ids:
    all_pos, all_mask = host_round_positions(plan, seed, round_idx, ids, sizes[ids])
  if ids and indexed:       # index rows of every client, with the draw, then items (one definition)
    parts = [data.rows(k, all_pos[i][all_mask[i] > 0]) for i, k in enumerate(ids)]
    rows = np.full((len(ids), num_steps, batch_size) + parts[0][0].shape[1:], -1, np.int32)
    rys = np.zeros((len(ids), num_steps, batch_size) + parts[0][1].shape[1:], y_dtype)
    for i, (cr, cy) in enumerate(parts):
      valid = all_mask[i] > 0
      if valid.any():
        rows[i][valid], rys[i][valid] = cr, cy
    if plan.draw is None and data.draw is not None:   # a plan built without the data's draw:
      rows, rys = rows[..., :data.slots], rys[:, :, :, :data.slots]      # the first pool columns, as `take`
    elif plan.draw is not None:
      rows, rys = (np.asarray(a) for a in _host_draw(
          plan.draw, num_steps, batch_size, sampling.seed_key(seed), jnp.asarray(round_idx, jnp.int32),
          jnp.asarray(np.asarray(ids, np.int32)), rows, rys))
    rows = np.where(all_mask[..., None] > 0, rows, -1)
  for i, k in enumerate(ids):
    n = int(sizes[k])
    need = steps_for_size(n, batch_size, epochs, full_batches=plan.full_batches, max_steps=plan.max_steps)
    if need > num_steps and not local_steps:
      raise ValueError(f'client with {n} examples needs {need} steps > padded steps {num_steps}')
    pos, mask = all_pos[i], all_mask[i]
    valid = mask > 0
    nums[i] = n
    out_ids[i] = k
    if n == 0:
      continue
    if indexed:
      xs[i][valid] = lookup(data.item_store(k), rows[i][valid])
      ys[i][valid] = rys[i][valid]
    else:
      xs[i][valid], ys[i][valid] = data.rows(k, pos[valid])
    ms[i] = mask
  client = client_steps(out_ids, num_steps) if plan.with_client else None
  return RoundBatches(xs, ys, ms, nums, out_ids, client=client)


def make_eval_batches(x: np.ndarray, y: np.ndarray, batch_size: int):
  """Stacked padded batches [nb, B, ...] + mask over a whole split (exact example-weighted metrics)."""
  n = len(y)
  nb = max(1, int(math.ceil(n / batch_size)))
  total = nb * batch_size
  xp = np.zeros((total,) + x.shape[1:], x.dtype)
  yp = np.zeros((total,) + y.shape[1:], label_dtype(y.dtype))   # labels may be arrays (tokens, label maps)
  mp = np.zeros((total,), np.float32)
  xp[:n], yp[:n], mp[:n] = x, y, 1.0
  shape = lambda a: a.reshape((nb, batch_size) + a.shape[1:])
  return {'x': shape(xp), 'y': shape(yp), 'mask': shape(mp)}
