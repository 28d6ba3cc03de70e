"""FedProx (Li et al., MLSys 2020; FedJAX fedjax/algorithms/fed_prox.py).

  server sends w^t
  client k: each step of the client optimizer on  f_k(w) + (mu/2) ||w - w^t||^2:
              g <- grad f_B(w) [SAM/ASAM: at the ascent point] + mu (w - w^t)      (local_step `correction`)
  Delta = sum_k (N_k/N) (w^t - w_k);   w^{t+1} = ServerOpt(w^t, Delta)      (FedAvg server: SGD lr 1)

FedJAX builds the same gradient from mean(per_example_loss + (mu/2)||w - w^t||^2) and weights deltas by
the number of examples. mu = 0 is FedAvg. With client.optimizer 'asam' this is FedProx+ASAM (thesis
Table 4.8). Grids: mu in {0.1, 0.01, 0.001} (Ch. 4), {1e-4, 1e-3, 1e-2} (FedSeq).

This module also holds the small helpers the other baseline modules share (hyperparameters, population,
the server step towards a target model, a client config with its sharpness step removed).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.algorithms.fedavg import make_hparams_fn
from fedjax_flat.algorithms.registry import default_hparams, register

tmap = jax.tree_util.tree_map


# ---- shared helpers of the baseline modules -------------------------------------------------------------
def hparams(ctx, name: str) -> dict:
  """config.algo over the registered defaults of `name`."""
  return {**default_hparams(name), **ctx.algo.to_dict()}


def population(ctx, hp: dict) -> int:
  """N, the number of clients (SCAFFOLD's |S|/N, FedDyn's 1/m): algo.population, else the dataset's number of
  clients (BuildContext.population), else config.data.num_clients. config/validate.py checks an explicit
  algo.population against the dataset before anything is built."""
  n = (int(hp.get('population', 0) or 0) or int(getattr(ctx, 'population', 0) or 0)
       or int(ctx.config.data.get('num_clients', 0) or 0))
  if n <= 0:
    raise ValueError('this algorithm needs the population size N: set config.algo.population '
                     '(or config.data.num_clients)')
  return n


def server_step_to(server_tx, state, target):
  """ServerOpt on the pseudo-gradient w - target: with server SGD lr 1 (the papers' setting) w' = target."""
  w = state['params']
  pseudo = tmap(lambda a, b: a - b, w, target)
  updates, opt_state = server_tx.update(pseudo, state['opt_state'], w)
  return {**state, 'params': optax.apply_updates(w, updates), 'opt_state': opt_state}


def without_sharpness(client_cfg):
  """The client config with optimizer 'sgd': for methods that compute their own ascent step (FedSpeed,
  FedSMOO) and feed the resulting gradient to the rest of the client chain (correction, clip, wd, sgd)."""
  cfg = ml_collections.ConfigDict(client_cfg.to_dict())
  cfg.optimizer = 'sgd'
  return cfg


def global_norm(tree):
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree_util.tree_leaves(tree)))


# ---- FedProx ----------------------------------------------------------------------------------------------
@register('fedprox', hparams={'mu': 0.01})
def fedprox(ctx) -> FederatedAlgorithm:
  """FedAvg whose clients add the proximal gradient mu (w - w^t) (at the unperturbed weights)."""
  from fedjax_flat.algorithms.fedavg import fedavg
  mu = float(hparams(ctx, 'fedprox')['mu'])
  client_cfg, loss_fn, make_client_tx = ctx.client_cfg, ctx.loss_fn, ctx.make_client_tx
  base = fedavg(ctx.model, loss_fn, client_cfg, ctx.server_tx, make_client_tx=make_client_tx, name='fedprox')

  def client_step(bcast, local, batch, rng):
    tx = make_client_tx(client_cfg, bcast['hparams'])
    prox = tmap(lambda w, w0: mu * (w - w0), local.params, local.init_params)       # mu (w - w^t)
    return local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, correction=prox)

  return base.replace(client_step=client_step)
