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
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.transforms import pipeline as transforms
from fedjax_flat.evaluation import corruption
from fedjax_flat.evaluation.evaluator import make_evaluator, make_validation_evaluator
from fedjax_flat.grouping import style_clusters
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models.base import num_params
from fedjax_flat.systems import run_part
from fedjax_flat.tasks import base as tasks_lib

# Rounds per call (core/rounds.py).
AUTO_ROUNDS_PER_CALL = 32      # the compiled block length of 'auto' (measured: benchmarks/speed/rounds_per_s.py)


def declaration(config):
  """The configured algorithm's static declarations (algorithms/registry.declared: name, needs, hparams over their
  defaults, chain layout), read before anything is built; None for a name that is not registered. The builder is
  where training/ meets the registry: the modules that plan around the algorithm before it exists (trainers,
  chain_loop, packing, checkpoint) ask here; after the build they read the built FederatedAlgorithm."""
  return alg_registry.declared(config)


def algo_defaults(config) -> dict:
  """The registered defaults of the configured algorithm's hyperparameters ({} for an unknown name): the values
  config.algo holds implicitly (training/checkpoint.config_diffs)."""
  declared = declaration(config)
  return declared.defaults() if declared is not None else {}


class RunPlan:
  """Everything a run is built from (see the module docstring). `shard_clients` overrides
  config.engine.shard_clients (training/batched.py: the devices take runs instead)."""

  def __init__(self, config, workdir: Optional[str] = None, *, data=None, shard_clients: Optional[bool] = None):
    validate.validate_config(config)
    self.config, self.workdir = config, workdir
    # The data part; dataset_name: what summary.json, summary.md and the plot titles call the data.
    self.data, self.dataset_name = data_registry.run_data(config, data)
    validate.validate_against_data(config, self.data)
    corruption.check_files(config)   # the CIFAR-C test set is read after training: find it before training
    self.model = model_registry.get_model(config.model, self.data.num_classes, self.data.input_shape,
                                          compute_dtype=model_registry.compute_dtype(config),
                                          **config.model_kwargs.to_dict())
    self.task = tasks_lib.from_config(tasks_lib.task_of(self.data), config)  # loss and metrics (tasks/base.py)
    self.attack_report = None            # config.attack: what the label-flipping attack poisoned
    self.declared = declaration(config)  # the static declarations the build reads (ChainPlan: the chain layout)
    self.algorithm = self.build_algorithm()
    # Need 'client_groups' (H-FL): every client's group from the dataset's metadata, read when the algorithm is
    # built; the rounds then sample a fixed number of clients per group (data/sampling.stratified_ids).
    self.client_groups = self.algorithm.client_groups
    # Need 'style_clusters' (LADD): the clustering it was built with, and the FDA window that routes test images.
    self.style_clusters = self.algorithm.style_clusters
    self.style_fda_b = int(self.algorithm.hparams['fda_b']) if self.style_clusters is not None else 0
    # The sampling part and the client-state part (where a stateful algorithm's states live).
    self.sampler = sampling.RoundSampler(config, self.data.num_clients, self.client_groups)
    self.client_states = client_state.ClientStates(config, self.algorithm, self.data.num_clients, workdir)
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
    # Messages, the virtual clock (config.system) and asynchronous steps: the systems part.
    self.systems = run_part.SystemsPart(
        config, self.algorithm, self.data, cohort=self.cohort, num_steps=self.num_steps, batch_plan=self.batch_plan,
        num_params=lambda: self.num_params,
        host={'stream': self.stream, 'partial': self.placement is not None and self.placement.partial,
              'val_source': self.val_source})
    self.clock = self.systems.clock
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
    return self.build(population=self.data.num_clients, data=self.data, cluster_styles=self.cluster_styles)

  def build(self, config=None, **kwargs):
    """The algorithm of `config` (default: the run's) built with this run's model and task
    (algorithms/registry.build_algorithm); training/batched_trainer.py builds it from a config whose per-run
    values are traced."""
    return alg_registry.build_algorithm(self.config if config is None else config, self.model, task=self.task,
                                        **kwargs)

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
    """Runs this plan with a larger batch plan of the same kind (training/packing.align_plans: one program for runs
    whose client sizes differ). The padding is masked; the run's numbers are those of its own plan."""
    self.batch_plan, self.num_steps = plan, plan.num_steps
    self.systems.batch_plan, self.systems.num_steps = plan, plan.num_steps      # the clock pads to its steps

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
    """'device' | 'host' | 'disk' | None (stateless): where this run keeps its client states."""
    return self.client_states.kind(self.param_shapes)

  def initial_state(self, params=None):
    """(server state, client-state store) of round 0 from `params` (default: the fresh init); the server's key
    is stream 1 of the root key, the state replicated over the mesh when the clients are sharded."""
    params = self.fresh_params() if params is None else params
    state = self.algorithm.server_init(params, jax.random.fold_in(self.key, 1))
    if self.placement is not None:
      state = self.placement.replicate(state)
    return state, self.client_states.new(params)

  # Pure functions of the round.
  def sample_round(self, r: int) -> np.ndarray:
    """The client ids of round r (the sampling part, data/sampling.RoundSampler)."""
    return self.sampler.ids(r)

  def device_sampler(self):
    """The traceable twin of `sample_round` for the compiled multi-round block (None: uniform, 'sort')."""
    return self.sampler.device_fn()

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
    fit, reports, totals = self.systems.round_limits(r, ids)
    return batching.limit_steps(rb, fit, reports, totals)

  def num_examples(self, full_ids) -> np.ndarray:
    sizes = np.asarray(self.data.client_sizes())
    return np.where(full_ids >= 0, sizes[np.maximum(full_ids, 0)], 0).astype(np.float32)

  def client_keys(self, r, client_ids):
    return sampling.client_keys_jit(self.key, jnp.asarray(r, jnp.int32), jnp.asarray(client_ids, jnp.int32))
