"""The run loop: sample -> batch -> one jitted round -> divergence check -> evaluate -> write.

Two paths (`Trainer.device_rounds`): in-memory data that fit on the device run blocks of rounds in one
compiled program (core/rounds.py: sampling, batches, client keys and device-store client states inside the
program; `engine.rounds_per_call`; with several devices of one process the clients are sharded over them
inside that program); otherwise (out-of-memory sources, streaming, multi-host sharding, FedSoup's
validation steps, the host client-state store) the host samples and batches each round (prefetched on a
thread) and calls the one-round program. Both use the same definitions and give the same numbers.

Everything random derives from (config.seed, round, client id), so a run resumed at round r reproduces the
uninterrupted run exactly: the only state to save is the server state, the client-state store and the
round counter (plus the metrics written so far).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import time
from typing import Optional

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat import errors
from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.core import engine as engine_lib
from fedjax_flat.core import sharding as sharding_lib
from fedjax_flat.core import streaming
from fedjax_flat.core.client_state import store_for
from fedjax_flat.data import validation_steps
from fedjax_flat.core import rounds as rounds_lib
from fedjax_flat import devices
from fedjax_flat.data import sampling
from fedjax_flat.tasks import base as tasks_lib
from fedjax_flat.evaluation.evaluator import Evaluator, make_evaluator, make_validation_evaluator  # noqa: F401
from fedjax_flat.data.sampling import sample_clients
from fedjax_flat.data import attacks
from fedjax_flat.data import batching
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data import virtual_clients
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models.base import num_params
from fedjax_flat.data.transforms import pipeline as transforms
from fedjax_flat.config import validate
from fedjax_flat.training import writers
from fedjax_flat.training.evals import registry as evals
from fedjax_flat.training.evals import routed as evals_routed
from fedjax_flat.data.sources import cifar_c
from fedjax_flat.errors import ConfigError
from fedjax_flat.grouping import style_clusters


class DivergenceError(errors.OperationError):
  pass


def _finite_tree(tree):
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def _check_corruption_files(config) -> None:
  """config.corruption_eval's files exist (one bad-input line naming the field and the download command):
  they are read at the end of training, so a missing directory must not cost the whole run."""
  ce = config.get('corruption_eval')
  if ce is None or not ce.name:
    return
  try:
    cifar_c.locate(ce.data_dir, ce.name)
  except FileNotFoundError as e:
    raise ConfigError('corruption_eval.data_dir', ce.data_dir, str(e).replace('\n', ' ')) from None


class Trainer:
  """Builds everything from a config; `train()` runs the rounds. Usable from tests and notebooks."""

  def __init__(self, config, workdir: Optional[str] = None, *, data=None, write_files: bool = True,
               shard_clients: Optional[bool] = None):
    """shard_clients: overrides config.engine.shard_clients (training/batched.py: the devices take runs)."""
    validate.validate_config(config)
    self.config = config
    self.workdir = workdir
    self.data = data if data is not None else data_registry.get_dataset(config.dataset, **config.data.to_dict())
    if config.get('fedvc') is not None and config.fedvc.virtual_size:     # FedVC: equal-size virtual clients
      self.data = virtual_clients.virtual_clients(self.data, config.fedvc.virtual_size, seed=config.seed)
    validate.validate_against_data(config, self.data)
    _check_corruption_files(config)   # the CIFAR-C test set is read after training: find it before training
    self.model = model_registry.get_model(config.model, self.data.num_classes, self.data.input_shape,
                                          compute_dtype=model_registry.compute_dtype(config),
                                          **config.model_kwargs.to_dict())
    self.task = tasks_lib.from_config(tasks_lib.task_of(self.data), config)  # loss and metrics (tasks/base.py)
    self.style_clusters = None           # need 'style_clusters' (LADD): the clustering it was built with
    self.algorithm = self.build_algorithm()
    # Need 'client_groups' (H-FL): every client's group from the dataset's metadata, read when the algorithm is
    # built; the rounds then sample a fixed number of clients per group (data/sampling.stratified_ids).
    self.client_groups = self.algorithm.client_groups
    self.clients_per_group = int(self.client_groups['per_group']) if self.client_groups is not None else 0
    if self.algorithm.style_clusters is not None:
      self.style_clusters = self.algorithm.style_clusters
      self.style_fda_b = int(self.algorithm.hparams['fda_b'])
    self.train_transform, self.eval_transform = transforms.make_transforms(config, self.data.num_classes,
                                                                           data=self.data)

    ec = config.engine
    self.strategy = engine_lib.resolve_strategy(ec.strategy)
    # Sharding over devices/hosts (core/sharding.py): None = the single-device program.
    shard = (sharding_lib.resolve_shard_clients(ec.get('shard_clients', 'auto')) if shard_clients is None
             else shard_clients)
    self.mesh = sharding_lib.client_mesh() if shard else None
    if self.mesh is not None:
      self.cohort, chunk = sharding_lib.plan_cohort(self.strategy, config.clients_per_round,
                                                    ec.clients_per_chunk, self.mesh.devices.size)
      self.placement = sharding_lib.ClientPlacement(self.mesh, self.cohort)
      logging.info('clients sharded over %s; cohort padded to %d (%d per device, chunk %d)',
                   sharding_lib.describe(self.mesh), self.cohort, self.cohort // self.mesh.devices.size, chunk)
    else:
      self.placement = None
      self.cohort = engine_lib.padded_cohort(self.strategy, config.clients_per_round, ec.clients_per_chunk,
                                             self.cohort_multiple())
      chunk = engine_lib.chunk_size(self.strategy, self.cohort, ec.clients_per_chunk)
    self.num_steps = batching.padded_num_steps(
        self.data.client_sizes(), config.client.batch_size, epochs=config.client.local_epochs,
        local_steps=config.client.local_steps, bucketing=ec.step_bucketing,
        full_batches=bool(config.client.get('full_batches', False)),
        max_steps=int(config.client.get('max_local_steps', 0)))
    # Algorithms with a `val_source` hyperparameter (FedSoup) get each client's validation examples appended
    # to the round batches as flagged extra steps (evaluation/personalized.py).
    self.val_source = self.algorithm.val_source
    self.val_steps = (validation_steps.validation_num_steps(self.data, self.val_source, config.client.batch_size)
                      if self.val_source else 0)
    self.stream = bool(ec.get('stream_batches', False))   # host batches one chunk at a time (core/streaming.py)
    if self.stream and self.mesh is not None:
      raise validate.ConfigError('engine.stream_batches', True, 'streams a single-device round; with several '
                                 'devices set engine.shard_clients=False or stream_batches=False (sharding '
                                 'already keeps each device to its own rows)')
    self.chunk = chunk
    self.batch_plan = batching.batch_plan(
        self.data.client_sizes(), batch_size=config.client.batch_size, num_steps=self.num_steps,
        epochs=config.client.local_epochs, local_steps=config.client.local_steps,
        shuffle=config.data.get('shuffle', True),
        with_client=(self.train_transform.needs_client       # style transfer's bank
                     or 'client_ids' in self.algorithm.needs),   # FedFomo's slots
        full_batches=bool(config.client.get('full_batches', False)),
        max_steps=int(config.client.get('max_local_steps', 0)),
        draw=self.data.draw)     # a dataset drawing columns from a pool (data/federated.py)
    self.round_fn = self.build_round_fn(chunk)

    self.key = jax.random.key(config.seed)
    sample_x = jnp.zeros((1,) + tuple(self.data.input_shape), jnp.float32)
    params = self.model.init(jax.random.fold_in(self.key, 0), sample_x)
    self.num_params = num_params(params)
    self.server_state = self.algorithm.server_init(params, jax.random.fold_in(self.key, 1))
    if self.placement is not None:
      self.server_state = self.placement.replicate(self.server_state)
    # host dict (lazy) or device [K, ...] arrays, None when stateless: core/client_state.py
    self.store = store_for(self.algorithm, params, self.data.num_clients, config.get('client_state_store', 'auto'),
                           config.get('client_state_device_max_mb', 256) * 2**20)
    # The global test set (Evaluator), or test-client groups / BN test policy / resolution (segmentation).
    self.evaluator = make_evaluator(config, self.model, self.data, self.task, self.eval_transform,
                                    local_batch_stats=self.algorithm.local_batch_stats)
    # Retrieval runs with validation clients (FedVPR's 12 held-out clients): 'val_<metric>' at every evaluation.
    self.val_evaluator = make_validation_evaluator(config, self.model, self.data, self.task, self.eval_transform)
    self.round = 0                       # rounds completed
    self.is_writer = jax.process_index() == 0          # multi-host: only process 0 writes files
    self.writer = writers.MetricsWriter(workdir) if (workdir and write_files and self.is_writer) else None
    self.records = []
    self.client_domains = None          # k-means client domains [K] when the config asks (training/trainers.py)
    self.comm_total = {'down_params': 0.0, 'up_params': 0.0}
    # Run state beyond the server state and the store, saved in checkpoints (training/checkpoint.py).
    self.pending_train_losses = []       # train losses of the rounds since the last evaluation
    self.round_log = self.algorithm.round_log   # the algorithm's schedule values per round, or None
    self.elapsed_offset = 0.0            # wall time of the run before this process (resume)
    self.checkpointer = None             # a checkpoint.Checkpointer saves every checkpoint_every rounds
    self.stopped_early = False
    self._t0 = time.time()
    self._finite = jax.jit(_finite_tree)
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._setup_rounds_per_call()

  # Rounds per call (core/rounds.py).
  AUTO_ROUNDS_PER_CALL = 32      # the compiled block length of 'auto' (measured: benchmarks/speed/rounds_per_s.py)
  AUTO_BLOCK_TARGET_S = 2.0      # 'auto' sizes blocks to about this wall time (signals, progress lines)

  def device_rounds_blocker(self) -> Optional[str]:
    """Why this run cannot keep data on the device and run rounds in one program (None: it can)."""
    ec = self.config.engine
    if not isinstance(self.data, FederatedDataset):
      return 'the training data are not an in-memory FederatedDataset (out-of-memory source)'
    if self.mesh is not None and jax.process_count() > 1:
      return 'clients are sharded over several processes (each host builds the batches of its own clients)'
    if self.stream:
      return 'engine.stream_batches=True builds batches on the host chunk by chunk'
    if self.val_source:
      return "the algorithm appends host-built validation steps (FedSoup's val_source)"
    if self.store is not None and self.store.kind != 'device':
      return ('per-client states live in the host store (client_state_store=host, or the population is '
              'larger than client_state_device_max_mb)')
    nbytes = self.data.nbytes
    limit = ec.get('device_data_max_mb', 1024) * 2**20
    if ec.get('device_data', 'auto') == 'auto' and nbytes > limit:
      return f'the training data ({nbytes / 2**20:.0f} MB) exceed engine.device_data_max_mb'
    return None

  def _setup_rounds_per_call(self):
    ec = self.config.engine
    want = ec.get('rounds_per_call', 'auto')
    blocker = self.device_rounds_blocker()
    use = ec.get('device_data', 'auto')
    if use is True and blocker:
      raise validate.ConfigError('engine.device_data', True, f'is not possible: {blocker}')
    if use is False or blocker:
      if want != 'auto' and want > 1:
        raise validate.ConfigError('engine.rounds_per_call', want,
                                   f'needs the data on the device (engine.device_data), not possible here: '
                                   f'{blocker or "engine.device_data=False"}; use 1 or auto')
      self.device_rounds, self.rounds_per_call = False, 1
      return
    self.device_rounds = True
    self.rounds_per_call = self.AUTO_ROUNDS_PER_CALL if want == 'auto' else int(want)
    self._adaptive = want == 'auto'
    self._round_s = None                       # measured wall per round ('auto' block sizing)
    self.dev_data = batching.device_data(self.data)
    if self.placement is not None:     # one copy of the data per device; each device gathers its clients' rows
      self.dev_data = self.placement.replicate(jax.device_get(self.dev_data))
      round_fn = engine_lib.make_round_fn(
          self.algorithm, chunk=self.chunk, unroll=ec.unroll, augment_fn=self.train_transform, jit=False,
          client_block=sharding_lib.make_sharded_block(self.algorithm, self.mesh, chunk=self.chunk,
                                                       unroll=ec.unroll, augment_fn=self.train_transform))
    else:
      round_fn = self.build_round_fn(self.chunk, jit=False)
    self.block_fn = rounds_lib.make_block_fn(
        round_fn, plan=self.batch_plan, num_clients=self.data.num_clients,
        clients_per_round=self.config.clients_per_round, cohort=self.cohort,
        rounds_per_call=self.rounds_per_call, has_store=self.store is not None, mesh=self.mesh,
        sample_fn=self.device_sampler())

  def build_algorithm(self):
    """Extension point (training/chain_loop.py groups the clients first). A configured label-flipping attack
    poisons the attackers' data here, before anything trains (data/attacks.py)."""
    if attacks.enabled(self.config):
      self.poison_data(None)
    return alg_registry.build_algorithm(self.config, self.model, population=self.data.num_clients,
                                        task=self.task, data=self.data, cluster_styles=self.cluster_styles)

  def sample_round(self, r: int) -> np.ndarray:
    """The client ids of round r: uniform (data/sampling.sample_clients) or stratified by client group."""
    c = self.config
    if self.client_groups is not None:
      return sampling.sample_clients_stratified(self.client_groups['labels'], self.clients_per_group, seed=c.seed,
                                                round_idx=r)
    return sample_clients(self.data.num_clients, c.clients_per_round, seed=c.seed, round_idx=r)

  def device_sampler(self):
    """The traceable twin of `sample_round` for the compiled multi-round block (None: uniform)."""
    if self.client_groups is None:
      return None
    groups = jnp.asarray(self.client_groups['labels'], jnp.int32)
    per, total = self.clients_per_group, self.config.clients_per_round
    return lambda key, r: sampling.stratified_ids(key, r, groups, per, total)

  def cluster_styles(self, ks, force_k: int, b: int):
    """What an algorithm that needs 'style_clusters' (LADD) is built with: the clients clustered by their FDA
    styles (Algorithm 7, grouping/style_clusters.py) over k in `ks` (or `force_k`), keyed by the seed."""
    clusters = style_clusters.cluster_clients(self.data, ks=ks, force_k=force_k, seed=int(self.config.seed), b=b)
    logging.info('style clusters: k = %d, sizes %s, silhouettes %s', clusters.k, clusters.sizes().tolist(),
                 {k: round(v, 4) for k, v in clusters.scores.items()})
    return clusters

  def poison_data(self, superclients):
    self.data, self.attack_report = attacks.apply(self.data, self.config.attack, self.config.seed, superclients)
    if self.workdir and jax.process_index() == 0:
      os.makedirs(self.workdir, exist_ok=True)
      attacks.write_report(self.workdir, self.attack_report)

  # Extension points for the sharding layer (core/sharding.py).
  def cohort_multiple(self) -> int:
    return 1

  def build_round_fn(self, chunk, jit: bool = True):
    ec = self.config.engine
    if self.stream:
      ids = self.sample_round(0)[:chunk]
      spec = streaming.batch_spec_of(self._build_rows(0, ids, chunk))
      return streaming.StreamedRoundFn(self.algorithm, chunk=chunk, cohort=self.cohort, batch_spec=spec,
                                       unroll=ec.unroll, augment_fn=self.train_transform)
    if self.mesh is not None:
      return sharding_lib.ShardedRoundFn(self.algorithm, self.mesh, chunk=chunk, unroll=ec.unroll,
                                         augment_fn=self.train_transform)
    return engine_lib.make_round_fn(self.algorithm, chunk=chunk, unroll=ec.unroll,
                                    augment_fn=self.train_transform, jit=jit)

  def place_round_inputs(self, inputs):
    if self.placement is None:
      return inputs
    local = self.placement.partial and inputs[0]['mask'].shape[0] != self.cohort
    return self.placement.place(inputs, batches_are_local=local)

  def fetch_outputs(self, tree):
    """Round outputs (per-client metrics, new client states) as host arrays, whole on every host."""
    if self.placement is None:
      return jax.device_get(tree)
    return self.placement.to_host(tree)

  # One round.
  def prepare_round(self, r: int):
    c = self.config
    ids = self.sample_round(r)
    if self.placement is not None and self.placement.partial:
      return self._prepare_local_rows(r, ids)
    if self.stream:
      full_ids = np.full((self.cohort,), -1, np.int32)
      full_ids[:len(ids)] = ids
      return streaming.LazyRoundBatches(r, full_ids, self._num_examples(full_ids), self.chunk, self._build_rows)
    rb = batching.make_round_batches(self.data, ids, round_idx=r, seed=c.seed, batch_size=c.client.batch_size,
                                     num_steps=self.num_steps, epochs=c.client.local_epochs,
                                     local_steps=c.client.local_steps, pad_clients_to=self.cohort,
                                     shuffle=c.data.get('shuffle', True), plan=self.batch_plan)
    if self.val_source:
      rb = validation_steps.append_validation_steps(rb, self.data, self.val_source, self.val_steps)
    return rb

  def _build_rows(self, r, ids, pad_to, as_dict=True):
    """Batches of the given real client ids, padded with empty clients to `pad_to` rows."""
    c = self.config
    rb = batching.make_round_batches(self.data, ids, round_idx=r, seed=c.seed, batch_size=c.client.batch_size,
                                     num_steps=self.num_steps, epochs=c.client.local_epochs,
                                     local_steps=c.client.local_steps, pad_clients_to=pad_to,
                                     shuffle=c.data.get('shuffle', True), plan=self.batch_plan)
    if self.val_source:
      rb = validation_steps.append_validation_steps(rb, self.data, self.val_source, self.val_steps)
    return rb.as_dict() if as_dict else rb

  def _num_examples(self, full_ids):
    sizes = np.asarray(self.data.client_sizes())
    return np.where(full_ids >= 0, sizes[np.maximum(full_ids, 0)], 0).astype(np.float32)

  def _prepare_local_rows(self, r, ids):
    """Multi-host: batches only for the rows this host's devices run; ids and weights for the whole cohort."""
    full_ids = np.full((self.cohort,), -1, np.int64)
    full_ids[:len(ids)] = ids
    mine = full_ids[self.placement.local_rows]
    rb = self._build_rows(r, mine[mine >= 0], len(mine), as_dict=False)
    # x/y/mask hold this host's rows only; ids and weights the whole cohort (place_round_inputs knows).
    return dataclasses.replace(rb, num_examples=self._num_examples(full_ids), client_ids=full_ids.astype(np.int32))

  def _client_rngs(self, r, client_ids):
    return sampling.client_keys_jit(self.key, jnp.asarray(r, jnp.int32), jnp.asarray(client_ids, jnp.int32))

  def run_round(self, r: int, rb) -> dict:
    states = self.store.gather(rb.client_ids) if self.store is not None else None
    inputs = (rb.as_dict(), states, self._client_rngs(r, rb.client_ids), rb.num_examples,
              rb.client_ids >= 0)
    inputs = self.place_round_inputs(inputs)
    self.server_state, new_states, m = self.round_fn(self.server_state, *inputs, jnp.asarray(r, jnp.int32))
    m = self.fetch_outputs(m)
    self._check_divergence(r, rb.client_ids, m['finite'], bool(self._finite(self.server_state)))
    if self.store is not None:
      self.store.scatter(rb.client_ids, new_states if self.placement is None else self.fetch_outputs(new_states))
    return self._round_result(rb.client_ids, m)

  @staticmethod
  def _check_divergence(r, client_ids, finite, server_finite):
    bad = (client_ids >= 0) & ~np.asarray(finite)
    if bad.any() or not server_finite:
      raise DivergenceError(
          f'divergence (NaN/inf) at round {r + 1}: clients {client_ids[bad].tolist() or "none"} produced '
          f'non-finite loss or updates; server state finite={server_finite}. '
          f'Lower client.lr / rho, or enable client.grad_clip.')

  def _round_result(self, client_ids, m) -> dict:
    """Per-round bookkeeping shared by both paths: communication, last clients, the train loss."""
    real = client_ids >= 0
    n = int(real.sum())
    self.last_clients = client_ids[real]
    self.comm_total['down_params'] += self.algorithm.comm_down * self.algorithm.num_phases * n * self.num_params
    self.comm_total['up_params'] += self.algorithm.comm_up * self.algorithm.num_phases * n * self.num_params
    count = float(np.sum(m['count'][real]))
    return {'train_loss': float(np.sum(m['loss_sum'][real]) / max(count, 1.0)), 'clients': client_ids[real]}

  def run_block(self, r: int, n: int) -> list:
    """Rounds r .. r+n-1 in one call of the block program (device path); returns the per-round results."""
    store = self.store.arrays if self.store is not None else None
    template = self.store.template if self.store is not None else None
    if self.placement is not None:   # replicated on the mesh (a no-op after the first block or a restore)
      store, template = self.placement.replicate_device(store), self.placement.replicate_device(template)
      self.server_state = self.placement.replicate_device(self.server_state)
    self.server_state, store, m = self.block_fn(self.server_state, store, template, self.dev_data, self.key,
                                                jnp.asarray(r, jnp.int32), jnp.asarray(n, jnp.int32))
    return self.block_results(r, n, jax.device_get(m), store)

  def block_results(self, r: int, n: int, m: dict, store=None) -> list:
    """The host side of a block: the device store's new arrays, divergence checks, per-round results."""
    if self.store is not None:
      self.store.arrays = store
      ran_ids = m['ids'][m['ran']]
      self.store._seen[ran_ids[ran_ids >= 0]] = True        # pylint: disable=protected-access
    results = []
    for i in range(n):
      if not m['ran'][i]:          # skipped after a divergent round (raised below, at that round)
        break
      self._check_divergence(r + i, m['ids'][i], m['finite'][i], bool(m['server_finite'][i]))
      results.append(self._round_result(m['ids'][i], {k: v[i] for k, v in m.items()}))
    return results

  def boundary_after(self, r: int, end: int) -> int:
    """The first round > r whose end must be seen by the host: evaluation, checkpoint, the last round."""
    c = self.config
    nxt = lambda every: (r // every + 1) * every if every > 0 else end
    b = min(end, nxt(c.eval_every))
    if end > c.rounds - c.get('eval_every_last', 0):
      b = min(b, max(r + 1, c.rounds - c.get('eval_every_last', 0) + 1))
    if self.checkpointer is not None:
      kept = [k for k in getattr(self.checkpointer, 'keep_rounds', ()) if k > r]   # config.keep_rounds
      b = min(b, nxt(self.checkpointer.every), *kept or [end])
    return max(b, r + 1)

  def block_length(self, r: int, end: int) -> int:
    n = min(self.rounds_per_call, self.boundary_after(r, end) - r)
    if self._adaptive and self._round_s:
      n = min(n, max(1, int(self.AUTO_BLOCK_TARGET_S / self._round_s)))
    return n

  def evaluate(self) -> dict:
    out = {}
    view = (lambda p: p) if self.placement is None else self.placement.local_view
    models = {n: view(p) for n, (p, active) in self.algorithm.eval_models(self.server_state).items() if bool(active)}
    many = getattr(self.evaluator, 'evaluate_many', None)     # every model in one pass over the test set
    results = many(models) if many is not None else {n: self.evaluator(p) for n, p in models.items()}
    for name, params in models.items():
      res = results[name]
      prefix = '' if name == 'global' else f'{name}/'
      out[prefix + 'test_accuracy'] = res['accuracy']
      out[prefix + 'test_loss'] = res['loss']
      for k, v in res.items():   # task-specific metrics (e.g. mIoU) beside loss and accuracy
        if k not in ('accuracy', 'loss', 'count'):
          out[f'{prefix}test_{k}'] = v
      if self.val_evaluator is not None:    # the validation clients, each against its own database
        res = self.val_evaluator(params)
        out.update({f'{prefix}val_{k}': v for k, v in res.items() if k != 'count'})
    for ev in self.evaluations():       # the run's periodic plug-ins (training/evals/: routed, clients)
      if ev.periodic is not None:
        out.update(ev.periodic(self))
    return out

  def evaluations(self) -> list:
    """The evaluation plug-ins this run selects (training/evals/), once."""
    if getattr(self, '_evaluations', None) is None:
      self._evaluations = evals.selected(self)
    return self._evaluations

  def evaluate_routed(self) -> dict:
    """'routed/test_<metric>' of a style-clustered run (training/evals/routed.py)."""
    return evals_routed.evaluate(self)

  def train(self, num_rounds: Optional[int] = None, stop_requested=lambda: False) -> dict:
    end = self.begin_training(num_rounds)
    future = None
    if not self.device_rounds and self.round < end:
      future = self._pool.submit(self.prepare_round, self.round)
    while self.round < end:
      r = self.round
      if self.device_rounds:              # a block of rounds in one program, up to the next boundary
        n = self.block_length(r, end)
        tb = time.time()
        block = self.run_block(r, n)
        if r > self._start_round:        # the first block includes compilation
          self._round_s = (time.time() - tb) / max(n, 1)
      else:
        rb = future.result()
        future = self._pool.submit(self.prepare_round, r + 1) if r + 1 < end else None  # overlap host batching
        block = [self.run_round(r, rb)]
      if self.record_block(block, end, stop_requested):
        break
    return self.end_training()

  def begin_training(self, num_rounds: Optional[int] = None) -> int:
    """Starts this process's share of the run; returns the round to stop after (training/batched.py drives
    several trainers through begin_training / record_block / end_training)."""
    c = self.config
    end = c.rounds if num_rounds is None else min(c.rounds, self.round + num_rounds)
    self._t0 = self._last_progress = time.time()
    self._start_round = self.round
    return end

  def record_block(self, block: list, end: int, stop_requested=lambda: False) -> bool:
    """After a block of rounds (results of run_block / run_round): train losses, evaluation and metrics at
    evaluation rounds, progress, checkpoint. Returns True when the run stops here (a stop was requested)."""
    c = self.config
    train_losses = self.pending_train_losses
    train_losses.extend(res['train_loss'] for res in block)    # every round's train loss, as with R=1
    # `train_loss` (console, metrics.jsonl, TensorBoard alike): the mean client training loss of the rounds
    # since the previous evaluation, so the console never shows one round's value under the same name.
    window_loss = float(np.mean(train_losses))
    self.round = block_end = self.round + len(block)
    rps = (self.round - self._start_round) / max(time.time() - self._t0, 1e-9)
    elapsed = self.elapsed_s()
    if (block_end % c.eval_every == 0 or block_end == end
        or block_end > c.rounds - c.get('eval_every_last', 0)):
      logged = self.round_log(block_end - 1) if self.round_log is not None else {}   # schedules (FedGloSS)
      rec = {'round': block_end, **self.evaluate(), 'train_loss': window_loss, **logged,
             'elapsed_s': elapsed, 'rounds_per_s': rps,
             'comm_down_params': self.comm_total['down_params'], 'comm_up_params': self.comm_total['up_params'],
             'comm_bytes': 4.0 * (self.comm_total['down_params'] + self.comm_total['up_params'])}
      train_losses.clear()
      self.records.append(rec)
      if self.writer:
        self.writer.write(rec)
      self.on_evaluation(rec)
    if time.time() - self._last_progress >= c.progress_every_s or block_end == end:
      self._last_progress = time.time()
      eta = (end - block_end) / max(rps, 1e-9)
      latest = self.records[-1] if self.records else {}
      logging.info('round %d/%d  %.2f rounds/s  ETA %.0fs  train_loss %.4f  test_acc %s', block_end, c.rounds,
                   rps, eta, window_loss, f"{latest.get('test_accuracy', float('nan')):.4f}")
    self.after_round()
    stop = bool(stop_requested())
    if self.placement is not None and self.placement.multi_process:
      stop = sharding_lib.any_process(stop)   # every host stops after the same round
    if self.checkpointer is not None:
      self.checkpointer.maybe_save(self, final=stop or block_end == end)
    if stop:
      self.stopped_early = block_end < end
    return stop

  def end_training(self) -> dict:
    if self.checkpointer is not None:
      self.checkpointer.wait()
    return self.finish(time.time() - self._t0, self.round - self._start_round)

  def elapsed_s(self) -> float:
    """Wall time of the whole run, across resumes."""
    return self.elapsed_offset + (time.time() - self._t0)

  def on_evaluation(self, rec):
    pass

  def after_round(self):
    pass

  def summary_sections(self) -> dict:
    """Entries a trainer adds to summary.json beside the plug-ins' (training/chain_loop.py: 'fedseq')."""
    return {}

  def finish(self, wall, rounds_run):
    """wall / rounds_run: this process only (a resumed run reports its own speed, not rounds since 0). What a
    run reports beyond its records comes from its evaluation plug-ins (training/evals/), each declared by the
    config and the algorithm's eval models."""
    c = self.config
    plugins = self.evaluations()
    # the first of the algorithm's reported models (WiMA, then SWA) that was evaluated, else the global one
    reported = evals.reported_model(self.algorithm.reported_models, self.records)
    summary = writers.summarize(self.records, c.summary_last_k, {
        'experiment': os.path.basename(self.workdir.rstrip('/')) if self.workdir else 'run',
        'algorithm': self.algorithm.label, 'dataset': c.dataset, 'model': c.model,
        'rounds_completed': self.round, 'rounds_planned': c.rounds, 'wall_time_s': wall,
        'rounds_this_process': rounds_run, 'wall_time_total_s': self.elapsed_offset + wall,
        'rounds_per_s': (rounds_run / wall) if wall > 0 else 0.0, 'num_params': self.num_params,
        'reported_model': reported, 'strategy': self.strategy, 'backend': jax.default_backend(),
        'rounds_per_call': self.rounds_per_call, 'device_data': self.device_rounds,
        'sampling_procedure': sampling.PROCEDURE,
        'comm_total_params': self.comm_total, 'comm_total_bytes': 4.0 * sum(self.comm_total.values()),
        'summary_last_k': c.summary_last_k})
    for ev in plugins:
      if ev.final is not None:
        ev.final(self, summary, reported)
    summary.update(self.summary_sections())
    if self.workdir and self.writer:
      writers.write_summary(self.workdir, summary)
      writers.plot_metrics(self.records, os.path.join(self.workdir, 'metrics.png'),
                           title=f'{self.algorithm.label} on {c.dataset}')
      self.writer.close()
    return summary


# config.json's key for the process's device record (not a config field: loaders of config.json drop it).
DEVICES_KEY = 'host_devices'


def write_config(config, workdir):
  """WORKDIR/config.json: the config, plus the host-device choice of this process (fedjax_flat/devices.py)
  and the devices jax then saw, under `host_devices`."""
  os.makedirs(workdir, exist_ok=True)
  doc = json.loads(config.to_json_best_effort())
  doc[DEVICES_KEY] = {**devices.describe(), 'backend': jax.default_backend(), 'device_count': jax.device_count(),
                      'local_device_count': jax.local_device_count(), 'process_count': jax.process_count()}
  writers.atomic_write(os.path.join(workdir, 'config.json'), lambda f: f.write(json.dumps(doc, indent=2)))
