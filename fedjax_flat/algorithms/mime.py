"""Mime and MimeLite (Karimireddy et al. 2020, "Mime: Mimicking Centralized Stochastic Algorithms in FL"),
with the semantics of FedJAX's fedjax/algorithms/mime.py and mime_lite.py. Base optimizer: SGD with
momentum beta (algo.beta; 0 = "Mime SGD"), lr = client.lr, coupled weight decay client.weight_decay, whose
state m is the SERVER's momentum, applied by every client with the state held fixed during the round.

Mime (num_phases = 2: the full-batch gradient at x is needed before local training)
  phase 0  server sends x; client k accumulates its full-batch gradient at x over its batches (no parameter
           update) and sends it;  c = sum_k N_k grad f_k(x) / sum_k N_k        (FedJAX: example-weighted)
  phase 1  server sends c (and m); client k, y <- x, each step on batch B:
              g <- grad f_B(y) [SAM/ASAM: at the ascent point] - grad f_B(x) + c + beta m + wd y
              y <- y - lr g                              (FedJAX: base_optimizer.apply with the fixed state)
           Delta = sum_k (N_k/N)(x - y_k)
  server   x <- ServerOpt(x, Delta)        (FedJAX: x - server_learning_rate Delta = server SGD, lr eta_g)
           m <- (c + wd x) + beta m        (FedJAX: base_optimizer.apply(c, state, x); optax trace)

MimeLite (1 phase): the same without the SVRG term: g <- grad f_B(y) + beta m + wd y. The full-batch
gradient at x that updates m is accumulated during the same pass (FedJAX computes it after training; the
order does not matter since MimeLite's local steps do not use it).

The paper writes the momentum as an EMA, m <- (1 - beta) c + beta m and g <- (1 - beta) g_i + beta m; that is
FedJAX's form with the client lr scaled by (1 - beta). client.momentum must be 0 (the base optimizer's
momentum is algo.beta). The client full-batch gradient uses the training batches of the round (all E local
epochs; with augmentation, augmented examples).

Communication per client (comm multipliers are per phase): Mime  down x; then c and m (m only if beta > 0),
up grad f_k(x); then y_k.  MimeLite  down x, m; up y_k, grad f_k(x).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from absl import logging

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import run_value, tmap
from fedjax_flat.algorithms.hparams import Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init
from fedjax_flat.errors import ConfigError
from fedjax_flat.optimizers import client as client_opt

HPARAMS = {'beta': Number(0.9, lo=0, hi=1, hi_open=True)}

# Measured (benchmarks/studies/README.baselines.md, MimeLite beta 0.9 on the digits quickstart, 100 rounds): client lr
# 0.01 trains at alpha 0 and 0.5; 0.02 diverges at alpha 0; 0.03 degrades (0.61) and 0.04-0.05 diverge at
# alpha 0.5. The momentum trace g + beta m scales the step by 1/(1 - beta), so the bound is on lr / (1 - beta).
MIME_MAX_EFFECTIVE_LR = 0.1


def warn_mime_lr(lr, beta, algo) -> bool:
  """Logs a warning (and returns True) when lr / (1 - beta) is above the measured stable range."""
  eff = float(lr) / (1.0 - float(beta))
  if eff <= MIME_MAX_EFFECTIVE_LR * (1 + 1e-9):
    return False
  logging.warning('%s: client.lr=%g with algo.beta=%g is an effective step lr/(1-beta)=%.3g, above %.2g where it '
                  'diverged on the digits quickstart (benchmarks/studies/README.baselines.md); try client.lr <= %.3g',
                  algo, lr, beta, eff, MIME_MAX_EFFECTIVE_LR, MIME_MAX_EFFECTIVE_LR * (1.0 - float(beta)))
  return True


def check(cfg, hp) -> None:
  """The base optimizer is Mime's own SGD with momentum algo.beta: no client momentum, no Adam."""
  algo = cfg.algorithm
  warn_mime_lr(cfg.client.lr, hp['beta'], algo)
  if cfg.client.momentum:
    raise ConfigError('client.momentum', cfg.client.momentum,
                      f'{algo} must have client.momentum = 0 (its base-optimizer momentum is algo.beta)')
  if cfg.client.get('base_optimizer', 'sgd') == 'adam':
    raise ConfigError('client.base_optimizer', 'adam',
                      f'{algo} defines its own SGD-momentum base optimizer: use sgd')


def _check(ctx):
  if ctx.client_cfg.momentum:
    raise ValueError(f'{ctx.name}: client.momentum must be 0 (the base optimizer momentum is algo.beta)')
  return float(ctx.hp['beta'])


def _grad_sum(loss_fn, w, batch, rng):
  """(loss_sum, count), sum over the batch's valid examples of the per-example gradients at w."""
  (_, (loss_sum, count)), g = jax.value_and_grad(lambda p: loss_fn(p, batch, rng), has_aux=True)(w)
  return loss_sum, count, tmap(lambda a: a * count, g)


