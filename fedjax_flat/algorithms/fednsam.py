"""FedNSAM (Liu et al., 2026: Nesterov-momentum sharpness-aware FL; release code junkangLiu0/FedNSAM,
main_FedNSAM.py `update_NSAM`, `apply_weights_avgACG`). The server's Nesterov momentum is the clients' estimate of
the global ascent direction, unnormalised: one backward pass a local step.

variant='paper' (the default):
  server state: w, m (init 0)
  server sends w and m                                                       (comm_down = 2)
  client k, w_{k,0} = w, each local step on batch B:
        g = grad f_B(w_k + gamma m)                  the gradient at the momentum-extrapolated point (one pass)
        w_k <- w_k - lr (g + wd w_k)                client chain (clip, wd, momentum) at the unperturbed w_k
  server: Delta = (1/|S|) sum_S (w_k - w)
          m <- gamma m + Delta;  w <- w + m          (= ServerOpt(w, -m), exact with server SGD lr 1)
  client.optimizer must be 'sgd': the extrapolation is the method's ascent.

variant='release' (main_FedNSAM.py as it runs):
  server sends the lookahead w~ = w + gamma m                                (comm_down = 1)
  client k starts AT w~ and takes steps of the client optimizer (the release: SAM, rho 0.05 hard-coded, clip 10,
        weight decay 1e-3: client.optimizer='sam', client.rho=0.05, client.grad_clip=10, client.weight_decay=1e-3)
  server: Delta = (1/|S|) sum_S (w_k - w~)
          m <- Delta in the first round, then (1 + gamma) Delta: `apply_weights_avgACG` loops
          `for k, v in sum_weights.items(): momen_m[k] = gamma * v + sum_weights[k]`, so v is Delta itself, not the
          old momentum (its unused twin apply_weights_avgACG2 has gamma * m + Delta); w <- w + m.
  The release hard-codes gamma = 0.85 (args.gamma overwritten in update_NSAM) and averages plainly, as here.

Plain means over the round's clients in both (the release's; FedACG's convention, fedacg.py). The evaluated model is
w. algo.gamma: 0.85 (the release's and the README's).

Checked against the release (benchmarks/reference/flat2024_releases.py, torch 2.13 CPU, 3 rounds):
runs main_FedNSAM.py's own DataWorker.update_NSAM and apply_weights_avgACG (taken from the script with ast; its
module-level setup replaced) next to variant='release': max relative error 1.1e-6 (client step), 9.8e-7 (round;
the clip acting). The suite's test stays the NumPy re-implementation (tests/algorithms/test_fednsam.py).
"""
from __future__ import annotations

import jax.numpy as jnp

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import server_step_to, tmap
from fedjax_flat.algorithms.fedlesam import weights_only
from fedjax_flat.algorithms.hparams import Choice, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init
from fedjax_flat.errors import ConfigError

VARIANTS = ('paper', 'release')


def check(cfg, hp) -> None:
  """The paper's extrapolated gradient is the method's ascent step: no second ascent from the client optimizer."""
  if hp['variant'] == 'paper' and cfg.client.optimizer != 'sgd':
    raise ConfigError('client.optimizer', cfg.client.optimizer,
                      "fednsam (algo.variant='paper') takes its gradient at w + gamma m itself: set "
                      "client.optimizer='sgd', or algo.variant='release' for the release's SAM client")


@register('fednsam', hparams={'gamma': Number(0.85, lo=0, hi=1, hi_open=True),
                              'variant': Choice('paper', VARIANTS,
                                                note=" (paper: the gradient at w + gamma m from w; release: SAM "
                                                     "steps from w + gamma m, m = (1 + gamma) Delta)")},
          client_optimizers=('sgd', 'sam', 'asam'), check=check)
def fednsam(ctx) -> FederatedAlgorithm:
  hp = ctx.hp
  gamma, release = float(hp['gamma']), hp['variant'] == 'release'
  if hp['variant'] not in VARIANTS:
    raise ValueError(f"algo.variant={hp['variant']!r}; allowed: {VARIANTS}")
  loss_fn, server_tx, tx, hparams_fn = ctx.loss_fn, ctx.server_tx, ctx.client_tx, ctx.hparams_fn

  server_init = fedavg_server_init(server_tx, extra=lambda params: {'m': tmap(jnp.zeros_like, params),
                                                                     'first': jnp.bool_(True)})

  if release:   # the lookahead is where the clients start
    broadcast = fedavg_broadcast(hparams_fn, model=lambda state, t: tmap(lambda w, m: w + gamma * m,
                                                                          state['params'], state['m']))
  else:         # BatchNorm running statistics are not shifted (they would be carried into the step's statistics)
    broadcast = fedavg_broadcast(hparams_fn, extra=lambda state, t: {
        'shift': weights_only(tmap(lambda m: gamma * m, state['m']))})

  def client_init(bcast, cs, rng):
    del cs, rng
    w = bcast['params']
    return local_lib.LocalState(w, tx.init(w), w)

  def client_step(bcast, local, batch, rng):
    loss = loss_fn
    if not release:   # gradient at w_k + gamma m, taken with respect to w_k
      shift = bcast['shift']
      loss = lambda p, b, r=None: loss_fn(tmap(lambda a, s: a + s.astype(a.dtype), p, shift), b, r)  # noqa: E731
    return local_lib.local_step(local, batch, rng, loss_fn=loss, tx=tx, hparams=bcast['hparams'])

  def client_final(bcast, local, cs):
    del bcast
    return {'weighted': {}, 'uniform': {'dy': tmap(lambda a, b: a - b, local.params, local.init_params)}}, cs

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    delta = agg['uniform']['dy']
    if release:   # apply_weights_avgACG as it runs: m = Delta in round 1, then (1 + gamma) Delta
      m = tmap(lambda d: jnp.where(state['first'], 1.0, 1.0 + gamma) * d, delta)
    else:
      m = tmap(lambda mm, d: gamma * mm + d, state['m'], delta)
    target = tmap(lambda w, mm: w + mm, state['params'], m)
    return {**server_step_to(server_tx, state, target), 'm': m, 'first': jnp.bool_(False)}

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, comm_down=1.0 if release else 2.0,
                            extra_passes=0.0)   # paper: SGD's one pass; release: the client optimizer's own
