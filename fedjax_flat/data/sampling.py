"""Client sampling: uniform without replacement, a pure function of (seed, round).

A resumed run samples the same clients; the sequence does not depend on anything that happened earlier.

One definition serves the host and the compiled multi-round program (core/rounds.py): `sample_ids` is a
traceable JAX function (threefry bits + a stable sort), and the host's `sample_clients` runs the same
function jitted. Before PROCEDURE 'jax-v1' the host drew from numpy's PCG64, which no compiled program can
reproduce; runs made with the older procedure sample other clients (and batch orders, data/batching.py).

Cost in the population K: `sample_ids` draws one 32-bit key per client (the draw is the C smallest), O(K) per
round; the C smallest are found from the keys below a threshold instead of a sort of all K (the same clients;
0.36 s -> 0.016 s of CPU per round at K = 10^6). Config sampler='floyd' (`floyd_ids`) draws C clients in O(C^2)
work, nothing of size K: the round's cost then follows the cohort, not the population
(benchmarks/speed/README.population.md), at the price of other clients than the 'sort' procedure's. The default,
sampler='auto' (`resolve`), is 'sort' up to AUTO_FLOYD_ABOVE clients, where its O(K) draw costs under a
millisecond a round on a CPU and every run made before 'auto' keeps its clients, and 'floyd' above, so a round of
a million-client population costs what one of a thousand does.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

# Recorded in summary.json: results of runs with another procedure differ (other clients, other batches).
PROCEDURE = 'sampling+batch-order/jax-threefry-sort-v1'
FLOYD_PROCEDURE = 'sampling/jax-threefry-floyd-v1+batch-order/jax-threefry-sort-v1'     # config sampler='floyd'
SAMPLERS = ('auto', 'sort', 'floyd')
# sampler='auto' is 'floyd' above this population: 'sort' at 10^4 clients is 0.7 ms a round on a 2-core CPU,
# at 10^6 21 ms (benchmarks/speed/population_cpu.md); no run of the seeds' tables has more than 10^4 clients.
AUTO_FLOYD_ABOVE = 10_000

SAMPLE_STREAM = 0x5A3D       # fold_in tags keep the random streams of (seed, round) apart
BATCH_STREAM = 0xB47C
FLOYD_STREAM = 0xF10D
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


def sample_ids(key, round_idx, num_clients, clients_per_round: int, size=None):
  """Sorted int32 [clients_per_round] client ids for round `round_idx` (traceable; key = seed_key(seed)).

  size: a padded population (static, >= num_clients), so that num_clients may be traced (a batched program over
  population sizes, issue 39): ids >= num_clients are never drawn, and the ids equal the unpadded draw's bit for bit
  (threefry's bits of index i do not depend on the array's length; tests/core/test_rounds.py checks it).
  """
  k = jax.random.fold_in(jax.random.fold_in(key, SAMPLE_STREAM), round_idx)
  size = num_clients if size is None else size
  if _candidates(clients_per_round) * 4 > size:     # a small population: the sort is cheap
    return jnp.sort(random_permutation(k, num_clients, size)[:clients_per_round])
  return _smallest_keys(k, num_clients, size, clients_per_round)


_BLOCK = 1024


def _candidates(c: int) -> int:
  """The expected number of threshold candidates for a cohort of c: 2c + 32 (fewer than c: ~1e-12 for c = 20)."""
  return 2 * c + 32


def _smallest_keys(key, n, size: int, c: int):
  """The ids of the c smallest (key, id) pairs among the first n of `size` random keys, sorted by id: the same
  set as `random_permutation(key, n, size)[:c]` (its stable sort orders by key, ties by id), in O(size) instead
  of a sort of the whole population (a 10^6-client sort took 0.7 s per round on CPU, benchmarks/speed/
  README.population.md).

  Only keys below a threshold T (expected 2c + 32 of them) are kept and sorted. When at least c keys fall below
  T, the c smallest all do, so the set is exact; when fewer do, or more than the 2x candidate room, the full
  sort runs instead (lax.cond): the result never depends on the shortcut, only the time does.
  """
  m = _candidates(c)
  room = 2 * m
  bits = jax.random.bits(key, (size,), jnp.uint32)
  ar = jnp.arange(size, dtype=jnp.int32)
  real = ar < n
  # T ~ m / n of the key range (float32 rounding only moves T: any T gives the exact set or the fallback).
  t = jnp.minimum(jnp.float32(m) * jnp.float32(2.0 ** 32) / jnp.maximum(n, 1).astype(jnp.float32),
                  jnp.float32(4294967040.0)).astype(jnp.uint32)
  below = real & (bits < t)
  count = jnp.sum(below.astype(jnp.int32))
  if size <= 4 * room * _BLOCK:
    cand = jnp.nonzero(below, size=room, fill_value=0)[0].astype(jnp.int32)     # ascending ids
  else:   # a nonzero over the whole population scans 2x as long as drawing its keys: only over the blocks of
    # 1024 that hold a candidate, then within those blocks
    nb = -(-size // _BLOCK)
    padded = jnp.pad(below, (0, nb * _BLOCK - size)).reshape(nb, _BLOCK)
    blocks = jnp.nonzero(jnp.any(padded, axis=1), size=room, fill_value=0)[0].astype(jnp.int32)
    inner = jnp.nonzero(padded[blocks].reshape(-1), size=room, fill_value=0)[0].astype(jnp.int32)
    cand = blocks[inner // _BLOCK] * _BLOCK + inner % _BLOCK     # ascending ids (the blocks ascend)

  def fast(_):
    ckeys = jnp.where(jnp.arange(room) < count, bits[cand], jnp.uint32(0xFFFFFFFF))
    order = jnp.argsort(ckeys, stable=True)        # by key, ties by id (cand ascends)
    return jnp.sort(cand[order[:c]])

  def full(_):
    keyed = jnp.where(real, bits, jnp.uint32(0xFFFFFFFF))
    return jnp.sort(jnp.argsort(keyed, stable=True).astype(jnp.int32)[:c])
  return jax.lax.cond((count >= c) & (count <= room), fast, full, None)


def floyd_ids(key, round_idx, num_clients, clients_per_round: int):
  """Sorted int32 [clients_per_round] client ids for round `round_idx` by Floyd's algorithm (config
  sampler='floyd'; traceable): uniform without replacement like `sample_ids`, in O(C^2) work for C clients and
  nothing of size K, so a round of a million-client population costs what one of a thousand does. Other clients
  than `sample_ids` draws (its own procedure, FLOYD_PROCEDURE).

  For i = 0..C-1 with j = K - C + i: t_i uniform in [0, j]; take t_i unless already taken, else j (j was never
  a candidate before step i, so the C ids are distinct; every C-subset has probability 1 / binom(K, C)).
  """
  c = int(clients_per_round)
  k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, SAMPLE_STREAM), round_idx), FLOYD_STREAM)
  j = jnp.asarray(num_clients, jnp.int32) - c + jnp.arange(c, dtype=jnp.int32)
  t = jax.random.randint(k, (c,), 0, j + 1, dtype=jnp.int32)

  def body(i, chosen):
    return chosen.at[i].set(jnp.where(jnp.any(chosen == t[i]), j[i], t[i]))
  return jnp.sort(jax.lax.fori_loop(0, c, body, jnp.full((c,), -1, jnp.int32)))


def resolve(sampler: str, num_clients: int) -> str:
  """The concrete draw ('sort' or 'floyd') of config `sampler` for a population of `num_clients`."""
  if sampler not in SAMPLERS:
    raise ValueError(f'sampler={sampler!r}; allowed: {SAMPLERS}')
  if sampler == 'auto':
    return 'floyd' if int(num_clients) > AUTO_FLOYD_ABOVE else 'sort'
  return sampler


def draw_ids(sampler: str, key, round_idx, num_clients: int, clients_per_round: int):
  """The uniform draw of config `sampler`: 'sort' (`sample_ids`), 'floyd' (`floyd_ids`) or 'auto' (`resolve`:
  the population `num_clients` must then be a Python int)."""
  if sampler == 'auto':
    sampler = resolve(sampler, num_clients)
  if sampler == 'floyd':
    return floyd_ids(key, round_idx, num_clients, clients_per_round)
  return sample_ids(key, round_idx, num_clients, clients_per_round)


def procedure(sampler: str = 'sort', num_clients: Optional[int] = None) -> str:
  """What summary.json and checkpoints record of a run's sampling (PROCEDURE, or FLOYD_PROCEDURE); 'auto' needs
  the population."""
  if sampler == 'auto':
    if num_clients is None:
      raise ValueError("procedure('auto') needs num_clients: the draw depends on the population")
    sampler = resolve(sampler, num_clients)
  return FLOYD_PROCEDURE if sampler == 'floyd' else PROCEDURE


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _sample_jit(sampler, key, round_idx, num_clients, clients_per_round):
  return draw_ids(sampler, key, round_idx, num_clients, clients_per_round)


def sample_clients(num_clients: int, clients_per_round: int, *, seed, round_idx: int,
                   sampler: str = 'auto') -> np.ndarray:
  if not 0 < clients_per_round <= num_clients:
    raise ValueError(f'clients_per_round={clients_per_round} must be in [1, {num_clients}] (the population)')
  if sampler not in SAMPLERS:
    raise ValueError(f'sampler={sampler!r}; allowed: {SAMPLERS}')
  ids = _sample_jit(resolve(sampler, num_clients), seed_key(seed), jnp.asarray(round_idx, jnp.int32), int(num_clients),
                    int(clients_per_round))
  return np.asarray(ids).astype(np.int64)


def client_keys(key, round_idx, client_ids):
  """Per-client training keys [C] for a round (padding ids -1 read client 0's key; their outputs are masked)."""
  base = jax.random.fold_in(jax.random.fold_in(key, TRAIN_STREAM), round_idx)
  return jax.vmap(lambda k: jax.random.fold_in(base, k))(jnp.maximum(client_ids, 0))


client_keys_jit = jax.jit(client_keys)


# Stratified sampling (H-FL, algorithms/hfl.py): a fixed number of clients from every group per round.

def stratified_total(groups, per_group: int) -> int:
  """The number of clients a stratified round samples: sum over groups of min(per_group, group size)."""
  _, counts = np.unique(np.asarray(groups), return_counts=True)
  return int(np.minimum(counts, int(per_group)).sum())


def stratified_ids(key, round_idx, groups, per_group: int, total: int):
  """Sorted int32 [total] client ids for round `round_idx`: `per_group` clients drawn uniformly without
  replacement from every group (all of a smaller group), traceable (groups: int32 [K], total =
  stratified_total(groups, per_group)). Same random keys as `sample_ids` (one 32-bit key per client from the
  (seed, round) stream); within each group the clients with the smallest keys are taken (ties: lower id)."""
  groups = jnp.asarray(groups, jnp.int32)
  k = groups.shape[0]
  key = jax.random.fold_in(jax.random.fold_in(key, SAMPLE_STREAM), round_idx)
  bits = jax.random.bits(key, (k,), jnp.uint32)
  order = jnp.lexsort((jnp.arange(k), bits, groups))          # by group, then key, then id
  g_sorted = groups[order]
  first = jnp.searchsorted(g_sorted, g_sorted, side='left')    # position of the group's first member
  rank = jnp.zeros(k, jnp.int32).at[order].set(jnp.arange(k, dtype=jnp.int32) - first.astype(jnp.int32))
  chosen = rank < per_group
  return jnp.nonzero(chosen, size=total, fill_value=-1)[0].astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _stratified_jit(key, round_idx, groups, per_group, total):
  return stratified_ids(key, round_idx, groups, per_group, total)


def sample_clients_stratified(groups, per_group: int, *, seed, round_idx: int) -> np.ndarray:
  """Host version of `stratified_ids` (the same function jitted)."""
  groups = np.asarray(groups, np.int64)
  if int(per_group) < 1 or groups.ndim != 1 or not len(groups) or groups.min() < 0:
    raise ValueError(f'per_group={per_group} must be >= 1 and groups {groups.shape} non-negative ids, one per client')
  total = stratified_total(groups, per_group)
  ids = _stratified_jit(seed_key(seed), jnp.asarray(round_idx, jnp.int32), jnp.asarray(groups, jnp.int32),
                        int(per_group), total)
  return np.asarray(ids).astype(np.int64)


class RoundSampler:
  """A run's client sampling (the run plan's sampling part): round r's client ids on the host (`ids`) and their
  traceable twin for a compiled block of rounds (`device_fn`): uniform by config.sampler, or stratified by the
  clients' groups (need 'client_groups': H-FL) with `per_group` clients of every group."""

  def __init__(self, config, num_clients: int, client_groups=None):
    self.seed, self.num_clients = config.seed, int(num_clients)
    self.clients_per_round = int(config.clients_per_round)
    self.sampler = resolve(config.get('sampler', 'auto'), self.num_clients)      # 'sort' or 'floyd'
    self.procedure = procedure(self.sampler)
    self.groups = None if client_groups is None else client_groups['labels']
    self.per_group = int(client_groups['per_group']) if client_groups is not None else 0

  def ids(self, r: int) -> np.ndarray:
    if self.groups is not None:
      return sample_clients_stratified(self.groups, self.per_group, seed=self.seed, round_idx=r)
    return sample_clients(self.num_clients, self.clients_per_round, seed=self.seed, round_idx=r,
                          sampler=self.sampler)

  def device_fn(self):
    """fn(key, r) -> ids for the compiled multi-round block (None: the engine's default uniform 'sort' draw)."""
    if self.groups is None:
      if self.sampler == 'sort':
        return None
      k, c, name = self.num_clients, self.clients_per_round, self.sampler
      return lambda key, r: draw_ids(name, key, r, k, c)
    groups = jnp.asarray(self.groups, jnp.int32)
    per, total = self.per_group, self.clients_per_round
    return lambda key, r: stratified_ids(key, r, groups, per, total)
