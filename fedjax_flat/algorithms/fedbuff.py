"""FedBuff (Nguyen et al. 2022): buffered asynchronous aggregation on the virtual clock.

`concurrency` clients train at once, each from the model version the server held when it started
(systems/events.py decides who arrives when, on the clock's speeds and bandwidths). The server keeps the last
S + 1 models (a ring in its state, S = max_staleness); every K = `buffer` arrivals it takes one step:

    Delta_k = w^{v_k} - w_k                   client k's delta from the version v_k it started from
    tau_k   = t - v_k,   s(tau) = 1 / sqrt(1 + tau)     (arrivals with tau > S are discarded: s = 0)
    Delta   = (1 / K) sum_k s(tau_k) Delta_k
    w^{t+1} = ServerOpt(w^t, Delta)           (server SGD lr eta_g: w^t - eta_g Delta)

Clients run the client optimizer as FedAvg's do (SAM / ASAM: FedBuff with SAM clients). The server step is a
function of values (K, S), not of the config; training/driver.AsyncDriver runs one compiled program per step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.algorithms.common import tmap
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.hparams import Integer
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import AsyncSpec, FederatedAlgorithm

HPARAMS = {'buffer': Integer(3, lo=1, note=' (K: arrivals per server step)'),
           'concurrency': Integer(0, lo=0, note=' (clients training at once; 0: clients_per_round)'),
           'max_staleness': Integer(8, lo=0, note=' (S: staler arrivals are discarded; the ring holds S + 1 models)')}


def staleness_weight(tau):
  """s(tau) = 1 / sqrt(1 + tau), traced."""
  return jax.lax.rsqrt(1.0 + jnp.asarray(tau, jnp.float32))


def with_ring(server_init, slots: int):
  """server_init(params, rng) whose state also holds `ring`: `slots` copies of the initial model."""
  def init(params, rng):
    state = server_init(params, rng)
    return {**state, 'ring': tmap(lambda p: jnp.broadcast_to(p, (slots,) + p.shape), params)}
  return init


def models_at(slots: int):
  def at(state, versions):
    return tmap(lambda r: r[jnp.asarray(versions) % slots], state['ring'])
  return at


def push(state, params, t, slots: int):
  """The new model w^{t+1} written into the ring's slot (t + 1) mod slots."""
  i = (jnp.asarray(t, jnp.int32) + 1) % slots
  return {**state, 'params': params, 'ring': tmap(lambda r, p: r.at[i].set(p), state['ring'], params)}


def fedbuff(base: FederatedAlgorithm, server_tx, *, buffer: int, concurrency: int, max_staleness: int,
            name: str = '') -> FederatedAlgorithm:
  """`base`: FedAvg (its broadcast and client functions); the server step above."""
  slots = max_staleness + 1

  def server_update(state, agg, t, phase=0):
    del phase
    s = staleness_weight(agg['staleness']) * agg['valid'].astype(jnp.float32)
    delta = tmap(lambda d: jnp.tensordot(s.astype(d.dtype), d, axes=1) / buffer, agg['delta'])
    updates, opt_state = server_tx.update(delta, state['opt_state'], state['params'])
    return push({**state, 'opt_state': opt_state}, optax.apply_updates(state['params'], updates), t, slots)

  return base.replace(name=name or base.name, server_init=with_ring(base.server_init, slots),
                      server_update=server_update,
                      asynchronous=AsyncSpec(buffer, concurrency, max_staleness, models_at(slots)))


@register('fedbuff', hparams=HPARAMS)
def fedbuff_builder(ctx) -> FederatedAlgorithm:
  hp = ctx.hp
  base = fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)
  return fedbuff(base, ctx.server_tx, buffer=int(hp['buffer']), concurrency=int(hp['concurrency']),
                 max_staleness=int(hp['max_staleness']), name=ctx.name)
