"""SCAFFOLD (Karimireddy et al., ICML 2020), control variates with option II. Stateful clients, 2x communication.

  server state: x, c (init 0);  client state: c_k (init 0, lazily: never-seen clients read zeros)
  server sends x and c                                                      (comm_down = 2)
  client k, y <- x; K valid local steps of the client optimizer on
        g <- grad f_B(y) [SAM/ASAM: at the ascent point] + (c - c_k)         (local_step `correction`)
  c_k+ = c_k - c + (x - y) / (K eta_l)                                       option II; K = valid steps taken
  sends dy = y - x and dc = c_k+ - c_k                                       (comm_up = 2)
  server: x <- x + eta_g mean_S(dy)        = ServerOpt(x, mean_S(x - y)), server SGD with lr eta_g
          c <- c + (|S|/N) mean_S(dc)       N = population (algo.population or the dataset's number of clients)

Both means are the paper's plain means over the round's clients (not example-weighted). With a SAM/ASAM
client this is SCAFFOLD+ASAM of thesis Table 4.8 (FedGamma, fedgamma.py, is SCAFFOLD with a SAM client).
eta_l is the client lr of the round (broadcast hparams); K counts only the steps that ran (padding steps of
shorter clients never reach the update), so clients of different sizes get their own K.
"""
from __future__ import annotations

import jax.numpy as jnp

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import population, server_step_to, tmap
from fedjax_flat.algorithms.hparams import Population
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init


def scaffold_algorithm(ctx, make_loss=None) -> FederatedAlgorithm:
  """make_loss(corr) -> loss: FedGamma's optional corrected-perturbation loss."""
  n_pop = population(ctx, ctx.hp)
  loss_fn, server_tx, tx = ctx.loss_fn, ctx.server_tx, ctx.client_tx
  # FedAvg's server state and broadcast, plus the server control variate c, sent to the clients
  server_init = fedavg_server_init(server_tx, lambda p: {'c': tmap(jnp.zeros_like, p)})
  broadcast = fedavg_broadcast(ctx.hparams_fn, shared=('c',))

  def client_init(bcast, c_k, rng):
    del rng
    x = bcast['params']
    correction = tmap(lambda c, ck: c - ck, bcast['c'], c_k)                # c - c_k, fixed during the round
    return local_lib.LocalState(x, tx.init(x), x, {'corr': correction, 'steps': jnp.zeros((), jnp.float32)})

  def client_step(bcast, local, batch, rng):
    corr, hp_round = local.extra['corr'], bcast['hparams']
    if make_loss is not None:   # the correction inside the loss: SAM's ascent uses g + c - c_k
      new, m = local_lib.local_step(local, batch, rng, loss_fn=make_loss(corr), tx=tx, hparams=hp_round)
    else:
      new, m = local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=hp_round, correction=corr)
    return new._replace(extra={**local.extra, 'steps': local.extra['steps'] + 1.0}), m

  def client_final(bcast, local, c_k):
    x, y = local.init_params, local.params
    k_lr = jnp.maximum(local.extra['steps'], 1.0) * bcast['hparams']['lr']   # K eta_l (K >= 1: padding clients)
    c_new = tmap(lambda ck, c, a, b: ck - c + (a - b) / k_lr, c_k, bcast['c'], x, y)
    out = {'delta': tmap(lambda a, b: a - b, x, y),                          # x - y_k  (= -dy)
           'dc': tmap(lambda a, b: a - b, c_new, c_k)}
    return {'weighted': {}, 'uniform': out}, c_new

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    mean_delta = agg['uniform']['delta']
    new = server_step_to(server_tx, state, tmap(lambda w, d: w - d, state['params'], mean_delta))
    frac = agg['num_clients'] / n_pop                                        # |S| / N
    new['c'] = tmap(lambda c, dc: c + frac * dc, state['c'], agg['uniform']['dc'])
    return new

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, client_state_init=lambda p: tmap(jnp.zeros_like, p),
                            comm_down=2.0, comm_up=2.0)


@register('scaffold', hparams={'population': Population()}, needs=('population', 'client_state'))
def scaffold(ctx) -> FederatedAlgorithm:
  return scaffold_algorithm(ctx)
