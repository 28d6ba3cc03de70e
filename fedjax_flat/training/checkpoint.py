"""Run checkpoints with orbax-checkpoint: save every N rounds, keep the last K, resume exactly.

Layout: WORKDIR/checkpoints/<round>/ with four orbax items
  server    the whole server state (whatever `algorithm.server_init` returned: params, optimizer state,
            SWA/WiMA buffers, ...), saved as its flat list of leaves {'00000': array, ...}; restored into
            the tree structure of a freshly built Trainer, so optax NamedTuples, None and empty nodes come
            back exactly, and a leaf whose shape or dtype differs is reported instead of silently loaded
  clients   the client-state store's state_dict() (ids + stacked states, flat leaves); absent when empty
  meta      JSON: round, evaluation records so far, pending train losses, communication totals, elapsed time,
            and content hashes (SHA-256) of every server leaf, of the client-state store, of the config and
            of meta itself
  config    JSON: the config that wrote it (compared with the current one on resume)

Integrity: orbax checks structure, not content, so a flipped bit inside an array file loads silently. Every
leaf's SHA-256 (of dtype, shape and bytes) is stored in meta at save time and checked on restore; a mismatch
makes the checkpoint corrupt (the fallback below then takes the previous one). Checkpoints written before
hashes existed (format 1) restore unverified.

Nothing random needs saving: sampling, batch order, client rngs and augmentation derive from
(seed, round, client id), so restoring the state above at round r reproduces the uninterrupted run bit for
bit (tests/training/test_resume.py kills runs with SIGKILL at random rounds).

Atomicity: orbax writes each checkpoint into `<round>.orbax-checkpoint-tmp-*` and renames it when complete
(commit_success.txt on object stores), so a crash mid-write leaves the previous checkpoints intact; leftover
temporary directories are removed at the next start (training/workdir.py, with the workdir locked). Saves are
asynchronous: the state is copied to host
numpy synchronously (cheap) and written by a background thread while the next rounds run. A failed write
(disk full, permissions) raises `CheckpointError` naming the directory; the previous checkpoints are kept.

Resume picks the newest checkpoint that restores and verifies; a corrupt or partial newest one is logged
(warning naming it), moved to WORKDIR/checkpoints.corrupt/ and the previous one used. `read_only=True`
(analysis tools reading a run that may still be training) neither cleans up temporary directories nor moves
anything. A checkpoint written by a config that
changes the computation (model, algorithm, dataset, seed, hyperparameters...) is refused with
`CheckpointMismatchError` unless the run is started with fresh=True (`--fresh`).

Multi-host: every process calls save/restore (orbax synchronizes them); the host-numpy leaves are written by
process 0 only. The workdir must be a filesystem all hosts see (e.g. a GCS bucket on TPU pods).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import logging as std_logging
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat import cpu_paths
from fedjax_flat import errors
from fedjax_flat.config import schema as config_schema
from fedjax_flat.config import validate
from fedjax_flat.data import sampling
from fedjax_flat.config.default_config import default_config
from fedjax_flat.core.sharding import ClientPlacement
from fedjax_flat.schema import RESULT, RESUME, SAME_BITS, tagged

FORMAT_VERSION = 2          # 2: content hashes in meta (format 1 restores unverified)

# The kinds of config field a resume compares, from the sections' tags (fedjax_flat/schema.py, config/schema.py).
# Fields that change what is computed (RESULT): a checkpoint written with other values is refused. Not RESULT on
# purpose: `published` (the paper's number, documentation only), so correcting a transcribed number never blocks
# a resume; evaluation / output fields likewise do not change the computation. A section tagged RESULT is named
# whole; a dotted entry names one field of a section whose other fields are not RESULT (engine.compute_dtype:
# mixed precision computes other numbers; the rest of `engine` only reorders float reductions, WARN_FIELDS).
COMPUTATION_FIELDS = tagged(config_schema.SCHEMA, RESULT)
# Fields that may change on resume with a warning (RESUME; the run is then no longer identical to an
# uninterrupted run with either value): the round budget (SWA's start round depends on it) and the engine (same
# computation, other floating-point reduction order).
WARN_FIELDS = tagged(config_schema.SCHEMA, RESUME, top=True)
# Engine fields that give bit-identical results (SAME_BITS; tests/core/test_rounds.py): no warning when they change.
SAME_RESULT_FIELDS = tagged(config_schema.SCHEMA, SAME_BITS)


def _sampling_procedure(trainer) -> str:
  # recorded: a checkpoint of another procedure resumes with a warning
  return sampling.procedure(trainer.config.get('sampler', 'auto'), trainer.plan.data.num_clients)


class CheckpointError(errors.OperationError):
  """A checkpoint could not be written or no checkpoint in the directory can be restored."""


class CheckpointMismatchError(validate.ConfigError):
  """The workdir's checkpoint was written by a config that computes something else."""

  def __init__(self, directory: str, step: int, diffs: List[Tuple[str, Any, Any]]):
    self.directory, self.step, self.diffs = directory, step, diffs
    ValueError.__init__(self, self._message())
    self.field = diffs[0][0] if diffs else ''
    self.value = diffs[0][2] if diffs else None
    self.allowed = 'must match the checkpoint'

  def _message(self):
    lines = [f'the checkpoint to resume from ({self.directory}/{self.step}) was written with a different config:']
    for field, old, new in self.diffs[:12]:
      lines.append(f'  config.{field}: checkpoint {old!r}, now {new!r}')
    if len(self.diffs) > 12:
      lines.append(f'  ... and {len(self.diffs) - 12} more')
    lines.append('Resume with the same config, pass --fresh to start over in this workdir (its checkpoints '
                 'and metrics are discarded), or choose another --workdir.')
    return '\n'.join(lines)

  def __str__(self):
    return self._message()


