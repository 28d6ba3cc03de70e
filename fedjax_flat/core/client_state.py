"""Per-client persistent state (SCAFFOLD c_k, FedDyn g_k, AdaBest h_k, FedGloSS sigma_k, ...): gather / scatter.

Only the sampled clients' states enter a round (gathered into [C, ...] arrays) and are scattered back. Three
stores share one API (`gather`, `scatter`, `nbytes`, `__len__` = clients seen, `state_dict` /
`load_state_dict` for checkpoints):

  HostClientStateStore    numpy pytrees in a dict keyed by client id. Never-seen clients cost nothing: they
                          read the template (lazy init), so memory grows with the clients SEEN, not the
                          population: nbytes() == len(store) * bytes_per_client. For large populations
                          (100,000 clients, or 10,000+ clients of a ResNet).
  DeviceClientStateStore  one [K, ...] device array per state leaf for the whole population (K clients),
                          read with jnp.take and written with .at[ids].set inside two jitted functions: no
                          host round trip per round. For small populations (K * bytes_per_client small).
  DiskClientStateStore    one numpy memmap [K, ...] per state leaf in a directory (the run's workdir
                          `client_states/`), a bool [K] mark of the clients written: rows are read and written
                          per round, unseen clients read the template (or their initial row), the files are
                          sparse (disk grows with the clients written). For populations whose states exceed
                          the host budget (a million SCAFFOLD clients of a large model).

All three hold the same float bits: a row is stored and read back unchanged, so a run's params do not depend on
the store (tests/core/test_client_state.py: SCAFFOLD with each store, bit for bit).

`make_client_state_store(template, population, kind, device_max_bytes, initial=None, host_max_bytes=,
directory=)` picks one: kind 'host' | 'device' | 'disk' | 'auto' (device if population * bytes_per_client <=
device_max_bytes, else host if <= host_max_bytes, else disk). config: `client_state_store`,
`client_state_device_max_mb` and `client_state_host_max_mb` (config/default_config.py).

Per-client initial states (`initial`: the template's structure with a leading axis [K], the algorithm's
`initial_client_states`, core/contract.py): a client not yet scattered reads its row instead of the template
(host store: the rows are kept in numpy, [K, ...]; device store: its arrays start as the rows). Without them
every client starts from the template.

Client id -1 marks a padding client: gather returns the template for it and scatter ignores it.
Checkpoint format (both stores, interchangeable): {'ids': int64 [M] sorted, 'states': pytree of [M, ...]
numpy arrays or None}; only clients that were scattered at least once are included.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

STORE_KINDS = ('auto', 'host', 'device', 'disk')
HOST_MAX_MB = 4096     # config client_state_host_max_mb's default: beyond it, 'auto' keeps the states on disk


def _template_numpy(template):
  return jax.tree_util.tree_map(lambda a: np.array(jax.device_get(a), copy=True), template)


def bytes_per_client(template) -> int:
  leaves = [a if hasattr(a, 'dtype') else np.asarray(a) for a in jax.tree_util.tree_leaves(template)]
  return int(sum(np.dtype(a.dtype).itemsize * int(np.prod(np.shape(a))) for a in leaves))


class HostClientStateStore:
  """States of the clients seen so far, as numpy pytrees in a dict (lazy: unseen clients cost nothing)."""

  kind = 'host'

  def __init__(self, template: Any, initial: Any = None):
    self.template = _template_numpy(template)
    self._treedef = jax.tree_util.tree_structure(self.template)
    self._tleaves = jax.tree_util.tree_leaves(self.template)
    self._initial = None if initial is None else jax.tree_util.tree_leaves(_initial_numpy(initial, self.template))
    self.states: Dict[int, list] = {}          # client id -> list of leaves (numpy)

  def _unseen(self, k: int) -> list:
    if k < 0 or self._initial is None:
      return self._tleaves
    if k >= self._initial[0].shape[0]:
      raise IndexError(f'client id {k} >= population {self._initial[0].shape[0]}')
    return [a[k] for a in self._initial]

  def __len__(self):
    return len(self.states)

  @property
  def bytes_per_client(self) -> int:
    return sum(a.nbytes for a in self._tleaves)

  def written(self, client_ids: Sequence[int]) -> np.ndarray:
    """bool [C]: which of the clients have a written state (the others read the template / initial row)."""
    return np.array([int(k) in self.states for k in client_ids], bool)

  def gather(self, client_ids: Sequence[int]):
    """Stacked states [C, ...] (numpy) for the given ids (-1 = padding client: template)."""
    rows = [self.states[int(k)] if int(k) in self.states else self._unseen(int(k)) for k in client_ids]
    leaves = [np.stack([r[i] for r in rows]) for i in range(len(self._tleaves))]
    return jax.tree_util.tree_unflatten(self._treedef, leaves)

  def scatter(self, client_ids: Sequence[int], stacked):
    leaves = [np.asarray(a) for a in jax.device_get(jax.tree_util.tree_leaves(stacked))]
    for i, k in enumerate(client_ids):
      if k < 0:
        continue
      self.states[int(k)] = [np.array(a[i], copy=True) for a in leaves]

  def nbytes(self) -> int:
    return sum(a.nbytes for s in self.states.values() for a in s)

  def state_dict(self):
    ids = np.array(sorted(self.states), np.int64)
    stacked = self.gather(ids) if len(ids) else None
    return {'ids': ids, 'states': stacked}

  def load_state_dict(self, d: Optional[dict]):
    self.states = {}
    if d and len(d['ids']):
      self.scatter(np.asarray(d['ids']), d['states'])


def _initial_numpy(initial, template):
  """The per-client initial rows as numpy, checked against the template (structure, row shapes, dtypes)."""
  rows = _template_numpy(initial)
  if jax.tree_util.tree_structure(rows) != jax.tree_util.tree_structure(template):
    raise ValueError('initial client states must have the structure of the client-state template: '
                     f'{jax.tree_util.tree_structure(rows)} vs {jax.tree_util.tree_structure(template)}')
  leaves, tleaves = jax.tree_util.tree_leaves(rows), jax.tree_util.tree_leaves(template)
  k = {a.shape[0] if a.ndim else None for a in leaves}
  if len(k) != 1 or None in k:
    raise ValueError(f'initial client states need one leading population axis on every leaf, got {sorted(map(str, k))}')
  for a, t in zip(leaves, tleaves):
    if a.shape[1:] != t.shape:
      raise ValueError(f'initial client state rows of shape {a.shape[1:]} do not match the template {t.shape}')
  return jax.tree_util.tree_map(lambda a, t: a.astype(t.dtype), rows, template)


def _gather_dev(arrays, template, ids):
  safe = jnp.maximum(ids, 0)
  pad = ids < 0

  def one(a, t):
    rows = jnp.take(a, safe, axis=0)
    return jnp.where(pad.reshape((-1,) + (1,) * t.ndim), t[None], rows)
  return jax.tree_util.tree_map(one, arrays, template)


def _scatter_dev(arrays, ids, stacked):
  k = jax.tree_util.tree_leaves(arrays)[0].shape[0]
  idx = jnp.where(ids >= 0, ids, k)        # out of bounds -> dropped
  return jax.tree_util.tree_map(lambda a, s: a.at[idx].set(s.astype(a.dtype), mode='drop'), arrays, stacked)


class DeviceClientStateStore:
  """The whole population's states as [K, ...] device arrays (jnp.take / .at[].set, jitted)."""

  kind = 'device'

  def __init__(self, template: Any, population: int, initial: Any = None):
    if population < 1:
      raise ValueError(f'population={population} must be >= 1')
    self.population = int(population)
    self.template_np = _template_numpy(template)
    self.template = jax.tree_util.tree_map(jnp.asarray, self.template_np)
    self.initial_np = None if initial is None else _initial_numpy(initial, self.template_np)
    if self.initial_np is not None and jax.tree_util.tree_leaves(self.initial_np)[0].shape[0] != self.population:
      raise ValueError(f'initial client states hold {jax.tree_util.tree_leaves(self.initial_np)[0].shape[0]} '
                       f'rows for a population of {self.population}')
    self._seen = np.zeros(self.population, bool)
    self._reset()
    self._gather = jax.jit(_gather_dev)
    self._scatter = jax.jit(_scatter_dev, donate_argnums=(0,))

  def _reset(self):
    if self.initial_np is not None:
      self.arrays = jax.tree_util.tree_map(jnp.array, self.initial_np)
    else:
      self.arrays = jax.tree_util.tree_map(
          lambda t: jnp.broadcast_to(t, (self.population,) + t.shape).copy(), self.template)
    self._seen[:] = False

  def __len__(self):
    return int(self._seen.sum())

  @property
  def bytes_per_client(self) -> int:
    return sum(a.nbytes for a in jax.tree_util.tree_leaves(self.template_np))

  def _ids(self, client_ids):
    ids = np.asarray(client_ids, np.int64)
    if ids.size and ids.max() >= self.population:
      raise IndexError(f'client id {int(ids.max())} >= population {self.population}')
    return jnp.asarray(ids.astype(np.int32))

  def gather(self, client_ids: Sequence[int]):
    """Stacked states [C, ...] as device arrays (padding ids -1 read the template)."""
    return self._gather(self.arrays, self.template, self._ids(client_ids))

  def scatter(self, client_ids: Sequence[int], stacked):
    ids = np.asarray(client_ids, np.int64)
    self.arrays = self._scatter(self.arrays, self._ids(ids), stacked)
    self.mark_seen(ids)

  def written(self, client_ids: Sequence[int]) -> np.ndarray:
    """bool [C]: which of the clients have a written state (the others read the template / initial row)."""
    ids = np.asarray(client_ids, np.int64)
    return (ids >= 0) & self._seen[np.maximum(ids, 0)]

  def mark_seen(self, client_ids):
    """Clients whose rows were written (by `scatter`, or inside a block program: core/rounds.py)."""
    ids = np.asarray(client_ids, np.int64)
    self._seen[ids[ids >= 0]] = True

  def nbytes(self) -> int:
    """Device memory held: the whole population (allocated up front)."""
    return sum(a.nbytes for a in jax.tree_util.tree_leaves(self.arrays))

  def state_dict(self):
    ids = np.flatnonzero(self._seen).astype(np.int64)
    stacked = jax.device_get(self.gather(ids)) if len(ids) else None
    return {'ids': ids, 'states': stacked}

  def load_state_dict(self, d: Optional[dict]):
    self._reset()
    if d and len(d['ids']):
      self.scatter(np.asarray(d['ids']), jax.tree_util.tree_map(jnp.asarray, d['states']))


