"""FedSMOO (Sun, Shen, Chen, Ding & Tao, ICML 2023: dynamic regularized SAM), in the form of the authors'
release code (FL-Simulator, client/fedsmoo.py, optimizer/DRegSAM.py, server/FedSMOO.py). 2x communication.

ADMM on the weights (FedDyn with alpha = 1/beta) and on the SAM perturbation (clients' eps_k vs a global s):
  client state: sigma_k (weight dual, init 0), mu_k (perturbation dual, init 0)
  server state: w, h (init 0), s (global perturbation, init 0)
  server sends w and s                                                        (comm_down = 2)
  client k, w_{k,0} = w, each step on batch B (rho = client.rho):
        g = grad f_B(w_k);  d = g - mu_k - s;  eps = rho d / ||d||;  mu_k <- mu_k + eps - s
        g2 = grad f_B(w_k + eps)
        w_k <- w_k - lr (g2 - sigma_k + (w_k - w)/beta + wd w_k)          [config.client.grad_clip clips
                                                                             g2 - sigma_k + (w_k - w)/beta]
  sigma_k <- sigma_k - (w_{k,K} - w)/beta;  sends w_{k,K} and mu_k            (comm_up = 2)
  server: h <- h - (1/beta)(1/N) sum_S (w_{k,K} - w)                          N = population
          w <- (1/|S|) sum_S w_{k,K} - beta h     (ServerOpt on w - target: exact with server SGD lr 1)
          s <- rho mean_S(mu_k) / ||mean_S(mu_k)||   (the release code's simplified global dual, which drops
                                                       the clients' last eps from the paper's solution)

The release code writes the weight ADMM as FedDyn's h_k = sum of past updates with weight decay lambda;
sigma_k = -h_k / beta here and the server's -beta h is its average over all clients of h_k. client.optimizer
must be 'sam' (the dual-corrected ascent is part of the method). Grids (Table A.5): rho, beta in {5, 10, 100}.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import (global_norm, population, server_step_to,
                                           tmap, without_sharpness)
from fedjax_flat.algorithms.fedspeed import apply_gradient, ascent_point, require_sam
from fedjax_flat.algorithms.hparams import Number, Population
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init
from fedjax_flat.optimizers.client import client_optimizer


@register('fedsmoo', hparams={'beta': Number(10.0, lo=0, lo_open=True), 'population': Population()},
          client_optimizers=('sam',), needs=('population', 'client_state'))
def fedsmoo(ctx) -> FederatedAlgorithm:
  require_sam(ctx)
  hp = ctx.hp
  beta, n_pop = float(hp['beta']), population(ctx, hp)
  client_cfg, loss_fn, server_tx = ctx.client_cfg, ctx.loss_fn, ctx.server_tx
  tx = client_optimizer(without_sharpness(client_cfg))      # its own ascent step: the rest of the chain
  hparams_fn = ctx.hparams_fn
  zeros = lambda t: tmap(jnp.zeros_like, t)

  # FedAvg's server state and broadcast, plus h and the global perturbation s (sent to the clients)
  server_init = fedavg_server_init(server_tx, lambda p: {'h': zeros(p), 's': zeros(p)})
  broadcast = fedavg_broadcast(hparams_fn, shared=('s',))

  def client_init(bcast, cs, rng):
    del rng
    w = bcast['params']
    return local_lib.LocalState(w, tx.init(w), w, cs)

  def client_step(bcast, local, batch, rng):
    grad = lambda p: jax.value_and_grad(lambda q: loss_fn(q, batch, rng), has_aux=True)(p)
    (_, (loss_sum, count)), g = grad(local.params)
    s, mu = bcast['s'], local.extra['mu']
    d = tmap(lambda a, m, ss: a - m - ss, g, mu, s)
    w_eps, eps = ascent_point(local.params, d, bcast['hparams']['rho'])
    mu = tmap(lambda m, e, ss: m + e - ss, mu, eps, s)
    g2 = grad(w_eps)[1]
    corr = tmap(lambda sg, w, w0: -sg + (w - w0) / beta, local.extra['sigma'], local.params, local.init_params)
    new, m = apply_gradient(local, g2, tx, bcast['hparams'], corr, loss_sum, count)
    return new._replace(extra={'sigma': local.extra['sigma'], 'mu': mu}), m

  def client_final(bcast, local, cs):
    del bcast, cs
    drift = tmap(lambda a, b: a - b, local.params, local.init_params)
    sigma = tmap(lambda sg, d: sg - d / beta, local.extra['sigma'], drift)
    return {'weighted': {}, 'uniform': {'drift': drift, 'mu': local.extra['mu']}}, {'sigma': sigma,
                                                                                     'mu': local.extra['mu']}

  def server_update(state, agg, round_idx, phase=0):
    del phase
    drift, mu_bar = agg['uniform']['drift'], agg['uniform']['mu']
    frac = agg['num_clients'] / n_pop
    h = tmap(lambda hh, d: hh - frac * d / beta, state['h'], drift)
    target = tmap(lambda w, d, hh: w + d - beta * hh, state['params'], drift, h)
    rho = hparams_fn(round_idx)['rho']
    s = tmap(lambda m: (rho / (global_norm(mu_bar) + 1e-12)) * m, mu_bar)
    return {**server_step_to(server_tx, state, target), 'h': h, 's': s}

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update,
                            client_state_init=lambda p: {'sigma': zeros(p), 'mu': zeros(p)},
                            comm_down=2.0, comm_up=2.0)