def _jsonable(x):
  return json.loads(json.dumps(x, default=lambda o: o.tolist() if hasattr(o, 'tolist') else str(o)))


def config_dict(config) -> Dict:
  return _jsonable(json.loads(config.to_json_best_effort()))


def _flatten_dict(d, prefix=''):
  out = {}
  if isinstance(d, dict):
    for k, v in d.items():
      out.update(_flatten_dict(v, f'{prefix}{k}.'))
  else:
    out[prefix[:-1]] = d
  return out


def _implicit_defaults(algo_defaults: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """The value a field has when a config does not set it: default_config's, and for algo.* the algorithm's
  registered default. A checkpoint written before a field existed computed with exactly that value."""
  out = _flatten_dict(config_dict(default_config()))
  for k, v in (algo_defaults or {}).items():
    out[f'algo.{k}'] = _jsonable(v)
  return out


def algo_defaults(trainer) -> Dict[str, Any]:
  """The registered defaults of the trainer's algorithm (the implicit values of config.algo), from its plan's
  declarations (training/plan.declaration)."""
  declared = trainer.plan.declared
  return declared.defaults() if declared is not None else {}


def config_diffs(saved: Dict, current: Dict, fields=COMPUTATION_FIELDS,
                 algo_defaults: Optional[Dict[str, Any]] = None,
                 num_clients: Optional[int] = None) -> List[Tuple[str, Any, Any]]:
  """(field, checkpoint value, current value) for every leaf field under `fields` that differs.

  A field present on one side only is not a difference when the other side's value is its implicit default
  (a newer version added the field, or --config.algo.* filled in the registered defaults: `algo_defaults`, the
  current algorithm's; None: no algo.* field has one). Two samplers that draw alike for the run's population
  (`num_clients`: 'sort' and 'auto' up to sampling.AUTO_FLOYD_ABOVE, the checkpoints of before 'auto') are not;
  before the data is loaded (`num_clients` None) a difference to 'auto' is left to the restore.
  """
  diffs, defaults = [], None
  for f in fields:
    a, b = _field_leaves(saved, f), _field_leaves(current, f)
    for k in sorted(set(a) | set(b)):
      if a.get(k, '<absent>') != b.get(k, '<absent>'):
        if k == 'sampler' and ('auto' in (a.get(k), b.get(k)) if num_clients is None else (   # None: decided
            sampling.resolve(a.get(k, 'sort'), num_clients) == sampling.resolve(b.get(k, 'sort'), num_clients))):
          continue                                                                        # at the restore
        if (k in a) != (k in b):
          defaults = _implicit_defaults(algo_defaults) if defaults is None else defaults
          if k in defaults and a.get(k, b.get(k)) == defaults[k]:
            continue
        diffs.append((k, a.get(k, '<absent>'), b.get(k, '<absent>')))
  return diffs


def _field_leaves(config: Dict, field: str) -> Dict[str, Any]:
  """{dotted name: value} of the leaves under `field` (a dotted `field` absent from the config: {})."""
  head, *rest = field.split('.')
  v = config.get(head)
  for k in rest:
    if not isinstance(v, dict) or k not in v:
      return {}
    v = v[k]
  return _flatten_dict(v, field + '.') if isinstance(v, dict) else {field: v}


def _is_key(a) -> bool:
  return isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key)


