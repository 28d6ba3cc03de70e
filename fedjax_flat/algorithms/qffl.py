"""q-FFL / q-FedAvg (Li, Sanjabi, Beirami & Smith, ICLR 2020, "Fair Resource Allocation in Federated Learning",
Algorithm 3; release code litian96/fair_flearn, flearn/trainers/qffedavg.py): the fairness baseline, clients with a
larger loss weigh more.

  server sends w^t
  client k: F_k = F_k(w^t), its training loss at w^t; E local epochs of the client optimizer from w^t -> w_k
            Dw_k = L (w^t - w_k),  L = 1 / lr (the round's client learning rate: the paper's Lipschitz estimate)
            D_k  = F_k^q Dw_k
            h_k  = q F_k^(q-1) ||Dw_k||^2 + L F_k^q      (||.||: the L2 norm over every layer at once)
  w^{t+1} = ServerOpt(w^t, sum_k D_k / sum_k h_k)      (server SGD lr 1, the paper: w^t - sum D_k / sum h_k)

q = 0 is FedAvg with a uniform mean over the round's clients (h_k = L, D_k = L (w^t - w_k)); larger q pulls the
model towards the clients of high loss. The uploads go through the engine's uniform means: sum D_k / sum h_k is
mean D_k / mean h_k.

As the release: F_k^q is (F_k + 1e-10)^q (so q < 1 stays finite at F_k = 0), and the squared norm is the whole
model's. Where it departs: the release computes F_k on the client's whole training set in one pass before
training; here F_k is the mean loss at w^t over the examples of the round's local steps (one forward pass at w^t
per step, in evaluation mode), which is the same number when the local steps cover whole epochs and nothing
augments the data, and the loss on the examples seen otherwise. The release samples clients with probability
proportional to their size (its `sampling` option); here the run's sampling decides. L = 1/lr is an estimate for
SGD steps at one learning rate, so another base optimizer or an lr that changes within the round is refused.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import check_sgd_one_lr, tmap
from fedjax_flat.algorithms.hparams import Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init

EPS = 1e-10     # the release's loss offset inside the powers


def qffl_upload(w0, w, loss, q, lr):
  """(D_k, h_k) of one client from its start w0 = w^t, its trained w, its loss F_k at w^t (the module docstring)."""
  lip = 1.0 / lr
  dw = tmap(lambda a, b: lip * (a - b), w0, w)
  sq = sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(dw))
  fq = jnp.power(loss + EPS, q)
  h = q * jnp.power(loss + EPS, q - 1.0) * sq + lip * fq
  return tmap(lambda a: fq * a, dw), h


def qffl(loss_fn, eval_loss_fn, client_tx, hparams_fn, server_tx, *, q, name: str = '') -> FederatedAlgorithm:
  """loss_fn: the training loss the client optimizer follows; eval_loss_fn: the loss F_k (evaluation mode)."""
  tx = client_tx
  server_init = fedavg_server_init(server_tx)
  broadcast = fedavg_broadcast(hparams_fn)

  def client_init(bcast, client_state, rng):
    del client_state, rng
    p = bcast['params']
    return local_lib.LocalState(p, tx.init(p), p, {'loss_sum': jnp.zeros(()), 'count': jnp.zeros(())})

  def client_step(bcast, local, batch, rng):
    # F_k(w^t) on this step's examples: summed over the round's steps it is the loss over the examples seen.
    _, (loss_sum, count) = eval_loss_fn(local.init_params, batch, None)
    new, m = local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'])
    acc = {'loss_sum': local.extra['loss_sum'] + loss_sum, 'count': local.extra['count'] + count}
    return new._replace(extra=acc), m

  def client_final(bcast, local, client_state):
    loss = local.extra['loss_sum'] / jnp.maximum(local.extra['count'], 1.0)
    d, h = qffl_upload(local.init_params, local.params, loss, q, bcast['hparams']['lr'])
    return {'weighted': {}, 'uniform': {'d': d, 'h': h}}, client_state

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    u = agg['uniform']
    h = u['h']       # > 0 once a client reported (L F^q > 0); 0 in a round where none did: no step, not 0/0
    step = tmap(lambda d: jnp.where(h > 0, d / jnp.where(h > 0, h, 1.0), 0.0), u['d'])   # mean D / mean h
    updates, opt_state = server_tx.update(step, state['opt_state'], state['params'])
    return {**state, 'params': optax.apply_updates(state['params'], updates), 'opt_state': opt_state}

  return FederatedAlgorithm(name, server_init, broadcast, client_init, client_step, client_final, server_update,
                            extra_passes=1.0 / 3.0)    # the forward pass at w^t: about a third of a step


def check(cfg, hp) -> None:
  """L = 1/lr is the Lipschitz estimate of SGD steps at one lr through the round (the paper's and the release's
  local solver): another base optimizer or an lr that changes within the round would make it some other number."""
  del hp
  check_sgd_one_lr(cfg, 'qffl', 'estimates L = 1/lr from SGD steps')


@register('qffl', hparams={'q': Number(1.0, lo=0, finite=True, bound=True,
                                       note=' (0 = FedAvg with a uniform mean; larger = fairer)')}, check=check)
def _qffl(ctx) -> FederatedAlgorithm:
  """q-FedAvg: the clients' updates weighted by their loss at w^t to the power q, a step size from the
  Lipschitz estimate 1/lr."""
  eval_loss = local_lib.make_loss(ctx.model, train=False, task=ctx.task)
  return qffl(ctx.loss_fn, eval_loss, ctx.client_tx, ctx.hparams_fn, ctx.server_tx, q=float(ctx.hp['q']),
              name=ctx.name)
