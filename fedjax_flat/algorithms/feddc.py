"""FedDC (Gao et al., CVPR 2022): local drift decoupling and correction. Stateful clients, 2x communication.

MAN's Tables 1-2 run it with alpha = 0.01 (seed 003). The update rules as the FedDC release computes them:

  server state: theta_g, c (init 0), hbar = (1/N) sum_{all k} h_k (init 0)
  client state: h_k (local drift, init 0), c_k (last local update direction, init 0)
  server sends theta_g and c                                                       (comm_down = 2)
  client k minimizes  f_k(theta) + (alpha/2) ||theta - (theta_g - h_k)||^2 + <theta, c - c_k>
        with the client optimizer:  g <- grad f_B(theta) [SAM/ASAM: at the ascent point]
                                         + alpha (theta - theta_g + h_k) + (c - c_k)
        (local_step `correction`: config.client.grad_clip clips this whole gradient, as the release's
        clip_grad_norm_ of the summed loss does; client.weight_decay is the SGD weight decay)
  after K valid local steps, with d_k = theta_k - theta_g:
        h_k <- h_k + d_k
        c_k+ = c_k - c - d_k / (K eta)                 eta: the first round's client lr (the release's beta =
                                                       1 / n_minibatch / learning_rate, undecayed);
                                                       algo.control_lr='round' uses the round's lr instead
  sends theta_k and c_k+ - c_k                                                     (comm_up = 2)
  server: hbar <- hbar + (|S|/N) mean_S(d_k)
          c    <- c + (|S|/N) mean_S(c_k+ - c_k)
          theta_g <- mean_S(theta_k) + hbar        (= ServerOpt on that target: exact with server SGD lr 1)

Client weights: the release scales alpha, the global c and its update by w_k = n_k / mean(n). Here w_k = 1,
which is the release exactly when clients are equal-sized (the balanced splits of FedDC and MAN); the
engine does not give a client its share of the population's examples. The model evaluated is theta_g (the
release's "cloud" model).
"""
from __future__ import annotations

import jax.numpy as jnp

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import population, server_step_to, tmap
from fedjax_flat.algorithms.hparams import Choice, Number, Population
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init


@register('feddc', hparams={'alpha': Number(0.01, lo=0, lo_open=True), 'population': Population(),
                            'control_lr': Choice('initial', ('initial', 'round'))},
          needs=('population', 'client_state'))
def feddc(ctx) -> FederatedAlgorithm:
  hp = ctx.hp
  alpha, n_pop, control_lr = float(hp['alpha']), population(ctx, hp), hp['control_lr']
  loss_fn, server_tx, tx = ctx.loss_fn, ctx.server_tx, ctx.client_tx
  hparams_fn = ctx.hparams_fn

  # FedAvg's server state and broadcast, plus c (sent to the clients) and hbar: two buffers, since the round
  # program donates its state
  server_init = fedavg_server_init(server_tx, lambda p: {'c': tmap(jnp.zeros_like, p),
                                                          'hbar': tmap(jnp.zeros_like, p)})
  broadcast = fedavg_broadcast(hparams_fn, shared=('c',))

  def client_init(bcast, client_state, rng):
    del rng
    theta_g = bcast['params']
    extra = {'h': client_state['h'], 'steps': jnp.zeros((), jnp.float32),
             'cg': tmap(lambda c, ck: c - ck, bcast['c'], client_state['c'])}    # c - c_k, fixed this round
    return local_lib.LocalState(theta_g, tx.init(theta_g), theta_g, extra)

  def client_step(bcast, local, batch, rng):
    ex = local.extra
    corr = tmap(lambda w, w0, h, cg: alpha * (w - w0 + h) + cg, local.params, local.init_params, ex['h'], ex['cg'])
    new, m = local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'],
                                  correction=corr)
    return new._replace(extra={**ex, 'steps': ex['steps'] + 1.0}), m

  def client_final(bcast, local, client_state):
    d = tmap(lambda a, b: a - b, local.params, local.init_params)             # theta_k - theta_g
    lr = hparams_fn(0)['lr'] if control_lr == 'initial' else bcast['hparams']['lr']
    k_lr = jnp.maximum(local.extra['steps'], 1.0) * lr                       # K eta (K >= 1: padding clients)
    c_new = tmap(lambda ck, c, dd: ck - c - dd / k_lr, client_state['c'], bcast['c'], d)
    new_state = {'h': tmap(lambda h, dd: h + dd, client_state['h'], d), 'c': c_new}
    out = {'d': d, 'dc': tmap(lambda a, b: a - b, c_new, client_state['c'])}
    return {'weighted': {}, 'uniform': out}, new_state

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    frac = agg['num_clients'] / n_pop                                          # |S| / N
    mean_d, mean_dc = agg['uniform']['d'], agg['uniform']['dc']
    hbar = tmap(lambda h, dd: h + frac * dd, state['hbar'], mean_d)
    target = tmap(lambda w, dd, h: w + dd + h, state['params'], mean_d, hbar)   # mean_S theta_k + hbar
    new = server_step_to(server_tx, state, target)
    return {**new, 'hbar': hbar, 'c': tmap(lambda c, dc: c + frac * dc, state['c'], mean_dc)}

  def client_state_init(params):
    return {'h': tmap(jnp.zeros_like, params), 'c': tmap(jnp.zeros_like, params)}

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, client_state_init=client_state_init,
                            comm_down=2.0, comm_up=2.0)
