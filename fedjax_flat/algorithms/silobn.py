"""SiloBN (Andreux et al. 2020; FedDrive's baseline): FedAvg with BatchNorm statistics local.

  server sends w^t (every param, and BatchNorm statistics it never updates after round 0)
  client k: starts from w^t with ITS OWN running statistics (the server's on its first visit), trains
            E local epochs (statistics follow the BatchNorm update), keeps its new statistics
  server: FedAvg / FedOpt on everything else (the affine scale and bias of the norms included)

The client's statistics live in its client state (algorithms/wrappers/local_norm.with_local_norm with
`select=is_batch_stats_path`, in the client-state store). With the client optimizer SAM / ASAM this is
Table 4.10's "SiloBN + SAM / ASAM"; with server SWA, "+ SWA". FedBN (statistics AND affine params local)
is the algorithm 'fedbn'. Unseen test clients need a test-time policy (config.bn.test_policy,
core/batch_stats.py). A model without BatchNorm makes this plain FedAvg.
"""
from __future__ import annotations

from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.registry import register
from fedjax_flat.algorithms.wrappers import local_norm


@register('silobn', needs=('client_state', 'batch_stats', 'local_batch_stats'), upload='delta')
def _silobn_builder(ctx) -> FederatedAlgorithm:
  base = fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)
  return local_norm.with_local_norm(base, name=ctx.name, select=local_norm.is_batch_stats_path)
