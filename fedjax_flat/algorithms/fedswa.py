"""FedSWA and FedMoSWA (Liu et al., ICML 2025: stochastic weight averaging for highly heterogeneous FL; release code
junkangLiu0/FedSWA, main_FedSWA.py `update_FedSWA`, `update_FedMoSWA`, `update_scafplus`, `apply_weights_SCAF`).
No SAM: one forward+backward pass a local step.

Each round is one cycle of a cyclic learning rate; the server averages the cycles' end points (the SWA):
  local step k = 0 .. K-1 of client k (K = algo.cycle_steps, 0 = client.local_steps):
        lr_k = ((1 - k/K) + (k/K) r) lr          from lr = client.lr (the round's) down towards r lr, r = lr_ratio
        (steps past K keep r lr)
FedSWA:   w_k <- w_k - lr_k (g + wd w_k);  server FedAvg: w^{t+1} = ServerOpt(w^t, sum_k (N_k/N)(w^t - w_k))
FedMoSWA: SCAFFOLD's control variates on the cyclic steps, the global one updated with momentum:
        w_k <- w_k - lr_k (g + c - c_k + wd w_k)
        c_k+ = c_k - c + (w^t - w_k) / (K_k lr_bar)     lr_bar = the mean lr of the client's K_k valid steps
        server: w^{t+1} = ServerOpt(w^t, mean_S(w^t - w_k))   (plain means, as the release)
                c <- c + beta (mean_S c_k+ - c)   (round 1: c = mean_S c_k+; apply_weights_SCAF)   beta = algo.beta

The rule needs K before the round starts, and a client does not see its own number of batches before it trains:
K = algo.cycle_steps, else client.local_steps (exact: every client takes K steps), else in the epochs mode the
release README's K = 50 (a warning names the run's own step count when it differs; a client with fewer steps stops
before the bottom of the cycle, one with more keeps r lr past K).

Where the release differs:
  * update_FedSWA builds its SGD with lr*2 and hard-codes rho = 0 (lr_ratio = 0): lr_k = 2 (1 - k/K) args.lr; the
    README's "FedSWA's lr is twice FedAvg's" is on top of it. Here: client.lr = 2 args.lr, algo.lr_ratio=0. The
    README passes --rho 0.01, the default lr_ratio here.
  * the registered 'MoFedSWA' of the release runs `update_scafplus`, not `update_FedMoSWA`: a constant lr
    (algo.lr_ratio=1), at most args.K steps, the raw gradient clipped BEFORE c - c_k is added (here
    client.grad_clip clips the corrected one), beta = 0.4 hard-coded (the default here). `update_FedMoSWA` (never
    dispatched) is the cyclic form above, lr_bar = (lr + r lr) / 2: FedMoSWA's algo.cv_lr='release' (the mean of
    the cycle's two ends, for K_k steps) instead of the default 'steps' (the mean of the lrs the client took).

Checked against the release (benchmarks/reference/flat2024_releases.py, torch 2.13 CPU, 3 rounds):
runs main_FedSWA.py's own DataWorker methods and server functions (taken with ast): FedSWA (update_FedSWA +
apply_weights_avg; client.lr = 2 lr, lr_ratio 0, clip acting) 2.9e-6 / 1.9e-6 (client step / round); the
registered MoFedSWA (update_scafplus + apply_weights_SCAF; lr_ratio 1) 9.5e-8 / 9.9e-8. update_FedMoSWA (cyclic)
with algo.cv_lr='release' 2.2e-7 / 1.5e-7; with the default cv_lr='steps' the steps agree (9.4e-8 in round 1) and
c_k differs (relative gap (1 - r) / (2K): 25% at the check's K = 3, 1% at K = 50). The suite's tests stay the
NumPy re-implementation and the rule for both cv_lr (tests/algorithms/test_fedswa.py).
"""
from __future__ import annotations

import jax.numpy as jnp
import optax
from absl import logging

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import server_step_to, tmap
from fedjax_flat.algorithms.hparams import Choice, Integer, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init
from fedjax_flat.data import batching


RELEASE_K = 50     # the release README's --K 50 local steps


def cycle_length(cfg, hp) -> int:
  """K: algo.cycle_steps, else client.local_steps, else (the epochs mode) the release README's K = 50."""
  return int(hp['cycle_steps'] or cfg.client.get('local_steps', 0) or RELEASE_K)


def check_data(cfg, hp, data) -> None:
  """The epochs mode: K against the run's step count (its largest client's), which the rule cannot read."""
  if hp['cycle_steps'] or cfg.client.get('local_steps', 0):
    return
  c = cfg.client
  s = batching.padded_num_steps(data.client_sizes(), c.batch_size, epochs=c.local_epochs,
                                full_batches=bool(c.get('full_batches', False)), max_steps=c.get('max_local_steps', 0))
  if s != RELEASE_K:
    logging.warning('%s decays the client lr over K = %d steps (algo.cycle_steps=0, epochs mode) but the largest '
                    'client takes %d a round: set --config.algo.cycle_steps=%d for a full cycle', cfg.algorithm,
                    RELEASE_K, s, s)


