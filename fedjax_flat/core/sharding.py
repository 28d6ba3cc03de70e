"""Clients of a round sharded over every device of every host; aggregation is a cross-device psum.

One 1-D mesh axis, 'clients', spans `jax.devices()` (all devices of all processes after
`jax.distributed.initialize`). A round's padded cohort [C] is split into D contiguous blocks of L = C/D
clients, one per device. Inside one jitted program (shard_map over the mesh):

  every device:  acc_d, states_d, metrics_d = engine.run_clients(its L clients, chunked as configured)
  acc = psum_d(acc_d)          partial sums of N_k * out_k, sum out_k, N, |C|   (all-reduce over devices/hosts)
  server_update(finalize_aggregate(acc))                                        (replicated on every device)

(algorithm.aggregate='stacked': the uploads [L, ...] all-gathered into [C, ...] in client order instead,
engine.reduce_across: every device holds the cohort's uploads, the same array whatever D.)

so the server state stays replicated, client data, client states and per-client metrics stay sharded.
Results equal the single-device program up to floating-point reduction order (the per-device partial
sums are added in a different order).

Multi-host: host h builds only the rows (clients) its own devices hold (`ClientPlacement.local_rows`);
the sampled ids, weights and rngs are cheap and computed identically on every host, so the global arrays
are assembled with `jax.make_array_from_callback` from each host's local rows. Outputs that the host
needs whole (per-client metrics, new client states) are gathered with `process_allgather` when they are
not fully addressable.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedjax_flat.core import engine as engine_lib

AXIS = 'clients'


def resolve_shard_clients(value) -> bool:
  """config.engine.shard_clients: 'auto' = on when there is more than one device (of any host)."""
  if value == 'auto':
    return jax.device_count() > 1
  if isinstance(value, bool):
    return value
  raise ValueError(f"engine.shard_clients={value!r}; allowed: 'auto', True, False")


def client_mesh(devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A 1-D ('clients',) mesh over every device of every process (jax.devices() order)."""
  devices = list(jax.devices() if devices is None else devices)
  return Mesh(np.array(devices, dtype=object), (AXIS,))


def plan_cohort(strategy: str, num_clients: int, clients_per_chunk: int, num_devices: int):
  """(padded cohort C, per-device chunk): C = D * L with L a multiple of the per-device chunk.

  The per-device block of L = ceil(n / D) clients is what each device runs with `run_clients`; 'vmap'
  vmaps over the whole block, 'chunked' over `clients_per_chunk` at a time, 'sequential' one at a time.
  """
  per_device = -(-num_clients // num_devices)
  chunk = engine_lib.chunk_size(strategy, per_device, clients_per_chunk)
  local = -(-per_device // chunk) * chunk
  return local * num_devices, chunk


def _as_keys(rngs):
  if jnp.issubdtype(rngs.dtype, jax.dtypes.prng_key):
    return rngs
  return jax.random.wrap_key_data(rngs)


def make_sharded_block(algorithm, mesh: Mesh, *, chunk: int, unroll=1, augment_fn=None):
  """A drop-in `client_block` for engine.make_round_fn: shard_map over the clients axis + psum."""
  rep, cl = P(), P(AXIS)

  def block(bcast, batches, states, rngs, weights, valid, phase=0):
    def local(bcast, batches, states, rngs, weights, valid):
      acc, new_states, metrics = engine_lib.run_clients(
          algorithm, bcast, batches, states, _as_keys(rngs), weights, valid, chunk=chunk, unroll=unroll,
          augment_fn=augment_fn, phase=phase)
      return engine_lib.reduce_across(acc, AXIS), new_states, metrics

    # check_vma=False: the engine's zero-initialized scan accumulators are device-invariant while the
    # client outputs vary; the psum above is the only cross-device operation.
    return jax.shard_map(local, mesh=mesh, in_specs=(rep, cl, cl, cl, cl, cl), out_specs=(rep, cl, cl),
                         check_vma=False)(bcast, batches, states, rngs, weights, valid)
  return block


class ShardedRoundFn:
  """round(server_state, batches, states, rngs, weights, valid, round_idx) jitted over the client mesh.

  Explicit in/out shardings keep one compiled program for every round (replicated server state,
  client-sharded everything else); the server state and client states are donated as in the engine.
  """

  def __init__(self, algorithm, mesh: Mesh, *, chunk: int, unroll=1, augment_fn=None, donate: bool = True):
    block = make_sharded_block(algorithm, mesh, chunk=chunk, unroll=unroll, augment_fn=augment_fn)
    fn = engine_lib.make_round_fn(algorithm, chunk=chunk, unroll=unroll, augment_fn=augment_fn,
                                  client_block=block, jit=False)
    rep, cl = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))
    self._jitted = jax.jit(fn, in_shardings=(rep, cl, cl, cl, cl, cl, rep), out_shardings=(rep, cl, cl),
                           donate_argnums=(0, 2) if donate else ())

  def __call__(self, server_state, batches, states, rngs, weights, valid, round_idx):
    # A host scalar (not a single-device array): valid input on every process of a multi-host program.
    return self._jitted(server_state, batches, states, rngs, weights, valid, np.int32(round_idx))

  def _cache_size(self):
    return self._jitted._cache_size()

  def lower(self, *args):
    return self._jitted.lower(*args)


