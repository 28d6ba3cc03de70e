"""The federated dataset type: shared example arrays, clients as index sets.

All training examples live in one array per feature (`x`, `y`); a client is a slice of one flat index
array (CSR layout: `client_offsets[k]:client_offsets[k+1]` of `client_index`). No per-client copies, so a
population of 100,000 clients costs one int64 per example plus one per client. Memory per round depends only
on the clients sampled that round (their examples are gathered by the round batcher).

Every training data source, in memory or not (Landmarks), subclasses `ClientDataSource`, the protocol the round
batcher calls: `num_clients`, `client_sizes()`, `client_examples(k) -> (x, y)`, `test_examples() -> (x, y)`,
`rows(k, positions)`, with declared defaults (`label_shape` () = one class per example, `input_dtype`,
`label_dtype`, `indexed`, `draw`); optionally `task` (fedjax_flat/tasks/base.py; default classification).

Examples that share items (FedVPR's query tuples: one database image is a candidate of many queries) can keep
each item once: `store` [I, *item_shape] holds the items and x holds int32 indices [N, K] into it (-1: an
empty slot, read as zeros). With `draw = (fixed, count)` an example's first `fixed` columns are always used
and `count` of its remaining K - fixed columns (a pool; -1 entries are not drawn) are drawn afresh whenever
the round batches are built (data/batching.py: keyed by seed, round, client, step and example); y [N, K]
follows the same columns. The batch gather maps the indices to items (`lookup`), so the data hold each item
once, not once per example that uses it. Outside the rounds (`take`: client evaluation) an example uses its
first `count` pool columns (a pool stored in random order: a random subset, the same at every use); the
centralized run draws afresh at every visit through the rounds' draw (training/centralized.py).
A source of such examples too large for memory (data/sources/msls_stream.py) gives each client its own store:
`client_indexed(k) -> (rows [n_k, K] int32 indices into the store, y [n_k, K], store [I_k, *item])` (the batcher's
`rows` and `item_store(k)`), with `indexed`, `draw`, `slots`, `input_dtype`, `input_shape` / `label_shape` of what
the model sees; the round batches go through the same draw and `lookup`.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Optional, Sequence, Tuple

import numpy as np


class ClientDataSource(abc.ABC):
  """What the round batcher (data/batching.make_round_batches) calls on any training data: the one declared
  protocol, a base class whose defaults are an out-of-memory source's (every source subclasses it, so nothing
  probes for attributes).

  A source gives `num_clients`, `num_classes`, `input_shape`, `client_sizes()`, `client_examples(k) -> (x, y)`
  and `test_examples()`. Declared with defaults: `label_shape` (() = one class per example), `input_dtype` /
  `label_dtype` (of the batches: uint8 images stay uint8), `rows(k, positions)` (client k's examples at those
  positions; default: indexed out of `client_examples(k)`, read once per round). Sources of index rows into an
  item store (module docstring) set `indexed`, return index rows from `rows` and give the items through
  `item_store(k)`; with `draw = (fixed, count)` the batcher draws the pool columns, `slots` = fixed + count.
  """
  num_clients: int
  num_classes: int
  input_shape: tuple
  label_shape: tuple = ()
  input_dtype = np.dtype(np.float32)
  label_dtype = np.dtype(np.int32)
  indexed: bool = False                        # rows() gives int32 index rows into item_store(k)
  draw: Optional[Tuple[int, int]] = None       # (fixed, count): the pool draw of indexed examples
  slots: int = 0                               # columns the model sees of an indexed example (with a draw)

  @abc.abstractmethod
  def client_sizes(self) -> np.ndarray:
    """Required of every source."""

  @abc.abstractmethod
  def client_examples(self, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Required of every source."""

  @abc.abstractmethod
  def test_examples(self) -> Tuple[np.ndarray, np.ndarray]:
    """Required of every source."""

  def rows(self, k: int, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(x, y) of client k's examples at `positions` (index rows and labels for an indexed source)."""
    x, y = self.client_examples(k)
    return x[positions], y[positions]

  def item_store(self, k: int) -> np.ndarray:
    """The items [I, *item] client k's index rows point into (indexed sources only)."""
    raise NotImplementedError(f'{type(self).__name__} is not an indexed source')


def lookup(store, idx, xp=np):
  """The items of `store` [I, *item] at indices idx [...] (-1: zeros) -> [..., *item]: the one definition of
  the store gather (numpy on the host, xp=jax.numpy inside the compiled round)."""
  items = store[xp.maximum(idx, 0)]
  keep = (idx >= 0).reshape(idx.shape + (1,) * (items.ndim - idx.ndim))
  return xp.where(keep, items, xp.zeros((), store.dtype))


def _csr(groups: Sequence[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
  sizes = np.array([len(g) for g in groups], dtype=np.int64)
  offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  flat = (np.concatenate([np.asarray(g, np.int64) for g in groups]) if len(groups)
          else np.zeros((0,), np.int64))
  return flat, offsets


@dataclasses.dataclass
class FederatedDataset(ClientDataSource):
  """In-memory federated data.

  x, y: all training examples ([N, *input_shape], [N] int labels).
  client_index, client_offsets: CSR index sets of the clients into x/y.
  test_x, test_y: the global (centralized) test split.
  client_test_index, client_test_offsets: optional per-client test splits, index sets into test_x/test_y,
    one per training client (client k's own held-out data).
  test_population_index, test_population_offsets: optional test *clients* that are a separate population
    (TFF/FedJAX CIFAR-100: 100 test clients, none of them a training client), index sets into test_x/test_y.
  client_names: optional external ids (e.g. TFF client ids); clients are addressed by position 0..K-1.
  """
  x: np.ndarray
  y: np.ndarray
  client_index: np.ndarray
  client_offsets: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray
  num_classes: int
  name: str = 'dataset'
  client_test_index: Optional[np.ndarray] = None
  client_test_offsets: Optional[np.ndarray] = None
  client_names: Optional[Sequence[str]] = None
  test_population_index: Optional[np.ndarray] = None
  test_population_offsets: Optional[np.ndarray] = None
  test_client_names: Optional[Sequence[str]] = None
  task: Any = None   # what the labels mean (fedjax_flat/tasks/base.py: a name or an instance); None = classification
  store: Optional[np.ndarray] = None         # shared items [I, *item_shape]; x then holds int32 indices [N, K]
  draw: Optional[Tuple[int, int]] = None     # (fixed, count): columns kept, columns drawn from the rest per round

  def __post_init__(self):
    if len(self.x) != len(self.y):
      raise ValueError(f'x has {len(self.x)} examples but y has {len(self.y)}')
    if self.client_offsets[0] != 0 or self.client_offsets[-1] != len(self.client_index):
      raise ValueError('client_offsets must start at 0 and end at len(client_index)')
    if len(self.client_index) and (self.client_index.min() < 0 or self.client_index.max() >= len(self.x)):
      raise ValueError('client_index points outside x')
    if self.store is not None:
      if np.asarray(self.x).ndim != 2 or not np.issubdtype(np.asarray(self.x).dtype, np.integer):
        raise ValueError(f'with a store, x holds integer indices [N, K]; got {self.x.dtype} {self.x.shape}')
      if self.x.size and (self.x.min() < -1 or self.x.max() >= len(self.store)):
        raise ValueError(f'x indexes outside the store of {len(self.store)} items (-1 marks an empty slot)')
    if self.draw is not None:
      fixed, count = (int(v) for v in self.draw)
      if self.store is None or fixed < 0 or count < 1 or fixed + count > self.x.shape[1]:
        raise ValueError(f'draw={self.draw}: needs a store and 0 <= fixed, 1 <= count, fixed + count <= K = '
                         f'{np.shape(self.x)[1:]} columns')
      if tuple(np.shape(self.y)[:2]) != tuple(np.shape(self.x)[:2]):
        raise ValueError(f'draw: y {np.shape(self.y)} must have the columns of x {np.shape(self.x)}')
    if self.client_test_offsets is not None and len(self.client_test_offsets) - 1 != self.num_clients:
      raise ValueError(f'{len(self.client_test_offsets) - 1} per-client test splits for {self.num_clients} '
                       'training clients: they must be one per training client; test clients that are a '
                       'separate population go to test_population_index/offsets')

  @classmethod
  def from_client_indices(cls, x, y, client_indices: Sequence[np.ndarray], test_x, test_y, num_classes,
                          name='dataset', client_test_indices=None, client_names=None,
                          test_population_indices=None, test_client_names=None, task=None, store=None,
                          draw=None):
    idx, off = _csr(client_indices)
    t_idx = t_off = p_idx = p_off = None
    if client_test_indices is not None:
      t_idx, t_off = _csr(client_test_indices)
    if test_population_indices is not None:
      p_idx, p_off = _csr(test_population_indices)
    return cls(x=x, y=np.asarray(y), client_index=idx, client_offsets=off, test_x=test_x,
               test_y=np.asarray(test_y), num_classes=int(num_classes), name=name,
               client_test_index=t_idx, client_test_offsets=t_off, client_names=client_names,
               test_population_index=p_idx, test_population_offsets=p_off, test_client_names=test_client_names,
               task=task, store=store, draw=None if draw is None else (int(draw[0]), int(draw[1])))

  @property
  def num_clients(self) -> int:
    return len(self.client_offsets) - 1

  @property
  def slots(self) -> int:
    """Columns of an example as the model sees it (with a store): fixed + count with a draw, else K."""
    return int(sum(self.draw)) if self.draw is not None else int(np.shape(self.x)[1])

  @property
  def input_shape(self) -> tuple:
    if self.store is not None:
      return (self.slots,) + tuple(self.store.shape[1:])
    return tuple(self.x.shape[1:])

  @property
  def input_dtype(self) -> np.dtype:
    return (self.store if self.store is not None else self.x).dtype

  @property
  def label_dtype(self) -> np.dtype:
    return np.asarray(self.y).dtype

  @property
  def indexed(self) -> bool:
    return self.store is not None

  @property
  def label_shape(self) -> tuple:
    """() for one class per example; (T,) for token labels, (H, W) for label maps."""
    if self.draw is not None:
      return (self.slots,) + tuple(np.shape(self.y)[2:])
    return tuple(np.shape(self.y)[1:])

  @property
  def nbytes(self) -> int:
    """Bytes of the training arrays (x, y, the store, the client index)."""
    return int(self.x.nbytes + np.asarray(self.y).nbytes + self.client_index.nbytes
               + (self.store.nbytes if self.store is not None else 0))

  def take(self, idx) -> Tuple[np.ndarray, np.ndarray]:
    """(x, y) of the training examples idx as the model sees them: items looked up in the store, with a draw
    the first `count` pool columns (module docstring); without a store x[idx], y[idx]."""
    idx = np.asarray(idx, np.int64)
    x, y = self.x[idx], np.asarray(self.y)[idx]
    if self.store is None:
      return x, y
    if self.draw is not None:
      x, y = x[:, :self.slots], y[:, :self.slots]
    return lookup(self.store, x), y

  def client_sizes(self) -> np.ndarray:
    # Cached: every round reads it, and np.diff over a million clients' offsets took ~2 ms each time. Keyed on
    # the offsets array itself, so a dataset given new offsets is never answered with the old sizes.
    cached = self.__dict__.get('_sizes_cache')
    if cached is None or cached[0] is not self.client_offsets:
      sizes = np.diff(self.client_offsets)
      sizes.flags.writeable = False        # shared by every caller: nobody may edit it in place
      cached = self.__dict__['_sizes_cache'] = (self.client_offsets, sizes)
    return cached[1]

  def client_indices(self, k: int) -> np.ndarray:
    if not 0 <= k < self.num_clients:
      raise IndexError(f'client {k} out of range [0, {self.num_clients})')
    return self.client_index[self.client_offsets[k]:self.client_offsets[k + 1]]

  def client_examples(self, k: int) -> Tuple[np.ndarray, np.ndarray]:
    return self.take(self.client_indices(k))

  def rows(self, k: int, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """x, y rows of client k at positions: examples, or index rows into the store (the batcher draws and
    looks up)."""
    flat = self.client_indices(k)[positions]
    return self.x[flat], np.asarray(self.y)[flat]

  def item_store(self, k: int) -> np.ndarray:
    return self.store

  def client_labels(self, k: int) -> np.ndarray:
    return self.y[self.client_indices(k)]

  def client_test_examples(self, k: int) -> Tuple[np.ndarray, np.ndarray]:
    if self.client_test_offsets is None:
      raise ValueError(f'dataset {self.name!r} has no per-client test splits')
    i = self.client_test_index[self.client_test_offsets[k]:self.client_test_offsets[k + 1]]
    return self.test_x[i], self.test_y[i]

  def test_examples(self) -> Tuple[np.ndarray, np.ndarray]:
    return self.test_x, self.test_y

  @property
  def num_test_clients(self) -> int:
    """Test clients of a separate test population (0 when the test set is only centralized)."""
    return 0 if self.test_population_offsets is None else len(self.test_population_offsets) - 1

  def test_client_examples(self, j: int) -> Tuple[np.ndarray, np.ndarray]:
    if not 0 <= j < self.num_test_clients:
      raise IndexError(f'test client {j} out of range [0, {self.num_test_clients})')
    i = self.test_population_index[self.test_population_offsets[j]:self.test_population_offsets[j + 1]]
    return self.test_x[i], self.test_y[i]
