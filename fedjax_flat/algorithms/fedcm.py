"""FedCM: client-level momentum (Xu et al. 2021), as in the GHBM code of the thesis' group. 2x down, 1x up.

  server state: x, d = previous round's average per-step pseudo-gradient (init 0)
  server sends x and d                                                      (comm_down = 2)
  client k, y <- x, each step:  v = alpha_CM grad f_B(y) [SAM/ASAM: at the ascent point] + (1 - alpha_CM) d
                                y <- y - lr (v + wd y)                      (weight decay not scaled)
  sends y_k; server: Delta = sum_k (N_k/N)(x - y_k);  x <- ServerOpt(x, Delta)
          d <- sum_k (N_k/N) (x - y_k) / (lr K_k)                           K_k = valid local steps of client k

The paper's Delta_{r+1} = (1/(lr K |S|)) sum (x - y_k) with a common K; here each client divides by its own
number of steps (GHBM divides the server's pseudo-gradient by lr times the receiving client's steps; the two
agree when clients have equal sizes). alpha_CM scales the data gradient through the loss (alpha_CM * f), so
SAM's ascent direction is unchanged and weight decay stays at wd. Grid: alpha_CM in {0.05, 0.1, 0.5}.
"""
from __future__ import annotations

import jax.numpy as jnp
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import tmap
from fedjax_flat.algorithms.hparams import Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init


@register('fedcm', hparams={'alpha': Number(0.1, lo=0, lo_open=True, hi=1)})
def fedcm(ctx) -> FederatedAlgorithm:
  alpha = float(ctx.hp['alpha'])
  loss_fn, server_tx, tx = ctx.loss_fn, ctx.server_tx, ctx.client_tx

  def scaled_loss(p, batch, rng=None):
    loss, aux = loss_fn(p, batch, rng)
    return alpha * loss, aux

  # FedAvg's server state and broadcast, plus the server's direction d, sent to the clients
  server_init = fedavg_server_init(server_tx, lambda p: {'d': tmap(jnp.zeros_like, p)})
  broadcast = fedavg_broadcast(ctx.hparams_fn, shared=('d',))

  def client_init(bcast, cs, rng):
    del cs, rng
    x = bcast['params']
    return local_lib.LocalState(x, tx.init(x), x, {'steps': jnp.zeros((), jnp.float32)})

  def client_step(bcast, local, batch, rng):
    corr = tmap(lambda d: (1.0 - alpha) * d, bcast['d'])
    new, m = local_lib.local_step(local, batch, rng, loss_fn=scaled_loss, tx=tx, hparams=bcast['hparams'],
                                  correction=corr)
    return new._replace(extra={'steps': local.extra['steps'] + 1.0}), m

  def client_final(bcast, local, cs):
    delta = tmap(lambda a, b: a - b, local.init_params, local.params)
    k_lr = jnp.maximum(local.extra['steps'], 1.0) * bcast['hparams']['lr']
    return {'weighted': {'delta': delta, 'd': tmap(lambda x: x / k_lr, delta)}, 'uniform': {}}, cs

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    updates, opt_state = server_tx.update(agg['weighted']['delta'], state['opt_state'], state['params'])
    return {**state, 'params': optax.apply_updates(state['params'], updates), 'opt_state': opt_state,
            'd': agg['weighted']['d']}

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, comm_down=2.0, comm_up=1.0)
