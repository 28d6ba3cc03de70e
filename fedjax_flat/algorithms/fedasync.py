"""FedAsync (Xie et al. 2019): asynchronous aggregation, one arrival per server step, on the virtual clock.

Each arrival (client k, started from version v_k, its model w_k) is mixed into the server model at once:

    tau = t - v_k,   alpha_t = alpha s(tau),   s(tau) = 1 / sqrt(1 + tau)   (polynomial staleness, a = 0.5)
    w^{t+1} = (1 - alpha_t) w^t + alpha_t w_k      (w_k = w^{v_k} - Delta_k; tau > S: discarded, w^{t+1} = w^t)

The models the clients started from are the ring of algorithms/fedbuff.py (S + 1 = max_staleness + 1 slots);
who arrives when: systems/events.py with a buffer of 1. No server optimizer: the mixing is the server step.
"""
from __future__ import annotations

import jax.numpy as jnp

from fedjax_flat.algorithms.common import tmap
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.fedbuff import models_at, push, staleness_weight, with_ring
from fedjax_flat.algorithms.hparams import Integer, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import AsyncSpec, FederatedAlgorithm

HPARAMS = {'alpha': Number(0.6, lo=0, hi=1, lo_open=True, note=' (the mixing weight before staleness)'),
           'concurrency': Integer(0, lo=0, note=' (clients training at once; 0: clients_per_round)'),
           'max_staleness': Integer(8, lo=0, note=' (S: staler arrivals are discarded; the ring holds S + 1 models)')}


def fedasync(base: FederatedAlgorithm, *, alpha: float, concurrency: int, max_staleness: int,
             name: str = '') -> FederatedAlgorithm:
  slots = max_staleness + 1
  at = models_at(slots)

  def server_update(state, agg, t, phase=0):
    del phase
    a = alpha * staleness_weight(agg['staleness'][0]) * agg['valid'][0].astype(jnp.float32)
    start = tmap(lambda r: r[0], at(state, agg['versions']))
    w_k = tmap(lambda s, d: s - d[0], start, agg['delta'])
    new = tmap(lambda w, c: ((1.0 - a) * w + a * c).astype(w.dtype), state['params'], w_k)
    return push(state, new, t, slots)

  return base.replace(name=name or base.name, server_init=with_ring(base.server_init, slots),
                      server_update=server_update,
                      asynchronous=AsyncSpec(1, concurrency, max_staleness, at))


@register('fedasync', hparams=HPARAMS)
def fedasync_builder(ctx) -> FederatedAlgorithm:
  hp = ctx.hp
  base = fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)
  return fedasync(base, alpha=float(hp['alpha']), concurrency=int(hp['concurrency']),
                  max_staleness=int(hp['max_staleness']), name=ctx.name)
