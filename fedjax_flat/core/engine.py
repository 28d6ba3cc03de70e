"""The round engine: one jitted program runs every sampled client and the server update.

Data flow of a round (all inside one XLA program):

  bcast = algorithm.broadcast(server_state, round, phase)
  for each chunk of clients (lax.scan over chunks; vmap inside a chunk):
      per client: local = client_init; lax.scan of client_step over the padded steps
                  (a step whose batch is all padding leaves `local` unchanged); client_final
      accumulate sum_k N_k * out_weighted, sum_k out_uniform, N, |C|      (streaming: O(chunk) memory)
      (N_k = 1 for every sampled client when algorithm.client_weighting == 'uniform', min(N_k, weight_cap)
      when it is 'capped')
  agg = weighted / uniform means;  server_state = algorithm.server_update(server_state, agg, round, phase)

algorithm.aggregate='stacked' (core/contract.py) keeps every client's upload instead of the running sums:
server_update gets {'uploads': [C, ...], 'weights': [C], 'valid': [C], 'num_clients', 'total_weight'} in the
round's client order (all-gathered over devices: `reduce_across`), memory C x the upload (docs/aggregation.md).

Client strategies (config.engine.strategy): 'vmap' (all clients of the round in one vmap), 'chunked'
(vmap over `clients_per_chunk`, sequential over chunks), 'sequential' (one client at a time). All are
numerically the same computation. The per-client outputs kept are only the new client states (stateful
algorithms) and a few scalars (loss, divergence flags).

Why the scan over local steps is unrollable: on XLA:CPU a convolution weight-gradient inside a while loop
runs 10-20x slower (jax#12868). Models use the im2col convolution on CPU ('auto'), which removes the trap;
`unroll` remains available (it trades compile time for speed).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.core.contract import AGGREGATES, WEIGHTINGS, FederatedAlgorithm
from fedjax_flat.models.base import COMPUTE_DTYPES
from fedjax_flat.schema import (EXECUTION, RESULT, RESUME, SAME_BITS, Choice, Field, Flag, Int, Num, Section, Test,
                                is_number)

STRATEGIES = ('vmap', 'chunked', 'sequential')


def _auto_or_flag(v) -> bool:
  return v == 'auto' or isinstance(v, bool)


# config.engine: how the rounds are executed. The same computation whatever the values (a resume may change
# them, with a warning: another floating-point reduction order), bit-identical for the SAME_BITS fields
# (tests/core/test_rounds.py).
SECTION = Section('engine', (
    Field('strategy', Choice('auto', ('auto',) + STRATEGIES, sort=True),
          "clients of a round: 'auto' | 'vmap' | 'chunked' | 'sequential'"),
    Field('clients_per_chunk', Int(0, lo=0), "'chunked': clients per chunk (0 = auto)"),
    Field('unroll', Test(1, ok=lambda v: v is True or (is_number(v, integer=True) and v >= 1),
                         message='must be an integer >= 1 or True (full unroll)', what='integer >= 1 | True'),
          'unroll of the scan over local steps'),
    Field('step_bucketing', Choice('exact', ('exact', 'pow2'), sort=True),
          "padded local steps: 'exact' | 'pow2' (fewer compiled shapes)"),
    Field('shard_clients', Test('auto', ok=_auto_or_flag, message="allowed values: 'auto', True, False",
                                what="'auto' | True | False"),
          "clients over every device of every host: 'auto' (if > 1 device) | True | False (docs/scaling.md)",
          ref=True),
    Field('stream_batches', Flag(False), "build / copy the round's batches one chunk at a time "
          '(core/streaming.py: memory O(chunk), not O(cohort))'),
    Field('rounds_per_call', Test('auto', ok=lambda v: v == 'auto' or (is_number(v, integer=True) and v >= 1),
                                  message="must be 'auto' or an integer >= 1", what="'auto' | integer >= 1"),
          "rounds per compiled call (core/rounds.py): 'auto' (blocks of up to 32, cut at every evaluation / "
          'checkpoint round) or R >= 1 (R > 1 needs the training data on the device)', {SAME_BITS}, ref=True),
    Field('device_data', Test('auto', ok=_auto_or_flag, message="allowed values: 'auto', True, False",
                              what="'auto' | True | False"),
          "training data on the device, sampled and batched inside the program: 'auto' (when possible and within "
          'device_data_max_mb) | True | False', {SAME_BITS}, ref=True),
    Field('device_data_max_mb', Num(1024, lo=0), "'auto' device_data: the largest data kept on the device (MB)",
          {SAME_BITS}),
    Field('stacked_max_mb', Test('auto', ok=lambda v: v == 'auto' or (is_number(v) and v > 0),
                                 message="must be 'auto' or a number > 0", what="'auto' | number > 0"),
          "a stacked aggregation's budget (server.aggregator other than 'mean'): the round's uploads, C x the "
          "model, must fit (MB); 'auto': half of a device's free memory (docs/aggregation.md)",
          {SAME_BITS}, ref=True),
    Field('compute_dtype', Choice('float32', COMPUTE_DTYPES, sort=True),
          "'bfloat16': mixed precision (models/base.with_compute_dtype: params, optimizer state and aggregation in "
          'float32, activations and matmuls in bfloat16); changes the result: a checkpoint must match it',
          {RESULT}),
), tags={RESUME, EXECUTION}, doc='how the rounds are executed (same computation; SAME_BITS fields: same bits)')


def resolve_strategy(strategy: str) -> str:
  """'auto' -> the measured default for the backend (benchmarks/README.md)."""
  if strategy == 'auto':
    return 'sequential' if jax.default_backend() == 'cpu' else 'vmap'
  if strategy not in STRATEGIES:
    raise ValueError(f"engine.strategy={strategy!r}; allowed: 'auto', {STRATEGIES}")
  return strategy


def _tree_zeros_like(t):
  return jax.tree_util.tree_map(jnp.zeros_like, t)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  strategy: str = 'auto'
  clients_per_chunk: int = 0      # chunked: clients per vmap chunk
  unroll: Any = 1                 # lax.scan unroll over local steps (int or True)


def chunk_size(strategy: str, num_clients: int, clients_per_chunk: int) -> int:
  strategy = resolve_strategy(strategy)
  if strategy == 'vmap':
    return num_clients
  if strategy == 'sequential':
    return 1
  return max(1, min(clients_per_chunk or num_clients, num_clients))


def padded_cohort(strategy: str, num_clients: int, clients_per_chunk: int, multiple: int = 1) -> int:
  """Clients per round rounded up so chunks (and devices) divide it; extra clients are masked out."""
  c = chunk_size(strategy, num_clients, clients_per_chunk)
  m = int(np.lcm(c, multiple))
  return int(-(-num_clients // m) * m)


def under_batch1(fn):
  """fn(*args) computed under a vmap over a leading axis of size 1 added to every argument and removed from every
  output: the form the one-client path runs each step in (`make_client_runner(step_batch1=True)`)."""
  one = lambda t: jax.tree_util.tree_map(lambda a: a[None], t)  # noqa: E731

  def batched(*args):
    return jax.tree_util.tree_map(lambda a: a[0], jax.vmap(fn)(*map(one, args)))
  return batched


def make_client_runner(algorithm: FederatedAlgorithm, *, unroll=1, augment_fn=None, phase: int = 0,
                       step_batch1: bool = False):
  """Returns run(bcast, batch [S,B,...], client_state, rng) -> (out, client_state', metrics) for one client.

  Multi-phase algorithms (num_phases > 1) get the static `phase=` keyword in client_init/step/final.
  step_batch1: compute each step under a vmap over a leading axis of size 1 (the one-client-at-a-time path:
  XLA:CPU runs the step's ops with ~10% less CPU time that way than without the axis, measured in
  benchmarks/README.md), while the runner itself stays unbatched so its padded-step `cond` really skips.
  """
  kw = {'phase': phase} if algorithm.num_phases > 1 else {}

  def client_step(bcast, local, batch, rng):
    return algorithm.client_step(bcast, local, batch, rng, **kw)

  if step_batch1:
    unbatched_step = client_step

    def client_step(bcast, local, batch, rng):
      return under_batch1(lambda l, b, r: unbatched_step(bcast, l, b, r))(local, batch, rng)

  def run(bcast, batches, client_state, rng):
    local = algorithm.client_init(bcast, client_state, rng, **kw)
    num_steps = batches['mask'].shape[0]

    def body(local, xs):
      batch, step = xs

      def do_step(local):
        step_rng = jax.random.fold_in(rng, step)
        b = batch
        if augment_fn is not None:   # data/transforms/transform.py: (rng, batch) -> batch
          b = augment_fn(jax.random.fold_in(step_rng, 1), b)
        new_local, m = client_step(bcast, local, b, step_rng)
        return new_local, (m['loss_sum'], m['count'])

      def skip(local):
        zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(do_step, local)[1])
        return local, zeros

      # A step whose batch is all padding leaves `local` unchanged. One client at a time (the sequential
      # strategy, CPU default) `cond` does not compute it at all; under vmap JAX lowers the cond to a
      # select of both branches (the padded step is computed and discarded, as a where would).
      return jax.lax.cond(jnp.sum(batch['mask']) > 0, do_step, skip, local)

    local, (loss_sums, counts) = jax.lax.scan(body, local, (batches, jnp.arange(num_steps)), unroll=unroll)
    out, new_state = algorithm.client_final(bcast, local, client_state, **kw)
    finite = jnp.all(jnp.isfinite(loss_sums))
    for leaf in jax.tree_util.tree_leaves(out):
      finite = finite & jnp.all(jnp.isfinite(leaf))
    metrics = {'loss_sum': jnp.sum(loss_sums), 'count': jnp.sum(counts), 'finite': finite}
    return out, new_state, metrics
  return run


def run_clients(algorithm, bcast, batches, client_states, rngs, weights, valid, *, chunk: int, unroll=1,
                augment_fn=None, phase: int = 0):
  """Runs a block of clients; returns (partial sums, new client states, per-client metrics).

  Shapes: batches leaves [C, S, B, ...]; client_states leaves [C, ...] (or None); rngs [C] keys;
  weights [C] (N_k, 0 for padding clients); valid [C] bool. C must be a multiple of `chunk`.
  The partial sums are what a cross-device reduction (psum) adds up (core/sharding.py).
  """
  runner = make_client_runner(algorithm, unroll=unroll, augment_fn=augment_fn, phase=phase,
                              step_batch1=chunk == 1)
  if chunk == 1:   # one client at a time: no vmap, so the runner's cond really skips padded steps
    squeeze = lambda t: jax.tree_util.tree_map(lambda a: a[0], t)
    expand = lambda t: jax.tree_util.tree_map(lambda a: a[None], t)
    vrun = lambda bcast, b, s, r: expand(runner(bcast, squeeze(b), squeeze(s), squeeze(r)))
  else:
    vrun = jax.vmap(runner, in_axes=(None, 0, 0, 0))
  c = weights.shape[0]
  n_chunks = c // chunk
  split = lambda t: jax.tree_util.tree_map(lambda a: a.reshape((n_chunks, chunk) + a.shape[1:]), t)
  xs = (split(batches), split(client_states), split(rngs), split(weights), split(valid))

  # Output structure (for zero-initialized accumulators) without running anything.
  one = jax.tree_util.tree_map(lambda a: a[0, :1], xs)
  out_shape = jax.eval_shape(lambda b, s, r: vrun(bcast, b, s, r), one[0], one[1], one[2])[0]
  zeros_of = lambda t: jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape[1:], s.dtype), t)
  acc0 = {'weighted': zeros_of(out_shape['weighted']), 'uniform': zeros_of(out_shape['uniform']),
          'total_weight': jnp.zeros((), jnp.float32), 'num_clients': jnp.zeros((), jnp.float32)}

  def body(acc, chunk_xs):
    b, s, r, w, v = chunk_xs
    out, new_s, m = vrun(bcast, b, s, r)
    vf = v.astype(jnp.float32)
    acc = {
        'weighted': jax.tree_util.tree_map(lambda a, x: a + jnp.tensordot(w.astype(x.dtype), x, axes=1),
                                           acc['weighted'], out['weighted']),
        'uniform': jax.tree_util.tree_map(lambda a, x: a + jnp.tensordot(vf.astype(x.dtype), x, axes=1),
                                          acc['uniform'], out['uniform']),
        'total_weight': acc['total_weight'] + jnp.sum(w),
        'num_clients': acc['num_clients'] + jnp.sum(vf),
    }
    m = {**m, 'finite': m['finite'] | ~v}
    return acc, (new_s, m)

  merge = lambda t: jax.tree_util.tree_map(lambda a: a.reshape((c,) + a.shape[2:]), t)
  if algorithm.aggregate == 'stacked':   # every upload kept [C, ...] in the block's client order
    def stacked_body(acc, chunk_xs):
      b, s, r, w, v = chunk_xs
      out, new_s, m = vrun(bcast, b, s, r)
      acc = {'total_weight': acc['total_weight'] + jnp.sum(w),
             'num_clients': acc['num_clients'] + jnp.sum(v.astype(jnp.float32))}
      return acc, (new_s, {**m, 'finite': m['finite'] | ~v}, out)

    sums0 = {k: acc0[k] for k in ('total_weight', 'num_clients')}
    sums, (new_states, metrics, outs) = jax.lax.scan(stacked_body, sums0, xs)
    acc = {'uploads': merge(outs), 'weights': weights, 'valid': valid, **sums}
    return acc, merge(new_states), merge(metrics)
  if algorithm.aggregate != 'mean':
    raise ValueError(f'aggregate={algorithm.aggregate!r}; allowed: {AGGREGATES}')

  acc, (new_states, metrics) = jax.lax.scan(body, acc0, xs)
  return acc, merge(new_states), merge(metrics)


STACKED_KEYS = ('uploads', 'weights', 'valid')   # what a stacked aggregate keeps per client ([C, ...])


def split_stacked(acc):
  """(the sums a cross-device / cross-chunk reduction adds, the per-client rows it concatenates): the rows are
  empty for the streaming mean."""
  return ({k: v for k, v in acc.items() if k not in STACKED_KEYS},
          {k: v for k, v in acc.items() if k in STACKED_KEYS})


def reduce_across(acc, axis_name):
  """The block's aggregate over every device of a mesh axis (inside shard_map): the sums psum'd, the stacked
  rows all-gathered in device order (= the round's client order: device d holds the d-th contiguous block), so
  every device holds the whole cohort's [C, ...] uploads, the same array whatever the device count."""
  sums, rows = split_stacked(acc)
  sums = jax.lax.psum(sums, axis_name)
  rows = jax.tree_util.tree_map(lambda a: jax.lax.all_gather(a, axis_name, axis=0, tiled=True), rows)
  return {**sums, **rows}


def finalize_aggregate(acc):
  if 'uploads' in acc:       # aggregate='stacked': server_update reduces the rows itself
    return acc
  tw = jnp.maximum(acc['total_weight'], 1e-12)
  nc = jnp.maximum(acc['num_clients'], 1.0)
  return {'weighted': jax.tree_util.tree_map(lambda x: x / tw.astype(x.dtype), acc['weighted']),
          'uniform': jax.tree_util.tree_map(lambda x: x / nc.astype(x.dtype), acc['uniform']),
          'total_weight': acc['total_weight'], 'num_clients': acc['num_clients']}


def make_round_fn(algorithm: FederatedAlgorithm, *, chunk: int, unroll=1, augment_fn=None, client_block=None,
                  jit: bool = True, donate: bool = True):
  """Builds round(server_state, batches, client_states, rngs, weights, valid, round_idx).

  Returns (server_state', client_states', metrics) with metrics leaves [C] per client (of the last phase).
  `client_block(bcast, batches, states, rngs, weights, valid, phase=)` lets the sharding layer replace the
  single-device client block by a sharded one with the same signature.
  """
  block = client_block or (lambda *a, phase=0: run_clients(algorithm, *a, chunk=chunk, unroll=unroll,
                                                           augment_fn=augment_fn, phase=phase))
  if algorithm.client_weighting not in WEIGHTINGS:
    raise ValueError(f'client_weighting={algorithm.client_weighting!r}; allowed: {WEIGHTINGS}')
  if algorithm.aggregate not in AGGREGATES:
    raise ValueError(f'aggregate={algorithm.aggregate!r}; allowed: {AGGREGATES}')
  uniform = algorithm.client_weighting == 'uniform'
  capped = algorithm.client_weighting == 'capped'
  if capped and not algorithm.weight_cap > 0:
    raise ValueError(f"client_weighting='capped' needs weight_cap > 0, got {algorithm.weight_cap!r}")

  def round_fn(server_state, batches, client_states, rngs, weights, valid, round_idx):
    if uniform:   # every sampled client counts once in the 'weighted' mean; padding clients stay at 0
      weights = valid.astype(jnp.float32)
    elif capped:  # a client's weight stops growing at the cap: no client dominates (or, under DP, is unbounded)
      weights = jnp.minimum(weights, jnp.float32(algorithm.weight_cap)) * valid.astype(jnp.float32)
    metrics = None
    for phase in range(algorithm.num_phases):
      bcast = algorithm.broadcast(server_state, round_idx, phase)
      acc, client_states, metrics = block(bcast, batches, client_states, rngs, weights, valid, phase=phase)
      server_state = algorithm.server_update(server_state, finalize_aggregate(acc), round_idx, phase)
    return server_state, client_states, metrics

  if not jit:
    return round_fn
  return jax.jit(round_fn, donate_argnums=(0, 2) if donate else ())
