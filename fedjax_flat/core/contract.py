"""The algorithm contract: a federated algorithm is a bundle of pure functions over pytrees.

In the spirit of FedJAX's `FederatedAlgorithm(init, apply)`, split into the pieces the round engine
schedules (see WORKSPACE.md for the data flow):

  server_init(params, rng)                 -> server_state
  broadcast(server_state, round, phase)    -> bcast        what every sampled client receives: a dict with
                                                           'params' and 'hparams' ({'lr', 'rho', ...}: the
                                                           server drives client hyperparameters, e.g. SWA's
                                                           cyclic lr; the client optimizer, built once, gets
                                                           them at every step), plus algorithm extras
  client_init(bcast, client_state, rng)    -> local        local training state
  client_step(bcast, local, batch, rng)    -> (local, {'loss_sum', 'count'})   one local step
  client_final(bcast, local, client_state) -> (out, client_state')
        out = {'weighted': pytree, 'uniform': pytree}: the engine reduces 'weighted' to the example-weighted
        mean (weights N_k) and 'uniform' to the plain mean over the round's clients, inside the round program
  server_update(server_state, agg, round, phase) -> server_state
        agg = {'weighted': mean, 'uniform': mean, 'num_clients': |C^t|, 'total_weight': N}   (aggregate='mean')
        agg = {'uploads': {'weighted': [C, ...], 'uniform': [C, ...]}, 'weights': [C], 'valid': [C] bool,
               'num_clients', 'total_weight'}                                             (aggregate='stacked')
  aggregate: how the engine reduces the uploads. 'mean' (default): the streaming means above, folded into running
             sums inside the scan over clients (memory O(chunk)). 'stacked': every client's upload kept, stacked
             [C, ...] over the round's padded cohort in the round's client order with the engine's weights (0 for
             padding) and validity mask (padding and non-reporting clients False), gathered across devices and
             hosts, so server_update (a robust aggregator: fedjax_flat/aggregators.py) sees the same array
             whatever the device count; memory C x the upload (docs/aggregation.md).
  eval_models(server_state) -> {name: (params, active)}   the models to evaluate ('global', 'swa', ...);
                                                           `active` is a bool array (static structure);
                                                           default (None): FedAvg's, {'global': state['params']}
  server_init, broadcast: default (None): FedAvg's, `fedavg_server_init(server_tx)` and
                          `fedavg_broadcast(hparams_fn)` (the per-round schedule of the client hyperparameters),
                          filled in by algorithms/registry.build_algorithm from its BuildContext (`with_defaults`).
                          An algorithm whose server state or broadcast is FedAvg's plus entries of its own (SCAFFOLD's
                          control variate 'c') passes `fedavg_server_init(server_tx, extra=fn(params) -> {...})`
                          and `fedavg_broadcast(hparams_fn, shared=('c',))` instead of writing them.
  client_state_init(params) -> template of one client's persistent state (None: stateless). Never-seen
                               clients start from this template (lazy zero init).
  initial_client_states(params) -> every client's initial persistent state, stacked [K, ...] over the population
                               (None: every client starts from the template). For starting points that differ
                               per client and are known when the algorithm is built (LADD: each client's style
                               cluster). A client reads its row until its state is first written; padding
                               clients (id -1) still read the template, which must have the rows' structure.
  num_phases: exchanges per round with the same clients (2 for NaiveFedGloSS, Mime's full-gradient pass).
              When > 1, client_init/client_step/client_final also receive the static keyword `phase=`.
  comm_down / comm_up: models sent server->client / client->server per client per phase (communication
                       accounting; SCAFFOLD sends 2).
  extra_passes: forward+backward passes of one local step beyond num_phases x the client optimizer's (SGD 1,
                SAM / ASAM 2: optimizers/client.gradient_passes): the step's cost on the virtual clock
                (systems/clock.py); Mime's gradient at the server model.
  client_weighting: the weight of a client in the 'weighted' mean: 'examples' (N_k, FedAvg), 'uniform'
                    (1 per sampled client: pfl-research's weight_by_samples=False) or 'capped' (min(N_k,
                    weight_cap): McMahan et al. 2018's bounded weights); config.server.weighting / weight_cap.

What the run needs to know about the algorithm travels with it (set by algorithms/registry.build_algorithm
from the declarations, passed through by the wrappers), so no layer above asks the registry by name:
  name            the registered name; `wrappers` the server / client wrappers applied in order ('swa', 'wima',
                  'localnorm'); `label` = 'name+wrapper+...' (summaries, plot titles)
  needs, hparams  the declared needs and the algorithm's own hyperparameters (config.algo over the defaults)
  upload          what client_final sends (UPLOADS): 'delta' = the model delta alone, which DP, compression and
                  the robust aggregators act on; 'other' (the default) = anything else, which they refuse
  round_log       fn(t) -> {name: float}: schedule values written with each evaluation record (FedGloSS), or None
  reported_models the models reported instead of 'global' once evaluated, first preferred (('wima', 'swa'))
  personalizer    Personalizer(name, fn(algorithm, server_state, client_state) -> params): a client's personal
                  model (FedSoup, local normalization); None = the global model (algorithms/personalization.py)
  counters        fn(server_state) -> {name: scalar}: message counters kept in the server state (H-FL), or None
  val_source      'val' | 'local_test': each client's validation examples appended to the round batches (FedSoup)
  client_groups   {'labels': int [K], 'per_group': int, ...}: the rounds sample per_group clients of every group
  style_clusters  the clients' FDA style clusters the algorithm was built with (LADD; routed evaluation)
  chain           ChainSpec: a chain algorithm (FedSeq family) run by training/chain_loop.py
  asynchronous    AsyncSpec: server steps on client arrivals (FedBuff, FedAsync) run by training/driver.AsyncDriver
  local_batch_stats  BatchNorm statistics stay on the clients (FedBN, SiloBN: test-time 'batch' policy)

Per-run values (batched runs, core/runs.py): a builder reads its numbers from the config, and in a batched
program the config's VALUE_FIELDS (client lr / rho / momentum / weight decay / ASAM eta, server lr / momentum,
SWA lrs) are traced per-run values (`RunValue`). A builder uses them as values (arithmetic, jnp, optax) and
never turns them into Python numbers (float(), int(), comparisons: algorithms/common.run_value keeps a value
as it is); only the zero / non-zero truth of STATIC_TRUTH fields may choose the program's structure. A builder
that breaks the rule, or needs what a batched program does not give it (H-FL's client groups, LADD's style
clusters), is refused in one line before compiling (training/batched_trainer.BatchRefused); tests/training/
test_batched_every_algorithm.py holds every registered algorithm to it.

Padded steps are handled by the engine (a step whose batch is all padding leaves `local` unchanged), so
algorithms never see masks beyond the per-example mask inside the batch.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, FrozenSet, Mapping, Optional, Tuple

import jax.numpy as jnp

from fedjax_flat.optimizers.server import WEIGHTINGS  # noqa: F401  (client_weighting: config.server.weighting)

AGGREGATES = ('mean', 'stacked')   # FederatedAlgorithm.aggregate: streaming means | stacked uploads
# FederatedAlgorithm.upload: what client_final sends. 'delta': exactly {'weighted': {'delta': w^t - w_k}, 'uniform':
# {}}, the model delta alone (the features that act on a delta -- DP's clip, compression, robust aggregators --
# run with it); 'other': anything else (control variates, duals, normalized directions, slots), which they refuse.
UPLOADS = ('delta', 'other')

Params = Any


def fedavg_server_init(server_tx, extra: Optional[Callable] = None) -> Callable:
  """FedAvg's server_init: the params and the server optimizer's state (the contract's default server state),
  plus `extra(params)` -> {name: array}: the algorithm's own entries (SCAFFOLD's 'c'), when given."""
  def server_init(params, rng):
    del rng
    state = {'params': params, 'opt_state': server_tx.init(params)}
    return state if extra is None else {**state, **extra(params)}
  return server_init


def fedavg_broadcast(hparams_fn, shared: Tuple[str, ...] = (), model: Optional[Callable] = None,
                     extra: Optional[Callable] = None) -> Callable:
  """FedAvg's broadcast: the global params and the round's client hyperparameters (the per-round schedule), plus
  the server state's entries named in `shared`, sent as they are (SCAFFOLD's control variate 'c').

  model(state, round_idx): the params the clients start from instead of state['params'] (a lookahead, a
  perturbed point); extra(state, round_idx) -> dict: more entries the clients read (an estimate, a switch)."""
  shared = tuple(shared)

  def broadcast(state, round_idx, phase=0):
    del phase
    params = state['params'] if model is None else model(state, round_idx)
    more = {} if extra is None else extra(state, round_idx)
    return {'params': params, 'hparams': hparams_fn(round_idx), **{k: state[k] for k in shared}, **more}
  return broadcast


def global_model(state):
  """FedAvg's eval_models: the server state's 'params', always active (the contract's default)."""
  return {'global': (state['params'], jnp.bool_(True))}


@dataclasses.dataclass(frozen=True)
class ChainSpec:
  """How a chain algorithm (FedSeq family, algorithms/fedseq.py) lays out its chains; declared with the algorithm
  (`register(..., chain=ChainSpec(...))`) and read by training/chain_loop.py instead of names."""
  over: str = 'superclients'   # 'superclients': chains of sampled superclients; 'clients': one chain of sampled clients
  regroup: bool = False        # regroup on the growth schedule f_gr(t) (FedSeq2Par)
  slots: bool = False          # a persistent model slot per lane, one chain per lane (FedAsyncSeq)
  auto_lanes: str = 'sampled'  # algo.lanes=0: 'sampled' = C N_S lanes, 'one' = a single lane (FedSeq2Par)


@dataclasses.dataclass(frozen=True)
class AsyncSpec:
  """An asynchronous algorithm (FedBuff, FedAsync; training/driver.AsyncDriver runs it on the event simulation of
  systems/events.py): a server step every `buffer` arrivals, `concurrency` clients training at once (0: the
  config's clients_per_round), arrivals staler than `max_staleness` discarded. `models_at(state, versions [K])`
  -> the stacked models [K, ...] the arrivals started from (the server state's ring of the last max_staleness + 1
  models). server_update(state, {'delta': [K, ...], 'staleness': [K], 'valid': [K]}, t) is the server step."""
  buffer: int
  concurrency: int
  max_staleness: int
  models_at: Callable


@dataclasses.dataclass(frozen=True)
class Personalizer:
  """A client's personal model: fn(algorithm, server_state, client_state or None) -> params; `name` is reported.
  Traceable in the client state (a choice on its values made with jnp.where, not a Python branch): the client
  evaluation maps it over the clients' stacked states in one program (training/evals/client_eval.py)."""
  name: str
  fn: Callable


# The default of the four client / server functions, which an algorithm must give (positionally or by keyword):
# a default at all only so that server_init and broadcast before them can default to FedAvg's.
class _Required:
  def __repr__(self):
    return '<required>'


_REQUIRED = _Required()
_REQUIRED_FIELDS = ('client_init', 'client_step', 'client_final', 'server_update')


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
  name: str
  server_init: Optional[Callable] = None   # None: FedAvg's (fedavg_server_init), filled in by `with_defaults`
  broadcast: Optional[Callable] = None     # None: FedAvg's (fedavg_broadcast), filled in by `with_defaults`
  client_init: Callable = _REQUIRED
  client_step: Callable = _REQUIRED
  client_final: Callable = _REQUIRED
  server_update: Callable = _REQUIRED
  eval_models: Optional[Callable] = None   # None: FedAvg's, the global model `state['params']` (global_model)
  client_state_init: Optional[Callable] = None
  initial_client_states: Optional[Callable] = None
  num_phases: int = 1
  comm_down: float = 1.0
  comm_up: float = 1.0
  extra_passes: float = 0.0
  client_weighting: str = 'examples'
  weight_cap: float = 0.0
  aggregate: str = 'mean'          # 'mean' | 'stacked' (AGGREGATES; see the module docstring)
  upload: str = 'other'            # 'delta' | 'other' (UPLOADS): declared with the algorithm (registry `upload=`)
  # What the run needs (see the module docstring); defaults: a plain stateless algorithm.
  wrappers: Tuple[str, ...] = ()
  needs: FrozenSet[str] = frozenset()
  hparams: Optional[Mapping[str, Any]] = None
  round_log: Optional[Callable] = None
  reported_models: Tuple[str, ...] = ()
  personalizer: Optional[Personalizer] = None
  counters: Optional[Callable] = None
  val_source: Optional[str] = None
  client_groups: Any = None
  style_clusters: Any = None
  chain: Optional[ChainSpec] = None
  local_batch_stats: bool = False
  asynchronous: Optional[AsyncSpec] = None   # FedBuff, FedAsync: server steps on arrivals (see AsyncSpec)

  def __post_init__(self):
    missing = [f for f in _REQUIRED_FIELDS if getattr(self, f) is _REQUIRED]
    if missing:
      raise TypeError(f'FederatedAlgorithm {self.name!r}: missing {", ".join(missing)} (core/contract.py)')
    if self.upload not in UPLOADS:
      raise ValueError(f'FederatedAlgorithm {self.name!r}: upload={self.upload!r}, one of {UPLOADS}')
    if self.eval_models is None:     # the contract's default: most algorithms evaluate only their global model
      object.__setattr__(self, 'eval_models', global_model)

  @property
  def label(self) -> str:
    """'name+wrapper+...': how summaries and plots name the run's algorithm."""
    return '+'.join((self.name,) + tuple(self.wrappers))

  def replace(self, **kw) -> 'FederatedAlgorithm':
    return dataclasses.replace(self, **kw)

  def with_defaults(self, server_tx, hparams_fn) -> 'FederatedAlgorithm':
    """This algorithm with FedAvg's server_init (from `server_tx`) and broadcast (`hparams_fn`: round -> the
    client hyperparameters) where it leaves them None; itself when it gives both."""
    fill = {}
    if self.server_init is None:
      fill['server_init'] = fedavg_server_init(server_tx)
    if self.broadcast is None:
      fill['broadcast'] = fedavg_broadcast(hparams_fn)
    return self.replace(**fill) if fill else self
