"""The event simulation of asynchronous aggregation (FedBuff, FedAsync) on the virtual clock: pure Python, seeded.

`concurrency` clients train at once. At time 0 that many clients (drawn without replacement) start from model
version 0. A client that starts at time s finishes at s + duration(client) (down + compute + up on the clock).
The server takes arrivals in finish order (ties: dispatch order); every `buffer` arrivals it applies one server
step t, which makes version t + 1. Each arrival frees a slot: a new client (drawn uniformly from the clients not
training, from (seed, dispatch number)) starts at once from the version the server holds at that moment (the
version before step t for the first buffer - 1 arrivals of the step, t + 1 for the last); a client that arrived
in step t is not drawn again before the step is taken, so a step's arrivals are distinct clients (the
population must exceed concurrency + buffer - 1). The staleness of an arrival in step t is t - (its start
version).

    steps = simulate(durations, population, concurrency, buffer, num_steps, seed)
    steps[t] = Step(ids [buffer], versions [buffer], time_s)       time_s: the virtual time of server step t

The whole schedule is a function of its arguments, so a resumed run recomputes it and continues bit-identically.
"""
from __future__ import annotations

import dataclasses
import heapq
from typing import Callable, List

import numpy as np

DISPATCH_STREAM = 0xA51C


@dataclasses.dataclass(frozen=True)
class Step:
  ids: np.ndarray         # [buffer] the arriving clients
  versions: np.ndarray    # [buffer] the model version each started from
  time_s: float           # virtual time of the server step (its last arrival)


def _draw(seed: int, n: int, population: int, busy: set) -> int:
  free = np.array([k for k in range(population) if k not in busy])
  return int(free[np.random.default_rng([int(seed), int(n), DISPATCH_STREAM]).integers(len(free))])


def simulate(duration: Callable[[int], float], population: int, concurrency: int, buffer: int, num_steps: int,
             seed: int) -> List[Step]:
  """The first `num_steps` server steps (see the module docstring); duration(client) -> seconds."""
  if not (1 <= buffer <= concurrency and concurrency + buffer <= population):
    raise ValueError(f'need 1 <= buffer ({buffer}) <= concurrency ({concurrency}) and concurrency + buffer <= '
                     f'population ({population})')
  heap, busy, arrived, n = [], set(), set(), 0

  def dispatch(now: float, version: int):
    nonlocal n
    k = _draw(seed, n, population, busy | arrived)
    busy.add(k)
    heapq.heappush(heap, (now + float(duration(k)), n, k, version))
    n += 1

  for _ in range(concurrency):
    dispatch(0.0, 0)
  steps = []
  for t in range(num_steps):
    ids, versions = [], []
    now = 0.0
    for i in range(buffer):
      now, _, k, v = heapq.heappop(heap)
      busy.discard(k)
      arrived.add(k)
      ids.append(k)
      versions.append(v)
      if i < buffer - 1:
        dispatch(now, t)
    steps.append(Step(np.array(ids, np.int64), np.array(versions, np.int64), now))
    arrived.clear()
    dispatch(now, t + 1)
  return steps


def staleness_weight(tau):
  """s(tau) = 1 / sqrt(1 + tau) (FedBuff's polynomial staleness weighting, Nguyen et al. 2022)."""
  return 1.0 / np.sqrt(1.0 + np.asarray(tau, np.float64))
