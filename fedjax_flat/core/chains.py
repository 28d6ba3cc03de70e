"""Chain execution (FedSeq family): sampled superclients in parallel, their clients one after another.

A round of a chain algorithm is a set of *chains*: each is one sampled superclient whose clients train in
a (re-shuffled) order, the model passed from one to the next, E_S passes over the chain; the server then
combines the chains' final models. The round program sees the chains as *lanes* of local steps:

  lanes [L, T]: lane l is a sequence of T local steps. The sampled chains are packed into the lanes back to
  back (one chain per lane for FedSeq / FedAsyncSeq, every chain in one lane for FedCyclic / FedSeq2Par by
  default); inside a chain each member contributes exactly its own steps (E_k epochs of its data, no
  per-client padding); only the end of a lane is padding. Per step the layout carries the batch, the client
  (for its keys) and `member_start` (a new client of the chain starts here: a fresh client optimizer state,
  as the reference code builds a new optimizer per client, model passed along; `reset_opt_state=False` keeps
  it); per chain of a lane its first step, its length and |D_S|. Each chain starts from its start model
  (client_init) and ends with client_final -> |D_S| * out added to the aggregate.

  L, T (and the most chains per lane) are fixed for the run (`LaneShape`), so chains of unequal length and clients
  of unequal size
  never change a shape: one compiled round program for every round (tests/algorithms/test_fedseq.py counts compiles).

The lane runner reuses the algorithm contract (core/contract.py): client_init / client_step /
client_final of the chain algorithm (FedAvg's local training with any client optimizer: SGD, SAM, ASAM),
then `algorithm.server_update` on the |D_S|-weighted means, exactly as the client engine does
(core/engine.py): server optimizers and the SWA / WiMA wrappers work unchanged. Lanes run `chunk` at a time
(vmap inside a chunk, sequential over chunks, like engine.run_clients). A lane loops over its real steps
only (a while loop with the lane's step count as trip count: padding is never computed on one lane; under
vmap the chunk runs to its longest lane); with chunk 1 (the CPU default) a lane is not vmapped, so the
restart / emit branches are real conditionals that cost nothing when not taken.

Randomness, as for plain clients (data/sampling.py, data/batching.py): a member's batch order and its step
keys are those of the same client in a FedAvg round (seed, round, client id; E_S pass e > 0 folds e in), so
a chain of one client computes exactly a FedAvg client.

The layout is built on the host (numpy) each round (`build_lanes`); with in-memory data the lanes carry
example indices and the program gathers the examples from the device copy of the data (no per-round copy
of images), otherwise the host gathers them.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.core import engine as engine_lib
from fedjax_flat.data import sampling
from fedjax_flat.data import batching
from fedjax_flat.core import sharding as sharding_lib

PASS_STREAM = 0x5E9       # fold_in tag of the batch order of E_S passes e > 0 (pass 0 = the FedAvg order)
# What the round program takes per lane: per step [L, T(, B)] and per chain slot of the lane [L, C] / [L].
LANE_KEYS = ('client', 'step', 'member_start', 'mask', 'chain_offset', 'chain_len', 'chain_weight', 'num_chains')


@dataclasses.dataclass(frozen=True)
class LaneShape:
  lanes: int      # L: chains run in parallel (vmap / chunks)
  steps: int      # T: local steps per lane (the longest lane of any round of the run)
  chains: int = 1  # the most chains a lane holds in any round (FedSeq2Par / FedCyclic packing)


@dataclasses.dataclass
class Chain:
  """One sampled superclient of a round."""
  superclient: int            # its index in the round's grouping (-1: FedCyclic's chain of sampled clients)
  members: np.ndarray         # [E_S, K_S] client ids in training order, one row per pass over the chain
  weight: float               # |D_S|: the chain's aggregation weight (sum of its clients' examples)
  lane: int = -1              # where build_lanes put it
  slot: int = -1              # FedAsyncSeq: the persistent chain slot that trains it


def client_steps(sizes, *, batch_size: int, epochs: int, local_steps: int = 0) -> np.ndarray:
  """Local steps of each client (int64 [K]): E_k epochs of ceil(n/B) batches, or `local_steps` (n > 0)."""
  sizes = np.asarray(sizes, np.int64)
  if local_steps:
    return np.where(sizes > 0, int(local_steps), 0).astype(np.int64)
  return (int(epochs) * -(-sizes // int(batch_size))).astype(np.int64)


def chain_rng(seed: int, round_idx: int, stream: int, *extra: int) -> np.random.Generator:
  """Host randomness of a round's chains: a pure function of (seed, round, stream[, superclient, pass])."""
  return np.random.default_rng([int(seed), int(round_idx), int(stream)] + [int(e) % 2**32 for e in extra])