class DiskClientStateStore:
  """The population's states as numpy memmaps [K, ...] in `directory` (sparse files), a bool [K] mark of the
  clients written; unseen clients read the template or their initial row (as the host store)."""

  kind = 'disk'

  def __init__(self, template: Any, population: int, directory: Optional[str] = None, initial: Any = None):
    if population < 1:
      raise ValueError(f'population={population} must be >= 1')
    self.population = int(population)
    self.template = _template_numpy(template)
    self._treedef = jax.tree_util.tree_structure(self.template)
    self._tleaves = jax.tree_util.tree_leaves(self.template)
    self._initial = None if initial is None else jax.tree_util.tree_leaves(_initial_numpy(initial, self.template))
    self._tmp = None
    if directory is None:      # no workdir (a run in memory): a temporary directory, removed with the store
      self._tmp = tempfile.TemporaryDirectory(prefix='client_states_')
      directory = self._tmp.name
    os.makedirs(directory, exist_ok=True)
    self.directory = directory
    # w+: a fresh file each run (a resumed run reloads the rows from its checkpoint, not from these files).
    self._maps = [np.lib.format.open_memmap(os.path.join(directory, f'leaf_{i}.npy'), mode='w+', dtype=t.dtype,
                                            shape=(self.population,) + t.shape)
                  for i, t in enumerate(self._tleaves)]
    self._seen = np.zeros(self.population, bool)
    self.dirty: set = set()       # clients written since the last state_dict (what a checkpoint adds)

  def __len__(self):
    return int(self._seen.sum())

  @property
  def bytes_per_client(self) -> int:
    return sum(a.nbytes for a in self._tleaves)

  def _ids(self, client_ids) -> np.ndarray:
    ids = np.asarray(client_ids, np.int64).reshape(-1)
    if ids.size and ids.max() >= self.population:
      raise IndexError(f'client id {int(ids.max())} >= population {self.population}')
    return ids

  def written(self, client_ids: Sequence[int]) -> np.ndarray:
    """bool [C]: which of the clients have a written state (the others read the template / initial row)."""
    ids = np.asarray(client_ids, np.int64)
    return (ids >= 0) & self._seen[np.maximum(ids, 0)]

  def gather(self, client_ids: Sequence[int]):
    """Stacked states [C, ...] (numpy): written rows from the files, others the template / initial row."""
    ids = self._ids(client_ids)
    safe = np.maximum(ids, 0)
    seen = (ids >= 0) & self._seen[safe]
    leaves = []
    for i, t in enumerate(self._tleaves):
      out = np.empty((len(ids),) + t.shape, t.dtype)
      out[:] = t
      if self._initial is not None:
        real = ids >= 0
        out[real] = self._initial[i][ids[real]]
      if seen.any():
        out[seen] = self._maps[i][ids[seen]]      # fancy indexing on a memmap: only these rows are read
      leaves.append(out)
    return jax.tree_util.tree_unflatten(self._treedef, leaves)

  def scatter(self, client_ids: Sequence[int], stacked):
    ids = self._ids(client_ids)
    real = ids >= 0
    if not real.any():
      return
    leaves = [np.asarray(a) for a in jax.device_get(jax.tree_util.tree_leaves(stacked))]
    for m, a in zip(self._maps, leaves):
      m[ids[real]] = a[real].astype(m.dtype, copy=False)
    self._seen[ids[real]] = True
    self.dirty.update(ids[real].tolist())

  def nbytes(self) -> int:
    """Bytes the written rows occupy on disk (the sparse files' data)."""
    return len(self) * self.bytes_per_client

  def flush(self):
    for m in self._maps:
      m.flush()

  def state_dict(self):
    ids = np.flatnonzero(self._seen).astype(np.int64)
    stacked = self.gather(ids) if len(ids) else None
    self.dirty = set()
    return {'ids': ids, 'states': stacked}

  def load_state_dict(self, d: Optional[dict]):
    self._seen[:] = False
    if d and len(d['ids']):
      self.scatter(np.asarray(d['ids']), d['states'])
    self.dirty = set()


