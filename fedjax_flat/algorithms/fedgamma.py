"""FedGAMMA (Dai et al., IEEE TNNLS 2023: global sharpness-aware minimization). 2x communication.

SCAFFOLD's control variates (option II) around a SAM/ASAM client, as in the release code of FedSMOO's
authors (FL-Simulator, client/fedgamma.py + server/FedGamma.py) and the thesis ("SCAFFOLD + SAM", Table 4.14):

  server sends x and c                                                       (comm_down = 2)
  client k, y <- x, each step:   g <- grad f_B(y + eps) + (c - c_k),   eps = rho grad f_B(y) / ||grad f_B(y)||
  c_k+ = c_k - c + (x - y)/(K lr);  sends y - x and c_k+ - c_k               (comm_up = 2)
  server: x <- x + eta_g mean_S(y - x);  c <- c + (|S|/N) mean_S(dc)

algo.perturb_corrected=True takes the ascent along the corrected gradient (eps = rho (g + c - c_k)/||.||,
the correction inside the loss), the "global" perturbation reading of the paper; the release code perturbs
along the local gradient (the default). client.optimizer must be 'sam' or 'asam'. See scaffold.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_flat.algorithms.hparams import Flag, Population
from fedjax_flat.algorithms.registry import register
from fedjax_flat.algorithms.scaffold import scaffold_algorithm
from fedjax_flat.core.contract import FederatedAlgorithm


@register('fedgamma', hparams={'population': Population(), 'perturb_corrected': Flag(False)},
          client_optimizers=('sam', 'asam'), needs=('population', 'client_state'))
def fedgamma(ctx) -> FederatedAlgorithm:
  if ctx.client_cfg.optimizer not in ('sam', 'asam'):
    raise ValueError(f"{ctx.name} is SCAFFOLD with a sharpness-aware client: set client.optimizer to 'sam' or "
                     f"'asam'; got {ctx.client_cfg.optimizer!r}")
  make_loss = None
  if ctx.hp['perturb_corrected']:
    loss_fn = ctx.loss_fn

    def make_loss(corr):
      def loss(p, batch, rng=None):
        value, aux = loss_fn(p, batch, rng)
        lin = sum(jnp.vdot(c, w) for c, w in zip(jax.tree_util.tree_leaves(corr),
                                                          jax.tree_util.tree_leaves(p)))
        return value + lin, aux
      return loss
  return scaffold_algorithm(ctx, make_loss)