def order_members(members: Sequence[int], *, seed: int, round_idx: int, superclient: int, passes: int,
                  shuffle: bool, stream: int = 0xC4A1) -> np.ndarray:
  """[E_S, K_S]: the chain order of each pass, re-drawn every round (and pass) from (seed, round, S)."""
  members = np.asarray(members, np.int64)
  rows = []
  for e in range(int(passes)):
    if shuffle:
      rows.append(members[chain_rng(seed, round_idx, stream, superclient, e).permutation(len(members))])
    else:
      rows.append(members.copy())
  return np.stack(rows) if rows else np.zeros((0, len(members)), np.int64)


def chain_total_steps(chain: Chain, steps: np.ndarray) -> int:
  return int(steps[chain.members].sum())


def pack_lanes(totals: Sequence[int], lanes: int, *, one_per_lane: bool = False) -> np.ndarray:
  """Lane of each chain: one chain per lane (in order), or longest-first onto the least-loaded lane (LPT)."""
  totals = np.asarray(totals, np.int64)
  if one_per_lane:
    if len(totals) > lanes:
      raise ValueError(f'{len(totals)} chains for {lanes} lanes (one chain per lane)')
    return np.arange(len(totals))
  load = np.zeros(lanes, np.int64)
  out = np.zeros(len(totals), np.int64)
  for i in np.argsort(-totals, kind='stable'):
    lane = int(np.argmin(load))
    out[i] = lane
    load[lane] += totals[i]
  return out


