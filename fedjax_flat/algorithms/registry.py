"""The algorithm registry: each algorithm declares, where it is defined, everything the rest of the package
needs to know about it; and the builder that composes an algorithm from config.

Adding an algorithm = its module in this package + its test (+ a config); nothing else changes:

    @register('fednova', hparams={'mu': Number(0.0, lo=0)},     # config.algo.* rules and defaults (hparams.py)
              client_optimizers=('sgd', 'sam', 'asam'),          # allowed client.optimizer (None: any)
              needs=('population',),                              # see NEEDS
              check=my_check, check_data=my_check_data)           # optional cross-field rules and warnings
    def fednova(ctx: BuildContext) -> FederatedAlgorithm: ...

The module is imported on the first lookup (fedjax_flat/registry.py walks the package). The contract:
  hparams            {name: Rule}: the ONLY hyperparameters config.algo may hold; their defaults fill config.algo
                     (`default_hparams`, `--config.algo.<k>=<v>` in config/algo_flags.py)
  client_optimizers  client.optimizer values the algorithm works with; anything else is a ConfigError
  upload             what its client_final sends (core/contract.UPLOADS): 'delta' = exactly the model delta, which
                     the features acting on a delta (DP, compression, robust aggregators: algorithms/features.py)
                     need; 'other' (the default) = anything else, which they refuse in one line
  needs              what the algorithm relies on, read by the central code instead of lists of names:
                       'population'        scales by N: algo.population must be the dataset's (checked on the data)
                       'static_population' N sizes its arrays (FedFomo's per-client slots): a batched program
                                           gives it a Python int, so only runs of equal N share one
                                           (training/packing.pack_key; other algorithms read a lane's traced N)
                       'chains'            runs sequential chains (training/chain_loop.py); algo.fraction samples
                       'client_state'      persistent per-client state (core/client_state.py)
                       'validation'        per-client validation examples in the round batches
                       'batch_stats'       BatchNorm statistics averaged through the FedAvg pseudo-gradient
                       'local_batch_stats' BatchNorm statistics kept on the clients
                       'style_clusters'    the clients clustered by their FDA styles before it is built (LADD,
                                           grouping/style_clusters.cluster_clients, by the trainer from the
                                           algorithm's hparams k_min, k_max, force_k, fda_b): ctx.client_clusters
                       'client_groups'     each client's group from the dataset's per-client metadata
                                           (data.client_groups[algo.group_by], e.g. FedVPR's city / continent),
                                           read by the trainer before the algorithm is built: ctx.client_groups;
                                           the trainer samples algo.clients_per_group clients of every group a
                                           round (data/sampling.stratified_ids; H-FL)
                       'client_ids'        each step's batch carries the client's id, batch['client'] (per-client
                                           slots on the server: FedFomo)
                       'client_domains'    with algo.domains='kmeans': each client's domain from k-means on
                                           locally trained client models, written into the training labels'
                                           domain column before training (training/trainers.py,
                                           grouping/domains.py; FedCG)
                       'domain_assignments' its server model assigns every test example to one of its domains
                                           (FedCG's student: fedcg.domain_assignments), which the 'domains'
                                           evaluation plug-in reports (training/evals/domains.py)
  check(cfg, hp)     static cross-field rules of this algorithm (hp = defaults over config.algo); raises
                     ConfigError, may log warnings; runs in config/validate.validate_config, before any data
  check_data(cfg, hp, data)  the same once the data are loaded (config/validate.validate_against_data)
  client_groups(data, hp) -> {'labels': int [K], 'per_group': int, ...}   with need 'client_groups': the
                     clients' groups from the dataset's metadata, read by the trainer (ctx.client_groups)
  round_log(cfg, hp) -> fn(t) -> {name: float}   optional: the algorithm's schedule values at 0-based round t
                     (FedGloSS's server radius), written with each evaluation record (metrics.jsonl, TensorBoard)

declared(config) -> Declared: the static declarations (spec, hp = config.algo over the defaults) of the configured
algorithm: the ONE lookup by name the layers above make before the algorithm is built (config validation, the
choice of trainer, the chain trainer's plan, a saved config's implicit defaults); once built, everything the run
needs is read from the FederatedAlgorithm itself (core/contract.py: needs, hparams, round log, personalizer,
counters, validation source, client groups, style clusters, chain spec), which the wrappers pass through.

build_algorithm(config, model):
  loss    = the task's loss (+ MAN when config.man.zeta > 0)                algorithms/local.py, tasks/base.py
  client  = SGD | SAM | ASAM optimizer chain, built once; hparams per step   optimizers/client.py
  server  = optax transform on the pseudo-gradient                         optimizers/server.py
  base    = the registered builder (ctx)                                   one module per algorithm
            (server_init / broadcast it leaves None: FedAvg's, from ctx.server_tx and ctx.hparams_fn)
  then the features the config turns on, in their order: compression, robust aggregation, DP, SWA, WiMA
                                                                           algorithms/features.py, wrappers/
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Tuple

from fedjax_flat.algorithms import hparams as hparams_lib
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms import features
from fedjax_flat.core.batch_stats import average_batch_stats
from fedjax_flat.core.contract import UPLOADS, ChainSpec, FederatedAlgorithm
from fedjax_flat.core.runs import RunValue
from fedjax_flat.data import validation_steps
from fedjax_flat.errors import BadInputError, ConfigError
from fedjax_flat.optimizers.server import make_server_tx
from fedjax_flat.registry import Registry

ALGORITHMS = Registry('algorithm', package='fedjax_flat.algorithms')

NEEDS = ('population', 'static_population', 'chains', 'client_state', 'validation', 'batch_stats',
         'local_batch_stats', 'style_clusters', 'client_groups', 'client_ids', 'client_domains',
         'domain_assignments')
CLIENT_OPTIMIZERS = ('sgd', 'sam', 'asam')


@dataclasses.dataclass(frozen=True)
class BuildContext:
  """What an algorithm builder gets: the model, the loss, the optimizers, the round's client hyperparameters and
  the algorithm's own, each resolved once in build_algorithm, and the whole config (for what only this
  algorithm reads). The registered builder is the one place that reads it: inner builders take values."""
  model: Any
  loss_fn: Callable
  client_cfg: Any
  server_tx: Any
  client_tx: Any             # the client optimizer (optimizers/client.client_optimizer), built once
  config: Any
  population: int = 0        # N, the dataset's number of clients (0 = unknown: config.data.num_clients); in a
                             # batched program of runs with other populations, the lane's traced N (a RunValue)
  task: Any = None           # the dataset's task (fedjax_flat/tasks/base.py); None = classification
  chain: Any = None          # chain algorithms (algorithms/fedseq.py): their plan from the chain trainer
  client_clusters: Any = None  # need 'style_clusters': the trainer's StyleClustering (grouping/style_clusters.py)
  client_groups: Any = None    # need 'client_groups': int [K] group id of every client (the dataset's metadata)
  name: str = ''               # the registered name: the built algorithm's label
  hp: Mapping[str, Any] = dataclasses.field(default_factory=dict)   # config.algo over the declared defaults
  hparams_fn: Optional[Callable] = None   # round -> the broadcast client hparams {'lr', 'rho'} (the schedule)

  @property
  def algo(self):
    return self.config.algo

  @property
  def hparams(self) -> Mapping[str, Any]:
    """The algorithm's hyperparameters (the same as `hp`)."""
    return self.hp


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One registered algorithm: its builder and its declarations (see the module docstring)."""
  name: str
  build: Callable[[BuildContext], FederatedAlgorithm]
  hparams: Mapping[str, hparams_lib.Rule]
  client_optimizers: Optional[Tuple[str, ...]]
  needs: FrozenSet[str]
  check: Optional[Callable] = None
  check_data: Optional[Callable] = None
  round_log: Optional[Callable] = None
  client_groups: Optional[Callable] = None
  chain: Optional[ChainSpec] = None
  upload: str = 'other'

  def defaults(self) -> Dict[str, Any]:
    return hparams_lib.defaults(self.hparams)

  def hp(self, cfg) -> Dict[str, Any]:
    """config.algo over the declared defaults."""
    return {**self.defaults(), **cfg.algo.to_dict()}

  def validate(self, cfg) -> None:
    """Names, rules, client optimizer, then the algorithm's own cross-field check."""
    for k in cfg.algo.keys():
      if k not in self.hparams:
        raise ConfigError(f'algo.{k}', cfg.algo[k], f'not a hyperparameter of algorithm {self.name!r}; '
                          f'its hyperparameters: {sorted(self.hparams)}')
    hp = self.hp(cfg)
    hparams_lib.check(self.hparams, hp)
    allowed = self.client_optimizers
    if allowed is not None and cfg.client.optimizer not in allowed:
      raise ConfigError('client.optimizer', cfg.client.optimizer,
                        f'{self.name} needs a sharpness-aware client: allowed values {list(allowed)}')
    if self.check is not None:
      self.check(cfg, hp)

  def validate_data(self, cfg, data) -> None:
    hp = self.hp(cfg)
    src = validation_steps.round_validation_source(cfg, self.defaults())
    if src:                                  # FedSoup's validation split must exist in the data
      validation_steps.check_validation_data(data, src)
    if 'population' in self.needs:
      check_population(cfg, data)
    if self.check_data is not None:
      self.check_data(cfg, hp, data)


