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
        agg = {'weighted': mean, 'uniform': mean, 'num_clients': |C^t|, 'total_weight': N}
  eval_models(server_state) -> {name: (params, active)}   the models to evaluate ('global', 'swa', ...);
                                                           `active` is a bool array (static structure)
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
  client_weighting: the weight of a client in the 'weighted' mean: 'examples' (N_k, FedAvg) or 'uniform'
                    (1 per sampled client: pfl-research's weight_by_samples=False); config.server.weighting.

Padded steps are handled by the engine (a step whose batch is all padding leaves `local` unchanged), so
algorithms never see masks beyond the per-example mask inside the batch.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from fedjax_flat.optimizers.server import WEIGHTINGS  # noqa: F401  (client_weighting: config.server.weighting)

Params = Any


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
  name: str
  server_init: Callable
  broadcast: Callable
  client_init: Callable
  client_step: Callable
  client_final: Callable
  server_update: Callable
  eval_models: Callable
  client_state_init: Optional[Callable] = None
  initial_client_states: Optional[Callable] = None
  num_phases: int = 1
  comm_down: float = 1.0
  comm_up: float = 1.0
  client_weighting: str = 'examples'

  def replace(self, **kw) -> 'FederatedAlgorithm':
    return dataclasses.replace(self, **kw)
