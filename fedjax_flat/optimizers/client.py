"""The client optimizer, built from config and from the per-round hyperparameters the server broadcasts.

chain(  [sam(rho) | asam(rho, eta) | nothing]   replaces g by the gradient at the ascent point
        add_correction()                        + algorithm correction (FedProx, SCAFFOLD, FedDyn...)
        [clip_by_global_norm(c)]                (FedDyn's gradient clipping)
        add_decayed_weights(wd)                 PyTorch-style coupled weight decay, at the unperturbed w
        sgd(lr, momentum) | adam(lr, b1, b2, eps) )   client.base_optimizer
lr: the broadcast one, or with client.lr_schedule='poly_step' lr * (1 - t / lr_poly_max) ** lr_power over the
round's local steps t (FedDrive's client scheduler; optimizers/schedules.poly_lr).

Adam (FedSoup's client optimizer) is torch.optim.Adam with its coupled `weight_decay`; its moments start at
zero each round (the usual FL practice; FedSoup's code keeps them across rounds per client).

It is built inside the jitted round from traced hparams (lr, rho), so a schedule driven by the server
(SWA's cyclic lr, FedGloSS's rho warm-up) changes values, never shapes: no recompilation.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax


class _Empty(NamedTuple):
  pass


def add_correction() -> optax.GradientTransformationExtraArgs:
  """Adds the `correction` extra argument (a pytree like the params) to the updates, if given."""
  def init(params):
    del params
    return _Empty()

  def update(updates, state, params=None, *, correction=None, **extra):
    del params, extra
    if correction is not None:
      updates = jax.tree_util.tree_map(lambda u, c: u + c.astype(u.dtype), updates, correction)
    return updates, state
  return optax.GradientTransformationExtraArgs(init, update)


def make_client_tx(client_cfg, hparams) -> optax.GradientTransformation:
  """client_cfg: the config's `client` section; hparams: {'lr': scalar, 'rho': scalar} (may be traced)."""
  parts = []
  kind = client_cfg.optimizer
  if kind == 'sam':
    from fedjax_flat.optimizers.sam import sam
    parts.append(sam(hparams['rho']))
  elif kind == 'asam':
    from fedjax_flat.optimizers.asam import asam
    parts.append(asam(hparams['rho'], client_cfg.asam_eta))
  elif kind != 'sgd':
    raise ValueError(f"client.optimizer={kind!r}; allowed: 'sgd', 'sam', 'asam'")
  parts.append(add_correction())
  if client_cfg.get('grad_clip', 0.0):
    parts.append(optax.clip_by_global_norm(client_cfg.grad_clip))
  if client_cfg.weight_decay:
    parts.append(optax.add_decayed_weights(client_cfg.weight_decay))
  base = client_cfg.get('base_optimizer', 'sgd')
  lr = hparams['lr']
  if client_cfg.get('lr_schedule', 'constant') == 'poly_step':   # decays over the round's local steps
    from fedjax_flat.optimizers.schedules import poly_lr
    lr = poly_lr(lr, client_cfg.lr_power, int(client_cfg.lr_poly_max))
  if base == 'sgd':
    parts.append(optax.sgd(lr, momentum=client_cfg.momentum or None))
  elif base == 'adam':
    parts.append(optax.adam(lr, b1=client_cfg.adam_b1, b2=client_cfg.adam_b2, eps=client_cfg.adam_eps))
  else:
    raise ValueError(f"client.base_optimizer={base!r}; allowed: 'sgd', 'adam'")
  return optax.chain(*parts)