def check_population(cfg, data) -> None:
  """Algorithms that scale by the population N (SCAFFOLD, FedDyn, FedSMOO, FedGamma, ...): the N they are
  given (algo.population, else data.num_clients) must be the dataset's."""
  pop = int(cfg.algo.get('population', 0) or 0)
  field = 'algo.population'
  if not pop:
    pop, field = int(cfg.data.get('num_clients', 0) or 0), 'data.num_clients'
    if not pop:
      return                     # neither set: the algorithm takes N from the dataset (BuildContext.population)
  if pop != data.num_clients:
    raise ConfigError(field, pop or None, f'{cfg.algorithm} needs the population N = {data.num_clients} clients '
                      f'of the data: set algo.population={data.num_clients}')


def register(name: str, hparams: Optional[Mapping[str, hparams_lib.Rule]] = None, *,
             client_optimizers: Optional[Tuple[str, ...]] = None, needs: Tuple[str, ...] = (),
             check: Optional[Callable] = None, check_data: Optional[Callable] = None,
             round_log: Optional[Callable] = None, client_groups: Optional[Callable] = None,
             chain: Optional[ChainSpec] = None, upload: str = 'other', replace: bool = False):
  """Registers `fn(ctx) -> FederatedAlgorithm` as algorithm `name` with its declarations. A name that is taken by
  another definition is refused (registry.DuplicateName) unless `replace=True`."""
  rules = dict(hparams or {})
  for k, r in rules.items():
    if not isinstance(r, hparams_lib.Rule):
      raise TypeError(f'algorithm {name!r}: hyperparameter {k!r} must be declared with a rule of '
                      f'algorithms/hparams.py (Number, Integer, Flag, Choice, Population), got {r!r}')
  bad = set(needs) - set(NEEDS)
  if bad:
    raise ValueError(f'algorithm {name!r}: unknown needs {sorted(bad)}; known: {list(NEEDS)}')
  if ('client_groups' in needs) != (client_groups is not None):
    raise ValueError(f"algorithm {name!r}: need 'client_groups' and a client_groups(data, hp) go together")
  if ('chains' in needs) != (chain is not None):
    raise ValueError(f"algorithm {name!r}: need 'chains' and a chain=ChainSpec(...) go together")
  if upload not in UPLOADS:
    raise ValueError(f'algorithm {name!r}: upload={upload!r}; one of {UPLOADS} (core/contract.py)')
  if client_optimizers is not None and not set(client_optimizers) <= set(CLIENT_OPTIMIZERS):
    raise ValueError(f'algorithm {name!r}: client_optimizers {client_optimizers} not in {CLIENT_OPTIMIZERS}')

  def deco(fn):
    spec = AlgorithmSpec(name, fn, rules, None if client_optimizers is None else tuple(client_optimizers),
                         frozenset(needs), check, check_data, round_log, client_groups, chain, upload)
    ALGORITHMS.register(name, spec=spec, replace=replace)(fn)
    return fn
  return deco