def _mime(ctx, lite: bool) -> FederatedAlgorithm:
  beta = _check(ctx)
  loss_fn, server_tx, tx = ctx.loss_fn, ctx.server_tx, ctx.client_tx
  wd = run_value(ctx.client_cfg.weight_decay)        # a batched run's weight decay stays its own traced value
  zeros = lambda t: tmap(jnp.zeros_like, t)

  # FedAvg's server state and broadcast, plus the server momentum m and the full-batch gradient c, sent to the
  # clients (MimeLite's clients do not use c)
  server_init = fedavg_server_init(server_tx, lambda p: {'m': zeros(p), 'c': zeros(p)})
  broadcast = fedavg_broadcast(ctx.hparams_fn, shared=('m',) if lite else ('m', 'c'))

  def server_step(state, delta, c):
    x = state['params']
    updates, opt_state = server_tx.update(delta, state['opt_state'], x)
    m = tmap(lambda g, p, mm: g + wd * p + beta * mm, c, x, state['m'])          # base optimizer on c at x
    return {**state, 'params': optax.apply_updates(x, updates), 'opt_state': opt_state, 'm': m, 'c': c}

  # -- the training pass (Mime phase 1, MimeLite's only phase)
  def train_init(bcast):
    x = bcast['params']
    return local_lib.LocalState(x, tx.init(x), x, {'gsum': zeros(x), 'n': jnp.zeros((), jnp.float32)})

  def train_step(bcast, local, batch, rng):
    _, count, gx_sum = _grad_sum(loss_fn, local.init_params, batch, rng)       # grad f_B(x) * |B|
    if lite:
      corr = tmap(lambda m: beta * m, bcast['m'])
    else:
      corr = tmap(lambda gs, c, m: -gs / jnp.maximum(count, 1.0) + c + beta * m, gx_sum, bcast['c'], bcast['m'])
    new, met = local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'],
                                    correction=corr)
    extra = local.extra
    if lite:
      extra = {'gsum': tmap(lambda a, b: a + b, extra['gsum'], gx_sum), 'n': extra['n'] + count}
    return new._replace(extra=extra), met

  def train_final(local):
    out = {'delta': tmap(lambda a, b: a - b, local.init_params, local.params)}
    if lite:
      out['grad'] = tmap(lambda s: s / jnp.maximum(local.extra['n'], 1.0), local.extra['gsum'])
    return {'weighted': out, 'uniform': {}}

  if lite:
    def client_init(bcast, cs, rng):
      del cs, rng
      return train_init(bcast)

    def client_final(bcast, local, cs):
      del bcast
      return train_final(local), cs

    def server_update(state, agg, round_idx, phase=0):
      del round_idx, phase
      return server_step(state, agg['weighted']['delta'], agg['weighted']['grad'])

    return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, train_step, client_final,
                              server_update, comm_down=2.0 if beta else 1.0, comm_up=2.0,
                              extra_passes=1.0)     # + the gradient at x on the same batch

  # -- Mime: phase 0 = full-batch gradient at x, phase 1 = training
  def client_init(bcast, cs, rng, *, phase):
    del cs, rng
    if phase == 0:
      x = bcast['params']
      return local_lib.LocalState(x, (), x, {'gsum': zeros(x), 'n': jnp.zeros((), jnp.float32)})
    return train_init(bcast)

  def client_step(bcast, local, batch, rng, *, phase):
    if phase == 0:
      loss_sum, count, g_sum = _grad_sum(loss_fn, local.params, batch, rng)
      extra = {'gsum': tmap(lambda a, b: a + b, local.extra['gsum'], g_sum), 'n': local.extra['n'] + count}
      return local._replace(extra=extra), {'loss_sum': loss_sum, 'count': count}
    return train_step(bcast, local, batch, rng)

  def client_final(bcast, local, cs, *, phase):
    del bcast
    if phase == 0:
      grad = tmap(lambda s: s / jnp.maximum(local.extra['n'], 1.0), local.extra['gsum'])
      return {'weighted': {'grad': grad}, 'uniform': {}}, cs
    return train_final(local), cs

  def server_update(state, agg, round_idx, phase=0):
    del round_idx
    if phase == 0:
      return {**state, 'c': agg['weighted']['grad']}
    return server_step(state, agg['weighted']['delta'], state['c'])

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, num_phases=2,
                            comm_down=(3.0 if beta else 2.0) / 2, comm_up=1.0,
                            # a step: phase 0's one pass + phase 1's optimizer step and gradient at x
                            extra_passes=2.0 - client_opt.gradient_passes(ctx.client_cfg))


@register('mime', hparams=HPARAMS, check=check)
def mime(ctx) -> FederatedAlgorithm:
  return _mime(ctx, lite=False)


@register('mimelite', hparams=HPARAMS, check=check)
def mimelite(ctx) -> FederatedAlgorithm:
  return _mime(ctx, lite=True)
