"""The client optimizer: built ONCE per algorithm from the config's `client` section; the per-round
hyperparameters the server broadcasts (lr, rho; may be traced) are passed to every update.

chain(  [sam(rho) | asam(rho, eta) | sam_every | looksam | ksam | nothing]   replaces g by the ascent-point gradient
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
import jax.numpy as jnp
import optax

from fedjax_flat.errors import ConfigError
from fedjax_flat.optimizers import asam as asam_lib
from fedjax_flat.optimizers import ksam as ksam_lib
from fedjax_flat.optimizers import looksam as looksam_lib
from fedjax_flat.optimizers import sam as sam_lib
from fedjax_flat.optimizers import sam_every as sam_every_lib
from fedjax_flat.optimizers.asam import asam
from fedjax_flat.optimizers.ksam import ksam
from fedjax_flat.optimizers.looksam import looksam
from fedjax_flat.optimizers.sam import sam
from fedjax_flat.optimizers.sam_every import sam_every
from fedjax_flat.optimizers.schedules import LR_SCHEDULES, client_step_lr
from fedjax_flat.schema import RESULT, TRUTH, VALUE, Choice, Field, Int, Num, Section, Test


def _adam_momentum(cfg) -> None:
  if cfg.client.momentum:
    raise ConfigError('client.momentum', cfg.client.momentum,
                      'must be 0 with client.base_optimizer=adam (Adam\'s first moment is client.adam_b1)')


def _steps_or_epochs(cfg) -> None:
  c = cfg.client
  if c.local_steps and (c.get('full_batches', False) or c.get('max_local_steps', 0)):
    raise ConfigError('client.local_steps', c.local_steps,
                      'is a fixed step count: set it to 0 to use client.full_batches / client.max_local_steps '
                      '(the epochs mode), or unset those')


def _poly_max(cfg) -> None:
  sched, t = cfg.client.get('lr_schedule', 'constant'), cfg.client.lr_poly_max
  if sched != 'constant' and t < 1:
    raise ConfigError('client.lr_poly_max', t,
                      f'client.lr_schedule={sched} needs T >= 1 ({"local steps" if sched == "poly_step" else "rounds"}'
                      f'; FedDrive: poly_step with 10000 x local epochs x steps per epoch)')


def _microbatches(cfg) -> None:
  k = cfg.client.microbatches
  if cfg.client.batch_size % k:
    raise ConfigError('client.microbatches', k, f'must divide client.batch_size={cfg.client.batch_size}')


def _opt(name: str) -> Callable[[Any], bool]:
  return lambda cfg: cfg.client.get('optimizer') == name


_ADAM_ON = "client.base_optimizer='adam'"


def _adam(cfg) -> bool:
  return cfg.client.get('base_optimizer') == 'adam'


# config.client: local training (read here, by optimizers/schedules.py and algorithms/local.py).
# The client optimizers with an ascent step: they read client.rho (sharpness-aware, each declared in its module).
ASCENT_OPTIMIZERS = ('sam', 'asam', 'sam_every', 'looksam', 'ksam')

SECTION = Section('client', (
    Field('optimizer', Choice('sgd', ('sgd', 'sam', 'asam', 'sam_every', 'looksam', 'ksam'), sort=True),
          "the gradient: 'sgd' (plain) | 'sam' | 'asam' (sharpness-aware) | 'sam_every' (SAM on every "
          "sam_every-th step) | 'looksam' (SAM every looksam_k-th step, its orthogonal part reused between) | "
          "'ksam' (K-SAM: SAM's gradients on the ascent_fraction highest-loss examples of the batch)"),
    Field('base_optimizer', Choice('sgd', ('sgd', 'adam'), sort=True),
          "'sgd' (lr, momentum) | 'adam' (lr, adam_b1, adam_b2, adam_eps)"),
    Field('adam_b1', Num(0.9, lo=0, hi=1, hi_open=True), 'Adam beta1', when=_adam, needs=_ADAM_ON),
    Field('adam_b2', Num(0.999, lo=0, hi=1, hi_open=True), "Adam beta2 (torch default; FedSoup's paper: 0.99)",
          when=_adam, needs=_ADAM_ON),
    Field('adam_eps', Num(1e-8, lo=0, lo_open=True), 'Adam epsilon', when=_adam, needs=_ADAM_ON,
          after=_adam_momentum),
    Field('lr', Num(0.01, lo=0, lo_open=True), 'client learning rate', {VALUE}),
    Field('momentum', Num(0.0, lo=0, hi=1, hi_open=True), 'SGD momentum', {VALUE, TRUTH}),
    Field('weight_decay', Num(4e-4, lo=0), 'coupled (PyTorch-style) weight decay', {VALUE, TRUTH}),
    Field('batch_size', Int(64, lo=1), 'local batch size'),
    Field('local_epochs', Int(1, lo=1), 'local epochs a round'),
    Field('local_steps', Int(0, lo=0), '> 0: a fixed number of local steps instead of epochs'),
    Field('full_batches', Test(False, ok=lambda v: v in (True, False), message='must be True or False',
                               what='True | False'),
          'epochs of floor(N_k / B) full batches (the remainder unused), not ceil'),
    Field('max_local_steps', Int(0, lo=0),
          "> 0: at most this many local steps a round in the epochs mode (FedVPR's min(floor(N_k / B), 2500))",
          after=_steps_or_epochs),
    Field('rho', Num(0.05, lo=0), 'SAM / ASAM radius', {VALUE}),
    Field('rho0', Num(0.0, lo=0), 'rho warm-up start (FedGloSS: 0.001)', {VALUE}),
    Field('rho_warmup_rounds', Int(0, lo=0), 'T_s of the rho warm-up; 0 = none'),
    Field('asam_eta', Num(0.0, lo=0), 'ASAM eta', {VALUE}),
    Field('sam_every', Int(2, lo=1), "k of client.optimizer='sam_every': SAM's two passes on one step in k",
          {VALUE}, when=_opt('sam_every'), needs="client.optimizer='sam_every'"),
    Field('looksam_k', Int(5, lo=1), "k of client.optimizer='looksam' (Liu et al. 2022: 5)", {VALUE},
          when=_opt('looksam'), needs="client.optimizer='looksam'"),
    Field('looksam_alpha', Num(0.7, lo=0), "alpha of client.optimizer='looksam' (Liu et al. 2022: 0.7)", {VALUE},
          when=_opt('looksam'), needs="client.optimizer='looksam'"),
    Field('ascent_fraction', Num(0.5, lo=0, hi=1, lo_open=True),
          "client.optimizer='ksam': the share of the batch's valid examples (highest loss first) K-SAM's gradients use",
          {VALUE}, when=_opt('ksam'), needs="client.optimizer='ksam'"),
    Field('ksam_descent', Choice('subset', ksam_lib.DESCENTS),
          "client.optimizer='ksam': 'subset' (the descent gradient on the same highest-loss examples as the ascent: "
          "Ni et al. 2022's rule) | 'full' (the descent on the whole batch, only the ascent on the subset)",
          when=_opt('ksam'), needs="client.optimizer='ksam'"),
    Field('grad_clip', Num(0.0, lo=0), 'clip_by_global_norm (FedDyn: 30); 0 = off'),
    Field('lr_schedule', Choice('constant', LR_SCHEDULES, sort=True),
          "'constant' | 'poly_step' (over each round's local steps, FedDrive) | 'poly_round' (over rounds): "
          'lr * (1 - t / lr_poly_max) ** lr_power'),
    Field('lr_power', Num(0.9, lo=0, lo_open=True), 'power of the poly schedules'),
    Field('lr_poly_max', Int(0, lo=0), 'T: local steps (poly_step) or rounds (poly_round); > 0 for poly_*',
          after=_poly_max),
    Field('microbatches', Int(1, lo=1), 'k > 1: each batch as k micro-batches (gradient accumulation; memory / k)',
          after=_microbatches),
), tags={RESULT}, doc='local training: the client optimizer, its schedule, batches and steps')


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


SGD_PASSES = 1     # one forward+backward pass a plain step


def gradient_passes(client_cfg) -> float:
  """Forward+backward passes of one local step of the client optimizer (each declared where it is defined):
  what a step costs on the virtual clock (systems/clock.py). The every-k methods declare their AVERAGE per step."""
  kind = client_cfg.optimizer
  if kind == 'sam_every':
    return sam_every_lib.passes(client_cfg.sam_every)
  if kind == 'looksam':
    return looksam_lib.passes(client_cfg.looksam_k)
  if kind == 'ksam':
    return ksam_lib.passes(client_cfg.ascent_fraction, client_cfg.get('ksam_descent', 'subset'))
  return {'sgd': SGD_PASSES, 'sam': sam_lib.PASSES, 'asam': asam_lib.PASSES}[kind]


def _step_period(k):
  """An every-k-steps period as the optimizers compare it with their step counter: a Python int, or in a batched
  program the run's traced value (core/runs.RunValue, a float32 whose arithmetic is traced) as an int32."""
  return int(k) if isinstance(k, (int, float)) else jnp.round(k * 1.0).astype(jnp.int32)