def make_client_state_store(template: Any, population: int, kind: str = 'auto',
                            device_max_bytes: float = 256 * 2**20, initial: Any = None,
                            host_max_bytes: float = HOST_MAX_MB * 2**20, directory: Optional[str] = None):
  """'host' | 'device' | 'disk' | 'auto' (device when population * bytes per client <= device_max_bytes, host
  when <= host_max_bytes, else disk: memmaps in `directory`, a temporary one when None).
  initial: every client's initial state [K, ...] (None: the template for every client)."""
  if kind not in STORE_KINDS:
    raise ValueError(f'client_state_store={kind!r}; allowed: {STORE_KINDS}')
  if kind == 'auto':
    kind = _auto_kind(template, population, device_max_bytes, host_max_bytes)
  if kind == 'device':
    return DeviceClientStateStore(template, population, initial)
  if initial is not None:
    initial = _initial_numpy(initial, _template_numpy(template))
    if jax.tree_util.tree_leaves(initial)[0].shape[0] != population:
      raise ValueError(f'initial client states hold {jax.tree_util.tree_leaves(initial)[0].shape[0]} rows for a '
                       f'population of {population}')
  if kind == 'disk':
    return DiskClientStateStore(template, population, directory, initial)
  return HostClientStateStore(template, initial)


