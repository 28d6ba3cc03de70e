"""FedVC's virtual clients (Hsu et al. 2020; FedVPR Table 6.7): every client is cut into virtual clients of the
same size, so that quantity skew stops mattering.

  client k with N_k examples -> m_k = ceil(N_k / V) virtual clients of exactly V examples each:
    the examples in a seeded random order, cut into m_k consecutive chunks; the last chunk (and a client smaller
    than V) is filled up to V by drawing again, without replacement where it can, from the client's own examples
    (a small client is replicated)
Uniform sampling over the virtual clients (data/sampling.py) then picks the real client k with probability
m_k / sum_j m_j, about N_k / N: large clients are resampled more often, as FedVC's sampling proportional to size;
with a fixed number of local steps (config.client.local_steps) every sampled client does the same work.

`virtual_clients(data, size, seed)` returns a new FederatedDataset over the same arrays (the clients are index
sets, so no example is copied); `virtual_of` [K_virtual] maps each virtual client to its real one.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_flat.data.federated import FederatedDataset, _csr
from fedjax_flat.schema import Field, Int, Section


def virtual_sets(client_indices, size: int, seed: int):
  """([index arrays of the virtual clients], [their real client ids]) (module docstring)."""
  if size < 1:
    raise ValueError(f'virtual client size {size} must be >= 1')
  sets, owner = [], []
  for k, idx in enumerate(client_indices):
    idx = np.asarray(idx, np.int64)
    if not len(idx):
      continue
    rng = np.random.default_rng([seed, k])
    order = idx[rng.permutation(len(idx))]
    m = -(-len(idx) // size)
    for j in range(m):
      chunk = order[j * size:(j + 1) * size]
      if len(chunk) < size:        # fill up from the client's own examples (replication for a small client)
        pool = np.setdiff1d(idx, chunk)
        extra = size - len(chunk)
        fill = (rng.choice(pool, extra, replace=False) if len(pool) >= extra
                else rng.choice(idx, extra, replace=True))
        chunk = np.concatenate([chunk, fill])
      sets.append(chunk)
      owner.append(k)
  return sets, np.asarray(owner, np.int64)


def virtual_clients(data: FederatedDataset, size: int, seed: int = 0) -> FederatedDataset:
  """The same data with FedVC's virtual clients of `size` examples in place of the real clients."""
  sets, owner = virtual_sets([data.client_indices(k) for k in range(data.num_clients)], int(size), int(seed))
  idx, off = _csr(sets)
  out = dataclasses.replace(data, client_index=idx, client_offsets=off, client_names=None,
                            client_test_index=None, client_test_offsets=None)
  for name, value in vars(data).items():          # a source's extra attributes (split statistics, ...)
    if not hasattr(out, name):
      setattr(out, name, value)
  out.virtual_of = owner
  return out


# config.fedvc: declared with the code that reads it (config/schema.py collects it)
SECTION = Section('fedvc', (
    Field('virtual_size', Int(0, lo=0), '> 0: virtual clients of this many examples (data/virtual_clients.py)'),
), doc="FedVC's virtual clients")
