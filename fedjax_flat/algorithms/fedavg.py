"""FedAvg / FedOpt (McMahan et al. 2017; Reddi et al. 2021).

  server sends w^t                                     (plus the round's client hparams)
  client k: E local epochs of the client optimizer from w^t -> w_k
  Delta = sum_k (N_k / N) (w^t - w_k)                  (pseudo-gradient; example-weighted mean)
  w^{t+1} = ServerOpt(w^t, Delta)                      (SGD lr 1: w^{t+1} = sum_k (N_k/N) w_k)

With client optimizer SAM / ASAM this is FedSAM / FedASAM (the server stays FedAvg).
"""
from __future__ import annotations

import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import tree_sub
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init


def fedavg(model, loss_fn, client_tx: optax.GradientTransformation, hparams_fn,
           server_tx: optax.GradientTransformation) -> FederatedAlgorithm:
  """client_tx: the client optimizer (optimizers/client.client_optimizer, built once); hparams_fn: round -> the
  broadcast client hparams {'lr', 'rho'} (optimizers/schedules.client_round_hparams). The built algorithm's
  name is the registered one (registry.build_algorithm)."""
  del model   # FedAvg reads the model only through loss_fn
  tx = client_tx

  server_init = fedavg_server_init(server_tx)
  broadcast = fedavg_broadcast(hparams_fn)

  def client_init(bcast, client_state, rng):
    del client_state, rng
    return local_lib.LocalState(bcast['params'], tx.init(bcast['params']), bcast['params'])

  def client_step(bcast, local, batch, rng):
    return local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'])

  def client_final(bcast, local, client_state):
    del bcast
    return {'weighted': {'delta': tree_sub(local.init_params, local.params)}, 'uniform': {}}, client_state

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    updates, opt_state = server_tx.update(agg['weighted']['delta'], state['opt_state'], state['params'])
    return {**state, 'params': optax.apply_updates(state['params'], updates), 'opt_state': opt_state}

  return FederatedAlgorithm('', server_init, broadcast, client_init, client_step, client_final,
                            server_update)


@register('fedavg', needs=('batch_stats',), upload='delta')
def _fedavg(ctx):
  """FedAvg, and FedOpt (FedAvgM, FedAdam, FedAdagrad, FedYogi) through config.server."""
  return fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)
