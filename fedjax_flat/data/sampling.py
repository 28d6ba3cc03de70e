"""Client sampling: uniform without replacement, a pure function of (seed, round).

A resumed run samples the same clients; the sequence does not depend on anything that happened earlier.

One definition serves the host and the compiled multi-round program (core/rounds.py): `sample_ids` is a
traceable JAX function (threefry bits + a stable sort), and the host's `sample_clients` runs the same
function jitted. Before PROCEDURE 'jax-v1' the host drew from numpy's PCG64, which no compiled program can
reproduce; runs made with the older procedure sample other clients (and batch orders, data/batching.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# Recorded in summary.json: results of runs with another procedure differ (other clients, other batches).
PROCEDURE = 'sampling+batch-order/jax-threefry-sort-v1'

SAMPLE_STREAM = 0x5A3D       # fold_in tags keep the random streams of (seed, round) apart
BATCH_STREAM = 0xB47C
TRAIN_STREAM = 2             # the clients' training keys (dropout, augmentation, SAM noise), as before


def seed_key(seed):
  """The run's base key from an int seed (or a key, passed through)."""
  if isinstance(seed, jax.Array) and jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
    return seed
  return jax.random.key(int(seed))


def random_permutation(key, n, size: int):
  """A uniform permutation of range(n) in the first n entries of an int32 [size] array (n traced, <= size).

  Entries >= n follow in order. Stable sort of 32-bit random keys with the padding keyed at the maximum: the
  padding sorts after every real entry (ties go to the lower index), so n can vary without recompiling.
  """
  bits = jax.random.bits(key, (size,), jnp.uint32)
  ar = jnp.arange(size, dtype=jnp.int32)
  bits = jnp.where(ar < n, bits, jnp.uint32(0xFFFFFFFF))
  return jnp.argsort(bits, stable=True).astype(jnp.int32)


def sample_ids(key, round_idx, num_clients: int, clients_per_round: int):
  """Sorted int32 [clients_per_round] client ids for round `round_idx` (traceable; key = seed_key(seed))."""
  k = jax.random.fold_in(jax.random.fold_in(key, SAMPLE_STREAM), round_idx)
  return jnp.sort(random_permutation(k, num_clients, num_clients)[:clients_per_round])


@functools.partial(jax.jit, static_argnums=(2, 3))
def _sample_jit(key, round_idx, num_clients, clients_per_round):
  return sample_ids(key, round_idx, num_clients, clients_per_round)


def sample_clients(num_clients: int, clients_per_round: int, *, seed, round_idx: int) -> np.ndarray:
  if not 0 < clients_per_round <= num_clients:
    raise ValueError(f'clients_per_round={clients_per_round} must be in [1, {num_clients}] (the population)')
  ids = _sample_jit(seed_key(seed), jnp.asarray(round_idx, jnp.int32), int(num_clients), int(clients_per_round))
  return np.asarray(ids).astype(np.int64)


def client_keys(key, round_idx, client_ids):
  """Per-client training keys [C] for a round (padding ids -1 read client 0's key; their outputs are masked)."""
  base = jax.random.fold_in(jax.random.fold_in(key, TRAIN_STREAM), round_idx)
  return jax.vmap(lambda k: jax.random.fold_in(base, k))(jnp.maximum(client_ids, 0))


client_keys_jit = jax.jit(client_keys)
