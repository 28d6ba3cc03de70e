"""The client optimizer: built ONCE per algorithm from the config's `client` section; the per-round
hyperparameters the server broadcasts (lr, rho; may be traced) are passed to every update.

chain(  [sam(rho) | asam(rho, eta) | nothing]   replaces g by the gradient at the ascent point
        add_correction()                        + algorithm correction (FedProx, SCAFFOLD, FedDyn...)
        [clip_by_global_norm(c)]                (FedDyn's gradient clipping)
        add_decayed_weights(wd)                 PyTorch-style coupled weight decay, at the unperturbed w
        sgd(lr, momentum) | adam(lr, b1, b2, eps) )   client.base_optimizer
lr: the broadcast one, or with client.lr_schedule='poly_step' decayed over the round's local steps
(optimizers/schedules.client_step_lr: every schedule lives in schedules.py).

    tx = client_optimizer(config.client)                       # once, in the algorithm's builder
    state = tx.init(params)
    updates, state = tx.update(g, state, params, hparams=bcast['hparams'], grad_fn=..., correction=...)

Only the two leaves that depend on a hyperparameter value (the SAM/ASAM radius and the base optimizer's lr)
read `hparams` at update time; their state structure never depends on the values, so `init` needs none.
A schedule driven by the server (SWA's cyclic lr, FedGloSS's rho warm-up) changes values, never shapes: no
recompilation. `make_client_tx(client_cfg, hparams)` is the same optimizer with fixed hparams, for one-off
local training outside a round (personalized fine-tuning, tests).

Adam (FedSoup's client optimizer) is torch.optim.Adam with its coupled `weight_decay`; its moments start at
zero each round (the usual FL practice; FedSoup's code keeps them across rounds per client).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import optax

from fedjax_flat.optimizers.asam import asam
from fedjax_flat.optimizers.sam import sam
from fedjax_flat.optimizers.schedules import client_step_lr


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


def _per_update(make: Callable[[Any], optax.GradientTransformation], name: str
                ) -> optax.GradientTransformationExtraArgs:
  """The transform `make(hparams)` with the hparams of each update (extra arg `hparams`)."""
  placeholder = {'lr': 0.0, 'rho': 0.0}    # init never reads the values (state shapes only)

  def init(params):
    return make(placeholder).init(params)

  def update(updates, state, params=None, *, hparams=None, **extra):
    if hparams is None:
      raise ValueError(f'the client optimizer ({name}) needs the round\'s hyperparameters: '
                       "update(..., hparams={'lr': ..., 'rho': ...})")
    tx = optax.with_extra_args_support(make(hparams))
    return tx.update(updates, state, params, **extra)
  return optax.GradientTransformationExtraArgs(init, update)


def client_optimizer(client_cfg) -> optax.GradientTransformationExtraArgs:
  """client_cfg: the config's `client` section. update(..., hparams={'lr', 'rho'}, grad_fn=, correction=)."""
  parts = []
  kind = client_cfg.optimizer
  if kind == 'sam':
    parts.append(_per_update(lambda hp: sam(hp['rho']), 'sam'))
  elif kind == 'asam':
    eta = client_cfg.asam_eta
    parts.append(_per_update(lambda hp: asam(hp['rho'], eta), 'asam'))
  elif kind != 'sgd':
    raise ValueError(f"client.optimizer={kind!r}; allowed: 'sgd', 'sam', 'asam'")
  parts.append(add_correction())
  if client_cfg.get('grad_clip', 0.0):
    parts.append(optax.clip_by_global_norm(client_cfg.grad_clip))
  if client_cfg.weight_decay:
    parts.append(optax.add_decayed_weights(client_cfg.weight_decay))
  base = client_cfg.get('base_optimizer', 'sgd')
  step_lr = client_step_lr(client_cfg)
  if base == 'sgd':
    momentum = client_cfg.momentum or None
    parts.append(_per_update(lambda hp: optax.sgd(step_lr(hp['lr']), momentum=momentum), 'sgd'))
  elif base == 'adam':
    b1, b2, eps = client_cfg.adam_b1, client_cfg.adam_b2, client_cfg.adam_eps
    parts.append(_per_update(lambda hp: optax.adam(step_lr(hp['lr']), b1=b1, b2=b2, eps=eps), 'adam'))
  else:
    raise ValueError(f"client.base_optimizer={base!r}; allowed: 'sgd', 'adam'")
  return optax.chain(*parts)


def with_hparams(tx: optax.GradientTransformationExtraArgs, hparams) -> optax.GradientTransformationExtraArgs:
  """`tx` (a `client_optimizer`) with fixed hparams: update() needs no `hparams` argument."""
  def update(updates, state, params=None, **extra):
    return tx.update(updates, state, params, hparams=hparams, **extra)
  return optax.GradientTransformationExtraArgs(tx.init, update)


def make_client_tx(client_cfg, hparams) -> optax.GradientTransformationExtraArgs:
  """The client optimizer with fixed hparams {'lr': scalar, 'rho': scalar} (one-off local training)."""
  return with_hparams(client_optimizer(client_cfg), hparams)
