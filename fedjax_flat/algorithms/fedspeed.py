"""FedSpeed (Sun, Shen, Huang, Ding & Tao, ICLR 2023, Algorithm 1). Stateful clients, 1x communication.

  client state: g^_k, the prox-correction (init 0)
  server sends x^t
  client k, x_{k,0} = x^t, each step on batch B (rho = client.rho, alpha, lambda = algo.alpha, algo.lam):
        g1 = grad f_B(x);  x~ = x + rho g1 / ||g1||;  g2 = grad f_B(x~)
        g  = (1 - alpha) g1 + alpha g2                                     (merged "~SAM" gradient)
        x <- x - lr (g - g^_k + (1/lambda)(x - x^t) + wd x)               (prox term + prox-correction)
  g^_k <- g^_k - (1/lambda)(x_{k,K} - x^t)
  sends x^_k = x_{k,K} - lambda g^_k
  server: x^{t+1} = (1/|S|) sum_S x^_k       (= ServerOpt(x^t, x^t - mean x^_k), exact with server SGD lr 1)

algo.dual_mean: 'active' is Algorithm 1 above: the prox-corrections enter through the round's
clients only. 'population' (the default) is the authors' release code (FL-Simulator server/FedSpeed.py): the server adds
the mean over ALL N clients of their corrections, x^{t+1} = mean_S x_{k,K} - lambda (1/N) sum_{k=1..N} g^_k
(FedDyn's server with alpha = 1/lambda; N = algo.population or the dataset's number of clients). The two coincide
under full participation. (The release code also uses alpha = 1, a plain SAM gradient: set algo.alpha=1.)
With partial participation the 'active' form over-weights each client's accumulated correction by N/|S|: on
the digits at alpha = 0 with 5 of 20 clients it collapses while 'population' reaches 0.96
(benchmarks/studies/README.baselines.md).

The ascent step is part of the method, so client.optimizer must be 'sam' (its rho, with the optional rho
warm-up, is the round's rho); grad_clip / weight decay / momentum of the client chain follow the merged
gradient and the correction. Grids (thesis Table A.5): rho, alpha in {0.9, 0.95, 0.99}, lambda in
{10, 100, 1000}.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from absl import logging

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import (global_norm, population, server_step_to,
                                           tmap, without_sharpness)
from fedjax_flat.algorithms.hparams import Choice, Number, Population
from fedjax_flat.algorithms.registry import check_population, register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_server_init
from fedjax_flat.optimizers.client import client_optimizer


def require_sam(ctx):
  if ctx.client_cfg.optimizer != 'sam':
    raise ValueError(f"{ctx.name} computes its own ascent step: set client.optimizer='sam' (its client.rho is "
                     f"the method's rho); got {ctx.client_cfg.optimizer!r}")


def ascent_point(w, direction, rho, eps=1e-12):
  """w + rho d / (||d|| + eps) and the perturbation itself (the SAM ascent of optimizers/sam.py)."""
  e = tmap(lambda d: (rho / (global_norm(direction) + eps)) * d, direction)
  return tmap(lambda p, a: p + a.astype(p.dtype), w, e), e


def apply_gradient(local, g, tx, hparams_round, correction, loss_sum, count):
  """One step of the (sharpness-free) client chain on a given gradient: correction, clip, wd, sgd."""
  updates, opt_state = tx.update(g, local.opt_state, local.params, hparams=hparams_round, correction=correction)
  return (local._replace(params=optax.apply_updates(local.params, updates), opt_state=opt_state),
          {'loss_sum': loss_sum, 'count': count})


DUAL_MEANS = ('active', 'population')


def check_data(cfg, hp, data) -> None:
  """The release code's population dual mean scales by N; Algorithm 1's active mean is unstable at partial
  participation."""
  if hp['dual_mean'] != 'active':
    check_population(cfg, data)
  elif cfg.clients_per_round < data.num_clients:
    # Measured (benchmarks/studies/README.baselines.md): Algorithm 1's active-client dual mean diverges at partial
    # participation (digits alpha=0: 0.33 test accuracy) where the release code's population mean reaches 0.96.
    logging.warning('fedspeed with algo.dual_mean=active (the paper\'s Algorithm 1) and partial participation '
                    '(clients_per_round=%d of %d) is unstable; the authors\' code uses '
                    '--config.algo.dual_mean=population', cfg.clients_per_round, data.num_clients)


# dual_mean defaults to 'population' (the release code; stable), 'active' (Algorithm 1) is one flag away.
@register('fedspeed', hparams={'alpha': Number(0.95, lo=0, hi=1), 'lam': Number(100.0, lo=0, lo_open=True),
                               'dual_mean': Choice('population', DUAL_MEANS), 'population': Population()},
          client_optimizers=('sam',), needs=('client_state',), check_data=check_data)
def fedspeed(ctx) -> FederatedAlgorithm:
  require_sam(ctx)
  hp = ctx.hp
  alpha, lam = float(hp['alpha']), float(hp['lam'])
  if hp['dual_mean'] not in DUAL_MEANS:
    raise ValueError(f"algo.dual_mean={hp['dual_mean']!r}; allowed: {DUAL_MEANS}")
  pop_mean = hp['dual_mean'] == 'population'
  n_pop = population(ctx, hp) if pop_mean else 0
  client_cfg, loss_fn, server_tx = ctx.client_cfg, ctx.loss_fn, ctx.server_tx
  tx = client_optimizer(without_sharpness(client_cfg))      # its own ascent step: the rest of the chain
  # FedAvg's server state (+ 'g_sum': the sum over all N clients of g^_k) and broadcast (the contract's default)
  server_init = fedavg_server_init(server_tx, (lambda p: {'g_sum': tmap(jnp.zeros_like, p)}) if pop_mean else None)

  def client_init(bcast, g_hat, rng):
    del rng
    x = bcast['params']
    return local_lib.LocalState(x, tx.init(x), x, g_hat)

  def client_step(bcast, local, batch, rng):
    grad = lambda p: jax.value_and_grad(lambda q: loss_fn(q, batch, rng), has_aux=True)(p)
    (_, (loss_sum, count)), g1 = grad(local.params)
    x_tilde, _ = ascent_point(local.params, g1, bcast['hparams']['rho'])
    g2 = grad(x_tilde)[1]
    g = tmap(lambda a, b: (1.0 - alpha) * a + alpha * b, g1, g2)
    corr = tmap(lambda gh, x, x0: -gh + (x - x0) / lam, local.extra, local.params, local.init_params)
    return apply_gradient(local, g, tx, bcast['hparams'], corr, loss_sum, count)

  def client_final(bcast, local, g_hat):
    del bcast
    new_g = tmap(lambda gh, x, x0: gh - (x - x0) / lam, g_hat, local.params, local.init_params)
    if pop_mean:
      out = {'x': local.params, 'dg': tmap(lambda a, b: a - b, new_g, g_hat)}
    else:
      out = {'x_hat': tmap(lambda x, gh: x - lam * gh, local.params, new_g)}
    return {'weighted': {}, 'uniform': out}, new_g

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    if not pop_mean:
      return server_step_to(server_tx, state, agg['uniform']['x_hat'])
    g_sum = tmap(lambda s, d: s + agg['num_clients'] * d, state['g_sum'], agg['uniform']['dg'])
    target = tmap(lambda x, s: x - lam * s / n_pop, agg['uniform']['x'], g_sum)
    return {**server_step_to(server_tx, state, target), 'g_sum': g_sum}

  return FederatedAlgorithm(ctx.name, server_init, client_init=client_init, client_step=client_step,
                            client_final=client_final, server_update=server_update,
                            client_state_init=lambda p: tmap(jnp.zeros_like, p))
