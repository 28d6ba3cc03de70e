"""Streamed client batches: the round's data stays on the host and enters the program one chunk at a time.

With `engine.strategy='chunked'` the device computation is O(clients_per_chunk), but the round's batch array
[C, S, B, ...] is still built on the host and copied to the device whole, so memory grows with the cohort
(benchmarks/speed/README.scaling.md). `engine.stream_batches=True` removes that term: the round program scans over
the chunks and, inside the scan, a host callback builds only the current chunk's batches (from the dataset,
keyed by (seed, round, client id) exactly as `make_round_batches`), so host and device hold O(chunk) data.

The chunk's clients then run through `engine.run_clients` as one block and its partial sums are added to the
round's accumulator, the same additions in the same order as the chunked strategy: results are
bit-identical to `strategy='chunked'` with the same chunk (tests/core/test_sharding.py). Single device only (with
several devices, each device already holds only its own clients' rows).
"""
from __future__ import annotations

import threading
from typing import Callable, Dict

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.core import engine as engine_lib


class LazyRoundBatches:
  """A round's cohort whose batches are built on demand, `chunk` clients at a time.

  Has the RoundBatches fields the run loop reads (client_ids, num_examples); `as_dict()` returns the object
  itself, which the streamed round function receives in place of the batch arrays.
  """

  def __init__(self, round_idx: int, client_ids: np.ndarray, num_examples: np.ndarray, chunk: int,
               build: Callable[[int, np.ndarray, int], Dict[str, np.ndarray]]):
    self.round_idx = int(round_idx)
    self.client_ids = client_ids
    self.num_examples = num_examples
    self.chunk = int(chunk)
    self._build = build
    self.reports = None       # RoundBatches' virtual-clock fields: a streamed round has no clock (refused in
    self.system = None        # training/plan.py), every real client reports

  def as_dict(self):
    return self

  def chunk_batches(self, i: int) -> Dict[str, np.ndarray]:
    ids = self.client_ids[i * self.chunk:(i + 1) * self.chunk]
    return self._build(self.round_idx, ids[ids >= 0], self.chunk)


class StreamedRoundFn:
  """round(server_state, LazyRoundBatches, states, rngs, weights, valid, round_idx), jitted once."""

  def __init__(self, algorithm, *, chunk: int, cohort: int, batch_spec: Dict[str, jax.ShapeDtypeStruct],
               unroll=1, augment_fn=None, donate: bool = True):
    if cohort % chunk:
      raise ValueError(f'cohort {cohort} is not a multiple of the chunk {chunk}')
    self.chunk, self.num_chunks = int(chunk), cohort // chunk
    self._sources: Dict[int, LazyRoundBatches] = {}
    self._lock = threading.Lock()

    def fetch(round_idx, chunk_idx):
      with self._lock:
        src = self._sources[int(round_idx)]
      return src.chunk_batches(int(chunk_idx))

    def block(bcast, chunk_ids, states, rngs, weights, valid, phase=0):
      split = lambda t: jax.tree_util.tree_map(
          lambda a: a.reshape((self.num_chunks, self.chunk) + a.shape[1:]), t)
      round_idx = chunk_ids['round']
      run = lambda b, s, r, w, v: engine_lib.run_clients(algorithm, bcast, b, s, r, w, v, chunk=self.chunk,
                                                         unroll=unroll, augment_fn=augment_fn, phase=phase)
      one = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((self.chunk,) + a.shape[1:], a.dtype),
                                   (states, rngs, weights, valid))
      acc_shape = engine_lib.split_stacked(jax.eval_shape(lambda b, *xs: run(b, *xs)[0], batch_spec, *one))[0]
      acc0 = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), acc_shape)

      def body(acc, xs):
        i, s, r, w, v = xs
        b = jax.pure_callback(fetch, batch_spec, round_idx, i)
        part, new_s, m = run(b, s, r, w, v)
        sums, rows = engine_lib.split_stacked(part)    # rows: the chunk's stacked uploads (aggregate='stacked')
        return jax.tree_util.tree_map(jnp.add, acc, sums), (new_s, m, rows)

      acc, (new_states, metrics, rows) = jax.lax.scan(
          body, acc0, (chunk_ids['chunks'], split(states), split(rngs), split(weights), split(valid)))
      merge = lambda t: jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), t)
      return {**acc, **merge(rows)}, merge(new_states), merge(metrics)

    fn = engine_lib.make_round_fn(algorithm, chunk=chunk, unroll=unroll, augment_fn=augment_fn,
                                  client_block=block, jit=False)
    self._jitted = jax.jit(fn, donate_argnums=(0, 2) if donate else ())

  def __call__(self, server_state, batches: LazyRoundBatches, states, rngs, weights, valid, round_idx):
    r = batches.round_idx
    with self._lock:
      self._sources = {k: v for k, v in self._sources.items() if k >= r - 1}   # keep O(1) rounds
      self._sources[r] = batches
    chunk_ids = {'round': np.int32(r), 'chunks': np.arange(self.num_chunks, dtype=np.int32)}
    return self._jitted(server_state, chunk_ids, states, rngs, weights, valid, round_idx)

  def _cache_size(self):
    return self._jitted._cache_size()


def batch_spec_of(batches: Dict[str, np.ndarray]) -> Dict[str, jax.ShapeDtypeStruct]:
  return {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in batches.items()}
