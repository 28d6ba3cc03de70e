"""FedGloSS and NaiveFedGloSS (Caldarola et al.; thesis Section 4.4, Algorithm 5; digest 1.6-1.7).

FedGloSS, round t (1x communication; the server's SAM ascent reuses the previous pseudo-gradient):

  eps~ = rho_s D~^{t-1} / ||D~^{t-1}||          (0 in the first round: no D~ yet; the state flag `has_prev`)
  w~   = w + eps~                               sent to the clients of C^t
  client k, from w_{k,0} = w~, each step of the client optimizer (SGD, or SAM/ASAM with the rho warm-up of
  config.client.rho0 / rho_warmup_rounds) on  g - sigma_k + (w_k - w_{k,0}) / beta   (local_step's
  `correction`, added after the SAM gradient and before weight decay / momentum / lr, as the release code):
      sigma_k <- sigma_k - (w_{k,E} - w~) / beta                       (stateful client)
  D~    = sum_k (N_k/N) (w~ - w_k)
  sigma <- sigma - (1 / (beta |C|)) sum_{k in C^t} (w_k - w)           (algo.dual_variant='thesis', Alg. 5)
  sigma <- sigma - sum_{k in C^t} (w_k - w~) / (beta K_total |C^t|)    (algo.dual_variant='release', the
                                                                        release code; the default: stable)
  w     <- ServerOpt(w, D~) - beta sigma      (server SGD lr 1, the paper's setting: w - D~ - beta sigma)
  store D~ (without the beta sigma term) for the next round's ascent.

|C| = K_total is the population (algo.population; 0 = the dataset's number of clients): Alg. 5 sums over C, the
clients that did not train this round contribute w_k - w = 0, as in FedDyn's server state (1/m). This is the
digest's reading (section 1.7: the release code has "an extra 1/|C^t| factor and the reference w~"); dividing
by |C^t| instead makes the dual K_total/|C^t| times larger and is unstable at alpha=0 (measured on the digits).

algo.admm=False drops sigma, sigma_k and the proximal term (thesis Table 4.17 "without ADMM"): FedAvg from
the ascent point w~. The evaluated model is w (never w~).

NaiveFedGloSS (num_phases=2, two exchanges with the same clients, 2x communication):
  phase 0: send w, clients train with the client optimizer (no ADMM term, duals untouched),
           D = sum_k (N_k/N)(w - w_k),  w~ = w + rho_s D / ||D||
  phase 1: exactly FedGloSS's client and server step from this w~ (with ADMM unless admm=False).

Hyperparameters (config.algo): rho_server, beta, admm, dual_variant ('thesis' | 'release'), population
(K_total of both dual updates; 0 = the dataset's number of clients), rho_server_schedule ('constant' |
'release' | 'linear': rho_s per round; 'release' reproduces the published CIFAR runs, where the server radius
was ~client.rho during the T_s = client.rho_warmup_rounds warm-up: see optimizers/schedules.py).
"""
from __future__ import annotations

import jax.numpy as jnp
import optax
from absl import logging

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import global_norm, population, tmap
from fedjax_flat.algorithms.hparams import Choice, Flag, Number, Population
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init
from fedjax_flat.errors import ConfigError
from fedjax_flat.optimizers.schedules import SERVER_RHO_SCHEDULES, server_rho_schedule

DUAL_VARIANTS = ('thesis', 'release')
# rho_server_schedule: 'constant' | 'release' | 'linear' (optimizers/schedules.server_rho_schedule); the
# warm-up uses config.client.rho0 and client.rho_warmup_rounds (one T_s for client and server, as the release).
# dual_variant defaults to 'release': Algorithm 5 as printed ('thesis') oscillates on the digits at alpha = 0
# (benchmarks/studies/README.flat_minima.md: 78.5 vs 95.6 last-K, SGD client); it stays one flag away, with a warning.
HPARAMS = {'rho_server': Number(0.15, lo=0, bound=True),
           'beta': Number(10.0, lo=0, lo_open=True, bound=True),
           'admm': Flag(True),
           'dual_variant': Choice('release', ('release', 'thesis')),
           'rho_server_schedule': Choice('constant', SERVER_RHO_SCHEDULES,
                                         note=' (warm-up length: client.rho_warmup_rounds)'),
           'population': Population()}


