"""FedSoup (Chen et al., MICCAI 2023; digest A2-A3): temporal model selection + federated model patching.

Client k keeps a running-mean soup of selected past global models and its count (O(1) models per client,
never the list):

  server sends theta_g (plus `soup_active` = round >= E, E = floor(start_fraction * T) or algo.start_round)
  theta_l <- local training from theta_g (the client optimizer; optionally continuing the client's own
             optimizer state across rounds: algo.persist_opt_state, the reference code's Adam moments)
  if soup_active:
      W  = (k soup + theta_l) / (k + 1)                  average(soup U {theta_l})
      W+ = (k soup + theta_l + theta_g) / (k + 2)        average(soup U {theta_l} U {theta_g})
      accept = ValAcc(W+) >= ValAcc(W)                   (paper's >=; algo.strict=True: the code's >)
      if accept: soup <- (k soup + theta_g) / (k + 1), k <- k + 1, theta_l <- W+   else theta_l <- W
  upload theta_l (the PATCHED model); server: FedAvg (config.server on Delta = theta_g - theta_l)

The personalized model of client k is its last uploaded theta_l (client state 'personal'); before the soup
starts it is the plain locally trained model. ValAcc is measured on the client's validation split
(algo.val_source='val') or its local test split ('local_test', the reference code's behaviour), which the
Trainer appends after the training steps of the round batches, flagged batch['split'] = 1 (see
data/validation_steps.py). client_step trains on split-0 steps and, on split-1 steps, accumulates the correct
counts of W and W+ (evaluated at the final theta_l, since those steps come last) in the local state;
client_final applies the rule. With no validation examples, both counts are 0: '>=' always accepts,
strict never does.

Hyperparameters (config.algo): start_fraction (0.75), start_round (-1 = from start_fraction), strict (False),
val_source ('val' | 'local_test'), persist_opt_state (False), local_norm (False: FedBN-style local
normalization params, algorithms/wrappers/local_norm.with_local_norm).

Also registers 'fedbn': FedAvg with local normalization params (FedBN for GroupNorm models).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import tmap
from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.hparams import Choice, Flag, Integer, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init
from fedjax_flat.algorithms import personalization
from fedjax_flat.algorithms.wrappers import local_norm
from fedjax_flat.data import validation_steps

HPARAMS = {'start_fraction': Number(0.75, lo=0, hi=1),
           'start_round': Integer(-1, lo=-1, note=' (-1 = from start_fraction)'),
           'strict': Flag(False),
           'persist_opt_state': Flag(False),
           'local_norm': Flag(False),
           'val_source': Choice('val', ('local_test', 'val'))}


# --- The soup arithmetic (pure; unit-tested on hand-made models). ---

def soup_candidates(soup, count, theta_l, theta_g):
  """(W, W+): the soup with theta_l, and with theta_l and theta_g; `soup` is the running mean of `count`."""
  k = jnp.asarray(count, jnp.float32)
  w = tmap(lambda s, l: (k * s + l) / (k + 1.0), soup, theta_l)
  w_plus = tmap(lambda s, l, g: (k * s + l + g) / (k + 2.0), soup, theta_l, theta_g)
  return w, w_plus


def soup_accept(correct_with, correct_without, strict: bool):
  """The paper's ValAcc(W+) >= ValAcc(W) (strict=True: the reference code's >)."""
  return correct_with > correct_without if strict else correct_with >= correct_without


def soup_add(soup, count, theta_g, accept):
  """Running mean with theta_g added where `accept`: (soup', count')."""
  k = jnp.asarray(count, jnp.float32)
  new = tmap(lambda s, g: jnp.where(accept, s + (g - s) / (k + 1.0), s), soup, theta_g)
  return new, k + jnp.asarray(accept, jnp.float32)


def start_round(config, hp) -> int:
  if int(hp['start_round']) >= 0:
    return int(hp['start_round'])
  return int(math.floor(float(hp['start_fraction']) * int(config.rounds) + 1e-9))


def _hp(ctx):
  hp = ctx.hp
  if not 0.0 <= float(hp['start_fraction']) <= 1.0:
    raise ValueError(f"algo.start_fraction={hp['start_fraction']!r} must be in [0, 1]")
  if hp['val_source'] not in validation_steps.VAL_SOURCES:
    raise ValueError(f"algo.val_source={hp['val_source']!r}; allowed: {validation_steps.VAL_SOURCES}")
  return hp


def fedsoup(model, loss_fn, client_tx, hparams_fn, server_tx, *, start: int, strict: bool = False,
            persist_opt_state: bool = False, name: str) -> FederatedAlgorithm:
  """client_tx: the client optimizer (built once); hparams_fn: round -> client hparams {'lr', 'rho'}; name: the
  algorithm's (its personal model is reported under it)."""
  tx = client_tx

  def correct(params, batch, vmask):
    logits = model.apply(params, batch['x'], train=False)
    return jnp.sum((jnp.argmax(logits, -1) == batch['y']).astype(jnp.float32) * vmask)

  server_init = fedavg_server_init(server_tx, lambda p: {'soup_accept_rate': jnp.zeros((), jnp.float32),
                                                          'soup_mean_size': jnp.zeros((), jnp.float32)})

  broadcast = fedavg_broadcast(hparams_fn, extra=lambda state, t: {'soup_active': jnp.asarray(t) >= start})

  def client_state_init(params):
    z = tmap(jnp.zeros_like, params)
    s = {'soup': z, 'count': jnp.zeros((), jnp.float32), 'personal': z}
    if persist_opt_state:
      s['opt_state'] = tmap(jnp.zeros_like, tx.init(params))
    return s

  def client_init(bcast, client_state, rng):
    del rng
    w0 = bcast['params']
    opt_state = client_state['opt_state'] if persist_opt_state else tx.init(w0)
    extra = {'soup': client_state['soup'], 'count': client_state['count'],
             'correct': jnp.zeros((2,), jnp.float32), 'val_count': jnp.zeros((), jnp.float32)}
    return local_lib.LocalState(w0, opt_state, w0, extra)

  def client_step(bcast, local, batch, rng):
    if 'split' not in batch:
      raise ValueError("fedsoup needs the clients' validation examples in the round batches (batch['split']); "
                       'the Trainer appends them (data/validation_steps.append_validation_steps)')
    split = batch['split'].astype(jnp.float32)
    train_batch = {'x': batch['x'], 'y': batch['y'], 'mask': batch['mask'] * (1.0 - split)}
    trained, m = local_lib.local_step(local, train_batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'])

    vmask = batch['mask'] * split
    ex = local.extra

    def val_counts(_):
      w, w_plus = soup_candidates(ex['soup'], ex['count'], local.params, local.init_params)
      return jnp.stack([correct(w_plus, batch, vmask), correct(w, batch, vmask)])
    # soup_active is the same for every client (broadcast): a real branch even under vmap.
    counts = jax.lax.cond(bcast['soup_active'], val_counts, lambda _: jnp.zeros((2,), jnp.float32), None)
    validated = local._replace(extra={**ex, 'correct': ex['correct'] + counts,
                                      'val_count': ex['val_count'] + jnp.sum(vmask)})
    is_val = jnp.max(split) > 0
    new_local = tmap(lambda a, b: jnp.where(is_val, a, b), validated, trained)
    m = {'loss_sum': jnp.where(is_val, 0.0, m['loss_sum']), 'count': jnp.where(is_val, 0.0, m['count'])}
    return new_local, m

  def client_final(bcast, local, client_state):
    ex = local.extra
    active = bcast['soup_active']
    theta_l, theta_g = local.params, local.init_params
    accept = active & soup_accept(ex['correct'][0], ex['correct'][1], strict)
    w, w_plus = soup_candidates(ex['soup'], ex['count'], theta_l, theta_g)
    patched = tmap(lambda a, b, c: jnp.where(active, jnp.where(accept, a, b), c), w_plus, w, theta_l)
    soup, count = soup_add(ex['soup'], ex['count'], theta_g, accept)
    new_state = {'soup': soup, 'count': count, 'personal': patched}
    if persist_opt_state:
      new_state['opt_state'] = local.opt_state
    delta = tmap(lambda g, p: g - p, theta_g, patched)
    out = {'weighted': {'delta': delta},
           'uniform': {'accepted': accept.astype(jnp.float32), 'soup_size': count}}
    return out, new_state

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    updates, opt_state = server_tx.update(agg['weighted']['delta'], state['opt_state'], state['params'])
    return {**state, 'params': optax.apply_updates(state['params'], updates), 'opt_state': opt_state,
            'soup_accept_rate': agg['uniform']['accepted'], 'soup_mean_size': agg['uniform']['soup_size']}

  return FederatedAlgorithm(name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, client_state_init=client_state_init,
                            personalizer=personalization.Personalizer(name, _fedsoup_personalizer))


def _fedsoup_personalizer(algorithm, server_state, client_state):
  if client_state is None:
    return personalization.global_params(algorithm, server_state)
  return client_state['personal']



@register('fedsoup', hparams=HPARAMS, needs=('client_state', 'validation'))
def _fedsoup_builder(ctx) -> FederatedAlgorithm:
  hp = _hp(ctx)
  alg = fedsoup(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx,
                start=start_round(ctx.config, hp), strict=bool(hp['strict']),
                persist_opt_state=bool(hp['persist_opt_state']), name=ctx.name)
  if hp['local_norm']:
    alg = local_norm.with_local_norm(alg)
  return alg


@register('fedbn', needs=('client_state', 'batch_stats', 'local_batch_stats'), upload='delta')
def _fedbn_builder(ctx) -> FederatedAlgorithm:
  """FedAvg with the normalization params kept local (FedBN, Li et al. 2021; GroupNorm models here)."""
  base = fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)
  return local_norm.with_local_norm(base, name=ctx.name)
