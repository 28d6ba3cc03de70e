"""Ditto (Li, Hu, Beirami & Smith, ICML 2021, "Ditto: Fair and Robust Federated Learning Through
Personalization", Algorithm 1; release code litian96/ditto, flearn/trainers_MTL/ditto.py): the personalization
baseline, a personal model per client held near the global one.

  server sends w^t
  client k, at each local step on its batch b:
    global:   w_k <- one step of the client optimizer on F_k from w^t (FedAvg's local solver, any optimizer)
    personal: v_k <- v_k - lr_p (grad F_k(v_k; b) + lam (v_k - w^t))     (the first s steps; s = 0: every step)
  w^{t+1} = ServerOpt(w^t, sum_k (N_k/N) (w^t - w_k))                   (FedAvg's server; v_k stays on the client)

The personal model v_k lives in the client state (kept across rounds, checkpointed, resumed); a client's personal
model is its v_k (algorithms/personalization.py: `config.personalized` and `config.client_eval`'s
`clients_personal_*` evaluate it), and the global model before its first visit. lam = 0 trains each v_k on its
own data alone; large lam holds v_k at w^t. lr_p = `personal_lr`, 0 = the round's client learning rate (the
release uses one learning rate for both). The upload is FedAvg's delta, so DP, compression and the robust
aggregators apply to the global model's training (the paper's robustness setting).

As the release: the personal and the global step of a local step see the same batch, and the personal step is
plain SGD (no momentum, no weight decay) with the regularizer at the broadcast w^t. Where it departs: the release
starts every v_k from the initial model w^0; here v_k starts from the w^t of the client's first visit (a client's
personal model before that visit is the global model, in training and in evaluation alike). The release
averages the global updates uniformly over the round's clients (`simple_average`): `server.weighting='uniform'`
does that here; its q > 0 option (exp(q F_k)-weighted aggregation) is not implemented; its dynamic lam (the best
of 0.1, 1, 2 on validation data at every step) neither.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_flat.algorithms.common import tmap
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.hparams import Integer, Number
from fedjax_flat.algorithms.personalization import Personalizer, global_params, if_seen
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm

HPARAMS = {'lam': Number(0.1, lo=0, finite=True, bound=True, note=' (lam: the pull of v_k towards w^t)'),
           'personal_steps': Integer(0, lo=0, note=' (s personal steps a round; 0 = every local step)'),
           'personal_lr': Number(0.0, lo=0, finite=True, bound=True,
                                 note=" (lr_p; 0 = the round's client learning rate)")}


def personal_step(v, w_global, batch, rng, *, loss_fn, lam, lr):
  """v - lr (grad F(v; batch) + lam (v - w^t)): one step of Ditto's personal objective."""
  g = jax.grad(lambda p: loss_fn(p, batch, rng)[0])(v)
  return tmap(lambda a, gr, w: a - lr * (gr + lam * (a - w)), v, g, w_global)


def ditto(model, loss_fn, client_tx, hparams_fn, server_tx, *, lam, personal_steps: int, personal_lr=None,
          name: str) -> FederatedAlgorithm:
  """personal_lr: lr_p, None = the round's client learning rate; name: the algorithm's (its personal model is
  reported under it)."""
  base = fedavg(model, loss_fn, client_tx, hparams_fn, server_tx)
  s = int(personal_steps)

  def client_state_init(params):
    return {'v': params, 'seen': jnp.zeros((), jnp.float32)}

  def client_init(bcast, client_state, rng):
    local = base.client_init(bcast, None, rng)
    # First visit: v_k starts from the broadcast model (the module docstring's departure from the release).
    v = tmap(lambda a, w: jnp.where(client_state['seen'] > 0, a, w), client_state['v'], bcast['params'])
    return local._replace(extra={'v': v, 'step': jnp.zeros((), jnp.int32)})

  def client_step(bcast, local, batch, rng):
    lr = bcast['hparams']['lr'] if personal_lr is None else personal_lr
    v = local.extra['v']
    new_v = personal_step(v, bcast['params'], batch, jax.random.fold_in(rng, 1), loss_fn=loss_fn, lam=lam, lr=lr)
    if s:      # only the round's first s steps move v (padding steps are skipped by the engine, not counted)
      new_v = tmap(lambda a, b: jnp.where(local.extra['step'] < s, a, b), new_v, v)
    new, m = base.client_step(bcast, local, batch, rng)
    return new._replace(extra={'v': new_v, 'step': local.extra['step'] + 1}), m

  def client_final(bcast, local, client_state):
    out, _ = base.client_final(bcast, local, None)
    return out, {'v': local.extra['v'], 'seen': jnp.ones((), jnp.float32)}

  return base.replace(name=name, client_init=client_init, client_step=client_step, client_final=client_final,
                      client_state_init=client_state_init, extra_passes=1.0,    # the personal step's pass
                      personalizer=Personalizer(name, _personal_model))


def _personal_model(algorithm, server_state, client_state):
  if client_state is None:
    return global_params(algorithm, server_state)
  return if_seen(client_state['seen'], client_state['v'], global_params(algorithm, server_state))


@register('ditto', hparams=HPARAMS, needs=('client_state',), upload='delta')
def _ditto(ctx) -> FederatedAlgorithm:
  """Ditto: FedAvg for the global model, and every client's personal model v_k trained on its own data with the
  proximal pull lam (v_k - w^t)."""
  hp = ctx.hp
  lr_p = float(hp['personal_lr']) or None
  return ditto(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx, lam=float(hp['lam']),
               personal_steps=int(hp['personal_steps']), personal_lr=lr_p, name=ctx.name)