def check_data(cfg, hp, data) -> None:
  """K_total against the data; the measured unstable combinations (warnings)."""
  if (hp['admm'] and not hp['population'] and cfg.data.get('num_clients')
      and cfg.data.get('num_clients') != data.num_clients):
    raise ConfigError('algo.population', hp['population'],
                      f'FedGloSS needs the population K_total: config.data.num_clients='
                      f'{cfg.data.get("num_clients")!r} is not the data\'s {data.num_clients} clients; set '
                      f'algo.population={data.num_clients}')
  if hp['dual_variant'] == 'thesis' and hp['admm'] and cfg.clients_per_round < data.num_clients:
    # Measured (benchmarks/studies/README.flat_minima.md): Algorithm 5's dual as printed is a |C^t| times larger step
    # than the release code's and oscillates at partial participation (digits alpha=0: 78.5 vs 95.6 last-K).
    logging.warning('%s with algo.dual_variant=thesis (Algorithm 5 as printed) and partial participation '
                    'is unstable; the release code (the default) is --config.algo.dual_variant=release',
                    cfg.algorithm)
  if cfg.swa.enabled and cfg.swa.cyclic_lr and hp['admm']:
    # Measured (benchmarks/studies/README.flat_minima.md): once SWA's cyclic client lr starts, the ADMM server term
    # outweighs the clients' steps at lr2 and the model collapses (digits: 0.86 -> 0.60).
    logging.warning('%s with server SWA and its cyclic client lr is unstable (the thesis never combines them); '
                    'use --config.swa.cyclic_lr=False (averaging only) or WiMA (wima.enabled)', cfg.algorithm)


def ascent(delta, rho, active):
  """eps = rho * delta / ||delta|| where `active` (and ||delta|| > 0), else 0."""
  norm = global_norm(delta)
  ok = active & (norm > 0)
  scale = jnp.where(ok, rho / jnp.where(ok, norm, 1.0), 0.0)
  return tmap(lambda d: (scale * d).astype(d.dtype), delta)


def _hp(ctx):
  hp = dict(ctx.hp)     # a copy: the schedule below joins it
  if hp['dual_variant'] not in DUAL_VARIANTS:
    raise ValueError(f"algo.dual_variant={hp['dual_variant']!r}; allowed: {DUAL_VARIANTS}")
  if not hp['beta'] > 0:
    raise ValueError(f"algo.beta={hp['beta']!r} must be > 0")
  if hp['admm']:
    hp['population'] = population(ctx, hp)     # K_total of the dual updates
  hp['rho_fn'] = _rho_fn(ctx.client_cfg, hp)
  return hp


def _rho_fn(client_cfg, hp):
  c = client_cfg
  return server_rho_schedule(hp['rho_server_schedule'], c.get('rho0', 0.0), c.rho, float(hp['rho_server']),
                             int(c.get('rho_warmup_rounds', 0)))


def _fedgloss_parts(ctx, hp):
  """Client functions and server pieces shared by FedGloSS and NaiveFedGloSS."""
  loss_fn, server_tx, tx = ctx.loss_fn, ctx.server_tx, ctx.client_tx
  beta = float(hp['beta'])
  admm = bool(hp['admm'])
  release = hp['dual_variant'] == 'release'

  def client_init(bcast, client_state, admm_on=admm):
    w0 = bcast['params']
    extra = client_state if admm_on else ()
    return local_lib.LocalState(w0, tx.init(w0), w0, extra)

  def client_step(bcast, local, batch, rng, admm_on=admm):
    correction = None
    if admm_on:   # - sigma_k + (w - w_{k,0}) / beta, at the unperturbed w
      correction = tmap(lambda w, w0, s: -s + (w - w0) / beta, local.params, local.init_params, local.extra)
    return local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'],
                                correction=correction)

  def client_final(bcast, local, client_state):
    """out: weighted D~ contribution (w~ - w_k); uniform (w_k - w~) for the global dual."""
    delta = tmap(lambda a, b: a - b, local.init_params, local.params)
    if not admm:
      return {'weighted': {'delta': delta}, 'uniform': {}}, client_state
    drift = tmap(lambda d: -d, delta)                                   # w_{k,E} - w~
    new_sigma_k = tmap(lambda s, d: s - d / beta, client_state, drift)
    return {'weighted': {'delta': delta}, 'uniform': {'drift': drift}}, new_sigma_k

  def descent(state, agg, eps):
    """sigma update, w <- ServerOpt(w, D~) - beta sigma; returns the new state (w is the unperturbed model)."""
    w = state['params']
    delta = agg['weighted']['delta']
    updates, opt_state = server_tx.update(delta, state['opt_state'], w)
    new_w = optax.apply_updates(w, updates)
    new = {**state, 'opt_state': opt_state}
    if admm:
      drift = agg['uniform']['drift']                                   # mean_{k in C^t} (w_k - w~)
      k_total = hp['population']      # an int, or a batched lane's traced N (core/runs.py): no float()
      if release:   # sigma - sum_k (w_k - w~) / (beta K_total |C^t|)
        sigma = tmap(lambda s, m: s - m / (beta * k_total), state['sigma'], drift)
      else:         # sigma - sum_k (w_k - w) / (beta K_total),  w_k - w = (w_k - w~) + eps
        n = agg['num_clients']
        sigma = tmap(lambda s, m, e: s - (n * (m + e)).astype(s.dtype) / (beta * k_total), state['sigma'],
                     drift, eps)
      new_w = tmap(lambda p, s: p - beta * s, new_w, sigma)
      new['sigma'] = sigma
    new['params'] = new_w
    return new, delta

  def dual_state(params):       # the server's dual sigma (ADMM), beside FedAvg's server state
    return {'sigma': tmap(jnp.zeros_like, params)} if admm else {}

  client_state_init = (lambda params: tmap(jnp.zeros_like, params)) if admm else None
  return client_init, client_step, client_final, descent, dual_state, client_state_init


