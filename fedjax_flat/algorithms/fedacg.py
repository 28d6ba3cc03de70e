"""FedACG: accelerated client gradient (Kim, Kim & Han, CVPR 2024; official code geehokim/FedACG). 1x comm.

  server state: theta, m (init 0)
  server sends the lookahead  theta~ = theta + lambda m                     (one model: comm 1x)
  client k, y <- theta~, each step of the client optimizer on  f_k(y) + (beta/2) ||y - theta~||^2:
        g <- grad f_B(y) [SAM/ASAM: at the ascent point] + beta (y - theta~)    (local_step `correction`)
  server: m <- lambda m + (1/|S|) sum_S (y_k - theta~)
          theta <- theta + m                 (= the plain mean of the y_k; ServerOpt(theta, -m), exact with
                                              server SGD lr 1)
The evaluated model is theta (not the lookahead). Plain means, as the official code.
Grids: beta_ACG in {0.01, 0.001}, lambda_ACG in {0.8, 0.85, 0.9} (Ch. 4 Appendix A.3.2).
"""
from __future__ import annotations

import jax.numpy as jnp

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import server_step_to, tmap
from fedjax_flat.algorithms.hparams import Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init


@register('fedacg', hparams={'beta': Number(0.01, lo=0),
                            'lam': Number(0.85, lo=0, hi=1, hi_open=True)})
def fedacg(ctx) -> FederatedAlgorithm:
  hp = ctx.hp
  beta, lam = float(hp['beta']), float(hp['lam'])
  loss_fn, server_tx, tx = ctx.loss_fn, ctx.server_tx, ctx.client_tx
  hparams_fn = ctx.hparams_fn

  server_init = fedavg_server_init(server_tx, lambda p: {'m': tmap(jnp.zeros_like, p)})   # + the momentum m

  # the clients start from the lookahead w + lambda m
  broadcast = fedavg_broadcast(hparams_fn, model=lambda state, t: tmap(lambda w, m: w + lam * m, state['params'],
                                                                        state['m']))

  def client_init(bcast, cs, rng):
    del cs, rng
    w = bcast['params']
    return local_lib.LocalState(w, tx.init(w), w)

  def client_step(bcast, local, batch, rng):
    prox = tmap(lambda y, w: beta * (y - w), local.params, local.init_params)
    return local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'],
                                correction=prox)

  def client_final(bcast, local, cs):
    del bcast
    return {'weighted': {}, 'uniform': {'dy': tmap(lambda a, b: a - b, local.params, local.init_params)}}, cs

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    m = tmap(lambda m, d: lam * m + d, state['m'], agg['uniform']['dy'])
    target = tmap(lambda w, mm: w + mm, state['params'], m)
    return {**server_step_to(server_tx, state, target), 'm': m}

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update)