def _host_leaves(tree) -> List[np.ndarray]:
  """Leaves as host numpy copies (typed PRNG keys as their raw uint32 data); works for multi-host arrays."""
  leaves = [jax.random.key_data(a) if _is_key(a) else a for a in jax.tree_util.tree_leaves(tree)]
  host = ClientPlacement.to_host(leaves)
  return [np.array(a, copy=True) for a in host]


def _leaf_dict(leaves) -> Dict[str, np.ndarray]:
  return {f'{i:05d}': a for i, a in enumerate(leaves)}


def _leaf_list(d: Dict[str, Any]) -> List[np.ndarray]:
  return [np.asarray(d[k]) for k in sorted(d)]


def _describe(a) -> str:
  return f'{np.dtype(a.dtype).name}{list(np.shape(a))}'


def _sha256(a: np.ndarray) -> str:
  """SHA-256 of an array's dtype, shape and bytes (C order)."""
  a = np.ascontiguousarray(a)
  h = hashlib.sha256(_describe(a).encode())
  h.update(a.reshape(-1).view(np.uint8))
  return h.hexdigest()


def _digests(leaves: List[np.ndarray]) -> List[str]:
  # hashlib releases the GIL on large buffers: big states hash on several threads (~1 GB/s each).
  if sum(a.nbytes for a in leaves) < (16 << 20):
    return [_sha256(a) for a in leaves]
  with concurrent.futures.ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
    return list(pool.map(_sha256, leaves))


def _json_sha256(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(',', ':')).encode()).hexdigest()


def _verify(what: str, leaves: List[np.ndarray], expected: Optional[List[str]]) -> None:
  """Raises CheckpointError naming the first leaf whose content hash differs from the one saved."""
  if expected is None:
    return
  got = _digests(leaves)
  if len(got) != len(expected):
    raise CheckpointError(f'{what}: {len(got)} arrays, its metadata hashes {len(expected)}')
  for i, (g, e) in enumerate(zip(got, expected)):
    if g != e:
      raise CheckpointError(f'{what}: content hash mismatch in array {i:05d} ({_describe(leaves[i])}): the files '
                            'changed after they were written (bit rot, a bad disk or an edit)')


class _QuietClosedLoop(std_logging.Filter):
  """sys.unraisablehook and asyncio-log filter while checkpoints are restored.

  When orbax's restore fails on a corrupt file (which the fallback then handles), tensorstore's other pending
  reads fail too, after orbax has stopped waiting for them. Python reports each in one of two ways: an
  unraisable 'Event loop is closed' traceback (the read calls back into the loop orbax closed), or asyncio's
  'Task exception was never retrieved' ERROR record (the read's task is collected with its error unread).
  Only those are dropped: the second only when its error is tensorstore's. Installed while checkpoints are
  restored; after a failed restore it stays until the process ends (`keep`): the orphaned reads can land after
  close(), e.g. while a binary exits with its one-line error.
  """

  def __init__(self):
    super().__init__()
    self.previous = None
    self.keep = False

  def __call__(self, unraisable):
    e = unraisable.exc_value
    if isinstance(e, RuntimeError) and str(e) == 'Event loop is closed':
      return
    (self.previous or sys.__unraisablehook__)(unraisable)

  def filter(self, record):
    """False for asyncio's report of an orphaned tensorstore read whose error nobody retrieved."""
    if not str(record.msg).split('\n', 1)[0].endswith('exception was never retrieved'):
      return True
    exc = record.exc_info[1] if record.exc_info else None
    return exc is None or 'tensorstore_spec' not in str(exc)

  def install(self):
    if self.previous is None and not isinstance(sys.unraisablehook, _QuietClosedLoop):
      self.previous = sys.unraisablehook
      sys.unraisablehook = self
      std_logging.getLogger('asyncio').addFilter(self)

  def uninstall(self):
    if self.keep:        # a restore failed: its orphaned reads may still land after close(), even at exit
      return
    if self.previous is not None and sys.unraisablehook is self:
      sys.unraisablehook = self.previous
    std_logging.getLogger('asyncio').removeFilter(self)
    self.previous = None