@dataclasses.dataclass(frozen=True)
class Declared:
  """The configured algorithm's static declarations, resolved once from the config (`declared`)."""
  spec: AlgorithmSpec
  hp: Mapping[str, Any]        # config.algo over the declared defaults

  @property
  def name(self) -> str:
    return self.spec.name

  @property
  def needs(self) -> FrozenSet[str]:
    return self.spec.needs

  @property
  def chain(self) -> Optional[ChainSpec]:
    return self.spec.chain

  @property
  def upload(self) -> str:
    return self.spec.upload

  def defaults(self) -> Dict[str, Any]:
    return self.spec.defaults()


def declared(config) -> Optional[Declared]:
  """The declarations of config.algorithm (a config, or a name: the defaults alone); None for a name that is not
  registered ('' or a typo: config validation reports those)."""
  name = config if isinstance(config, str) else config.get('algorithm', '')
  if name not in ALGORITHMS:
    return None
  s = spec(name)
  return Declared(s, s.defaults() if isinstance(config, str) else s.hp(config))


def names():
  return ALGORITHMS.names()


def spec(name: str) -> AlgorithmSpec:
  return ALGORITHMS.meta(name, 'spec')


def name_of(builder: Callable) -> Optional[str]:
  """The name a builder function is registered under (None: not registered)."""
  return next((n for n in names() if ALGORITHMS.get(n) is builder), None)


def needs(name: str) -> FrozenSet[str]:
  """The declared needs of `name`; empty for a name that is not registered (e.g. '' or a typo: the
  validator reports those)."""
  return spec(name).needs if name in ALGORITHMS else frozenset()


def client_groups(config, data):
  """The clients' groups of an algorithm with need 'client_groups' (its registered client_groups(data, hp))."""
  s = spec(config.algorithm)
  return s.client_groups(data, s.hp(config))