def lane_capacity(totals: Sequence[int], lanes: int, *, one_per_lane: bool = False) -> int:
  """Steps T that any packing of these chains (or a subset) into `lanes` lanes fits in (LPT's bound)."""
  totals = np.asarray(totals, np.int64)
  if not len(totals):
    return 1
  if one_per_lane or lanes >= len(totals):
    return int(totals.max())
  if lanes == 1:
    return int(totals.sum())
  # LPT: the last chain placed on the fullest lane started at most at sum/L (Graham's bound).
  return int(-(-totals.sum() // lanes) + totals.max())


@functools.partial(jax.jit, static_argnums=(0,))
def _positions(plan, key, round_idx, ids, sizes):
  return batching.round_positions(plan, key, round_idx, ids, sizes)


def member_positions(plan: batching.BatchPlan, seed, round_idx: int, ids: np.ndarray, sizes: np.ndarray,
                     pass_idx: int):
  """[n, S, B] positions / masks of clients `ids` in pass `pass_idx` (pass 0: their FedAvg batches)."""
  n = len(ids)
  cap = 1 << max(int(n) - 1, 0).bit_length()        # pow2 padding: a bounded number of tiny programs
  pid = np.full((cap,), -1, np.int32)
  psz = np.zeros((cap,), np.int32)
  pid[:n], psz[:n] = ids, sizes
  key = sampling.seed_key(seed)
  if pass_idx:
    key = jax.random.fold_in(key, PASS_STREAM + int(pass_idx))
  pos, mask = _positions(plan, key, jnp.asarray(round_idx, jnp.int32), jnp.asarray(pid), jnp.asarray(psz))
  return np.asarray(pos)[:n].astype(np.int64), np.asarray(mask)[:n]


def build_lanes(chains: List[Chain], shape: LaneShape, *, steps: np.ndarray, sizes: np.ndarray,
                plan: batching.BatchPlan, seed, round_idx: int, one_per_lane: bool = False) -> Dict[str, np.ndarray]:
  """The round's lane layout: per-step client, step index, flags, weights and example positions.

  Returns numpy arrays: client/step int32 [L, T] (client -1: padding), member_start/chain_start/chain_end
  bool [L, T], weight float32 [L, T] (|D_S| on chain_end steps), pos int64 [L, T, B] (into the client's own
  examples), mask float32 [L, T, B]; per chain of a lane, in order: chain_offset / chain_len int32 [L, C] (its
  first step and step count), chain_weight float32 [L, C] (|D_S|), num_chains int32 [L]. Sets each chain's
  `lane`.
  """
  L, T, B, C = shape.lanes, shape.steps, plan.batch_size, shape.chains
  totals = [chain_total_steps(c, steps) for c in chains]
  keep = [i for i, t in enumerate(totals) if t > 0]       # a chain of empty clients trains nothing
  lanes_of = pack_lanes([totals[i] for i in keep], L, one_per_lane=one_per_lane)
  out = {'client': np.full((L, T), -1, np.int32), 'step': np.zeros((L, T), np.int32),
         'member_start': np.zeros((L, T), bool), 'chain_start': np.zeros((L, T), bool),
         'chain_end': np.zeros((L, T), bool), 'weight': np.zeros((L, T), np.float32),
         'pos': np.zeros((L, T, B), np.int64), 'mask': np.zeros((L, T, B), np.float32),
         'chain_offset': np.zeros((L, C), np.int32), 'chain_len': np.zeros((L, C), np.int32),
         'chain_weight': np.zeros((L, C), np.float32), 'num_chains': np.zeros((L,), np.int32)}
  # Positions of every (member, pass): one batched call per pass.
  passes = max((c.members.shape[0] for c in chains), default=0)
  pos_of = {}
  for e in range(passes):
    ids = np.unique(np.concatenate([c.members[e] for c in chains if c.members.shape[0] > e]))
    ids = ids[steps[ids] > 0]
    if len(ids):
      p, m = member_positions(plan, seed, round_idx, ids, sizes[ids], e)
      for j, k in enumerate(ids):
        pos_of[(int(k), e)] = (p[j], m[j])
  fill = np.zeros(L, np.int64)
  for i, lane in zip(keep, lanes_of):
    c = chains[i]
    c.lane = int(lane)
    t0 = t = int(fill[lane])
    j = int(out['num_chains'][lane])
    if t + totals[i] > T or j >= C:
      raise ValueError(f'chain of {totals[i]} steps does not fit lane {lane} at step {t} of {T} (chain {j} '
                       f'of at most {C})')
    for e in range(c.members.shape[0]):
      for k in c.members[e]:
        s = int(steps[k])
        if not s:
          continue
        p, m = pos_of[(int(k), e)]
        out['client'][lane, t:t + s] = k
        out['step'][lane, t:t + s] = e * s + np.arange(s)     # the member's step index (pass 0: FedAvg's)
        out['member_start'][lane, t] = True
        out['pos'][lane, t:t + s] = p[:s]
        out['mask'][lane, t:t + s] = m[:s]
        t += s
    out['chain_start'][lane, t0] = True
    out['chain_end'][lane, t - 1] = True
    out['weight'][lane, t - 1] = c.weight
    out['chain_offset'][lane, j], out['chain_len'][lane, j] = t0, t - t0
    out['chain_weight'][lane, j] = c.weight
    out['num_chains'][lane] = j + 1
    fill[lane] = t
  return out


def gather_host(data, lanes: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """x, y [L, T, B, ...] gathered on the host (out-of-memory sources: `client_examples(k)`)."""
  client, pos, mask = lanes['client'], lanes['pos'], lanes['mask']
  L, T, B = pos.shape
  x = y = None
  for k in np.unique(client[client >= 0]):
    sel = client == k
    valid = mask[sel] > 0                                      # [n_steps, B]
    at = pos[sel][valid]
    if data.indexed:     # an item store (data/federated.py): client_examples looks the items up
      cx, cy = data.client_examples(int(k))
      cx, cy = cx[at], cy[at]
    else:                # the batcher's protocol (data/federated.ClientDataSource.rows)
      cx, cy = data.rows(int(k), at)
    if x is None:
      x = np.zeros((L, T, B) + tuple(cx.shape[1:]), cx.dtype)
      y = np.zeros((L, T, B) + tuple(np.shape(cy)[1:]), np.int32)       # per-position labels keep their shape
    xs, ys = x[sel], y[sel]
    xs[valid] = cx
    ys[valid] = cy
    x[sel], y[sel] = xs, ys
  if x is None:
    x = np.zeros((L, T, B) + tuple(data.input_shape), np.float32)
    y = np.zeros((L, T, B) + tuple(data.label_shape), np.int32)
  return {'x': x, 'y': y}


def flat_index(data, lanes: Dict[str, np.ndarray]) -> np.ndarray:
  """int32 [L, T, B] indices into data.x / data.y (masked entries 0) for the in-program gather."""
  client, pos = lanes['client'], lanes['pos']
  safe = np.maximum(client, 0)
  idx = data.client_index[data.client_offsets[safe][..., None] + pos * (client[..., None] >= 0)]
  return np.where(lanes['mask'] > 0, idx, 0).astype(np.int32)


def program_inputs(lanes: Dict[str, np.ndarray], gathered: Optional[Dict[str, np.ndarray]] = None,
                   index: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
  """What the round program takes: the step flags plus x/y (host gather) or `index` (device gather)."""
  out = {k: lanes[k] for k in LANE_KEYS}
  if index is not None:
    out['index'] = index
  else:
    out.update(gathered)
  return out


# ---------------------------------------------------------------------------------------------------------
# The round program.


def _tree_where(pred, a, b):
  return jax.tree_util.tree_map(lambda x, y: jnp.where(pred, x, y), a, b)


def _zeros_of(shapes):
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def make_lane_runner(algorithm: FederatedAlgorithm, *, reset_opt_state: bool = True, augment_fn=None):
  """run(bcast, lane, start_params, key, round_idx) -> (partial sums, final params, metrics) for one lane.

  lane: the LANE_KEYS arrays ([T] / [T, B] per step, [C] / [] per chain) plus x, y [T, B, ...].
  start_params: where each chain of the lane starts (the broadcast model, or FedAsyncSeq's slot model).
  A loop over the lane's chains, and inside a chain a loop over its steps: the chain's start and end are
  handled between the inner loops, so a step pays only for its own update (and, at a member's first step
  with reset_opt_state, a fresh optimizer state).
  """
  base_of = lambda key, r: jax.random.fold_in(jax.random.fold_in(key, sampling.TRAIN_STREAM), r)

  def run(bcast, lane, start_params, key, round_idx):
    base = base_of(key, round_idx)

    def fresh(params, rng):
      return algorithm.client_init({**bcast, 'params': params}, None, rng)

    local0 = fresh(start_params, base)
    out_shape = jax.eval_shape(lambda l: algorithm.client_final(bcast, l, None)[0], local0)
    acc0 = {'weighted': _zeros_of(out_shape['weighted']), 'uniform': _zeros_of(out_shape['uniform']),
            'total_weight': jnp.zeros((), jnp.float32), 'num_clients': jnp.zeros((), jnp.float32)}
    zero = jnp.zeros((), jnp.float32)

    def step_body(t, carry):
      local, finite, loss_sum, count = carry
      xs = jax.tree_util.tree_map(lambda a: a[t], {k: lane[k] for k in ('x', 'y', 'mask', 'client', 'step',
                                                                         'member_start')})
      batch = {'x': xs['x'], 'y': xs['y'], 'mask': xs['mask']}
      if augment_fn is not None and augment_fn.needs_client:   # style transfer excludes the client's own style
        batch['client'] = xs['client']
      ckey = jax.random.fold_in(base, jnp.maximum(xs['client'], 0))       # = sampling.client_keys
      step_rng = jax.random.fold_in(ckey, xs['step'])                     # = engine: fold_in(rng, step)
      if reset_opt_state:      # a new member: a fresh optimizer state, the params passed on
        opt = jax.lax.cond(xs['member_start'], lambda l: fresh(l.params, ckey).opt_state,
                           lambda l: l.opt_state, local)
        local = local._replace(opt_state=opt)
      if augment_fn is not None:   # as engine.make_client_runner
        batch = augment_fn(jax.random.fold_in(step_rng, 1), batch)
      local, m = algorithm.client_step(bcast, local, batch, step_rng)
      return local, finite & jnp.isfinite(m['loss_sum']), loss_sum + m['loss_sum'], count + m['count']

    def chain_body(j, carry):
      acc, finite, loss_sum, count, _ = carry
      local = fresh(start_params, base)                  # the chain starts from its start model
      first, n = lane['chain_offset'][j], lane['chain_len'][j]
      local, finite, loss_sum, count = jax.lax.fori_loop(first, first + n, step_body,
                                                         (local, finite, loss_sum, count))
      out, _ = algorithm.client_final(bcast, local, None)
      w = lane['chain_weight'][j]
      for v in jax.tree_util.tree_leaves(out):
        finite = finite & jnp.all(jnp.isfinite(v))
      acc = {'weighted': jax.tree_util.tree_map(lambda a, v: a + w.astype(v.dtype) * v, acc['weighted'],
                                                out['weighted']),
             'uniform': jax.tree_util.tree_map(lambda a, v: a + v, acc['uniform'], out['uniform']),
             'total_weight': acc['total_weight'] + w, 'num_clients': acc['num_clients'] + 1.0}
      return acc, finite, loss_sum, count, local.params

    acc, finite, loss_sum, count, last = jax.lax.fori_loop(
        0, lane['num_chains'], chain_body, (acc0, jnp.array(True), zero, zero, local0.params))
    return acc, last, {'loss_sum': loss_sum, 'count': count, 'finite': finite}
  return run


def make_chain_round_fn(algorithm: FederatedAlgorithm, *, chunk: int, reset_opt_state: bool = True,
                        per_lane_params: bool = False, augment_fn=None, jit: bool = True, donate: bool = True,
                        mesh=None):
  """round(server_state, lanes, data, key, round_idx) -> (server_state', metrics [L]).

  lanes: LANE_KEYS arrays [L, ...] plus x/y (host gather) or index [L, T, B] (gather from `data`, the
  device copy of the training arrays: {'x', 'y'}; None with host gather). L must be a multiple of `chunk`.
  per_lane_params: server_update also gets agg['lanes'] = {'params': [L, ...] each lane's final model,
  'weight': [L] its chain's |D_S|, 'valid': [L]} (FedAsyncSeq's persistent chain slots: one chain per lane).
  The start model of lane l is `bcast['slots'][l]` when the broadcast carries slots, else bcast['params'].
  mesh: lanes sharded over the ('clients',) mesh of core/sharding.py (L a multiple of devices x chunk): each
  device runs its block of lanes, the partial sums are psum'ed, the server update is replicated; results
  equal the one-device program up to the order of the floating-point sums.
  """
  if algorithm.num_phases != 1:
    raise ValueError(f'chain execution runs single-phase algorithms; {algorithm.name} has {algorithm.num_phases}')
  runner = make_lane_runner(algorithm, reset_opt_state=reset_opt_state, augment_fn=augment_fn)

  def lane_block(bcast, lanes, starts, data, key, round_idx):
    """A block of lanes (all of them, or one device's): (summed partial aggregates, final params, metrics)."""
    if 'index' in lanes:           # gather the examples from the device copy of the data
      idx = lanes['index']
      valid = lanes['mask'] > 0
      x, y = data['x'][idx], data['y'][idx]
      pad = lambda a: jnp.where(valid.reshape(valid.shape + (1,) * (a.ndim - valid.ndim)), a,   # noqa: E731
                                jnp.zeros((), a.dtype))
      lanes = {**{k: v for k, v in lanes.items() if k != 'index'}, 'x': pad(x), 'y': pad(y)}   # y: [..] or [.., P]
    n_lanes = lanes['mask'].shape[0]
    n_chunks = n_lanes // chunk
    split = lambda t: jax.tree_util.tree_map(lambda a: a.reshape((n_chunks, chunk) + a.shape[1:]), t)

    # vmapped even for chunk 1: on XLA:CPU the CNN step with a leading batch axis of 1 costs about 10% less
    # CPU time than without one (measured: benchmarks/studies/README.fedseq.md), as in engine.run_clients.
    def one(lane, start):
      in_start = None if start is None else 0
      s = bcast['params'] if start is None else start
      accs, params, m = jax.vmap(runner, in_axes=(None, 0, in_start, None, None))(bcast, lane, s, key, round_idx)
      return jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), accs), params, m

    xs = (split(lanes), None if starts is None else split(starts))
    first = jax.tree_util.tree_map(lambda a: a[0], xs)
    acc_shape = jax.eval_shape(lambda l, s: one(l, s)[0], *first)

    def body(acc, chunk_xs):
      a, params, m = one(*chunk_xs)
      acc = jax.tree_util.tree_map(lambda u, v: u + v, acc, a)
      return acc, ((params if per_lane_params else ()), m)

    acc, (params, metrics) = jax.lax.scan(body, _zeros_of(acc_shape), xs)
    merge = lambda t: jax.tree_util.tree_map(lambda a: a.reshape((n_lanes,) + a.shape[2:]), t)
    return acc, merge(params), merge(metrics)

  if mesh is not None:
    from jax.sharding import PartitionSpec as P
    rep, lane_axis = P(), P(sharding_lib.AXIS)

    def sharded_block(bcast, lanes, starts, data, key, round_idx):
      def local(bcast, lanes, starts, data, key, round_idx):
        acc, params, metrics = lane_block(bcast, lanes, starts, data, key, round_idx)
        return jax.lax.psum(acc, sharding_lib.AXIS), params, metrics
      # check_vma=False: the zero-initialized scan accumulators are device-invariant while the lane outputs
      # vary; the psum is the only cross-device operation (as core/sharding.make_sharded_block).
      return jax.shard_map(local, mesh=mesh, in_specs=(rep, lane_axis, lane_axis, rep, rep, rep),
                           out_specs=(rep, lane_axis, lane_axis), check_vma=False)(
                               bcast, lanes, starts, data, key, round_idx)
    block = sharded_block
  else:
    block = lane_block

  def round_fn(server_state, lanes, data, key, round_idx):
    bcast = algorithm.broadcast(server_state, round_idx, 0)
    acc, params, metrics = block(bcast, lanes, bcast.get('slots'), data, key, round_idx)
    agg = engine_lib.finalize_aggregate(acc)
    if per_lane_params:
      weight = jnp.sum(lanes['chain_weight'], axis=1)
      agg['lanes'] = {'params': params, 'weight': weight, 'valid': weight > 0}
    server_state = algorithm.server_update(server_state, agg, round_idx, 0)
    return server_state, metrics

  if not jit:
    return round_fn
  if mesh is None:
    return jax.jit(round_fn, donate_argnums=(0,) if donate else ())
  from jax.sharding import NamedSharding, PartitionSpec as P
  replicated, by_lane = NamedSharding(mesh, P()), NamedSharding(mesh, P(sharding_lib.AXIS))
  # Explicit shardings: one compiled program for every round (replicated server state, lane-sharded rest).
  return jax.jit(round_fn, in_shardings=(replicated, by_lane, replicated, replicated, replicated),
                 out_shardings=(replicated, by_lane), donate_argnums=(0,) if donate else ())