def cyclic_lr(lr, k, K, ratio):
  """((1 - k/K) + (k/K) ratio) lr, k the 0-based local step (k >= K: ratio lr)."""
  f = jnp.minimum(k / K, 1.0)
  return ((1.0 - f) + f * ratio) * lr


_HPARAMS = {'lr_ratio': Number(0.01, lo=0, hi=1, note=' (the release code: 0)'),
            'cycle_steps': Integer(0, lo=0, note=' (0: client.local_steps, else 50)')}
CV_LR = ('steps', 'release')      # FedMoSWA's K_k lr_bar: the sum of the lrs taken / K_k (lr + r lr) / 2


def swa_algorithm(ctx, momentum: bool) -> FederatedAlgorithm:
  hp = ctx.hp
  K = cycle_length(ctx.config, hp)
  ratio = float(hp['lr_ratio'])
  beta = float(hp['beta']) if momentum else 0.0
  release_cv = momentum and hp['cv_lr'] == 'release'
  loss_fn, server_tx, tx, hparams_fn = ctx.loss_fn, ctx.server_tx, ctx.client_tx, ctx.hparams_fn
  zeros = lambda t: tmap(jnp.zeros_like, t)  # noqa: E731

  # FedMoSWA keeps its momentum control variate 'c' at the server and sends it to the clients.
  server_init = fedavg_server_init(
      server_tx, extra=lambda params: {'c': zeros(params), 'first': jnp.bool_(True)} if momentum else {})
  broadcast = fedavg_broadcast(hparams_fn, shared=('c',) if momentum else ())

  def client_init(bcast, ck, rng):
    del rng
    w = bcast['params']
    extra = {'k': jnp.zeros((), jnp.float32), 'lr_sum': jnp.zeros((), jnp.float32)}
    if momentum:
      extra['corr'] = tmap(lambda c, cc: c - cc, bcast['c'], ck)
    return local_lib.LocalState(w, tx.init(w), w, extra)

  def client_step(bcast, local, batch, rng):
    ex = local.extra
    lr_k = cyclic_lr(bcast['hparams']['lr'], ex['k'], K, ratio)
    new, m = local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx,
                                  hparams={**bcast['hparams'], 'lr': lr_k},
                                  correction=ex['corr'] if momentum else None)
    return new._replace(extra={**ex, 'k': ex['k'] + 1.0, 'lr_sum': ex['lr_sum'] + lr_k}), m

  def client_final(bcast, local, ck):
    x, y = local.init_params, local.params
    delta = tmap(lambda a, b: a - b, x, y)
    if not momentum:
      return {'weighted': {'delta': delta}, 'uniform': {}}, ck
    if release_cv:      # update_FedMoSWA: K_k times the mean of the cycle's two ends
      k_lr = local.extra['k'] * (1.0 + ratio) / 2.0 * bcast['hparams']['lr']
    else:               # K_k lr_bar = the sum of the lrs used
      k_lr = local.extra['lr_sum']
    k_lr = jnp.maximum(k_lr, 1e-12)
    c_new = tmap(lambda cc, c, d: cc - c + d / k_lr, ck, bcast['c'], delta)
    return {'weighted': {}, 'uniform': {'delta': delta, 'c_new': c_new}}, c_new

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    w = state['params']
    if not momentum:
      updates, opt_state = server_tx.update(agg['weighted']['delta'], state['opt_state'], w)
      return {**state, 'params': optax.apply_updates(w, updates), 'opt_state': opt_state}
    new = server_step_to(server_tx, state, tmap(lambda p, d: p - d, w, agg['uniform']['delta']))
    b = jnp.where(state['first'], 1.0, beta)
    new['c'] = tmap(lambda c, cn: c + b * (cn - c), state['c'], agg['uniform']['c_new'])
    new['first'] = jnp.bool_(False)
    return new

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, client_state_init=(lambda p: zeros(p)) if momentum else None,
                            comm_down=2.0 if momentum else 1.0, comm_up=2.0 if momentum else 1.0,
                            extra_passes=0.0)   # no SAM: the SGD client's one pass a step


@register('fedswa', hparams=dict(_HPARAMS), client_optimizers=('sgd',), check_data=check_data, upload='delta')
def fedswa(ctx) -> FederatedAlgorithm:
  return swa_algorithm(ctx, momentum=False)


@register('fedmoswa', hparams={**_HPARAMS, 'beta': Number(0.4, lo=0, hi=1, lo_open=True),
                                'cv_lr': Choice('steps', allowed=CV_LR)},
          client_optimizers=('sgd',), check_data=check_data, needs=('client_state',))
def fedmoswa(ctx) -> FederatedAlgorithm:
  return swa_algorithm(ctx, momentum=True)