def client_optimizer(client_cfg) -> optax.GradientTransformationExtraArgs:
  """client_cfg: the config's `client` section. update(..., hparams={'lr', 'rho'}, grad_fn=, correction=)."""
  parts = []
  kind = client_cfg.optimizer
  if kind == 'sam':
    parts.append(_per_update(lambda hp: sam(hp['rho']), 'sam'))
  elif kind == 'asam':
    eta = client_cfg.asam_eta
    parts.append(_per_update(lambda hp: asam(hp['rho'], eta), 'asam'))
  elif kind == 'sam_every':
    k = _step_period(client_cfg.sam_every)
    parts.append(_per_update(lambda hp: sam_every(hp['rho'], k), 'sam_every'))
  elif kind == 'looksam':
    k, alpha = _step_period(client_cfg.looksam_k), client_cfg.looksam_alpha
    parts.append(_per_update(lambda hp: looksam(hp['rho'], k, alpha), 'looksam'))
  elif kind == 'ksam':
    fraction, descent = client_cfg.ascent_fraction, str(client_cfg.get('ksam_descent', 'subset'))
    parts.append(_per_update(lambda hp: ksam(hp['rho'], fraction, descent), 'ksam'))
  elif kind != 'sgd':
    raise ValueError(f"client.optimizer={kind!r}; allowed: 'sgd', 'sam', 'asam', 'sam_every', 'looksam', 'ksam'")
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