class _OrbaxSaveLog(std_logging.Filter):
  """Holds orbax's ERROR records while a save is in flight (on absl's logger): a write that fails (a full disk)
  is logged by each of orbax's save threads with its traceback (5 of them, 326 lines), then surfaces from
  `wait` / `save` as the run's one-line CheckpointError. So the held records are dropped when a save fails, and
  from then on (its orphaned threads may still log); a save that succeeds re-emits what was held."""

  def __init__(self):
    self.lock = threading.Lock()
    self.inflight = set()
    self.failed = False
    self.held: list = []
    self.installed = False

  def filter(self, record):
    if record.levelno < std_logging.ERROR or '/orbax/' not in record.pathname.replace(os.sep, '/'):
      return True
    with self.lock:
      if self.failed:
        return False
      if self.inflight:
        self.held.append(record)
        return False
    return True

  def begin(self, owner) -> None:
    with self.lock:
      self.inflight.add(id(owner))
      if not self.installed:
        logging.get_absl_logger().addFilter(self)
        self.installed = True

  def end(self, owner, ok: bool) -> None:
    with self.lock:
      self.inflight.discard(id(owner))
      if not ok:
        self.failed, self.held = True, []
        return
      release = [] if self.inflight else self.held
      if not self.inflight:
        self.held = []
    for record in release:            # a save that succeeded after all: its errors are shown as logged
      logging.get_absl_logger().handle(record)


_SAVE_LOG = _OrbaxSaveLog()


