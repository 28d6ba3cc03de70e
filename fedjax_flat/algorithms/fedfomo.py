"""FedFomo: federated first-order model optimization (Zhang et al., ICLR 2021).

The server keeps every client's latest uploaded model theta_1..theta_N. Each round, client i:

  downloads M of them (epsilon-greedy on its affinities P_i: with probability eps_t M random ones, else the M
            with the largest P_i; never its own, never a slot no client has filled yet)
  weighs them on its validation data (the client's current model theta_i, its last trained one):
      w_n = max(0, (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i||),  w_n <- w_n / sum_m w_m  (if > 0)
  federates  theta_i <- theta_i + sum_n w_n (theta_n - theta_i);  P_i[n] += w_n
  trains theta_i locally and uploads it to its slot.

Two phases per round with the same clients (num_phases = 2; the same round batches): phase 0 evaluates and
federates (only the validation steps, batch['split'] = 1, appended by the Trainer as for FedSoup:
data/validation_steps.py) and keeps the federated theta_i in the client state; phase 1 trains it on the
training steps and uploads it. A client's slot is its id (batch['client'], the need 'client_ids'): the upload
is one-hot over the N slots, so the engine's mean over the round's clients gives every slot its model.
A client on its first visit starts from the server's model (the initial model in round 0). The server's
'global' model (evaluation only; FedFomo has none) is the example-weighted mean of the round's uploads.
The personal model of client i is its last trained theta_i.

Hyperparameters: models (M, 5: the release's CLI default), epsilon (0.3) and epsilon_decay (0.05 per round:
the paper's schedule), val_source ('val' | 'local_test': the release evaluates on the local test split),
population (N), affinity ('paper': P_i[n] += w_n, the clipped and normalised weights above; 'release': the
authors' code, P_i[n] += (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i||, the raw gains, negatives
included, which steers the greedy download away from models that hurt; the federation itself is the same).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import population, tmap
from fedjax_flat.algorithms.hparams import Choice, Integer, Number, Population
from fedjax_flat.algorithms.personalization import Personalizer, global_params, if_seen
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.data import validation_steps
from fedjax_flat.tasks import base as tasks_lib

HPARAMS = {'models': Integer(5, lo=1, note=' (M models downloaded per round)'),
           'epsilon': Number(0.3, lo=0, hi=1),
           'epsilon_decay': Number(0.05, lo=0, finite=True, bound=True),
           'val_source': Choice('val', validation_steps.VAL_SOURCES),
           'population': Population(),
           'affinity': Choice('paper', ('paper', 'release'))}


def fomo_gains(loss_own, losses, dists, valid):
  """(L(theta_i) - L(theta_n)) / ||theta_n - theta_i||; 0 for an invalid slot or a model at distance 0 (the
  client's own, or an identical one)."""
  ok = valid & (dists > 0)
  return jnp.where(ok, (loss_own - losses) / jnp.where(ok, dists, 1.0), 0.0)


def fomo_weights(loss_own, losses, dists, valid):
  """w_n = max(0, gain_n), normalised to sum 1 when any is > 0 (fomo_gains)."""
  w = jnp.maximum(0.0, fomo_gains(loss_own, losses, dists, valid))
  total = jnp.sum(w)
  return jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), 0.0)