def round_log(cfg, hp):
  """The server SAM radius rho_s(t) of each round, logged with the metrics (its schedule is the part of
  FedGloSS a user most often gets wrong: see optimizers/schedules.server_rho_schedule)."""
  rho_fn = _rho_fn(cfg.client, hp)
  return lambda t: {'server_rho': float(rho_fn(t))}


@register('fedgloss', hparams=HPARAMS, needs=('client_state',), check_data=check_data, round_log=round_log)
def fedgloss_builder(ctx) -> FederatedAlgorithm:
  hp = _hp(ctx)
  rho_fn = hp['rho_fn']
  hparams_fn = ctx.hparams_fn
  client_init, client_step, client_final, descent, dual_state, client_state_init = _fedgloss_parts(ctx, hp)

  def eps_of(state, round_idx):
    return ascent(state['delta_prev'], rho_fn(round_idx), state['has_prev'])

  server_init = fedavg_server_init(ctx.server_tx, lambda p: {**dual_state(p), 'delta_prev': tmap(jnp.zeros_like, p),
                                                              'has_prev': jnp.bool_(False)})

  # the clients start from w~ = w + eps, the server's ascent point
  broadcast = fedavg_broadcast(hparams_fn, model=lambda state, t: tmap(lambda w, e: w + e, state['params'],
                                                                        eps_of(state, t)))

  def server_update(state, agg, round_idx, phase=0):
    del phase
    new, delta = descent(state, agg, eps_of(state, round_idx))
    return {**new, 'delta_prev': delta, 'has_prev': jnp.bool_(True)}

  return FederatedAlgorithm(
      ctx.name, server_init, broadcast,
      lambda bcast, cs, rng: client_init(bcast, cs),
      client_step,
      client_final,
      server_update, client_state_init=client_state_init)


@register('naive_fedgloss', hparams=HPARAMS, needs=('client_state',), check_data=check_data,
          round_log=round_log)
def naive_fedgloss_builder(ctx) -> FederatedAlgorithm:
  hp = _hp(ctx)
  rho_fn = hp['rho_fn']
  admm = bool(hp['admm'])
  hparams_fn = ctx.hparams_fn
  client_init, client_step, client_final, descent, dual_state, client_state_init = _fedgloss_parts(ctx, hp)

  # w_tilde: its own buffer (no aliasing: the state is donated)
  server_init = fedavg_server_init(ctx.server_tx, lambda p: {**dual_state(p), 'w_tilde': tmap(jnp.copy, p)})

  def broadcast(state, round_idx, phase=0):
    params = state['params'] if phase == 0 else state['w_tilde']
    return {'params': params, 'hparams': hparams_fn(round_idx)}

  def n_client_init(bcast, client_state, rng, *, phase):
    del rng
    return client_init(bcast, client_state, admm_on=admm and phase == 1)

  def n_client_step(bcast, local, batch, rng, *, phase):
    return client_step(bcast, local, batch, rng, admm_on=admm and phase == 1)

  def n_client_final(bcast, local, client_state, *, phase):
    if phase == 0:   # gradient estimate only: duals untouched
      delta = tmap(lambda a, b: a - b, local.init_params, local.params)
      return {'weighted': {'delta': delta}, 'uniform': {}}, client_state
    return client_final(bcast, local, client_state)

  def server_update(state, agg, round_idx, phase=0):
    if phase == 0:   # w~ = w + rho_s(t) D / ||D||
      eps = ascent(agg['weighted']['delta'], rho_fn(round_idx), jnp.bool_(True))
      return {**state, 'w_tilde': tmap(lambda w, e: w + e, state['params'], eps)}
    eps = tmap(lambda a, b: a - b, state['w_tilde'], state['params'])
    new, _ = descent(state, agg, eps)
    return new

  return FederatedAlgorithm(ctx.name, server_init, broadcast, n_client_init, n_client_step,
                            n_client_final, server_update, client_state_init=client_state_init,
                            num_phases=2, comm_down=1.0, comm_up=1.0)