def _auto_kind(template, population: int, device_max_bytes: float,
               host_max_bytes: float = HOST_MAX_MB * 2**20) -> str:
  total = population * bytes_per_client(template)
  if total <= device_max_bytes:
    return 'device'
  return 'host' if total <= host_max_bytes else 'disk'


def store_kind(algorithm, params, population: int, kind: str = 'auto', device_max_bytes: float = 256 * 2**20,
               host_max_bytes: float = HOST_MAX_MB * 2**20):
  """Where `store_for` keeps the client states ('device' | 'host' | 'disk'; None when stateless), from shapes
  alone: `params` may be abstract (jax.eval_shape), so a run's path is decided before anything is allocated."""
  if algorithm.client_state_init is None:
    return None
  if kind != 'auto':
    return kind
  return _auto_kind(jax.eval_shape(algorithm.client_state_init, params), population, device_max_bytes,
                    host_max_bytes)


def store_for(algorithm, params, population: int, kind: str = 'auto', device_max_bytes: float = 256 * 2**20,
              host_max_bytes: float = HOST_MAX_MB * 2**20, directory: Optional[str] = None):
  """The client-state store of a stateful algorithm (core/contract.py): its template from `client_state_init`,
  its per-client initial rows from `initial_client_states` when it declares them; None when stateless.
  directory: where a disk store keeps its files (the run's workdir/client_states; None: a temporary one)."""
  if algorithm.client_state_init is None:
    return None
  initial = algorithm.initial_client_states(params) if algorithm.initial_client_states is not None else None
  return make_client_state_store(algorithm.client_state_init(params), population, kind, device_max_bytes,
                                 initial=initial, host_max_bytes=host_max_bytes, directory=directory)


class ClientStates:
  """A run's client-state part: where a stateful algorithm's per-client states live (`kind`: 'device' | 'host' |
  'disk' | None when stateless, decided from shapes before anything is allocated) and its empty store (`new`), from
  config.client_state_store and its budgets; `workdir`: a disk store's files go to workdir/client_states (one
  directory per process when several hosts share the workdir)."""

  def __init__(self, config, algorithm, population: int, workdir: Optional[str] = None):
    self.algorithm, self.population, self.workdir = algorithm, int(population), workdir
    self.choice = config.get('client_state_store', 'auto')
    self.device_max_bytes = config.get('client_state_device_max_mb', 256) * 2**20
    self.host_max_bytes = config.get('client_state_host_max_mb', HOST_MAX_MB) * 2**20

  def kind(self, param_shapes) -> Optional[str]:
    return store_kind(self.algorithm, param_shapes, self.population, self.choice, self.device_max_bytes,
                      self.host_max_bytes)

  def directory(self) -> Optional[str]:
    if not self.workdir:
      return None
    d = os.path.join(self.workdir, 'client_states')
    return os.path.join(d, f'process_{jax.process_index()}') if jax.process_count() > 1 else d

  def new(self, params):
    return store_for(self.algorithm, params, self.population, self.choice, self.device_max_bytes,
                     self.host_max_bytes, directory=self.directory())