class Checkpointer:
  """Saves and restores a Trainer's whole run state in `directory` (WORKDIR/checkpoints)."""

  def __init__(self, directory: str, *, keep: int = 2, every: int = 0, asynchronous: bool = True,
               read_only: bool = False, keep_rounds=()):
    import orbax.checkpoint as ocp
    self._ocp = ocp
    self.directory = os.path.abspath(directory)
    self.keep, self.every = int(keep), int(every)
    # Rounds saved whatever `every` says and never deleted (config.keep_rounds): the states a later analysis
    # starts from, e.g. `hessian.py --per_client --per_client_round=r` recomputes round r's local models.
    self.keep_rounds = frozenset(int(r) for r in keep_rounds)
    self.read_only = bool(read_only)
    self._quiet = _QuietClosedLoop()
    try:
      if jax.process_index() == 0 and not read_only:
        os.makedirs(self.directory, exist_ok=True)
      if read_only:     # a reader of a run that may still be training: never touch its files
        options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False)
      else:
        # Step directories are created synchronously: when that fails (a read-only or full disk) the error
        # comes back from save() at once, instead of leaving orbax's writer threads waiting 300 s for a
        # "directory created" signal, which held the process at exit. Interrupted writes are removed by
        # training/workdir.py under the workdir lock (orbax's own cleanup would run on a thread that an
        # early exit, e.g. for missing data, interrupts with a traceback).
        if self.keep_rounds:
          cm = ocp.checkpoint_managers
          keeping = dict(preservation_policy=cm.AnyPreservationPolicy(
              [cm.LatestN(self.keep), cm.CustomSteps(sorted(self.keep_rounds))]))
        else:
          keeping = dict(max_to_keep=self.keep)
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=asynchronous, cleanup_tmp_directories=False,
            create=True, async_options=ocp.AsyncOptions(create_directories_asynchronously=False), **keeping)
      self.manager = ocp.CheckpointManager(self.directory, options=options,
                                           item_names=('server', 'clients', 'meta', 'config'))
    except OSError as e:
      raise CheckpointError(f'cannot create the checkpoint directory {self.directory}: {e.strerror or e}; '
                            'choose a writable --workdir') from e
    self.last_saved: Optional[int] = None
    self.last_save_s = 0.0            # blocking part of the last save (host copy + launching the write)
    self.save_times: List[float] = []

  # Saving.
  def maybe_save(self, trainer, *, final: bool = False) -> bool:
    r = trainer.round
    due = final or (self.every > 0 and r % self.every == 0) or r in self.keep_rounds
    if not due or r == self.last_saved or r in self.manager.all_steps():
      return False
    self.save(trainer)
    return True

  def save(self, trainer) -> None:
    ocp = self._ocp
    t0 = time.perf_counter()
    r = int(trainer.round)
    if self.last_saved is not None:
      self.wait()        # the previous (asynchronous) save: its failure is reported under its own round
    server = _leaf_dict(_host_leaves(trainer.server_state))
    items = {'server': ocp.args.StandardSave(server)}
    num_states, client_hashes = 0, None
    if trainer.store is not None and len(trainer.store):
      sd = trainer.store.state_dict()
      num_states = int(len(sd['ids']))
      ids, leaves = np.asarray(sd['ids'], np.int64), _host_leaves(sd['states'])
      items['clients'] = ocp.args.StandardSave({'ids': ids, 'leaves': _leaf_dict(leaves)})
      client_hashes = _digests([ids] + leaves)
    config = config_dict(trainer.config)
    meta = {
        'format': FORMAT_VERSION, 'round': r,
        **_jsonable(trainer.recorder.state_dict()),   # records, pending_train_losses, comm_total, elapsed_s
        'num_client_states': num_states, 'server_leaves': [_describe(a) for a in server.values()],
        'algorithm': trainer.algorithm.label, 'num_devices': jax.device_count(),
        'num_processes': jax.process_count(), 'jax_version': jax.__version__, 'time': time.time(),
        'sampling': _sampling_procedure(trainer), 'cpu_path': cpu_paths.applied(),
        'server_sha256': _digests(list(server.values())), 'clients_sha256': client_hashes,
        'config_sha256': _json_sha256(config),
    }
    meta['meta_sha256'] = _json_sha256(meta)
    items['meta'] = ocp.args.JsonSave(meta)
    items['config'] = ocp.args.JsonSave(config)
    _SAVE_LOG.begin(self)              # orbax's thread tracebacks of a failed write are held, not printed
    try:
      self.manager.save(r, args=ocp.args.Composite(**items), force=True)
      self.manager.check_for_errors()
    except Exception as e:  # noqa: BLE001 -- any storage error becomes one clear message
      raise self._save_error(r, e) from e
    self.last_saved = r
    self.last_save_s = time.perf_counter() - t0
    self.save_times.append(self.last_save_s)

  def _save_error(self, r, e) -> CheckpointError:
    _SAVE_LOG.end(self, ok=False)      # this line is the report: orbax's threads' tracebacks are dropped
    self.last_saved = None
    prev = [s for s in self.manager.all_steps() if s != r]
    kept = f'The previous checkpoint (round {max(prev)}) is intact' if prev else 'No earlier checkpoint exists'
    return CheckpointError(f'could not write the checkpoint of round {r} to {self.directory}: '
                           f'{type(e).__name__}: {e}. {kept}. Free disk space or fix permissions, then rerun '
                           'the same command to resume.')

  def wait(self) -> None:
    """Blocks until asynchronous writes are on disk; raises CheckpointError if one failed."""
    try:
      self.manager.wait_until_finished()
      self.manager.check_for_errors()
    except Exception as e:  # noqa: BLE001
      raise self._save_error(self.last_saved, e) from e
    _SAVE_LOG.end(self, ok=True)

  def close(self) -> None:
    try:
      if not self.read_only:
        self.wait()
    finally:
      self.manager.close()
      self._quiet.uninstall()

  # Inspecting.
  def steps(self) -> List[int]:
    self.manager.reload()
    return sorted(self.manager.all_steps())

  def _read_json(self, step: int) -> Tuple[Dict, Dict]:
    ocp = self._ocp
    out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(),
                                                             config=ocp.args.JsonRestore()))
    meta, cfg = out['meta'], out['config']
    _check_json(f'checkpoint {self.directory}/{step}', step, meta, cfg)
    return meta, cfg

  def check_config(self, config, algo_defaults: Optional[Dict[str, Any]] = None) -> Optional[int]:
    """Raises CheckpointMismatchError if the newest readable checkpoint was written by another computation.

    Called before anything is built, so a mismatch costs no data loading or compilation (algo_defaults: the
    algorithm's registered defaults, `config_diffs`). Returns the step checked (None if there is no readable
    checkpoint).
    """
    current = config_dict(config)
    for step in reversed(self.steps()):
      try:
        _, saved = self._read_json(step)
      except Exception:  # noqa: BLE001 -- corrupt: restore_latest reports it and falls back
        continue
      diffs = config_diffs(saved, current, algo_defaults=algo_defaults)
      if diffs:
        raise CheckpointMismatchError(self.directory, step, diffs)
      return step
    return None

  # Restoring.
  def restore_latest(self, trainer) -> Optional[int]:
    """Restores the newest valid checkpoint into `trainer`; returns its round, or None if there is none."""
    self._quiet.install()
    steps = self.steps()
    corrupt = []
    current = config_dict(trainer.config)
    for step in reversed(steps):
      try:
        meta, saved_cfg = self._read_json(step)
      except Exception as e:  # noqa: BLE001
        corrupt.append((step, e))
        self._quiet.keep = True
        continue
      diffs = config_diffs(saved_cfg, current, algo_defaults=algo_defaults(trainer),
                           num_clients=trainer.plan.data.num_clients)
      if diffs:
        raise CheckpointMismatchError(self.directory, step, diffs)
      try:
        server, clients = self._read_arrays(step, meta)
      except Exception as e:  # noqa: BLE001
        corrupt.append((step, e))
        self._quiet.keep = True
        continue
      self._apply(trainer, meta, saved_cfg, server, clients)
      for bad, err in corrupt:
        logging.warning('checkpoint %s/%d is corrupt or incomplete and was skipped (%s: %s); resumed from '
                        'round %d instead', self.directory, bad, type(err).__name__, str(err)[:300], step)
      if not self.read_only:
        self._set_aside([s for s, _ in corrupt])
      return step
    if corrupt:
      names = ', '.join(f'{self.directory}/{s} ({type(e).__name__}: {str(e)[:200]})' for s, e in corrupt)
      raise CheckpointError(f'no checkpoint in {self.directory} can be restored: {names}. Pass --fresh to '
                            'start over.')
    return None

  def restore_step(self, trainer, step: int) -> int:
    """Restores checkpoint `step` exactly (analysis of an earlier round: no fallback, nothing set aside)."""
    if step not in self.steps():
      raise CheckpointError(f'no checkpoint {self.directory}/{step}; available rounds: {self.steps()} '
                            '(keep more with config.checkpoint_every / keep_checkpoints, or chosen rounds with '
                            'config.keep_rounds)')
    self._quiet.install()
    meta, saved_cfg = self._read_json(step)
    diffs = config_diffs(saved_cfg, config_dict(trainer.config), algo_defaults=algo_defaults(trainer),
                         num_clients=trainer.plan.data.num_clients)
    if diffs:
      raise CheckpointMismatchError(self.directory, step, diffs)
    try:
      server, clients = self._read_arrays(step, meta)
    except Exception:
      self._quiet.keep = True
      raise
    self._apply(trainer, meta, saved_cfg, server, clients)
    return step

  def _read_arrays(self, step: int, meta: Dict):
    ocp = self._ocp
    items = {'server': ocp.args.StandardRestore()}
    if meta.get('num_client_states', 0) > 0:
      items['clients'] = ocp.args.StandardRestore()
    out = self.manager.restore(step, args=ocp.args.Composite(**items))
    return _check_arrays(f'checkpoint {self.directory}/{step}', meta, out)

  def _apply(self, trainer, meta, saved_cfg, server, clients) -> None:
    template = jax.tree_util.tree_leaves(trainer.server_state)
    treedef = jax.tree_util.tree_structure(trainer.server_state)
    if len(template) != len(server) or any(
        tuple(np.shape(t)) != a.shape or (np.dtype(jax.random.key_data(t).dtype if _is_key(t) else t.dtype)
                                           != a.dtype) for t, a in zip(template, server)):
      want = [_describe(jax.random.key_data(t) if _is_key(t) else t) for t in template]
      raise CheckpointError(
          f'checkpoint {self.directory}/{meta["round"]} holds a server state of {len(server)} arrays '
          f'{[_describe(a) for a in server][:6]}... but this run builds {len(template)} arrays {want[:6]}...: '
          'it was written by a different version of the code. Use --fresh or another --workdir.')
    leaves = [jax.random.wrap_key_data(a, impl=jax.random.key_impl(t)) if _is_key(t) else a
              for t, a in zip(template, server)]
    state = jax.tree_util.tree_unflatten(treedef, leaves)
    if trainer.plan.placement is not None:
      trainer.server_state = trainer.plan.placement.replicate(state)
    else:
      trainer.server_state = jax.tree_util.tree_map(jnp.asarray, state)
    if trainer.store is not None:
      if clients is None:
        trainer.store.load_state_dict({'ids': np.zeros((0,), np.int64), 'states': None})
      else:
        ids, leaves = clients
        sdef = jax.tree_util.tree_structure(trainer.store.gather(np.array([-1], np.int64)))
        trainer.store.load_state_dict({'ids': ids, 'states': jax.tree_util.tree_unflatten(sdef, leaves)})
    elif clients is not None:
      raise CheckpointError('checkpoint has client states but this algorithm keeps none')
    trainer.round = int(meta['round'])
    trainer.recorder.load_state_dict(meta)
    self.last_saved = trainer.round
    for field, old, new in config_diffs(saved_cfg, config_dict(trainer.config), WARN_FIELDS,
                                           algo_defaults(trainer)):
      if field not in SAME_RESULT_FIELDS:
        logging.warning('resuming with config.%s=%r (the checkpoint was written with %r)', field, new, old)
    saved_devices = meta.get('num_devices')
    if saved_devices is not None and int(saved_devices) != jax.device_count():
      # The server state is saved whole and re-replicated, client states live on the host: any count works.
      logging.warning('resuming on %d device(s) from a checkpoint written on %d: the clients are sharded '
                      'differently, so the resumed rounds agree with an uninterrupted run to float32 rounding '
                      '(reduction order), not bit for bit', jax.device_count(), int(saved_devices))
    if meta.get('sampling', 'numpy-pcg64') != _sampling_procedure(trainer):
      logging.warning('checkpoint written by a version that sampled clients and batch orders with %r; this one '
                      'uses %r: the resumed rounds differ from an uninterrupted run of either version',
                      meta.get('sampling', 'numpy-pcg64'), _sampling_procedure(trainer))
    path = cpu_paths.applied()
    if meta.get('cpu_path', path) != path:
      # Another CPU kernel path compiles other fusions (or, dense_direct, another gradient layout): the same
      # computation with other float32 rounding in places (SAM's norm, per-tensor DP clipping).
      logging.warning('resuming under CPU kernel path %r from a checkpoint written under %r: the resumed rounds '
                      'agree with an uninterrupted run to float32 rounding, not bit for bit (resume under %r, '
                      '--cpu_path or XLA_FLAGS, for the same bits)', path, meta['cpu_path'], meta['cpu_path'])
    if trainer.recorder.writer is not None:
      _reconcile_metrics(trainer.recorder.writer, trainer.round, trainer.records)
    trainer.recorder.resumed(trainer)

  def _set_aside(self, steps: List[int]) -> None:
    """Moves corrupt checkpoints out of the way (kept for inspection) so new saves can use their rounds."""
    if not steps:
      return
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices('fedjax_flat_ckpt_set_aside_start')
    if jax.process_index() == 0:
      dest_root = self.directory.rstrip('/') + '.corrupt'
      os.makedirs(dest_root, exist_ok=True)
      for s in steps:
        src = os.path.join(self.directory, str(s))
        if os.path.exists(src):
          dest = os.path.join(dest_root, f'{s}-{int(time.time())}')
          shutil.move(src, dest)
          logging.warning('moved corrupt checkpoint %s to %s', src, dest)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices('fedjax_flat_ckpt_set_aside_end')
    self.manager.reload()

  def clear(self) -> None:
    """--fresh: deletes every checkpoint of this workdir."""
    if jax.process_index() == 0:
      for s in self.steps():
        shutil.rmtree(os.path.join(self.directory, str(s)), ignore_errors=True)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices('fedjax_flat_ckpt_clear')
    self.manager.reload()
    self.last_saved = None