def fedfomo(model, loss_fn, task, client_tx, hparams_fn, *, num_clients: int, num_models: int, epsilon: float,
            epsilon_decay: float, seed: int = 0, name: str, affinity: str = 'paper') -> FederatedAlgorithm:
  """name: the algorithm's (its personal model is reported under it); affinity: 'paper' | 'release' (module
  docstring)."""
  task = tasks_lib.get_task(task)
  tx = client_tx
  affinity_rule = affinity
  if affinity_rule not in ('paper', 'release'):
    raise ValueError(f"affinity={affinity!r}; allowed: 'paper', 'release'")
  n, m = int(num_clients), int(min(num_models, max(num_clients - 1, 1)))

  def val_loss_sums(params, batch, vmask):
    logits = model.apply(params, batch['x'], train=False)
    return task.loss_sums(logits, batch['y'], vmask)[0]

  def server_init(params, rng):
    del rng
    return {'params': params, 'models': tmap(lambda a: jnp.broadcast_to(a, (n,) + a.shape), params),
            'seen': jnp.zeros((n,), jnp.float32)}

  def broadcast(state, round_idx, phase=0):
    b = {'params': state['params'], 'hparams': hparams_fn(round_idx)}
    if phase == 0:
      eps = jnp.maximum(0.0, epsilon - epsilon_decay * jnp.asarray(round_idx, jnp.float32))
      b.update(models=state['models'], seen=state['seen'], eps=eps,
               key=jax.random.fold_in(jax.random.key(seed), round_idx))
    return b

  def client_state_init(params):
    return {'personal': tmap(jnp.zeros_like, params), 'seen': jnp.zeros((), jnp.float32),
            'affinity': jnp.zeros((n,), jnp.float32)}

  def client_init(bcast, cs, rng, phase=0):
    del rng
    seen = cs['seen'] > 0
    theta = tmap(lambda a, b: jnp.where(seen, a, b), cs['personal'], bcast['params'])
    extra = {'cid': jnp.full((), -1, jnp.int32)}
    if phase == 0:
      extra.update(loss=jnp.zeros((m + 1,), jnp.float32), count=jnp.zeros((), jnp.float32),
                   sel=jnp.zeros((m,), jnp.int32), valid=jnp.zeros((m,), bool), affinity=cs['affinity'])
    return local_lib.LocalState(theta, tx.init(theta), theta, extra)

  def select(bcast, cid, affinity):
    """M slots: epsilon-greedy on the affinities, the same at every step of the round (keyed by round, id)."""
    k1, k2 = jax.random.split(jax.random.fold_in(bcast['key'], cid))
    noise = jax.random.uniform(k2, (n,))
    explore = jax.random.uniform(k1) < bcast['eps']
    score = jnp.where(explore, noise, affinity + 1e-6 * noise)      # noise breaks ties (P_i = 0 at first)
    ok = (bcast['seen'] > 0) & (jnp.arange(n) != cid)
    score = jnp.where(ok, score, -jnp.inf)
    top, sel = jax.lax.top_k(score, m)
    return sel.astype(jnp.int32), jnp.isfinite(top)

  def client_step(bcast, local, batch, rng, phase=0):
    if 'split' not in batch or 'client' not in batch:
      raise ValueError("fedfomo needs the clients' validation steps (batch['split']) and ids (batch['client']) "
                       'in the round batches; the Trainer adds them (needs: validation, client_ids)')
    split = batch['split'].astype(jnp.float32)
    is_val = jnp.max(split) > 0
    cid = jnp.maximum(local.extra['cid'], jnp.asarray(batch['client'], jnp.int32).reshape(()))
    zero = {'loss_sum': jnp.zeros((), jnp.float32), 'count': jnp.zeros((), jnp.float32)}
    if phase == 0:      # evaluate theta_i and the M downloaded models on the validation steps
      ex = {**local.extra, 'cid': cid}

      def evaluate(ex):
        sel, valid = select(bcast, cid, ex['affinity'])
        vmask = batch['mask'] * split
        picked = tmap(lambda s: s[sel], bcast['models'])
        own = val_loss_sums(local.params, batch, vmask)
        theirs = jax.vmap(lambda p: val_loss_sums(p, batch, vmask))(picked)
        return {**ex, 'sel': sel, 'valid': valid, 'count': ex['count'] + jnp.sum(vmask),
                'loss': ex['loss'] + jnp.concatenate([own[None], theirs])}
      # training steps are skipped in this phase (a real branch when clients run one at a time)
      return local._replace(extra=jax.lax.cond(is_val, evaluate, lambda e: e, ex)), zero
    train_batch = {'x': batch['x'], 'y': batch['y'], 'mask': batch['mask'] * (1.0 - split)}
    trained, mt = local_lib.local_step(local, train_batch, rng, loss_fn=loss_fn, tx=tx,
                                       hparams=bcast['hparams'])
    trained = trained._replace(extra={'cid': cid})
    skipped = local._replace(extra={'cid': cid})
    new_local = tmap(lambda a, b: jnp.where(is_val, a, b), skipped, trained)
    return new_local, {'loss_sum': jnp.where(is_val, 0.0, mt['loss_sum']),
                       'count': jnp.where(is_val, 0.0, mt['count'])}

  def client_final(bcast, local, cs, phase=0):
    theta = local.params
    if phase == 0:
      ex = local.extra
      losses = ex['loss'] / jnp.maximum(ex['count'], 1.0)
      picked = tmap(lambda s: s[ex['sel']], bcast['models'])
      diffs = tmap(lambda p, t: p - t[None], picked, theta)
      dists = jnp.sqrt(sum(jnp.sum(jnp.square(d).reshape(m, -1), axis=1) for d in jax.tree_util.tree_leaves(diffs)))
      w = fomo_weights(losses[0], losses[1:], dists, ex['valid'])
      federated = tmap(lambda t, d: t + jnp.tensordot(w, d, axes=1), theta, diffs)
      gain = fomo_gains(losses[0], losses[1:], dists, ex['valid']) if affinity_rule == 'release' else w
      affinity = cs['affinity'].at[ex['sel']].add(gain)
      new_cs = {'personal': federated, 'seen': jnp.ones((), jnp.float32), 'affinity': affinity}
      return {'weighted': {}, 'uniform': {'weight_sum': jnp.sum(w)}}, new_cs
    hit = jax.nn.one_hot(local.extra['cid'], n, dtype=jnp.float32)      # all zeros for a padding client (-1)
    slots = tmap(lambda t: hit.reshape((n,) + (1,) * t.ndim) * t[None], theta)
    out = {'weighted': {'params': theta}, 'uniform': {'slots': slots, 'hit': hit}}
    return out, {**cs, 'personal': theta, 'seen': jnp.ones((), jnp.float32)}

  def server_update(state, agg, round_idx, phase=0):
    del round_idx
    if phase == 0:      # the federation is local to each client: nothing to aggregate
      return state
    count = agg['num_clients']
    hits = agg['uniform']['hit'] * count                     # 1 for the slots uploaded this round
    filled = hits > 0
    models = tmap(lambda old, s: jnp.where(filled.reshape((n,) + (1,) * (old.ndim - 1)),
                                           s * count / jnp.maximum(hits, 1.0).reshape((n,) + (1,) * (old.ndim - 1)),
                                           old), state['models'], agg['uniform']['slots'])
    return {**state, 'params': agg['weighted']['params'], 'models': models,
            'seen': jnp.maximum(state['seen'], filled.astype(jnp.float32))}

  return FederatedAlgorithm(name, server_init, broadcast, client_init, client_step, client_final, server_update,
                            client_state_init=client_state_init, num_phases=2, comm_down=m / 2.0, comm_up=0.5,
                            personalizer=Personalizer(name, _personalizer))


def _personalizer(algorithm, server_state, client_state):
  if client_state is None:
    return global_params(algorithm, server_state)
  return if_seen(client_state['seen'], client_state['personal'], global_params(algorithm, server_state))



@register('fedfomo', hparams=HPARAMS,
          needs=('population', 'static_population', 'client_state', 'validation', 'client_ids'))
def _fedfomo_builder(ctx) -> FederatedAlgorithm:
  """FedFomo: clients federate the M downloaded models weighted by their validation-loss improvement."""
  hp = ctx.hp
  return fedfomo(ctx.model, ctx.loss_fn, ctx.task, ctx.client_tx, ctx.hparams_fn, num_clients=population(ctx, hp),
                 num_models=int(hp['models']), epsilon=float(hp['epsilon']),
                 epsilon_decay=float(hp['epsilon_decay']), seed=int(ctx.config.seed), name=ctx.name,
                 affinity=hp['affinity'])

