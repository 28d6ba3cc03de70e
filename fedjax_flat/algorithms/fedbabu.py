"""FedBABU (Oh et al., ICLR 2022): only the body is trained and aggregated; the head stays at its random init.

  server sends w^t = (phi^t, h^0)             h^0: the randomly initialised head, never changed during FL
  client k: local training of phi from phi^t with the head frozen at h^0 -> phi_k
  phi^{t+1} = ServerOpt(phi^t, sum_k (N_k / N) (phi^t - phi_k));   the head is restored to h^0 bit for bit
  after FL: each client fine-tunes the whole model on its local data (personalization; the paper's and the
            release's default fine-tunes body and head): config.personalized.finetune_epochs, evaluated by
            evaluation/personalized.py after every fine-tuning epoch

The head is frozen as torch's requires_grad=False freezes it (algorithms/local.masked_step: zero gradient,
value restored after each step), and the server keeps its own copy of h^0 whatever the server optimizer
does, so the global model's head is bit-identical to the initial one through FL. The head/body split is the
model's declared head (models/partition.py).
"""
from __future__ import annotations

import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import check_head, tmap
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.models import partition


def fedbabu(model, loss_fn, client_tx: optax.GradientTransformation, hparams_fn,
            server_tx: optax.GradientTransformation) -> FederatedAlgorithm:
  tx = client_tx
  base = fedavg(model, loss_fn, tx, hparams_fn, server_tx)
  mask_of = lambda p: partition.head_mask(model, p)  # noqa: E731   (True = head)

  def client_step(bcast, local, batch, rng):
    body = tmap(lambda m: not m, mask_of(local.params))
    return local_lib.masked_step(local, batch, rng, loss_fn=loss_fn, tx=tx, trainable=body,
                                 hparams=bcast['hparams'])

  def server_update(state, agg, round_idx, phase=0):
    new = base.server_update(state, agg, round_idx, phase)
    # The head never moves: h^0 kept exactly (a server optimizer with momentum or Adam could drift it).
    return {**new, 'params': partition.merge(mask_of(state['params']), state['params'], new['params'])}

  return base.replace(client_step=client_step, server_update=server_update)


@register('fedbabu', check=check_head, upload='delta')
def _fedbabu_builder(ctx) -> FederatedAlgorithm:
  """FedBABU: body-only FL with a fixed random head; fine-tune with config.personalized.finetune_epochs."""
  return fedbabu(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)

