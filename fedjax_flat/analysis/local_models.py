"""Clients' local models of a round, recomputed from the server state at the start of that round.

Nothing is kept during training: everything random in a round is a function of (seed, round, client id)
(sampling, batch order, augmentation, dropout; WORKSPACE.md), so re-running the client update of round r from
the checkpoint written after r rounds gives the local models round r trains (the round a resumed run would
run next). This touches no engine code: it replays `engine.make_client_runner`'s per-client loop on one client
at a time, with the Trainer's batches, client rngs, client states and train transform. Same computation;
floating-point results can differ from the vmapped round in the last bits (other reduction order).

Per-client sharpness (thesis Table 4.13): `per_client_sharpness` gives, for each sampled client k,
lambda_max of its local model on its own data, of the global model on the same data, and of the local model
on the global data: the test set (global_set='test', the default), the whole training set of all clients
(global_set='train', the thesis' lambda_{1,g} on D) or both side by side.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.analysis.data import make_fixed_batches
from fedjax_flat.analysis.eigen import RESIDUAL_TOL, check_pairs, top_eigenpairs_power
from fedjax_flat.analysis.hvp import make_hvp, param_dim
from fedjax_flat.analysis.per_client import client_lambda_max_estimates


def make_runner(alg, augment_fn):
  """The jitted local training of one client, as `engine.make_client_runner`'s per-client loop:
  run(bcast, batches [S, B, ...], client_state, rng) -> local params. The broadcast is an argument, so one compiled
  program serves every round of a run (a caller that measures several rounds keeps it)."""

  @jax.jit
  def run(bcast, batches, client_state, rng):
    local = alg.client_init(bcast, client_state, rng)

    def body(local, xs):     # as engine.make_client_runner
      batch, step = xs
      step_rng = jax.random.fold_in(rng, step)
      if augment_fn is not None:
        aug_rng = jax.random.fold_in(step_rng, 1)
        batch = augment_fn(aug_rng, batch)
      new_local, _ = alg.client_step(bcast, local, batch, step_rng)
      valid = jnp.sum(batch['mask']) > 0
      return jax.tree_util.tree_map(lambda a, b: jnp.where(valid, a, b), new_local, local), None

    local, _ = jax.lax.scan(body, local, (batches, jnp.arange(batches['mask'].shape[0])))
    return local.params
  return run


def local_updates(trainer, round_idx: int, runner=None) -> Dict:
  """Round `round_idx`'s clients trained from `trainer.server_state` (the state after `round_idx` rounds):
  {'ids': client ids, 'params': their local params, 'num_examples': [K] their N_k (FedAvg's weights),
  'start': the broadcast params they started from}. `runner`: a `make_runner` of this trainer (built if None)."""
  alg = trainer.algorithm
  if alg.num_phases != 1:
    raise ValueError(f'{alg.label} has {alg.num_phases} phases per round: local models are defined per phase; '
                     'only single-phase algorithms are supported')
  if alg.chain is not None:             # a chain algorithm (training/chain_loop.ChainTrainer)
    raise ValueError(f'{alg.label} trains its clients in chains: a client\'s model depends on its position in '
                     'its chain, so per-client local models from the broadcast model are not defined')
  r = int(round_idx)
  ids = [int(k) for k in trainer.plan.sample_round(r)]          # the round's clients (stratified for H-FL)
  rb = trainer.plan.round_batches(r, ids, len(ids))
  id_arr = np.asarray(ids, np.int32)
  rngs = trainer.plan.client_keys(r, id_arr)
  states = trainer.store.gather(id_arr) if trainer.store is not None else None
  bcast = alg.broadcast(trainer.server_state, jnp.asarray(r, jnp.int32))
  run = runner if runner is not None else make_runner(alg, trainer.plan.train_transform)
  batches = rb.as_dict()
  out = []
  for i in range(len(ids)):
    b = jax.tree_util.tree_map(lambda a: jnp.asarray(a[i]), batches)
    cs = None if states is None else jax.tree_util.tree_map(lambda a: a[i], states)
    out.append(jax.device_get(run(bcast, b, cs, rngs[i])))
  start = bcast['params'] if isinstance(bcast, dict) and 'params' in bcast else \
      alg.eval_models(trainer.server_state)['global'][0]
  return {'ids': ids, 'params': out, 'num_examples': np.asarray(rb.num_examples[:len(ids)], np.float32),
          'start': jax.device_get(start)}


def local_models(trainer, round_idx: int) -> Tuple[List[int], List]:
  """(client ids, their local params) of round `round_idx`, from `trainer.server_state` (which must be the
  state after `round_idx` rounds, e.g. restored from checkpoint `round_idx`)."""
  u = local_updates(trainer, round_idx)
  return u['ids'], u['params']


def _lambda(model, params, batches, *, num_iters, tol, rng, task=None) -> Tuple[float, int, float, bool]:
  """(lambda_max, power steps, residual ||Hu - lambda u||, converged) of the thesis' power iteration."""
  hvp = make_hvp(model, params, batches, task=task)
  lams, vecs, iters = top_eigenpairs_power(hvp, param_dim(params), k=1, num_iters=num_iters, tol=tol, rng=rng,
                                           return_num_iters=True)
  pairs = check_pairs(hvp, lams, vecs)
  return float(lams[0]), int(iters[0]), float(pairs.residuals[0]), bool(pairs.converged[0])


ESTIMATES = ('full_data', 'both')
GLOBAL_SETS = ('test', 'train', 'both')


def global_train_subset(data, num_examples: int, seed: int = 0) -> np.ndarray:
  """Indices into data.x of `num_examples` examples of the whole training set D (every client's examples),
  drawn uniformly without replacement with `seed`; all of D (sorted) when it has at most that many. The
  training set is stored client after client, so its first examples would be the first clients' data only."""
  held = np.unique(np.asarray(data.client_index))
  if len(held) <= num_examples:
    return held
  return np.sort(np.random.default_rng(seed).choice(held, size=num_examples, replace=False))


def per_client_sharpness(trainer, global_params, round_idx: int, *, num_examples: int = 500, batch_size: int = 100,
                         num_iters: int = 20, tol: float = 1e-4, seed: int = 0, estimate: str = 'full_data',
                         global_set: str = 'test', warn: bool = True) -> Dict:
  """Thesis Table 4.13 protocol for the clients sampled in round `round_idx`.

  Per client k: 'lambda_local_own' (local model on D_k, its training examples), 'lambda_global_own' (the
  global model on the same D_k) and the local model on the global data: 'lambda_local_global' on the test set
  (global_set='test' or 'both'), 'lambda_local_train' on the whole training set D of all clients, the thesis'
  lambda_{1,g} (global_set='train' or 'both'; `num_examples` of D drawn with `seed`, global_train_subset).
  First `num_examples` examples of the other sets, eval preprocessing. One power-iteration start vector for
  all. These are full-data estimates (lambda_max of the loss over all the examples). estimate='both' adds, side by side,
  FedSoup Fig. 2a's paper estimate 'lambda_<name>_batch_median': lambda_max of each batch of `batch_size`,
  the median over the batches (per_client.client_lambda_max_estimates).
  """
  if estimate not in ESTIMATES:
    raise ValueError(f'estimate={estimate!r}; allowed: {", ".join(ESTIMATES)}')
  if global_set not in GLOBAL_SETS:
    raise ValueError(f'global_set={global_set!r}; allowed: {", ".join(GLOBAL_SETS)}')
  ids, locals_ = local_models(trainer, round_idx)
  model, tf = trainer.model, trainer.plan.eval_transform
  on_global = []      # (name, batches) of the global sets the local model is measured on
  if global_set in ('test', 'both'):
    tx, ty = trainer.data.test_examples()
    on_global.append(('local_global', make_fixed_batches(np.asarray(tf(np.asarray(tx[:num_examples]))),
                                                         np.asarray(ty[:num_examples]), batch_size)))
  if global_set in ('train', 'both'):
    i = global_train_subset(trainer.data, num_examples, seed)
    gx, gy = trainer.data.take(i)
    on_global.append(('local_train', make_fixed_batches(np.asarray(tf(np.asarray(gx))), np.asarray(gy),
                                                        batch_size)))
  measured = ('local_own', 'global_own') + tuple(n for n, _ in on_global)
  rng = jax.random.key(seed)
  rows = []
  for k, params_k in zip(ids, locals_):
    x, y = trainer.data.client_examples(k)
    if len(y) == 0:
      continue
    own = make_fixed_batches(np.asarray(tf(np.asarray(x[:num_examples]))), np.asarray(y[:num_examples]), batch_size)
    row = {'client': k, 'num_examples': int(min(len(y), num_examples))}
    for name, p, b in (('local_own', params_k, own), ('global_own', global_params, own),
                       *((n, params_k, gb) for n, gb in on_global)):
      (row[f'lambda_{name}'], row[f'iters_{name}'], row[f'residual_{name}'],
       row[f'converged_{name}']) = _lambda(model, p, b, num_iters=num_iters, tol=tol,
                                                           rng=rng, task=trainer.task)
      if estimate == 'both':
        row[f'lambda_{name}_batch_median'] = client_lambda_max_estimates(
            model, p, b, num_iters=num_iters, tol=tol, rng=rng, task=trainer.task)['lambda_batch_median']
    rows.append(row)
  names = measured
  if estimate == 'both':
    names += tuple(f'{n}_batch_median' for n in names)
  means = {f'mean_lambda_{n}': float(np.mean([r[f'lambda_{n}'] for r in rows])) for n in names} if rows else {}
  bad = [(r['client'], n) for r in rows for n in measured if not r[f'converged_{n}']]
  if bad and warn:     # warn=False: the caller reports all_converged itself (experiments/hessian.py), once
    logging.warning('per-client lambda_max: %d of %d power iterations did not converge (residual > %g * lambda; '
                    'more steps: --num_iters): %s', len(bad), len(measured) * len(rows), RESIDUAL_TOL, bad[:10])
  return {'round': int(round_idx), 'clients': rows, 'all_converged': not bad, 'residual_tol': RESIDUAL_TOL,
          'estimate': estimate, 'global_set': global_set, **means}
