"""Ordered prefetching of per-client work on a thread pool (host decoding overlaps training)."""
from __future__ import annotations

import concurrent.futures as cf
from collections import OrderedDict
from typing import Callable, Iterator, Sequence, Tuple, TypeVar

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
