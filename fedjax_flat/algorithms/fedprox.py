"""FedProx (Li et al., MLSys 2020; FedJAX fedjax/algorithms/fed_prox.py).

  server sends w^t
  client k: each step of the client optimizer on  f_k(w) + (mu/2) ||w - w^t||^2:
              g <- grad f_B(w) [SAM/ASAM: at the ascent point] + mu (w - w^t)      (local_step `correction`)
  Delta = sum_k (N_k/N) (w^t - w_k);   w^{t+1} = ServerOpt(w^t, Delta)      (FedAvg server: SGD lr 1)

FedJAX builds the same gradient from mean(per_example_loss + (mu/2)||w - w^t||^2) and weights deltas by
the number of examples. mu = 0 is FedAvg. With client.optimizer 'asam' this is FedProx+ASAM (thesis
Table 4.8). Grids: mu in {0.1, 0.01, 0.001} (Ch. 4), {1e-4, 1e-3, 1e-2} (FedSeq).
"""
from __future__ import annotations

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import tmap
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.hparams import Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm


@register('fedprox', hparams={'mu': Number(0.01, lo=0)}, needs=('batch_stats',), upload='delta')
def fedprox(ctx) -> FederatedAlgorithm:
  """FedAvg whose clients add the proximal gradient mu (w - w^t) (at the unperturbed weights)."""
  mu = float(ctx.hp['mu'])
  loss_fn, tx = ctx.loss_fn, ctx.client_tx
  base = fedavg(ctx.model, loss_fn, tx, ctx.hparams_fn, ctx.server_tx)

  def client_step(bcast, local, batch, rng):
    prox = tmap(lambda w, w0: mu * (w - w0), local.params, local.init_params)       # mu (w - w^t)
    return local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'],
                                correction=prox)

  return base.replace(client_step=client_step)