def with_need(need: str):
  """The registered algorithms that declare `need`, sorted."""
  return [n for n in names() if need in spec(n).needs]


def round_logger(config) -> Optional[Callable[[int], Dict[str, float]]]:
  """fn(t) -> the algorithm's logged schedule values at 0-based round t, or None (nothing declared)."""
  if config.algorithm not in ALGORITHMS or spec(config.algorithm).round_log is None:
    return None
  s = spec(config.algorithm)
  return s.round_log(config, s.hp(config))


def default_hparams(name: str) -> dict:
  """The declared defaults of `name` ({} for a name that is not registered)."""
  return spec(name).defaults() if name in ALGORITHMS else {}


def _short_repr(v, n: int = 60) -> str:
  text = ' '.join(repr(v).split())
  return f'{type(v).__name__} {text[:n] + "..." if len(text) > n else text}' if v is not None else 'None'


def build_algorithm(config, model, population: int = 0, task=None, chain=None,
                    client_clusters=None, client_groups=None, data=None, cluster_styles=None) -> FederatedAlgorithm:
  """The configured algorithm, built once, carrying what the run needs (core/contract.py).

  data: the training data, from which an algorithm with need 'client_groups' reads its clients' groups (unless
  `client_groups` is given). cluster_styles(ks=, force_k=, b=) -> StyleClustering: the clustering of the data's
  FDA styles (grouping/style_clusters.cluster_clients, bound by the trainer to the data and the seed) that an
  algorithm with need 'style_clusters' is built with, from its hparams k_min..k_max, force_k, fda_b (unless
  `client_clusters` is given).
  """
  name = config.algorithm
  if name not in ALGORITHMS:
    raise ValueError(f'algorithm={name!r} is unknown; allowed: {names()}')
  s = spec(name)
  hp = s.hp(config)
  if 'client_groups' in s.needs and client_groups is None and data is not None:
    client_groups = s.client_groups(data, hp)
  if 'style_clusters' in s.needs and client_clusters is None and cluster_styles is not None:
    client_clusters = cluster_styles(ks=range(int(hp['k_min']), int(hp['k_max']) + 1), force_k=int(hp['force_k']),
                                     b=int(hp['fda_b']))
  man = local_lib.man_coefficient(config.man.zeta, config.man.get('convention', 'paper'))   # config.man
  loss_fn = local_lib.make_loss(model, man_zeta=man, task=task,
                                microbatches=int(config.client.get('microbatches', 1)))
  server_tx = make_server_tx(config.server)
  if getattr(model, 'batch_stats', False):   # BatchNorm statistics: averaged, not optimized (core/batch_stats.py)
    server_tx = average_batch_stats(server_tx)
  client_tx, hparams_fn = client_parts(config.client)     # the client optimizer and the round's schedule, once
  ctx = BuildContext(model=model, loss_fn=loss_fn, client_cfg=config.client, server_tx=server_tx,
                     client_tx=client_tx, config=config,
                     population=population if isinstance(population, RunValue) else int(population), task=task,
                     chain=chain, client_clusters=client_clusters,
                     client_groups=client_groups, name=name, hp=types.MappingProxyType(hp), hparams_fn=hparams_fn)
  alg = s.build(ctx)
  if not isinstance(alg, FederatedAlgorithm):     # a researcher's builder that forgot its `return`
    where = getattr(s.build, '__qualname__', repr(s.build))
    raise BadInputError(f'the builder {where}() of algorithm {name!r} returned {_short_repr(alg)}: a builder '
                        'must return a FederatedAlgorithm (fedjax_flat.FederatedAlgorithm, core/contract.py), e.g. '
                        '`return fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)`')
  # server_init / broadcast left None: FedAvg's, from this run's server optimizer and client schedule
  alg = alg.with_defaults(ctx.server_tx, ctx.hparams_fn)
  alg = alg.replace(name=name, needs=s.needs, upload=s.upload, hparams=hp, chain=s.chain, client_groups=client_groups,
                    style_clusters=client_clusters, local_batch_stats='local_batch_stats' in s.needs,
                    round_log=None if s.round_log is None else s.round_log(config, hp),
                    val_source=validation_steps.round_validation_source(config, s.defaults()))
  # The features the config turns on (compression, robust aggregation, DP, SWA, WiMA: algorithms/features.py), each
  # wrapping the algorithm in its declared order.
  alg = features.wrap(alg, config, features.WrapContext(population=population, data=data, model=model))
  # Last, so that no wrapper drops it: the engine reads it when it builds the round program.
  return alg.replace(client_weighting=config.server.get('weighting', 'examples'),
                     weight_cap=float(config.server.get('weight_cap', 0.0)))
