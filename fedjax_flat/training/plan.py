"""The plan of a run: what it is, decided once from the config and the algorithm's declarations.

`RunPlan(config)` loads the data (FedVC's virtual clients, a configured label-flipping attack), builds the model,
the task and the algorithm, the client transforms, where the clients run (strategy, the devices' mesh, the padded
cohort and chunk), the batch plan, the round path and the evaluators of the global test set. It trains nothing and
holds no run state; what it offers are pure functions of the round: `sample_round(r)` (the client ids),
`round_batches(r, ids, pad_to)` (their padded, masked batches), `client_keys(r, ids)` and `initial_state(params)`
(round 0's server state and client-state store).

The round path: `device_rounds` when the training data are an in-memory FederatedDataset small enough for the
device and nothing needs the host between rounds (`blocker` says why not), then blocks of up to
`rounds_per_call` rounds run in one program (training/driver.DeviceDriver); otherwise the host builds each round
(training/driver.HostDriver). The chain algorithms plan their lanes on top of this (training/chain_loop.ChainPlan).
"""
from __future__ import annotations

import functools
import os
from typing import Optional

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.algorithms.wrappers import robust as robust_lib
from fedjax_flat.config import validate
from fedjax_flat.core import engine as engine_lib
from fedjax_flat.core import sharding as sharding_lib
from fedjax_flat.core import client_state
from fedjax_flat.data import attacks
from fedjax_flat.data import batching
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data import sampling
from fedjax_flat.data import validation_steps
from fedjax_flat.data import virtual_clients
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.sources import cifar_c
from fedjax_flat.data.transforms import pipeline as transforms
from fedjax_flat.errors import ConfigError
from fedjax_flat.evaluation.evaluator import make_evaluator, make_validation_evaluator
from fedjax_flat.grouping import style_clusters
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models.base import num_params
from fedjax_flat.optimizers import client as client_opt
from fedjax_flat.systems import clock as clock_lib
from fedjax_flat.systems import compress as compress_lib
from fedjax_flat.systems import events as events_lib
from fedjax_flat.tasks import base as tasks_lib

# Rounds per call (core/rounds.py).
AUTO_ROUNDS_PER_CALL = 32      # the compiled block length of 'auto' (measured: benchmarks/speed/rounds_per_s.py)


def message_bytes(messages: dict):
  """(bytes down, bytes up) of round_messages' counts: float32 params, compressed uploads at their own bytes."""
  down = clock_lib.BYTES_PER_PARAM * messages['down_params']
  return down, messages.get('up_bytes', clock_lib.BYTES_PER_PARAM * messages['up_params'])


def check_corruption_files(config) -> None:
  """config.corruption_eval's files exist (one bad-input line naming the field and the download command):
  they are read at the end of training, so a missing directory must not cost the whole run."""
  ce = config.get('corruption_eval')
  if ce is None or not ce.name:
    return
  try:
    cifar_c.locate(ce.data_dir, ce.name)
  except FileNotFoundError as e:
    raise ConfigError('corruption_eval.data_dir', ce.data_dir, str(e).replace('\n', ' ')) from None


