"""FedDyn (Acar et al., ICLR 2021, Algorithm 1). Stateful clients, 1x communication.

  server state: theta, h (init 0);  client state: g_k = grad L_k(theta_k) of its last round (init 0)
  server sends theta^{t-1}
  client k minimizes  L_k(theta) - <g_k, theta> + (alpha/2) ||theta - theta^{t-1}||^2  with the client
  optimizer:   g <- grad f_B(theta) [SAM/ASAM: at the ascent point] - g_k + alpha (theta - theta^{t-1})
               (local_step `correction`; config.client.grad_clip, e.g. 30, clips this whole gradient)
  g_k <- g_k - alpha (theta_k - theta^{t-1})
  server: h <- h - alpha (1/N) sum_{k in S} (theta_k - theta^{t-1})       N = population
          theta^t = (1/|S|) sum_{k in S} theta_k - h / alpha
          (= ServerOpt(theta^{t-1}, theta^{t-1} - target), exact with server SGD lr 1)

Plain means over the round's clients, as in the paper. FedDyn+SAM / FedDyn+ASAM (thesis Tables 4.8, 4.15):
client.optimizer 'sam' / 'asam'. Grids: alpha in {0.01, 0.001} (Ch. 4), {1e-3, 1e-2, 0.1} (FedSeq, clip 30).
"""
from __future__ import annotations

import jax.numpy as jnp

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import population, server_step_to, tmap
from fedjax_flat.algorithms.hparams import Number, Population
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_server_init


@register('feddyn', hparams={'alpha': Number(0.01, lo=0, lo_open=True), 'population': Population()},
          needs=('population', 'client_state'))
def feddyn(ctx) -> FederatedAlgorithm:
  hp = ctx.hp
  alpha, n_pop = float(hp['alpha']), population(ctx, hp)
  loss_fn, server_tx, tx = ctx.loss_fn, ctx.server_tx, ctx.client_tx
  server_init = fedavg_server_init(server_tx, lambda p: {'h': tmap(jnp.zeros_like, p)})   # + the server's h
  # broadcast: FedAvg's (the contract's default)

  def client_init(bcast, g_k, rng):
    del rng
    w0 = bcast['params']
    return local_lib.LocalState(w0, tx.init(w0), w0, g_k)

  def client_step(bcast, local, batch, rng):
    corr = tmap(lambda w, w0, g: -g + alpha * (w - w0), local.params, local.init_params, local.extra)
    return local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'],
                                correction=corr)

  def client_final(bcast, local, g_k):
    del bcast
    drift = tmap(lambda a, b: a - b, local.params, local.init_params)            # theta_k - theta^{t-1}
    new_g = tmap(lambda g, d: g - alpha * d, g_k, drift)
    return {'weighted': {}, 'uniform': {'drift': drift}}, new_g

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    drift = agg['uniform']['drift']                                                # mean_S (theta_k - theta)
    frac = agg['num_clients'] / n_pop                                              # |S| / N
    h = tmap(lambda h, d: h - alpha * frac * d, state['h'], drift)
    target = tmap(lambda w, d, hh: w + d - hh / alpha, state['params'], drift, h)  # mean theta_k - h/alpha
    return {**server_step_to(server_tx, state, target), 'h': h}

  return FederatedAlgorithm(ctx.name, server_init, client_init=client_init, client_step=client_step,
                            client_final=client_final, server_update=server_update,
                            client_state_init=lambda p: tmap(jnp.zeros_like, p))
