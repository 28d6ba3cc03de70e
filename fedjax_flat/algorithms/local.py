"""Building blocks for local training that most algorithms share.

`make_loss` gives the client's data loss (the task's loss over the valid units of a masked batch,
fedjax_flat/tasks.py: cross-entropy over valid examples for classification; plus MAN's activation-norm term
when zeta > 0). `local_step` is one step of the client optimizer on it, with an
optional algorithm gradient correction (FedProx, SCAFFOLD, FedDyn, FedGloSS...) added after the SAM/ASAM
transform and before weight decay/momentum/lr, i.e. evaluated at the unperturbed weights, as the reference
codes do.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_flat import tasks as tasks_lib
from fedjax_flat.tasks import cross_entropy  # noqa: F401  (re-exported: the one definition lives in tasks)

Params = Any


class LocalState(NamedTuple):
  params: Params
  opt_state: Any
  init_params: Params       # w_{k,0}: where local training started
  extra: Any = ()           # algorithm-specific local quantities (e.g. SCAFFOLD's c - c_k)


def make_loss(model, *, man_zeta: float = 0.0, train: bool = True, task=None):
  """loss(params, batch, rng) -> (mean loss over valid units, (loss_sum, count)); BatchNorm models
  (model.batch_stats) add the updated running statistics: (loss_sum, count, batch_stats).

  `task` (fedjax_flat/tasks.py; default classification) defines the units and their loss: count is the
  number of valid units (examples, tokens, pixels) that the mean runs over.

  MAN (activation-norm regularization): zeta * sum over hidden layers of mean(a_l^2) on the post-activation
  outputs (logits excluded); the mean runs over the valid examples and the layer's units. Convention: we
  use zeta as written in the paper's loss (the reference code halves it; pass zeta/2 to match that code).
  """
  task = tasks_lib.get_task(task)

  bn = getattr(model, 'batch_stats', False)

  def loss(params, batch, rng=None):
    mask = batch['mask'].astype(jnp.float32)
    # BatchNorm models: batch statistics over the valid examples; the updated running statistics come back
    # as a third aux entry, which local_step writes into params (models/base.py).
    kw = {'mask': mask, 'with_batch_stats': True} if bn else {}
    out = model.apply(params, batch['x'], train=train, rng=rng, with_activations=bool(man_zeta), **kw)
    out, stats = out if bn else (out, None)
    logits, acts = out if man_zeta else (out, None)
    loss_sum, count = task.loss_sums(logits, batch['y'], mask)
    total = loss_sum / jnp.maximum(count, 1.0)
    if man_zeta:
      # MAN's term is per example (activations of the whole input), over the valid examples.
      n_ex = jnp.maximum(jnp.sum(mask), 1.0)
      reg = 0.0
      for a in acts:
        per_example = jnp.mean(jnp.square(a.astype(jnp.float32)).reshape(a.shape[0], -1), axis=-1)
        reg = reg + jnp.sum(per_example * mask) / n_ex
      total = total + man_zeta * reg
    return total, ((loss_sum, count, stats) if bn else (loss_sum, count))
  return loss


def local_step(local: LocalState, batch, rng, *, loss_fn, tx: optax.GradientTransformation,
               correction: Optional[Params] = None):
  """One client optimizer step. `tx` sees grad_fn (for SAM/ASAM) and `correction` as extra args."""
  params = local.params

  def grad_fn(p):
    return jax.grad(lambda q: loss_fn(q, batch, rng)[0])(p)

  (_, aux), grads = jax.value_and_grad(lambda p: loss_fn(p, batch, rng), has_aux=True)(params)
  loss_sum, count = aux[0], aux[1]
  updates, opt_state = tx.update(grads, local.opt_state, params, grad_fn=grad_fn, correction=correction)
  params = optax.apply_updates(params, updates)
  if len(aux) > 2:   # BatchNorm: the running statistics of this step's (unperturbed) forward pass
    params = {**params, 'batch_stats': aux[2]}
  # count: valid loss units (examples, tokens, pixels); examples: valid examples of the batch.
  return local._replace(params=params, opt_state=opt_state), {
      'loss_sum': loss_sum, 'count': count, 'examples': jnp.sum(batch['mask'].astype(jnp.float32))}