def _check_json(what: str, step: int, meta, cfg) -> None:
  """meta and config as written: the round, and (format >= 2) their own content hashes."""
  if not isinstance(meta, dict) or meta.get('round') != step or not isinstance(cfg, dict):
    raise CheckpointError(f'metadata of {what} is inconsistent (round '
                          f'{meta.get("round") if isinstance(meta, dict) else None!r})')
  if 'meta_sha256' in meta:
    if _json_sha256({k: v for k, v in meta.items() if k != 'meta_sha256'}) != meta['meta_sha256']:
      raise CheckpointError(f'{what}: content hash mismatch in its metadata (meta)')
    if _json_sha256(cfg) != meta.get('config_sha256'):
      raise CheckpointError(f'{what}: content hash mismatch in its config')


def _check_arrays(what: str, meta: Dict, out) -> Tuple[List[np.ndarray], Optional[Tuple]]:
  """(server leaves, (client ids, client leaves) or None) from a restored Composite, checked against meta."""
  server = _leaf_list(out['server'])
  if [_describe(a) for a in server] != meta['server_leaves']:
    raise CheckpointError(f'server leaves of {what} do not match its metadata')
  _verify(f'{what} server state', server, meta.get('server_sha256'))
  clients = None
  if meta.get('num_client_states', 0) > 0:
    clients = (np.asarray(out['clients']['ids'], np.int64), _leaf_list(out['clients']['leaves']))
    if len(clients[0]) != meta['num_client_states']:
      raise CheckpointError(f'client states of {what} do not match its metadata')
    _verify(f'{what} client states', [clients[0]] + clients[1], meta.get('clients_sha256'))
  return server, clients