class ClientPlacement:
  """Moves host round inputs onto the client mesh, and sharded outputs back to every host."""

  def __init__(self, mesh: Mesh, cohort: int):
    self.mesh = mesh
    self.cohort = int(cohort)
    self.num_devices = mesh.devices.size
    if self.cohort % self.num_devices:
      raise ValueError(f'cohort {cohort} is not a multiple of the {self.num_devices} devices')
    self.replicated = NamedSharding(mesh, P())
    self.sharded = NamedSharding(mesh, P(AXIS))
    index_map = self.sharded.addressable_devices_indices_map((self.cohort,))
    rows = set()
    for idx in index_map.values():
      rows.update(range(*idx[0].indices(self.cohort)))
    self.local_rows = np.array(sorted(rows), np.int64)   # the clients this process's devices run
    self._pos = {int(r): i for i, r in enumerate(self.local_rows)}

  @property
  def multi_process(self) -> bool:
    return jax.process_count() > 1

  @property
  def partial(self) -> bool:
    """True when this process holds only some of the cohort's rows (multi-host)."""
    return len(self.local_rows) < self.cohort

  def _callback(self, arr, local: bool):
    def cb(index):
      sl = index[0]
      if local:
        start, stop, _ = sl.indices(self.cohort)
        p = self._pos[start]
        sl = slice(p, p + (stop - start))
      return arr[(sl,) + tuple(index[1:])]
    return cb

  def shard_rows(self, tree, local: bool = False):
    """Host arrays [C, ...] (or, with local=True, [len(local_rows), ...]) -> global client-sharded arrays."""
    def put(a):
      if a is None:
        return None
      if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
        a = jax.random.key_data(a)   # sharded as raw uint32 data; the block re-wraps it
      a = np.asarray(a)
      shape = (self.cohort,) + a.shape[1:]
      return jax.make_array_from_callback(shape, self.sharded, self._callback(a, local))
    return jax.tree_util.tree_map(put, tree)

  def replicate(self, tree):
    """A pytree that is identical on every host -> arrays replicated on every device of the mesh."""
    def put(a):
      if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
        return jax.device_put(a, self.replicated)
      a = np.asarray(a)
      return jax.make_array_from_callback(a.shape, self.replicated, lambda idx: a[idx])
    return jax.tree_util.tree_map(put, tree)

  def replicate_device(self, tree):
    """Device arrays of one process -> replicated on the mesh (no copy for those already replicated)."""
    return jax.tree_util.tree_map(lambda a: jax.device_put(a, self.replicated), tree)

  def place(self, inputs, batches_are_local: bool):
    batches, states, rngs, weights, valid = inputs
    return (self.shard_rows(batches, local=batches_are_local), self.shard_rows(states), self.shard_rows(rngs),
            self.shard_rows(np.asarray(weights, np.float32)), self.shard_rows(np.asarray(valid, bool)))

  @staticmethod
  def to_host(tree):
    """Numpy copies of (possibly not fully addressable) arrays, identical on every host."""
    leaves = jax.tree_util.tree_leaves(tree)
    if all(not isinstance(a, jax.Array) or a.is_fully_addressable or a.is_fully_replicated for a in leaves):
      return jax.device_get(tree)
    from jax.experimental import multihost_utils
    return multihost_utils.process_allgather(tree, tiled=True)

  @staticmethod
  def local_view(tree):
    """Replicated global arrays -> this process's single-device copies (for per-host evaluation)."""
    def one(a):
      if isinstance(a, jax.Array) and len(a.sharding.device_set) > 1 and a.is_fully_replicated:
        return a.addressable_data(0)
      return a
    return jax.tree_util.tree_map(one, tree)


def any_process(flag: bool) -> bool:
  """True on every host when any host's flag is True (e.g. a SIGTERM seen by one host of a pod)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils
  return bool(np.any(multihost_utils.process_allgather(np.int32(bool(flag)))))


def describe(mesh: Mesh) -> str:
  return (f'{mesh.devices.size} devices ({jax.default_backend()}) over {jax.process_count()} process(es); '
          f'this is process {jax.process_index()} with {jax.local_device_count()} local device(s)')

