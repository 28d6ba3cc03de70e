"""Round drivers: how a planned run's rounds execute. One way to build each program, one interface.

  HostDriver     the host samples and batches each round (prefetched one round ahead on a thread) and calls the
                 one-round program: single-device (core/engine.py), streamed chunk by chunk (core/streaming.py)
                 or sharded over the devices and hosts of a mesh (core/sharding.py)
  DeviceDriver   blocks of rounds in one program (core/rounds.py): sampling, batches from the device copy of the
                 data, client keys and the device store inside it; sharded over the mesh when there is one
  AsyncDriver    asynchronous algorithms (FedBuff, FedAsync): a server step per arrival buffer, on the clock's
                 event simulation (systems/events.py)

`step(state, store, r, n, end) -> (state, results)` runs rounds r .. r+n-1 (`block_length` says how many the
driver takes before the recorder's next boundary), updates the client-state store in place, checks divergence
(naming the round, the client ids and the likely cause: the DP noise or the upload compressor when on,
`divergence_hint`) and returns one result per round: the mean client train loss, the real
client ids and the model-sized messages sent. The chain algorithms have their own driver
(training/chain_loop.ChainDriver) with the same interface.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat import errors
from fedjax_flat.algorithms import features
from fedjax_flat.core import engine as engine_lib
from fedjax_flat.core import rounds as rounds_lib
from fedjax_flat.core import sharding as sharding_lib
from fedjax_flat.core import streaming
from fedjax_flat.data import batching

AUTO_BLOCK_TARGET_S = 2.0      # 'auto' sizes blocks to about this wall time (signals, progress lines)


class DivergenceError(errors.OperationError):
  pass


def _finite_tree(tree):
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


finite = jax.jit(_finite_tree)


STEP_HINT = 'Lower client.lr / rho, or enable client.grad_clip.'


def divergence_hint(config=None, num_params: int = 0, population: int = 0) -> str:
  """What to change after a divergence: the first enabled feature's hint (algorithms/features.py: DP's noise,
  the upload compressor; each then the likely cause, not the client's step), else the client's step (STEP_HINT).
  d = num_params, population: the dataset's clients (a target epsilon's z is calibrated over it)."""
  if config is None:
    return STEP_HINT
  hints = features.divergence_hints(config, max(int(num_params), 1), population)
  return hints[0] if hints else STEP_HINT


def check_divergence(r, client_ids, finite_clients, server_finite, plan=None):
  """Raises DivergenceError (round, clients, the likely cause: divergence_hint of the plan's config, read only
  then) unless every real client and the server state are finite."""
  bad = (client_ids >= 0) & ~np.asarray(finite_clients)
  if bad.any() or not server_finite:
    hint = STEP_HINT if plan is None else divergence_hint(plan.config, plan.num_params, plan.data.num_clients)
    raise DivergenceError(
        f'divergence (NaN/inf) at round {r + 1}: clients {client_ids[bad].tolist() or "none"} produced '
        f'non-finite loss or updates; server state finite={server_finite}. {hint}')


def round_result(plan, client_ids, m, system=None) -> dict:
  """What the recorder keeps of a round: the mean client train loss, the real clients, the messages (and the
  round's virtual-clock totals with config.system)."""
  real = client_ids >= 0
  count = float(np.sum(m['count'][real]))
  # With the clock, only online clients download and only reporting ones upload (systems/clock.COMM_BYTES), as
  # the clock's own bytes count them.
  down, up = ((system['downloaded'], system['reported']) if system is not None else (int(real.sum()),) * 2)
  out = {'train_loss': float(np.sum(m['loss_sum'][real]) / max(count, 1.0)), 'clients': client_ids[real],
         'messages': plan.systems.round_messages(down, up)}
  if system is not None:
    out['system'] = system
  return out


def round_program(plan, jit: bool = True):
  """The one-round program of the plan's client placement: streamed, sharded or single-device."""
  ec = plan.config.engine
  if plan.stream:
    ids = plan.sample_round(0)[:plan.chunk]
    spec = streaming.batch_spec_of(plan.round_batches(0, ids, plan.chunk).as_dict())
    return streaming.StreamedRoundFn(plan.algorithm, chunk=plan.chunk, cohort=plan.cohort, batch_spec=spec,
                                     unroll=ec.unroll, augment_fn=plan.train_transform)
  if plan.mesh is not None:
    return sharding_lib.ShardedRoundFn(plan.algorithm, plan.mesh, chunk=plan.chunk, unroll=ec.unroll,
                                       augment_fn=plan.train_transform)
  return engine_lib.make_round_fn(plan.algorithm, chunk=plan.chunk, unroll=ec.unroll,
                                  augment_fn=plan.train_transform, jit=jit)


class HostDriver:
  """One round per call; round r+1's batches are built on a thread while round r runs."""

  def __init__(self, plan):
    self.plan = plan
    self.round_fn = round_program(plan)
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._next = None            # (round, future of its batches)

  def begin(self, r: int):
    del r
    self._next = None

  def block_length(self, r: int, boundary: int) -> int:
    del r, boundary
    return 1

  def prepare_round(self, r: int):
    """Round r's inputs, built on the host: the whole padded cohort, this host's rows (multi-host), or a lazy
    chunk-by-chunk source (streaming)."""
    p = self.plan
    if not p.stream and not (p.placement is not None and p.placement.partial):
      return p.cohort_batches(r)          # samples once itself (a draw is O(population): not twice per round)
    ids = p.sample_round(r)
    full_ids = np.full((p.cohort,), -1, np.int64)
    full_ids[:len(ids)] = ids
    if p.placement is not None and p.placement.partial:    # this host's rows; ids and weights of the whole cohort
      mine = full_ids[p.placement.local_rows]
      rb = p.round_batches(r, mine[mine >= 0], len(mine))
      return dataclasses.replace(rb, num_examples=p.num_examples(full_ids), client_ids=full_ids.astype(np.int32))
    if p.stream:
      return streaming.LazyRoundBatches(r, full_ids.astype(np.int32), p.num_examples(full_ids), p.chunk,
                                        lambda r_, ids_, pad: p.round_batches(r_, ids_, pad).as_dict())

  def place_round_inputs(self, inputs):
    p = self.plan
    if p.placement is None:
      return inputs
    local = p.placement.partial and inputs[0]['mask'].shape[0] != p.cohort
    return p.placement.place(inputs, batches_are_local=local)

  def fetch_outputs(self, tree):
    """Round outputs (per-client metrics, new client states) as host arrays, whole on every host."""
    if self.plan.placement is None:
      return jax.device_get(tree)
    return self.plan.placement.to_host(tree)

  def run_round(self, state, store, r: int, rb):
    """(new server state, round result) of round r on the prepared inputs `rb`."""
    states = store.gather(rb.client_ids) if store is not None else None
    weights, valid = batching.round_inputs_valid(rb)
    inputs = (rb.as_dict(), states, self.plan.client_keys(r, rb.client_ids), weights, valid)
    state, new_states, m = self.round_fn(state, *self.place_round_inputs(inputs), jnp.asarray(r, jnp.int32))
    m = self.fetch_outputs(m)
    check_divergence(r, rb.client_ids, m['finite'], bool(finite(state)), self.plan)
    if store is not None:        # a client that does not report (virtual clock) keeps its state
      written = rb.client_ids if rb.reports is None else np.where(valid, rb.client_ids, -1)
      store.scatter(written, new_states if self.plan.placement is None else self.fetch_outputs(new_states))
    return state, round_result(self.plan, rb.client_ids, m, rb.system)

  def step(self, state, store, r: int, n: int, end: int):
    del n
    if self._next is not None and self._next[0] == r:
      rb = self._next[1].result()
    else:
      rb = self.prepare_round(r)
    self._next = (r + 1, self._pool.submit(self.prepare_round, r + 1)) if r + 1 < end else None
    state, res = self.run_round(state, store, r, rb)
    return state, [res]


class DeviceDriver:
  """Blocks of rounds in one compiled program on the device copy of the data (core/rounds.py)."""

  def __init__(self, plan):
    self.plan = plan
    ec = plan.config.engine
    self.round_s: Optional[float] = None      # measured wall per round ('auto' block sizing)
    self.dev_data = batching.device_data(plan.data)
    if plan.placement is not None:     # one copy of the data per device; each device gathers its clients' rows
      self.dev_data = plan.placement.replicate(jax.device_get(self.dev_data))
      round_fn = engine_lib.make_round_fn(
          plan.algorithm, chunk=plan.chunk, unroll=ec.unroll, augment_fn=plan.train_transform, jit=False,
          client_block=sharding_lib.make_sharded_block(plan.algorithm, plan.mesh, chunk=plan.chunk,
                                                       unroll=ec.unroll, augment_fn=plan.train_transform))
    else:
      round_fn = round_program(plan, jit=False)
    self.block_fn = rounds_lib.make_block_fn(
        round_fn, plan=plan.batch_plan, num_clients=plan.data.num_clients,
        clients_per_round=plan.config.clients_per_round, cohort=plan.cohort,
        rounds_per_call=plan.rounds_per_call, has_store=plan.algorithm.client_state_init is not None,
        mesh=plan.mesh, sample_fn=plan.device_sampler())
    self._first = 0
    self._system = None      # the last block's virtual-clock totals per round (config.system)

  def begin(self, r: int):
    self._first = r                  # the first block of a train() call includes compilation: not timed

  def block_length(self, r: int, boundary: int) -> int:
    """Rounds of the block starting at r: up to the recorder's boundary, rounds_per_call, and ('auto') about
    AUTO_BLOCK_TARGET_S of wall time."""
    n = min(self.plan.rounds_per_call, boundary - r)
    if self.plan.adaptive and self.round_s:
      n = min(n, max(1, int(AUTO_BLOCK_TARGET_S / self.round_s)))
    return max(n, 1)

  def run_block(self, state, store, r: int, n: int):
    """Rounds r .. r+n-1 in one call of the block program; (new server state, per-round results)."""
    arrays = store.arrays if store is not None else None
    template = store.template if store is not None else None
    placement = self.plan.placement
    if placement is not None:   # replicated on the mesh (a no-op after the first block or a restore)
      arrays, template = placement.replicate_device(arrays), placement.replicate_device(template)
      state = placement.replicate_device(state)
    limits, self._system = self.block_limits(r, n)
    state, arrays, m = self.block_fn(state, arrays, template, self.dev_data, self.plan.key,
                                     jnp.asarray(r, jnp.int32), jnp.asarray(n, jnp.int32), limits)
    return state, self.block_results(store, r, n, jax.device_get(m), arrays)

  def block_limits(self, r: int, n: int):
    """The virtual clock's (fit steps, reports) of rounds r .. r+n-1 as [rounds_per_call, cohort] inputs of the
    block (None without a clock), and each round's totals. The host's sampling is the device's (one definition,
    tests/core/test_rounds.py), so the clock sees the clients the block trains."""
    p = self.plan
    if p.clock is None:
      return None, None
    fit = np.zeros((p.rounds_per_call, p.cohort), np.int32)
    rep = np.zeros((p.rounds_per_call, p.cohort), bool)
    totals = []
    for i in range(n):
      fit[i], rep[i], t = p.systems.round_limits(r + i, p.sample_round(r + i))
      totals.append(t)
    return {'fit': jnp.asarray(fit), 'reports': jnp.asarray(rep)}, totals

  def block_results(self, store, r: int, n: int, m: dict, arrays=None, system=None) -> list:
    """The host side of a block: the device store's new arrays, divergence checks, per-round results. system:
    the block's per-round clock totals (default: those of this driver's last `run_block`; a batched program
    computes each lane's itself, training/batched.py)."""
    if store is not None:
      store.arrays = arrays
      ran_ids = m['ids'][m['ran']]
      store.mark_seen(ran_ids[ran_ids >= 0])
    results = []
    for i in range(n):
      if not m['ran'][i]:          # skipped after a divergent round (raised below, at that round)
        break
      check_divergence(r + i, m['ids'][i], m['finite'][i], bool(m['server_finite'][i]), self.plan)
      totals = system if system is not None else getattr(self, '_system', None)
      system_i = totals[i] if totals else None
      results.append(round_result(self.plan, m['ids'][i], {k: v[i] for k, v in m.items()}, system_i))
    return results

  def step(self, state, store, r: int, n: int, end: int):
    del end
    t0 = time.time()
    state, results = self.run_block(state, store, r, n)
    if r > self._first:
      self.round_s = (time.time() - t0) / max(n, 1)
    return state, results


class AsyncDriver:
  """Asynchronous algorithms (FedBuff, FedAsync; core/contract.AsyncSpec): one server step per call on the event
  simulation of systems/events.py (plan.systems.async_steps). One compiled program trains the step's K arrivals,
  each from the model version it started from (the ring in the server state), one after another, and applies the server
  step with their staleness; arrivals staler than max_staleness weigh 0."""

  def __init__(self, plan):
    self.plan = plan
    alg, spec = plan.algorithm, plan.algorithm.asynchronous
    self.steps = plan.systems.async_steps()
    runner = engine_lib.make_client_runner(alg, unroll=plan.config.engine.unroll, augment_fn=plan.train_transform)

    def step_fn(state, batches, versions, valid, rngs, t):
      hp = alg.broadcast(state, t)['hparams']
      starts = spec.models_at(state, versions)

      def one(xs):
        params, b, rng = xs
        out, _, m = runner({'params': params, 'hparams': hp}, b, None, rng)
        return out['weighted']['delta'], m

      deltas, m = jax.lax.map(one, (starts, batches, rngs))
      agg = {'delta': deltas, 'staleness': t - versions, 'versions': versions, 'valid': valid}
      return alg.server_update(state, agg, t), m

    self.step_fn = jax.jit(step_fn)

  def begin(self, r: int):
    del r

  def block_length(self, r: int, boundary: int) -> int:
    del r, boundary
    return 1

  def step(self, state, store, r: int, n: int, end: int):
    del store, n, end
    p, st = self.plan, self.steps[r]
    rb = p.round_batches(r, st.ids, len(st.ids))
    valid = (r - st.versions) <= p.algorithm.asynchronous.max_staleness
    state, m = self.step_fn(state, rb.as_dict(), jnp.asarray(st.versions, jnp.int32), jnp.asarray(valid),
                            p.client_keys(r, rb.client_ids), jnp.asarray(r, jnp.int32))
    m = jax.device_get(m)
    check_divergence(r, rb.client_ids, m['finite'], bool(finite(state)), self.plan)
    system = None
    if p.clock is not None:        # the clock: time between server steps, every dispatch down, valid arrivals up
      prev = self.steps[r - 1].time_s if r else 0.0
      system = {'duration_s': st.time_s - prev, 'bytes_down': len(st.ids) * p.clock.bytes_down,
                'bytes_up': float(np.sum(valid)) * p.clock.bytes_up, 'downloaded': len(st.ids),
                'reported': int(np.sum(valid))}
    return state, [round_result(p, rb.client_ids, m, system)]


def make_driver(plan):
  if plan.algorithm.asynchronous is not None:
    return AsyncDriver(plan)
  return DeviceDriver(plan) if plan.device_rounds else HostDriver(plan)
