"""AdaBest (Varno et al., ECCV 2022), as in the authors' implementation (fedsim, `AdaBest`). 1x communication.

  client state: h_k (init 0), t'_k (last round it trained; "never" = -1), n_k (its dataset size)
  server state: theta, theta_bar_prev (init theta^0), running mean of the clients' dataset sizes n_bar
  server sends theta^t (and n_bar)
  client k, with mu' = mu * n_bar / n_k (algo.adaptive_mu; else mu'= mu):
        g <- grad f_B(theta) [SAM/ASAM: at the ascent point] - mu' h_k          (local_step `correction`)
  h_k <- h_k / (t - t'_k) + (theta^t - theta_k);   t'_k <- t
  server: theta_bar = (1/|S|) sum_S theta_k
          h = beta (theta_bar_prev - theta_bar);  theta^{t+1} = theta_bar - h;  theta_bar_prev <- theta_bar
          (= ServerOpt(theta^t, theta^t - theta^{t+1}), exact with server SGD lr 1, like fedsim)

fedsim's n_bar is the running mean of the sizes of all clients received so far; here it is the same mean over
the clients of the previous rounds (round 0: n_bar = 0, mu' = 0, where every h_k is 0 anyway). A client's n_k
is the number of examples it processed divided by local_epochs (its dataset size in the epochs mode; with
client.local_steps it is the number of examples processed), kept in its state from its previous round.
AdaBest+ASAM (thesis Table 4.8): client.optimizer 'asam'. Grids: mu in {0.01, 0.02},
beta in {0.5, ..., 0.95} (Ch. 4 Appendix A.3.2).
"""
from __future__ import annotations

import jax.numpy as jnp

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import server_step_to, tmap
from fedjax_flat.algorithms.hparams import Flag, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init


@register('adabest', hparams={'mu': Number(0.02, lo=0), 'beta': Number(0.9, lo=0, hi=1),
                             'adaptive_mu': Flag(True)},
          needs=('client_state',))
def adabest(ctx) -> FederatedAlgorithm:
  hp = ctx.hp
  mu, beta, adaptive = float(hp['mu']), float(hp['beta']), bool(hp['adaptive_mu'])
  loss_fn, server_tx, tx = ctx.loss_fn, ctx.server_tx, ctx.client_tx
  epochs = 1 if ctx.client_cfg.get('local_steps', 0) else int(ctx.client_cfg.local_epochs)
  hparams_fn = ctx.hparams_fn
  f32 = lambda v: jnp.asarray(v, jnp.float32)

  def client_state_init(params):
    # last: 1-based round of the last participation (0 = never, i.e. t'_k = -1); n: dataset size
    return {'h': tmap(jnp.zeros_like, params), 'last': f32(0.0), 'n': f32(0.0)}

  # FedAvg's server state, plus the previous average (its own buffer: the state is donated) and the running sum
  # and count of the clients' dataset sizes
  server_init = fedavg_server_init(server_tx, lambda p: {'avg_prev': tmap(jnp.copy, p), 'n_sum': f32(0.0),
                                                          'n_cnt': f32(0.0)})

  # + the mean client participation interval n_bar and the round index
  broadcast = fedavg_broadcast(hparams_fn, extra=lambda state, t: {
      'n_bar': state['n_sum'] / jnp.maximum(state['n_cnt'], 1.0), 'round': f32(t)})

  def client_init(bcast, cs, rng):
    del rng
    w0 = bcast['params']
    if adaptive:
      mu_k = jnp.where(cs['n'] > 0, mu * bcast['n_bar'] / jnp.maximum(cs['n'], 1.0), 0.0)
    else:
      mu_k = f32(mu)
    corr = tmap(lambda h: -mu_k * h, cs['h'])                                   # - mu' h_k
    return local_lib.LocalState(w0, tx.init(w0), w0, {'corr': corr, 'seen': f32(0.0)})

  def client_step(bcast, local, batch, rng):
    new, m = local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'],
                                  correction=local.extra['corr'])
    return new._replace(extra={**local.extra, 'seen': local.extra['seen'] + m['examples']}), m

  def client_final(bcast, local, cs):
    t1 = bcast['round'] + 1.0                                                   # t, 1-based
    gap = jnp.maximum(t1 - cs['last'], 1.0)                                     # t - t'_k
    pseudo = tmap(lambda a, b: a - b, local.init_params, local.params)          # theta^t - theta_k
    h = tmap(lambda h, p: h / gap + p, cs['h'], pseudo)
    n_k = local.extra['seen'] / epochs
    new_cs = {'h': h, 'last': t1, 'n': n_k}
    return {'weighted': {}, 'uniform': {'params': local.params, 'n': n_k}}, new_cs

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    avg = agg['uniform']['params']                                              # theta_bar^t
    target = tmap(lambda a, p: a - beta * (p - a), avg, state['avg_prev'])      # theta_bar - beta(prev - bar)
    new = server_step_to(server_tx, state, target)
    return {**new, 'avg_prev': avg, 'n_sum': state['n_sum'] + agg['uniform']['n'] * agg['num_clients'],
            'n_cnt': state['n_cnt'] + agg['num_clients']}

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, client_state_init=client_state_init)
