"""`msls_stream`: MSLS (data/sources/msls.py) as a streamed source: a client's images are decoded when its round
batches are built, so the whole of MSLS needs no in-memory image store.

The same federated split, tuples and candidate draws as `msls` (msls.index / msls.training_tuples: the CSVs read
once, no image decoded at construction), served through the indexed-source protocol of data/federated.py:
  client_indexed(k) -> (rows [n_k, K] int32, kinds [n_k, K] uint8, store [I_k, S, S, 3] uint8)
      the client's tuples as indices into its own store: the images its tuples use (queries, positives and
      negative pools), decoded on a thread pool (data/prefetch.py) and kept in an LRU cache of `cache_clients`
      clients (0: none). K is the widest pool of the whole split, so the rows and the draws of the round batches
      (data/batching.py: `draw` = (1 + P, num_candidates), keyed by seed, round, client, step and slot) are those
      of `msls` exactly: the same batches, image for image.
  client_examples(k) -> the tuples' images with the first `num_candidates` pool columns (client evaluation),
      as FederatedDataset.take (the centralized run concatenates the clients' `client_indexed` stores and
      draws afresh every epoch: training/centralized.union_indexed).
  test_examples() -> the test cities' queries and database (decoded on first use, then kept); val_x / val_y
      the held-out validation clients' (msls.val_set, decoded at construction: a few clients), val_client the
      validation client of each of those images (msls.val_client).
The host path builds the batches (no device copy of the data); memory follows the clients of a round (and the
cache), not the split.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Tuple

import numpy as np

from fedjax_flat.data import vpr_places
from fedjax_flat.data.federated import ClientDataSource, lookup
from fedjax_flat.data.prefetch import DecodePool, prefetch_map
from fedjax_flat.data.registry import register
from fedjax_flat.data.sources import msls
from fedjax_flat.errors import ConfigError


class MslsSource(ClientDataSource, DecodePool):
  """The streamed MSLS training clients (module docstring)."""
  task = 'retrieval'
  num_classes = 1
  indexed = True                     # rows() are index rows into item_store(k)
  input_dtype = np.dtype(np.uint8)
  label_dtype = np.dtype(np.uint8)
  _pool_prefix = 'msls'

  def __init__(self, ix, *, image_size: int, num_positives: int, num_candidates: int, neg_pool: int, seed: int,
               cache_clients: int = 0, num_workers: int = 2, name: str = 'msls_stream'):
    self.ix, self.size, self.seed, self.name = ix, int(image_size), int(seed), name
    fixed = 1 + int(num_positives)
    tuples = msls.training_tuples(ix, num_positives, neg_pool, seed)
    width = max([fixed + int(num_candidates)] + [t.shape[1] for t in tuples])    # = tuple_dataset's K
    self._ids, self._rows, self._kinds = [], [], []
    for t in tuples:
      t = vpr_places.pad_columns(list(t), width)
      ids = np.unique(t[t >= 0])
      self._ids.append(ids)                                   # global image ids of the client's store
      self._rows.append(np.where(t >= 0, np.searchsorted(ids, np.maximum(t, 0)), -1).astype(np.int32))
      self._kinds.append(vpr_places.slot_kinds(num_positives, t))
    self.draw = (fixed, int(num_candidates))
    self.slots = fixed + int(num_candidates)
    self.input_shape = (self.slots, self.size, self.size, 3)
    self.label_shape = (self.slots,)
    self.num_clients = len(tuples)
    self.num_workers = max(1, int(num_workers))
    self.cache_clients = max(0, int(cache_clients))
    self._cache: 'OrderedDict[int, np.ndarray]' = OrderedDict()
    self._lock = threading.Lock()
    self._pool = None
    self._test = None
    self.split_stats = vpr_places.split_statistics(ix['groups'], [len(f) for f in ix['seq_frames']])
    self.train_cities, self.test_cities = tuple(ix['train']), tuple(ix['test'])
    self.client_groups = msls.client_groups(ix)
    self.val_x, self.val_y = msls.val_set(ix, self.size)
    self.val_client = msls.val_client(ix)
    self.val_groups = ix['val_groups']

  def client_sizes(self) -> np.ndarray:
    return np.array([len(r) for r in self._rows], np.int64)

  def client_store(self, k: int) -> np.ndarray:
    """[I_k, S, S, 3] uint8: the images of client k's tuples, decoded on the pool (LRU-cached)."""
    with self._lock:
      hit = self._cache.get(k)
      if hit is not None:
        self._cache.move_to_end(k)
        return hit
    files = self.ix['files']
    ids = self._ids[k]
    decoded = [img for _, img in prefetch_map(self._get_pool(), lambda i: msls.load_image(*files[i], self.size),
                                              ids.tolist(), 2 * self.num_workers)]
    store = np.stack(decoded) if decoded else np.zeros((0, self.size, self.size, 3), np.uint8)
    if self.cache_clients:
      with self._lock:
        self._cache[k] = store
        while len(self._cache) > self.cache_clients:
          self._cache.popitem(last=False)
    return store

  def client_indexed(self, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    return self._rows[k], self._kinds[k], self.client_store(k)

  def rows(self, k: int, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    return self._rows[k][positions], self._kinds[k][positions]

  def item_store(self, k: int) -> np.ndarray:
    return self.client_store(k)

  def client_examples(self, k: int) -> Tuple[np.ndarray, np.ndarray]:
    rows, kinds, store = self.client_indexed(k)
    return lookup(store, rows[:, :self.slots]), kinds[:, :self.slots]

  def client_image_ids(self, k: int) -> np.ndarray:
    """[n_k, K] global image ids of client k's tuple slots (-1: empty): `msls`'s tuple_index before its store is
    re-indexed."""
    return np.where(self._rows[k] >= 0, self._ids[k][np.maximum(self._rows[k], 0)], -1)

  def test_examples(self) -> Tuple[np.ndarray, np.ndarray]:
    if self._test is None:
      self._test = msls.test_set(self.ix, self.size, self.seed)
    return self._test


FIELDS = {**msls.FIELDS, 'cache_clients': 0, 'num_workers': 2}


def _check(d):
  msls._check(d)
  if 'cache_clients' in d and int(d['cache_clients']) < 0:
    raise ConfigError('data.cache_clients', d['cache_clients'], 'an integer >= 0 (clients kept decoded)')


@register('msls_stream', task='retrieval', fields=FIELDS, check=_check)
def _msls_stream(data_dir='', split='proximity', split_radius=2000.0, num_clients=0, image_size=64, num_positives=2,
                 num_candidates=10, max_queries_per_city=0, max_sequences_per_city=0, seed=0, val_clients=0,
                 neg_pool=vpr_places.NEG_POOL, cache_clients=0, num_workers=2, cluster_features='image',
                 cluster_params='', cluster_model='vpr_resnet18', cluster_image_size=0, **unused):
  del unused
  cluster = dict(cluster_features=cluster_features, cluster_params=cluster_params, cluster_model=cluster_model,
                 cluster_image_size=cluster_image_size)
  _check(dict(split=split, split_radius=split_radius, image_size=image_size, num_positives=num_positives,
              num_candidates=num_candidates, neg_pool=neg_pool, cache_clients=cache_clients, val_clients=val_clients,
              **cluster))
  ix = msls.index(data_dir, split, split_radius, num_clients, max_queries_per_city, max_sequences_per_city, seed,
                  val_clients, msls.cluster_features_of(**cluster, image_size=image_size))
  return MslsSource(ix, image_size=image_size, num_positives=num_positives, num_candidates=num_candidates,
                    neg_pool=neg_pool, seed=seed, cache_clients=cache_clients, num_workers=num_workers,
                    name=f'msls_stream_{split}')