def _reconcile_metrics(writer, upto_round: int, records: List[Dict]) -> None:
  """metrics.jsonl := the checkpoint's records (rounds <= upto_round), each once; later lines are dropped."""
  writer.load_existing(upto_round)
  if [r.get('round') for r in writer.records] != [r.get('round') for r in records]:
    logging.warning('metrics.jsonl did not match the checkpoint (rounds %s vs %s); rewritten from the checkpoint',
                    [r.get('round') for r in writer.records], [r.get('round') for r in records])
    writer.records = [dict(r) for r in records]
    writer._rewrite()  # pylint: disable=protected-access


def read_checkpoint(directory: str, step: Optional[int] = None) -> Dict[str, Any]:
  """Reads a checkpoint without building a Trainer (inspection, tests): {'step', 'server_leaves' (flat list,
  the order of jax.tree_util.tree_leaves(server_state)), 'client_ids', 'client_leaves', 'meta', 'config'}."""
  import orbax.checkpoint as ocp
  options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False)
  mgr = ocp.CheckpointManager(os.path.abspath(directory), item_names=('server', 'clients', 'meta', 'config'),
                              options=options)
  try:
    step = mgr.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f'no checkpoint in {directory}')
    js = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(), config=ocp.args.JsonRestore()))
    what = f'checkpoint {os.path.abspath(directory)}/{step}'
    _check_json(what, step, js['meta'], js['config'])
    items = {'server': ocp.args.StandardRestore()}
    if js['meta'].get('num_client_states', 0) > 0:
      items['clients'] = ocp.args.StandardRestore()
    server, clients = _check_arrays(what, js['meta'], mgr.restore(step, args=ocp.args.Composite(**items)))
    out = {'step': step, 'server_leaves': server, 'meta': js['meta'],
           'config': js['config'], 'client_ids': None, 'client_leaves': None}
    if clients is not None:
      out['client_ids'], out['client_leaves'] = clients
    return out
  finally:
    mgr.close()
