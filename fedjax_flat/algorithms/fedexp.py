"""FedExP (Jhunjhunwala, Wang, Joshi, ICLR 2023): FedAvg with a server step size extrapolated from the clients'
own updates, the adaptive step that projection-onto-convex-sets methods take.

  server sends w^t
  client i: local steps of the client optimizer from w^t -> w_i;   Delta_i = w^t - w_i
  Delta = (1/M) sum_i Delta_i                                        (the uniform mean over the M clients)
  eta_g = max(1, (1/M) sum_i ||Delta_i||^2 / (2 (||Delta||^2 + eps)))
  w^{t+1} = w^t - eta_g Delta                                        (through the server optimizer: SGD lr 1 = this)

eta_g >= 1 always: FedExP never steps less than FedAvg, and much more when the clients' updates agree in size
but not in direction (||Delta|| small against their mean square norm). The iterates oscillate, so the paper
evaluates the mean of the last two, (w^t + w^{t+1}) / 2: reported here as the model 'last2' beside 'global'.
The server state keeps that round's eta_g ('eta_g'), so a run's step sizes are in its checkpoints.
"""
from __future__ import annotations

import jax.numpy as jnp
import optax

from fedjax_flat.algorithms.common import global_norm, tmap, tree_sub
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.hparams import Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm


def server_step_size(mean_sq_norm, mean_delta, eps):
  """eta_g = max(1, mean_i ||Delta_i||^2 / (2 (||mean_i Delta_i||^2 + eps)))."""
  return jnp.maximum(1.0, mean_sq_norm / (2.0 * (jnp.square(global_norm(mean_delta)) + eps)))


@register('fedexp', hparams={'eps': Number(1e-3, lo=0)})
def fedexp(ctx) -> FederatedAlgorithm:
  """FedAvg whose server extrapolates by eta_g from the clients' uniform mean update."""
  eps = ctx.hp['eps']
  server_tx = ctx.server_tx
  base = fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, server_tx)

  def server_init(params, rng):
    return {**base.server_init(params, rng), 'previous': params, 'eta_g': jnp.float32(1.0)}

  def client_final(bcast, local, client_state):
    del bcast
    delta = tree_sub(local.init_params, local.params)
    return {'weighted': {}, 'uniform': {'delta': delta, 'sq_norm': jnp.square(global_norm(delta))}}, client_state

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    mean = agg['uniform']['delta']
    eta = server_step_size(agg['uniform']['sq_norm'], mean, eps)
    updates, opt_state = server_tx.update(tmap(lambda d: eta * d, mean), state['opt_state'], state['params'])
    return {'params': optax.apply_updates(state['params'], updates), 'opt_state': opt_state,
            'previous': state['params'], 'eta_g': eta.astype(jnp.float32)}

  def eval_models(state):
    last2 = tmap(lambda a, b: 0.5 * (a + b), state['params'], state['previous'])
    return {'global': (state['params'], jnp.bool_(True)), 'last2': (last2, jnp.bool_(True))}

  return base.replace(server_init=server_init, client_final=client_final, server_update=server_update,
                      eval_models=eval_models)
