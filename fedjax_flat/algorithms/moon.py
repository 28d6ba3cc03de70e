"""MOON: model-contrastive federated learning (Li, He and Song, CVPR 2021).

  server sends w^t
  client k, every local step on a batch, z = the representation before the classifier (models/partition.py):
    z      = R_w(x)                  the model being trained
    z_glob = R_{w^t}(x)              the global model received this round (fixed: no gradient)
    z_prev = R_{w_k^{prev}}(x)       the client's own local model of its previous round (fixed)
    l_con  = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
    loss   = CE(w) + mu * mean over the valid examples of l_con          (sim: cosine similarity)
  Delta = sum_k (N_k/N) (w^t - w_k);  w^{t+1} = ServerOpt(w^t, Delta)          (FedAvg server)

The previous local model is per-client persistent state (the client-state store, as FedSoup's soup): on a
client's first visit it is the global model it receives (MOON's and the release's clients start their
"previous model" as a copy of the initial model), so l_con = log 2 at the first step. mu = 0 is FedAvg.

Hyperparameters (config.algo): mu (1.0: MOON's default for most of its tables; the FedSoup release's CLI
default is 0, which makes it FedAvg, see the digest A9), tau (0.5: MOON's; the release's CLI default 1.0).
The frozen models are evaluated in inference mode (train=False); the representation needs a model that
declares its head. Models with BatchNorm running statistics are not supported (the need is not declared).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import check_head, tmap
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.hparams import Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.errors import ConfigError
from fedjax_flat.models import partition
from fedjax_flat.tasks import base as tasks_lib

HPARAMS = {'mu': Number(1.0, lo=0, finite=True, bound=True),
           'tau': Number(0.5, lo=0, lo_open=True, finite=True, bound=True)}


def cosine(a, b, eps: float = 1e-8):
  """Row-wise cosine similarity (torch.nn.CosineSimilarity's eps clamp on each norm; the clamp inside the
  square root keeps the gradient finite at z = 0, a representation of dead ReLUs)."""
  na = jnp.sqrt(jnp.maximum(jnp.sum(a * a, axis=-1), eps * eps))
  nb = jnp.sqrt(jnp.maximum(jnp.sum(b * b, axis=-1), eps * eps))
  return jnp.sum(a * b, axis=-1) / (na * nb)


def contrastive_terms(z, z_glob, z_prev, tau):
  """Per-example l_con = -log softmax([sim(z, z_glob), sim(z, z_prev)] / tau)[0]."""
  logits = jnp.stack([cosine(z, z_glob), cosine(z, z_prev)], axis=-1) / tau
  return -jax.nn.log_softmax(logits, axis=-1)[..., 0]


def moon(model, task, client_tx: optax.GradientTransformation, hparams_fn, server_tx: optax.GradientTransformation,
         *, mu: float, tau: float) -> FederatedAlgorithm:
  tx = client_tx
  task = tasks_lib.get_task(task)
  base = fedavg(model, None, tx, hparams_fn, server_tx)

  def moon_loss(params, batch, rng, glob, prev):
    mask = batch['mask'].astype(jnp.float32)
    logits, z = partition.representation(model, params, batch['x'], train=True, rng=rng)
    loss_sum, count = task.loss_sums(logits, batch['y'], mask)
    z_glob = jax.lax.stop_gradient(partition.representation(model, glob, batch['x'], train=False)[1])
    z_prev = jax.lax.stop_gradient(partition.representation(model, prev, batch['x'], train=False)[1])
    con = jnp.sum(contrastive_terms(z, z_glob, z_prev, tau) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return loss_sum / jnp.maximum(count, 1.0) + mu * con, (loss_sum, count)

  def client_state_init(params):
    return {'prev': tmap(jnp.zeros_like, params), 'seen': jnp.zeros((), jnp.float32)}

  def client_init(bcast, client_state, rng):
    del rng
    w0 = bcast['params']
    seen = client_state['seen'] > 0
    prev = tmap(lambda a, b: jnp.where(seen, a, b), client_state['prev'], w0)
    return local_lib.LocalState(w0, tx.init(w0), w0, {'prev': prev})

  def client_step(bcast, local, batch, rng):
    loss_fn = lambda p, b, r=None: moon_loss(p, b, r, local.init_params, local.extra['prev'])  # noqa: E731
    return local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'])

  def client_final(bcast, local, client_state):
    out, _ = base.client_final(bcast, local, None)
    return out, {'prev': local.params, 'seen': jnp.ones((), jnp.float32)}

  return base.replace(client_state_init=client_state_init, client_init=client_init, client_step=client_step,
                      client_final=client_final)


def _check(cfg, hp):
  check_head(cfg, hp)
  if float(cfg.man.zeta) > 0:     # MOON builds its own loss from the representation: MAN's term is not in it
    raise ConfigError('man.zeta', cfg.man.zeta, 'moon does not add MAN\'s activation term; use 0')


@register('moon', hparams=HPARAMS, needs=('client_state',), check=_check, upload='delta')
def _moon_builder(ctx) -> FederatedAlgorithm:
  """MOON: FedAvg whose clients add mu * the model-contrastive loss (temperature tau)."""
  hp = ctx.hp
  partition.require_head(ctx.model)
  return moon(ctx.model, ctx.task, ctx.client_tx, ctx.hparams_fn, ctx.server_tx,
              mu=float(hp['mu']), tau=float(hp['tau']))