class RunPlan:
  """Everything a run is built from (see the module docstring). `shard_clients` overrides
  config.engine.shard_clients (training/batched.py: the devices take runs instead)."""

  def __init__(self, config, workdir: Optional[str] = None, *, data=None, shard_clients: Optional[bool] = None):
    validate.validate_config(config)
    self.config, self.workdir = config, workdir
    self.data = data if data is not None else data_registry.get_dataset(config.dataset, **config.data.to_dict())
    # What summary.json, summary.md and the plot titles call the data: the given dataset's own name
    # (ff.train(data=...)), else config.dataset, the one loaded.
    self.dataset_name = str(getattr(data, 'name', '') or config.dataset) if data is not None else config.dataset
    if config.get('fedvc') is not None and config.fedvc.virtual_size:     # FedVC: equal-size virtual clients
      self.data = virtual_clients.virtual_clients(self.data, config.fedvc.virtual_size, seed=config.seed)
    validate.validate_against_data(config, self.data)
    check_corruption_files(config)   # the CIFAR-C test set is read after training: find it before training
    self.model = model_registry.get_model(config.model, self.data.num_classes, self.data.input_shape,
                                          compute_dtype=model_registry.compute_dtype(config),
                                          **config.model_kwargs.to_dict())
    self.task = tasks_lib.from_config(tasks_lib.task_of(self.data), config)  # loss and metrics (tasks/base.py)
    self.attack_report = None            # config.attack: what the label-flipping attack poisoned
    self.algorithm = self.build_algorithm()
    # Need 'client_groups' (H-FL): every client's group from the dataset's metadata, read when the algorithm is
    # built; the rounds then sample a fixed number of clients per group (data/sampling.stratified_ids).
    self.client_groups = self.algorithm.client_groups
    self.clients_per_group = int(self.client_groups['per_group']) if self.client_groups is not None else 0
    # Need 'style_clusters' (LADD): the clustering it was built with, and the FDA window that routes test images.
    self.style_clusters = self.algorithm.style_clusters
    self.style_fda_b = int(self.algorithm.hparams['fda_b']) if self.style_clusters is not None else 0
    self.train_transform, self.eval_transform = transforms.make_transforms(config, self.data.num_classes,
                                                                           data=self.data)
    self.place_clients(shard_clients)
    c, ec = config.client, config.engine
    full_batches, max_steps = bool(c.get('full_batches', False)), int(c.get('max_local_steps', 0))
    self.num_steps = batching.padded_num_steps(
        self.data.client_sizes(), c.batch_size, epochs=c.local_epochs, local_steps=c.local_steps,
        bucketing=ec.step_bucketing, full_batches=full_batches, max_steps=max_steps)
    # Algorithms with a `val_source` hyperparameter (FedSoup) get each client's validation examples appended
    # to the round batches as flagged extra steps (evaluation/personalized.py).
    self.val_source = self.algorithm.val_source
    self.val_steps = (validation_steps.validation_num_steps(self.data, self.val_source, c.batch_size)
                      if self.val_source else 0)
    self.stream = bool(ec.get('stream_batches', False))   # host batches one chunk at a time (core/streaming.py)
    if self.stream and self.mesh is not None:
      raise validate.ConfigError('engine.stream_batches', True, 'streams a single-device round; with several '
                                 'devices set engine.shard_clients=False or stream_batches=False (sharding '
                                 'already keeps each device to its own rows)')
    self.batch_plan = batching.batch_plan(
        self.data.client_sizes(), batch_size=c.batch_size, num_steps=self.num_steps, epochs=c.local_epochs,
        local_steps=c.local_steps, shuffle=config.data.get('shuffle', True),
        with_client=(self.train_transform.needs_client       # style transfer's bank
                     or 'client_ids' in self.algorithm.needs),   # FedFomo's slots
        full_batches=full_batches, max_steps=max_steps,
        draw=self.data.draw)     # a dataset drawing columns from a pool (data/federated.py)
    self.key = jax.random.key(config.seed)
    # server.aggregator other than 'mean': the round's uploads stacked [C, ...] on every device must fit
    robust_lib.check_memory(config, self.cohort, self.param_shapes)
    self.clock = self.make_clock() if clock_lib.enabled(config) else None   # config.system: the virtual clock
    # The global test set (Evaluator), or test-client groups / BN test policy / resolution (segmentation).
    self.evaluator = make_evaluator(config, self.model, self.data, self.task, self.eval_transform,
                                    local_batch_stats=self.algorithm.local_batch_stats)
    # Retrieval runs with validation clients (FedVPR's 12 held-out clients): 'val_<metric>' at every evaluation.
    self.val_evaluator = make_validation_evaluator(config, self.model, self.data, self.task, self.eval_transform)
    self.choose_round_path()

  # The algorithm (training/chain_loop.ChainPlan builds its superclients first).
  def build_algorithm(self):
    """A configured label-flipping attack poisons the attackers' data here, before anything trains."""
    if attacks.enabled(self.config):
      self.poison_data(None)
    return alg_registry.build_algorithm(self.config, self.model, population=self.data.num_clients,
                                        task=self.task, data=self.data, cluster_styles=self.cluster_styles)

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

  # Where the clients run.
  def place_clients(self, shard_clients: Optional[bool]):
    """strategy, mesh (None: one device), the cohort padded for it, the chunk of clients vmapped at once and the
    placement of the cohort's rows over the mesh (core/sharding.py)."""
    ec = self.config.engine
    self.strategy = engine_lib.resolve_strategy(ec.strategy)
    shard = (sharding_lib.resolve_shard_clients(ec.get('shard_clients', 'auto')) if shard_clients is None
             else shard_clients)
    if self.algorithm.asynchronous is not None:     # one arrival buffer at a time, on one device
      shard = False
    self.mesh = sharding_lib.client_mesh() if shard else None
    if self.mesh is not None:
      self.cohort, self.chunk = sharding_lib.plan_cohort(self.strategy, self.config.clients_per_round,
                                                         ec.clients_per_chunk, self.mesh.devices.size)
      self.placement = sharding_lib.ClientPlacement(self.mesh, self.cohort)
      logging.info('clients sharded over %s; cohort padded to %d (%d per device, chunk %d)',
                   sharding_lib.describe(self.mesh), self.cohort, self.cohort // self.mesh.devices.size, self.chunk)
    else:
      self.placement = None
      self.cohort = engine_lib.padded_cohort(self.strategy, self.config.clients_per_round, ec.clients_per_chunk)
      self.chunk = engine_lib.chunk_size(self.strategy, self.cohort, ec.clients_per_chunk)

  def pad_batch_plan(self, plan):
    """Runs this plan with a larger batch plan of the same kind (training/batched.align_plans: one program for runs
    whose client sizes differ). The padding is masked; the run's numbers are those of its own plan."""
    self.batch_plan, self.num_steps = plan, plan.num_steps

  # The round path.
  def device_rounds_blocker(self) -> Optional[str]:
    """Why this run cannot keep data on the device and run rounds in one program (None: it can)."""
    ec = self.config.engine
    if self.algorithm.asynchronous is not None:
      return 'an asynchronous algorithm (FedBuff, FedAsync) takes server steps on arrivals (training/driver.py)'
    if not isinstance(self.data, FederatedDataset):
      return 'the training data are not an in-memory FederatedDataset (out-of-memory source)'
    if self.mesh is not None and jax.process_count() > 1:
      return 'clients are sharded over several processes (each host builds the batches of its own clients)'
    if self.stream:
      return 'engine.stream_batches=True builds batches on the host chunk by chunk'
    if self.val_source:
      return "the algorithm appends host-built validation steps (FedSoup's val_source)"
    if self.store_kind() not in (None, 'device'):
      return ('per-client states live in the host store (client_state_store=host, or the population is '
              'larger than client_state_device_max_mb)')
    nbytes = self.data.nbytes
    limit = ec.get('device_data_max_mb', 1024) * 2**20
    if ec.get('device_data', 'auto') == 'auto' and nbytes > limit:
      return f'the training data ({nbytes / 2**20:.0f} MB) exceed engine.device_data_max_mb'
    return None

  def choose_round_path(self):
    """device_rounds / rounds_per_call / adaptive (whether 'auto' sizes blocks by measured time); blocker."""
    ec = self.config.engine
    want = ec.get('rounds_per_call', 'auto')
    self.blocker = self.device_rounds_blocker()
    use = ec.get('device_data', 'auto')
    if use is True and self.blocker:
      raise validate.ConfigError('engine.device_data', True, f'is not possible: {self.blocker}')
    self.adaptive = False
    if use is False or self.blocker:
      if want != 'auto' and want > 1:
        raise validate.ConfigError('engine.rounds_per_call', want,
                                   f'needs the data on the device (engine.device_data), not possible here: '
                                   f'{self.blocker or "engine.device_data=False"}; use 1 or auto')
      self.device_rounds, self.rounds_per_call = False, 1
      return
    self.device_rounds = True
    self.rounds_per_call = AUTO_ROUNDS_PER_CALL if want == 'auto' else int(want)
    self.adaptive = want == 'auto'

  # The virtual clock (config.system).
  def clock_blocker(self) -> Optional[str]:
    """Why this run cannot have a virtual clock (None: it can)."""
    found = self.clock_conflict()
    return found[2] if found else None

  def clock_conflict(self):
    """(field, value, why) of what keeps this run from its virtual clock: the system field the user set and what
    it conflicts with (None: no conflict)."""
    s = self.config.system
    field, value = clock_lib.switched_on(self.config)
    if self.algorithm.chain is not None:
      return field, value, (f'algorithm={self.config.algorithm!r} is a chain algorithm (FedSeq family: its lanes '
                            'are planned by training/chain_loop.py) and has no virtual clock; drop the system '
                            'section or choose another algorithm')
    if self.stream:
      return field, value, ('engine.stream_batches=True and the virtual clock exclude each other (the clock '
                            'masks whole cohorts); set one of them off')
    if self.placement is not None and self.placement.partial:
      return field, value, ('clients sharded over several processes have no virtual clock; run on one process '
                            'or drop the system section')
    if self.val_source:
      return field, value, ("the algorithm appends validation steps (FedSoup's val_source) that a deadline would "
                            'cut; drop the system section')
    if self.algorithm.asynchronous is not None:
      for name, off, now in (('deadline_s', 0.0, float(s.deadline_s)), ('availability', 'always', s.availability),
                             ('dropout', 0.0, float(s.dropout))):
        if now != off:
          return f'system.{name}', s[name], (
              f'algorithm={self.config.algorithm!r} is asynchronous: it has no rounds to close, so its clock '
              f'reads the speeds and bandwidths only; set system.{name}={off!r} or choose a synchronous '
              'algorithm (e.g. fedavg)')
    return None

  def make_clock(self):
    """The run's clock: the population's devices, a local step's passes, the bytes of a round's messages."""
    c, alg = self.config, self.algorithm
    conflict = self.clock_conflict()
    if conflict:
      raise ConfigError(*conflict)
    cc = c.client
    self.client_step_examples = [
        clock_lib.step_examples(int(n), cc.batch_size, epochs=cc.local_epochs, local_steps=cc.local_steps,
                                full_batches=self.batch_plan.full_batches, max_steps=self.batch_plan.max_steps)
        for n in np.asarray(self.data.client_sizes())]
    passes = alg.num_phases * client_opt.gradient_passes(cc) + alg.extra_passes
    # One client's bytes down / up from round_messages, the recorder's comm_bytes' source: one definition.
    down, up = message_bytes(self.round_messages(1))
    return clock_lib.make_clock(c, self.data.num_clients, passes=passes, bytes_down=down, bytes_up=up,
                                full_steps=self.client_step_examples)

  def round_schedule(self, r: int, ids) -> 'clock_lib.RoundSchedule':
    """Round r of the real clients `ids` on the virtual clock (who answers, steps that fit, seconds, bytes)."""
    ids = np.asarray(ids, np.int64)
    return clock_lib.schedule(self.clock, r, ids, [self.client_step_examples[k] for k in ids])

  def round_limits(self, r: int, ids):
    """(fit steps [cohort] int32, reports [cohort] bool, totals) of round r: what the round program masks with."""
    sched = self.round_schedule(r, ids)
    fit, reports = clock_lib.padded(sched, self.cohort, self.num_steps)
    totals = {'duration_s': sched.duration_s, 'bytes_down': sched.bytes_down, 'bytes_up': sched.bytes_up,
              'downloaded': int(np.sum(sched.available)), 'reported': int(np.sum(sched.reports))}
    return fit, reports, totals

  def async_steps(self):
    """An asynchronous algorithm's server steps (systems/events.simulate over config.rounds steps): who arrives
    at each, from which version, when. A client's duration is its download + all its local steps + upload on the
    clock (without config.system: 1 s each, arrivals in dispatch order)."""
    spec, c = self.algorithm.asynchronous, self.config
    conc = int(spec.concurrency) or int(c.clients_per_round)
    if not (spec.buffer <= conc and conc + spec.buffer <= self.data.num_clients):
      raise ConfigError('algo.concurrency', conc, f'needs algo.buffer={spec.buffer} <= concurrency and concurrency '
                        f'+ buffer <= the population {self.data.num_clients} (0: clients_per_round)')
    if self.clock is None:
      duration = lambda k: 1.0     # noqa: E731
    else:
      duration = lambda k: float(clock_lib.transfer_s(self.clock, np.array([k]))[0] + np.sum(    # noqa: E731
          self.client_step_examples[k]) * self.clock.passes / self.clock.devices.speed[k])
    return events_lib.simulate(duration, self.data.num_clients, conc, spec.buffer, int(c.rounds), int(c.seed))

  # Round 0.
  def fresh_params(self):
    """The model's initial params from the run's root key (stream 0)."""
    sample_x = jnp.zeros((1,) + tuple(self.data.input_shape), jnp.float32)
    return self.model.init(jax.random.fold_in(self.key, 0), sample_x)

  @functools.cached_property
  def param_shapes(self):
    """The params' shapes and dtypes (the model's init traced once, nothing allocated)."""
    return jax.eval_shape(self.fresh_params)

  @functools.cached_property
  def num_params(self) -> int:
    return num_params(self.param_shapes)

  def store_kind(self) -> Optional[str]:
    """'device' | 'host' | None (stateless): where this run keeps its client states (core/client_state.py)."""
    c = self.config
    return client_state.store_kind(self.algorithm, self.param_shapes, self.data.num_clients,
                                   c.get('client_state_store', 'auto'),
                                   c.get('client_state_device_max_mb', 256) * 2**20,
                                   c.get('client_state_host_max_mb', client_state.HOST_MAX_MB) * 2**20)

  def new_store(self, params):
    """An empty client-state store (host dict, device [K, ...] arrays or memmaps in workdir/client_states), None
    when the algorithm is stateless."""
    c = self.config
    return client_state.store_for(self.algorithm, params, self.data.num_clients, c.get('client_state_store', 'auto'),
                                  c.get('client_state_device_max_mb', 256) * 2**20,
                                  c.get('client_state_host_max_mb', client_state.HOST_MAX_MB) * 2**20,
                                  directory=self._client_states_dir())

  def _client_states_dir(self) -> Optional[str]:
    # One directory per process: on several hosts sharing the workdir, each keeps its own store's files.
    if not self.workdir:
      return None
    d = os.path.join(self.workdir, 'client_states')
    return os.path.join(d, f'process_{jax.process_index()}') if jax.process_count() > 1 else d

  def initial_state(self, params=None):
    """(server state, client-state store) of round 0 from `params` (default: the fresh init); the server's key
    is stream 1 of the root key, the state replicated over the mesh when the clients are sharded."""
    params = self.fresh_params() if params is None else params
    state = self.algorithm.server_init(params, jax.random.fold_in(self.key, 1))
    if self.placement is not None:
      state = self.placement.replicate(state)
    return state, self.new_store(params)

  # Pure functions of the round.
  def sample_round(self, r: int) -> np.ndarray:
    """The client ids of round r: uniform (data/sampling.sample_clients) or stratified by client group."""
    c = self.config
    if self.client_groups is not None:
      return sampling.sample_clients_stratified(self.client_groups['labels'], self.clients_per_group, seed=c.seed,
                                                round_idx=r)
    return sampling.sample_clients(self.data.num_clients, c.clients_per_round, seed=c.seed, round_idx=r,
                                   sampler=c.get('sampler', 'sort'))

  def device_sampler(self):
    """The traceable twin of `sample_round` for the compiled multi-round block (None: uniform, 'sort')."""
    if self.client_groups is None:
      if self.config.get('sampler', 'sort') == 'sort':
        return None
      k, c, name = self.data.num_clients, self.config.clients_per_round, self.config.sampler
      return lambda key, r: sampling.draw_ids(name, key, r, k, c)
    groups = jnp.asarray(self.client_groups['labels'], jnp.int32)
    per, total = self.clients_per_group, self.config.clients_per_round
    return lambda key, r: sampling.stratified_ids(key, r, groups, per, total)

  def round_batches(self, r: int, ids, pad_to: int):
    """Round r's batches of the real client ids `ids`, padded with empty clients to `pad_to` rows (plus
    FedSoup's validation steps)."""
    c = self.config
    rb = batching.make_round_batches(self.data, ids, round_idx=r, seed=c.seed, batch_size=c.client.batch_size,
                                     num_steps=self.num_steps, epochs=c.client.local_epochs,
                                     local_steps=c.client.local_steps, pad_clients_to=pad_to,
                                     shuffle=c.data.get('shuffle', True), plan=self.batch_plan)
    if self.val_source:
      rb = validation_steps.append_validation_steps(rb, self.data, self.val_source, self.val_steps)
    return rb

  def cohort_batches(self, r: int):
    """Round r's batches of its sampled clients, padded to the cohort (what a host-built round trains on); with
    the virtual clock, each client's steps past those that fit masked and who does not report flagged."""
    ids = self.sample_round(r)
    rb = self.round_batches(r, ids, self.cohort)
    if self.clock is None:
      return rb
    fit, reports, totals = self.round_limits(r, ids)
    return batching.limit_steps(rb, fit, reports, totals)

  def num_examples(self, full_ids) -> np.ndarray:
    sizes = np.asarray(self.data.client_sizes())
    return np.where(full_ids >= 0, sizes[np.maximum(full_ids, 0)], 0).astype(np.float32)

  def client_keys(self, r, client_ids):
    return sampling.client_keys_jit(self.key, jnp.asarray(r, jnp.int32), jnp.asarray(client_ids, jnp.int32))

  def compressed_upload_bytes(self):
    """Bytes of one client's compressed upload (config.upload; systems/compress.upload_bytes, the clock's too), or
    None when uploads are not compressed."""
    c = self.config
    return compress_lib.upload_bytes(c.upload, self.num_params) if compress_lib.enabled(c) else None

  def round_messages(self, n_clients: int, n_up: Optional[int] = None) -> dict:
    """Model-sized messages of a round (FederatedAlgorithm.comm_down / comm_up per phase): downloads to
    `n_clients` clients, uploads from `n_up` (default n_clients; with the virtual clock the clients whose upload
    reached the server: systems/clock.COMM_BYTES); with compressed uploads also 'up_bytes', the bytes those
    uploads really send (the recorder's comm_bytes count them instead of 4 x up_params)."""
    alg, p = self.algorithm, self.num_params
    n_up = n_clients if n_up is None else n_up
    out = {'down_params': alg.comm_down * alg.num_phases * n_clients * p,
           'up_params': alg.comm_up * alg.num_phases * n_up * p}
    each = self.compressed_upload_bytes()
    if each is not None:
      out['up_bytes'] = alg.num_phases * n_up * each
    return out
