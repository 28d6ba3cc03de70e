"""Fisher-weighted model merging at the server (Matena & Raffel 2022, "Merging Models with Fisher Weighting").

  server sends w^t
  client k: E local epochs of the client optimizer from w^t -> w_k; along the way the diagonal empirical Fisher
            F_k = max(eps, (1/n_k) sum_i (d/dw log p(y_i | x_i; w))^2)      (each example's squared gradient)
  upload:   {'fw': F_k * w_k, 'f': F_k}  ('weighted': the engine's streaming mean, weights N_k)
  server:   w* = sum_k N_k F_k w_k / sum_k N_k F_k   (elementwise)
            w^{t+1} = ServerOpt(w^t, w^t - w*)         (SGD lr 1: w^{t+1} = w*)

The merge is the closed form of Matena & Raffel's Sec. 2 (the Laplace approximation of each model's posterior:
theta* = sum_i lambda_i F_i theta_i / sum_i lambda_i F_i, elementwise) with the merging weights lambda_k = N_k,
the clients' example counts, so equal Fishers give FedAvg's mean; eps is their floor on the Fisher (algo.fisher_eps,
default 1e-6 as in their code) that keeps the ratio defined where every client's Fisher vanishes.

Why the upload is the two sums, not stacked models: both are example-weighted means, so the engine's streaming mean
computes numerator and denominator in O(chunk) memory and the server divides them.

Where F_k is measured, a deviation from the paper: a client's final local step sees its last batch, not its whole
data (client_final gets no batches in this contract), so F_k is the empirical Fisher accumulated over the client's
local steps, each example's squared gradient at the model its step starts from, over every example it trained on
(the paper's Fisher at the final model; with one local epoch of small steps the two are close). The per-example
gradients cost one more forward+backward pass a step: declared `extra_passes=1` for the virtual clock.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.hparams import Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init

tmap = jax.tree_util.tree_map


def example_sq_grads(loss_fn, params, batch, rng):
  """(sum_i g_i^2, the valid examples): g_i the gradient of example i's negative log-likelihood (its loss sum:
  masked examples give 0)."""
  def one(ex):
    b1 = tmap(lambda a: a[None], ex)
    return jax.grad(lambda q: loss_fn(q, b1, rng)[1][0])(params)
  g = jax.vmap(one)(batch)
  return tmap(lambda x: jnp.sum(jnp.square(x.astype(jnp.float32)), axis=0), g), jnp.sum(
      batch['mask'].astype(jnp.float32))


def fedfisher(model, loss_fn, client_tx: optax.GradientTransformation, hparams_fn,
              server_tx: optax.GradientTransformation, fisher_eps: float = 1e-6) -> FederatedAlgorithm:
  """The module docstring's algorithm; `fisher_eps` the floor on each client's diagonal Fisher."""
  del model
  tx = client_tx
  server_init = fedavg_server_init(server_tx)
  broadcast = fedavg_broadcast(hparams_fn)

  def client_init(bcast, client_state, rng):
    del client_state, rng
    p = bcast['params']
    return {'local': local_lib.LocalState(p, tx.init(p), p),
            'fsum': tmap(lambda x: jnp.zeros(x.shape, jnp.float32), p), 'n': jnp.zeros((), jnp.float32)}

  def client_step(bcast, st, batch, rng):
    sq, n = example_sq_grads(loss_fn, st['local'].params, batch, rng)
    local, out = local_lib.local_step(st['local'], batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'])
    return {'local': local, 'fsum': tmap(jnp.add, st['fsum'], sq), 'n': st['n'] + n}, out

  def client_final(bcast, st, client_state):
    del bcast
    w = st['local'].params
    f = tmap(lambda s: jnp.maximum(s / jnp.maximum(st['n'], 1.0), fisher_eps), st['fsum'])
    return {'weighted': {'fw': tmap(lambda fi, x: fi * x.astype(jnp.float32), f, w), 'f': f},
            'uniform': {}}, client_state

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    fw, f = agg['weighted']['fw'], agg['weighted']['f']
    merged = tmap(lambda a, b: a / jnp.maximum(b, jnp.finfo(jnp.float32).tiny), fw, f)
    delta = tmap(lambda p, m: (p - m).astype(p.dtype), state['params'], merged)
    updates, opt_state = server_tx.update(delta, state['opt_state'], state['params'])
    return {**state, 'params': optax.apply_updates(state['params'], updates), 'opt_state': opt_state}

  return FederatedAlgorithm('', server_init, broadcast, client_init, client_step, client_final, server_update,
                            extra_passes=1.0)   # the per-example gradients of every step (the module docstring)


@register('fedfisher', hparams={'fisher_eps': Number(1e-6, lo=0, lo_open=True)})
def _fedfisher(ctx):
  """Fisher-weighted averaging of the client models (Matena & Raffel 2022), example-count merging weights."""
  return fedfisher(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx,
                   float(ctx.hp['fisher_eps']))
