"""Ordered prefetching of per-client work on a thread pool (host decoding overlaps training)."""
from __future__ import annotations

import concurrent.futures as cf
from collections import OrderedDict
from typing import Callable, Iterator, Optional, Sequence, Tuple, TypeVar

T = TypeVar('T')


def prefetch_map(pool: cf.Executor, fn: Callable[[int], T], ids: Sequence[int],
                 max_in_flight: int) -> Iterator[Tuple[int, T]]:
  """Yields (k, fn(k)) for k in ids, in order, keeping up to max_in_flight calls running ahead."""
  pending: 'OrderedDict[int, cf.Future]' = OrderedDict()
  ids = [int(k) for k in ids]
  nxt = 0
  while nxt < len(ids) or pending:
    while nxt < len(ids) and len(pending) < max(1, max_in_flight):
      pending[nxt] = pool.submit(fn, ids[nxt])
      nxt += 1
    j, fut = pending.popitem(last=False)
    yield ids[j], fut.result()


class DecodePool:
  """Mixin of out-of-memory sources: a lazily started decoding pool and `prefetch_clients`.

  The class sets `num_workers`, `_lock` (a threading.Lock) and `_pool = None`, and has `client_examples(k)`.
  """
  _pool_prefix = 'decode'

  def prefetch_clients(self, ids: Sequence[int], max_in_flight: Optional[int] = None) -> Iterator[Tuple[int, T]]:
    """Yields (k, client_examples(k)) in order while later clients decode in the background pool."""
    return prefetch_map(self._get_pool(), self.client_examples, ids, max_in_flight or 2 * self.num_workers)

  def close(self):
    if self._pool is not None:
      self._pool.shutdown(wait=True)
      self._pool = None

  def __del__(self):  # pragma: no cover
    try:
      self.close()
    except Exception:
      pass

  def _get_pool(self) -> cf.ThreadPoolExecutor:
    with self._lock:
      if self._pool is None:
        self._pool = cf.ThreadPoolExecutor(self.num_workers, thread_name_prefix=self._pool_prefix)
      return self._pool
