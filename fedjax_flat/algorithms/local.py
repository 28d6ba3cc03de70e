"""Building blocks for local training that most algorithms share.

`make_loss` gives the client's data loss (the task's loss over the valid units of a masked batch,
fedjax_flat/tasks/base.py: cross-entropy over valid examples for classification; plus MAN's activation-norm term
when zeta > 0). `local_step` is one step of the client optimizer on it, with an
optional algorithm gradient correction (FedProx, SCAFFOLD, FedDyn, FedGloSS...) added after the SAM/ASAM
transform and before weight decay/momentum/lr, i.e. evaluated at the unperturbed weights, as the reference
codes do.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.tasks import base as tasks_lib
from fedjax_flat.tasks.base import cross_entropy  # noqa: F401  (re-exported: the one definition lives in tasks)
from fedjax_flat.core.batch_stats import pooled_moments
from fedjax_flat.schema import RESULT, Choice, Field, Num, Section

Params = Any


class LocalState(NamedTuple):
  params: Params
  opt_state: Any
  init_params: Params       # w_{k,0}: where local training started
  extra: Any = ()           # algorithm-specific local quantities (e.g. SCAFFOLD's c - c_k)


MAN_CONVENTIONS = ('paper', 'code')


def man_coefficient(zeta: float, convention: str = 'paper') -> float:
  """The coefficient c of MAN's term in the client loss CE + c * sum_l mean(a_l^2) (config.man).

  'paper': zeta is Eq. 15's zeta (f_k = L_k + zeta L_k^act), c = zeta: the paper's 0.15 (CIFAR-100) / 0.1
  (Tiny-ImageNet) as printed. 'code': zeta is the release code's `mu_mean`, whose loss is CE + (mu_mean / 2)
  sum_l mean(a_l^2), so c = zeta / 2 (its EXPERIMENTS.md gives mu_mean = 0.15 / 0.1, i.e. c = 0.075 / 0.05;
  its TinyImageNet script passes 0.2, i.e. c = 0.1). Which one produced the paper's tables is not stated.
  """
  if convention not in MAN_CONVENTIONS:
    raise ValueError(f'man.convention={convention!r}; allowed: {MAN_CONVENTIONS}')
  return float(zeta) / 2.0 if convention == 'code' else float(zeta)


def make_loss(model, *, man_zeta: float = 0.0, train: bool = True, task=None, microbatches: int = 1):
  """loss(params, batch, rng) -> (mean loss over valid units, (loss_sum, count)); BatchNorm models
  (model.batch_stats) add the updated running statistics: (loss_sum, count, batch_stats).

  `task` (fedjax_flat/tasks/base.py; default classification) defines the units and their loss: count is the
  number of valid units (examples, tokens, pixels) that the mean runs over.

  MAN (activation-norm regularization): zeta * sum over hidden layers of mean(a_l^2) on the post-activation
  outputs (logits excluded); the mean runs over the valid examples and the layer's units. `man_zeta` is the
  coefficient itself (the paper's zeta); `man_coefficient(config.man.zeta, config.man.convention)` maps the
  release code's mu_mean convention onto it (mu_mean / 2).

  microbatches = k > 1 (client.microbatches; gradient accumulation for memory): the batch is split into k
  equal micro-batches run one after the other in a `lax.scan` whose body is a `jax.checkpoint` region, so
  activation memory follows one micro-batch (the recomputation sits inside the backward loop, where XLA:CPU
  cannot merge it with the forward pass). The loss, its gradient and the counts are exactly the full batch's
  (sums over micro-batches; the task's per-image OHEM and the booster heads decompose), except that
  BatchNorm normalizes each micro-batch with its own statistics ("ghost" batch norm) and OHEM 'thresh'
  thresholds per micro-batch; the running statistics are updated once, from the moments pooled over the
  micro-batches (= the full batch's).
  """
  task = tasks_lib.get_task(task)
  if microbatches > 1:
    return _microbatched_loss(model, man_zeta=man_zeta, train=train, task=task, k=int(microbatches))

  bn = getattr(model, 'batch_stats', False)

  def loss(params, batch, rng=None):
    mask = batch['mask'].astype(jnp.float32)
    # BatchNorm models: batch statistics over the valid examples; the updated running statistics come back
    # as a third aux entry, which local_step writes into params (models/base.py).
    kw = {'mask': mask, 'with_batch_stats': True} if bn else {}
    x, y = task.training_inputs(_cache_forward(model, params), batch['x'], batch['y'], mask)
    out = model.apply(params, x, train=train, rng=rng, with_activations=bool(man_zeta), **kw)
    out, stats = out if bn else (out, None)
    logits, acts = out if man_zeta else (out, None)
    loss_sum, count = task.loss_sums(logits, y, mask)
    total = loss_sum / jnp.maximum(count, 1.0)
    if man_zeta:
      # MAN's term is per example (activations of the whole input), over the valid examples.
      total = total + man_zeta * _man_sum(acts, mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return total, ((loss_sum, count, stats) if bn else (loss_sum, count))
  return loss


def _cache_forward(model, params):
  """The model without gradient in evaluation mode (BatchNorm: running statistics), for a task that picks its
  training inputs from a first pass (tasks/base.py `training_inputs`; retrieval's mining cache)."""
  return lambda x: jax.lax.stop_gradient(model.apply(params, x, train=False))


def _man_sum(acts, mask):
  """sum over hidden layers and valid examples of mean(a^2) per example (MAN's term times n_examples)."""
  reg = 0.0
  for a in acts:
    per_example = jnp.mean(jnp.square(a.astype(jnp.float32)).reshape(a.shape[0], -1), axis=-1)
    reg = reg + jnp.sum(per_example * mask)
  return reg


def _microbatched_loss(model, *, man_zeta, train, task, k):
  bn = getattr(model, 'batch_stats', False)

  def one(params, mb, rng):
    """Additive sums of one micro-batch: loss, count, MAN term, valid examples, BN moment sums."""
    mask = mb['mask'].astype(jnp.float32)
    kw = {'mask': mask, 'batch_moments': True} if bn else {}
    x, y = task.training_inputs(_cache_forward(model, params), mb['x'], mb['y'], mask)
    out = model.apply(params, x, train=train, rng=rng, with_activations=bool(man_zeta), **kw)
    out, moments = out if bn else (out, None)
    logits, acts = out if man_zeta else (out, None)
    loss_sum, count = task.loss_sums(logits, y, mask)
    n = jnp.sum(mask)
    sums = {'loss_sum': loss_sum, 'count': count, 'n': n,
            'man': _man_sum(acts, mask) if man_zeta else jnp.zeros((), jnp.float32)}
    if bn:   # n * mean and n * E[x^2] per layer (an all-padding micro-batch has NaN moments: weight 0)
      safe = lambda v: jnp.where(n > 0, v, 0.0)  # noqa: E731
      sums['moments'] = jax.tree_util.tree_map(
          lambda l: {'mean': safe(n * l['mean']), 'sq': safe(n * (l['var'] + jnp.square(l['mean'])))},
          moments, is_leaf=lambda t: isinstance(t, dict) and 'var' in t)
    return sums

  def loss(params, batch, rng=None):
    split = lambda a: a.reshape((k, a.shape[0] // k) + a.shape[1:])  # noqa: E731
    mbs = jax.tree_util.tree_map(split, batch)
    body_fn = jax.checkpoint(one)
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(
        one, params, jax.tree_util.tree_map(lambda a: a[0], mbs), rng))

    def body(acc, xs):
      mb, i = xs
      r = None if rng is None else jax.random.fold_in(rng, i)
      return jax.tree_util.tree_map(jnp.add, acc, body_fn(params, mb, r)), None

    sums, _ = jax.lax.scan(body, zeros, (mbs, jnp.arange(k)))
    total = sums['loss_sum'] / jnp.maximum(sums['count'], 1.0)
    if man_zeta:
      total = total + man_zeta * sums['man'] / jnp.maximum(sums['n'], 1.0)
    if not bn:
      return total, (sums['loss_sum'], sums['count'])
    pooled = pooled_moments(sums['moments'], sums['n'])
    m = model.bn_momentum
    stats = jax.tree_util.tree_map(lambda old, new: jax.lax.stop_gradient(m * old + (1 - m) * new),
                                   params['batch_stats'], pooled)
    return total, (sums['loss_sum'], sums['count'], stats)
  return loss


def local_step(local: LocalState, batch, rng, *, loss_fn, tx: optax.GradientTransformation,
               hparams=None, correction: Optional[Params] = None):
  """One client optimizer step. `tx` sees grad_fn (for SAM/ASAM), `correction` and the round's `hparams`
  ({'lr', 'rho'}: optimizers/client.client_optimizer; None for an optimizer with fixed hparams) as extra
  args."""
  params = local.params
  extra = {} if hparams is None else {'hparams': hparams}

  def grad_fn(p):
    return jax.grad(lambda q: loss_fn(q, batch, rng)[0])(p)

  # For a subset ascent (optimizers/ksam.py; traced only by an optimizer that calls them): each example's loss
  # as the derivative of the batch's loss sum with respect to its mask entry, and the gradient of the loss over
  # the examples a weight mask selects.
  def example_losses_fn(p):
    mask = batch['mask'].astype(jnp.float32)
    return jax.grad(lambda m: loss_fn(p, {**batch, 'mask': m}, rng)[1][0])(mask), mask

  def example_grad_fn(p, weights):
    return jax.grad(lambda q: loss_fn(q, {**batch, 'mask': weights}, rng)[0])(p)

  (_, aux), grads = jax.value_and_grad(lambda p: loss_fn(p, batch, rng), has_aux=True)(params)
  loss_sum, count = aux[0], aux[1]
  updates, opt_state = tx.update(grads, local.opt_state, params, grad_fn=grad_fn, correction=correction,
                                 example_losses_fn=example_losses_fn, example_grad_fn=example_grad_fn, **extra)
  params = optax.apply_updates(params, updates)
  if len(aux) > 2:   # BatchNorm: the running statistics of this step's (unperturbed) forward pass
    params = {**params, 'batch_stats': aux[2]}
  # count: valid loss units (examples, tokens, pixels); examples: valid examples of the batch.
  return local._replace(params=params, opt_state=opt_state), {
      'loss_sum': loss_sum, 'count': count, 'examples': jnp.sum(batch['mask'].astype(jnp.float32))}


def masked_step(local: LocalState, batch, rng, *, loss_fn, tx: optax.GradientTransformation, trainable,
                hparams=None, correction: Optional[Params] = None):
  """`local_step` training only the leaves where `trainable` (a params-shaped pytree of Python bools) is True.

  The other leaves are frozen as `requires_grad=False` freezes them in PyTorch: their gradient is exactly 0
  (a stop_gradient in the loss, so SAM's ascent does not move them either) and their value is restored after
  the step (weight decay or momentum never moves them). BatchNorm running statistics still follow the
  forward pass (a frozen torch module in train mode updates its buffers too). FedRep, FedBABU.
  """
  from_trainable = lambda m, x: x if m else jax.lax.stop_gradient(x)  # noqa: E731

  def frozen_loss(p, b, r=None):
    return loss_fn(jax.tree_util.tree_map(from_trainable, trainable, p), b, r)

  new, m = local_step(local, batch, rng, loss_fn=frozen_loss, tx=tx, hparams=hparams, correction=correction)
  keep = lambda path, t, a, b: a if (t or _is_stats(path)) else b  # noqa: E731
  params = jax.tree_util.tree_map_with_path(keep, trainable, new.params, local.params)
  return new._replace(params=params), m


def _is_stats(path) -> bool:
  k = path[0] if path else None
  return k is not None and str(getattr(k, 'key', k)) == 'batch_stats'


# config.man: declared with the code that reads it (config/schema.py collects it)
SECTION = Section('man', (
    Field('zeta', Num(0.0, lo=0), 'activation-norm regularizer coefficient (MAN); 0 = off'),
    Field('convention', Choice('paper', MAN_CONVENTIONS, note=" (paper: zeta is Eq. 15's coefficient; code: zeta is "
                               "the release's mu_mean, applied as mu_mean / 2)"),
          "'paper': zeta is Eq. 15's coefficient | 'code': the release's mu_mean, applied / 2 "
          '(algorithms/local.man_coefficient)'),
), tags={RESULT}, doc='the activation-norm regularizer (MAN)')
