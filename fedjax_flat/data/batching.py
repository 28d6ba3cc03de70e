"""Round batching: the sampled clients' data as padded [clients, steps, batch, ...] arrays with masks.

Shapes are fixed per run so that one compiled round program serves every round (no recompilation when
client sizes vary): the step count S is derived from the *population* (largest client, or a fixed
`local_steps`), rounded up to a bucket; shorter clients get fully masked steps, which leave their params
and optimizer state unchanged; a partial last batch is masked so the loss averages valid examples only.

Each client's order is reshuffled every local epoch from a generator keyed by (seed, round, client id), so
a resumed run reproduces the same batches and the batches do not depend on which other clients were
sampled. `shuffle=False` (config.data.shuffle) keeps each client's examples in stored order every epoch, to
compare against reference code batch by batch.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np


def steps_for_size(n: int, batch_size: int, epochs: int) -> int:
  return epochs * int(math.ceil(n / batch_size)) if n > 0 else 0


def bucket_steps(steps: int, policy: str = 'exact') -> int:
  """'exact' keeps S; 'pow2' rounds up to a power of two (bounded number of distinct shapes)."""
  if policy == 'exact' or steps <= 1:
    return max(int(steps), 1)
  if policy == 'pow2':
    return 1 << (int(steps) - 1).bit_length()
  raise ValueError(f"step bucketing policy={policy!r}; allowed: 'exact', 'pow2'")


def padded_num_steps(client_sizes: np.ndarray, batch_size: int, *, epochs: int = 1, local_steps: int = 0,
                     bucketing: str = 'exact') -> int:
  """The run's fixed S: local_steps if set, else the step count of the population's largest client."""
  if local_steps:
    return int(local_steps)
  return bucket_steps(steps_for_size(int(np.max(client_sizes)), batch_size, epochs), bucketing)


@dataclasses.dataclass
class RoundBatches:
  x: np.ndarray            # [C, S, B, *input_shape]
  y: np.ndarray            # [C, S, B] int32
  mask: np.ndarray         # [C, S, B] float32, 1 = real example
  num_examples: np.ndarray  # [C] float32: the client's dataset size N_k (FedAvg weight); 0 for padding
  client_ids: np.ndarray   # [C] int32 (-1 for padding clients)

  def as_dict(self):
    return {'x': self.x, 'y': self.y, 'mask': self.mask}


def client_rng(seed: int, round_idx: int, client_id: int) -> np.random.Generator:
  return np.random.default_rng([int(seed), int(round_idx), int(client_id), 0xB47C])


def client_step_indices(n: int, batch_size: int, num_steps: int, *, epochs: int, local_steps: int,
                        rng: np.random.Generator, shuffle: bool = True):
  """Per-step example positions (into the client's own examples) and masks, shape [S, B].

  shuffle=False: every epoch visits the examples in stored order (0..n-1); `rng` is unused.
  """
  perm = rng.permutation if shuffle else np.arange
  pos = np.zeros((num_steps, batch_size), np.int64)
  mask = np.zeros((num_steps, batch_size), np.float32)
  if n == 0:
    return pos, mask
  if local_steps:
    # A fixed number of full batches drawn from a stream of reshuffled epochs.
    need = local_steps * batch_size
    stream = np.concatenate([perm(n) for _ in range(int(math.ceil(need / n)))])[:need]
    pos[:local_steps] = stream.reshape(local_steps, batch_size)
    mask[:local_steps] = 1.0
    return pos, mask
  per_epoch = int(math.ceil(n / batch_size))
  s = 0
  for _ in range(epochs):
    order = perm(n)
    for b in range(per_epoch):
      chunk = order[b * batch_size:(b + 1) * batch_size]
      pos[s, :len(chunk)] = chunk
      mask[s, :len(chunk)] = 1.0
      s += 1
  if s > num_steps:
    raise ValueError(f'client with {n} examples needs {s} steps > padded steps {num_steps}')
  return pos, mask


def make_round_batches(data, client_ids: Sequence[int], *, round_idx: int, seed: int, batch_size: int,
                       num_steps: int, epochs: int = 1, local_steps: int = 0,
                       pad_clients_to: Optional[int] = None, shuffle: bool = True) -> RoundBatches:
  """Gathers the sampled clients' examples into padded arrays (host numpy).

  `data` is any object with `client_indices(k)` + `x`/`y` arrays (FederatedDataset), or the
  `client_examples(k) -> (x, y)` protocol (out-of-memory sources).
  """
  ids = [int(c) for c in client_ids]
  c_total = max(len(ids), pad_clients_to or 0)
  in_memory = hasattr(data, 'client_indices') and hasattr(data, 'x')
  input_shape = tuple(data.input_shape)
  x_dtype = data.x.dtype if in_memory else np.float32
  xs = np.zeros((c_total, num_steps, batch_size) + input_shape, x_dtype)
  ys = np.zeros((c_total, num_steps, batch_size), np.int32)
  ms = np.zeros((c_total, num_steps, batch_size), np.float32)
  nums = np.zeros((c_total,), np.float32)
  out_ids = np.full((c_total,), -1, np.int32)
  for i, k in enumerate(ids):
    if in_memory:
      idx = data.client_indices(k)
      n = len(idx)
    else:
      cx, cy = data.client_examples(k)
      n = len(cy)
      if i == 0 and xs.dtype != cx.dtype:
        xs = xs.astype(cx.dtype)
    pos, mask = client_step_indices(n, batch_size, num_steps, epochs=epochs, local_steps=local_steps,
                                    rng=client_rng(seed, round_idx, k), shuffle=shuffle)
    if in_memory:
      flat = idx[pos]
      xs[i] = data.x[flat]
      ys[i] = data.y[flat]
    else:
      xs[i] = cx[pos]
      ys[i] = cy[pos]
    ms[i] = mask
    nums[i] = n
    out_ids[i] = k
  return RoundBatches(xs, ys, ms, nums, out_ids)


def make_eval_batches(x: np.ndarray, y: np.ndarray, batch_size: int):
  """Stacked padded batches [nb, B, ...] + mask over a whole split (exact example-weighted metrics)."""
  n = len(y)
  nb = max(1, int(math.ceil(n / batch_size)))
  total = nb * batch_size
  xp = np.zeros((total,) + x.shape[1:], x.dtype)
  yp = np.zeros((total,), np.int32)
  mp = np.zeros((total,), np.float32)
  xp[:n], yp[:n], mp[:n] = x, y, 1.0
  shape = lambda a: a.reshape((nb, batch_size) + a.shape[1:])
  return {'x': shape(xp), 'y': shape(yp), 'mask': shape(mp)}
