"""The centralized upper bound, and a federated run's rounds to reach a fraction of it.

`train(config, workdir)` trains the config's model on the union of every training client's examples (one
dataset, no federation) with the federated clients' optimizer chain (optimizers/client.py, every step
algorithms/local.local_step): client.optimizer 'sgd' | 'sam' | 'asam' (client.rho, client.asam_eta), then
weight decay (PyTorch-style coupled, at the unperturbed weights) and SGD with momentum, a cosine-annealed
learning rate over all steps (the FedSeq chapter's centralized runs: cosine annealing, momentum 0.9), the
config's augmentation and the dataset's task (loss, metrics). Thesis Table 4.5's centralized SAM / ASAM
columns: --config.client.optimizer=sam|asam.

SWA (config.swa.enabled; Table 4.5's SWA / SAM+SWA / ASAM+SWA): the federated protocol with epochs in place of
rounds: from epoch s = floor(swa.start_fraction * epochs) the lr of epoch e is the cyclic
gamma(e) = (1 - t) lr1 + t lr2, t = ((e mod c) + 1) / c (swa.cyclic_lr), and the weights at the end of every
cycle's last epoch (e >= s, (e - s + 1) % c == 0, where gamma = lr2) are averaged (swa.average): the SWA
model is their plain mean, evaluated after each epoch as swa/test_*, and it is the reported model
(final_test_accuracy; the plain model's is final_test_accuracy_base). The thesis gives no centralized SWA
schedule beyond the federated one; BatchNorm statistics are averaged like the weights (no recomputation pass).

Initial weights: the model's init, or `config.init` (training/init.py: a params file `init.pretrained`, another
run's model `init.checkpoint`; `init.reinit_classifier='never'` keeps the loaded classifier), e.g. LADD's
centralized FTDA from the source model of experiments/pretrain_source.py. The loss is the dataset's task with the
config's settings (tasks/base.from_config: config.segmentation's OHEM).

Every epoch is one compiled program (a scan over its batches, gathered from the device copy of the data by a
permutation keyed by (seed, epoch); the per-step learning rates and the epoch are inputs, so every epoch runs the
same program); the test set is evaluated after every epoch.

Data over an item store (FedVPR's query tuples, data/federated.py: a FederatedDataset's `store`, or a source's
per-client `client_indexed` stores, concatenated) keep their index rows and the store on the device, and every
step looks its batch's items up (federated.lookup) as the rounds do. With a pool `draw` = (fixed, count) the
`count` negative candidates of every example are drawn afresh at every visit, through the rounds' definition
(data/batching.draw_keys / draw_columns): the union is client 0 of "round" `epoch`, so the draw of the example at
(step s, slot j) of epoch e is keyed by (seed, e, s, j): deterministic, and the same in a rerun. The federated
runs redraw every round, so Table 6.5's centralized row sees as many candidate sets as they do (not `take`'s
fixed first `count` pool columns). Data without a store run exactly as before (x[perm], y[perm]).

Writes WORKDIR/centralized.json:
  {"final_test_accuracy": ..., "best_test_accuracy": ..., "epochs": [...per-epoch metrics...], "hparams": ...}

`rounds_to_centralized(records, config, model)`: for each fraction f of `config.centralized.fractions`
(default 0.7, 0.9) the first evaluated round whose test accuracy, averaged over the last
`config.centralized.window` evaluations (1 = the evaluation itself; the FedSeq release averages 5), reaches
f * the centralized accuracy; None when never reached. The centralized accuracy is
`config.centralized.accuracy` or the `final_test_accuracy` of `config.centralized.path` (a centralized run's
JSON or its workdir). The round resolution is `eval_every` (and every round of the last `eval_every_last`).

Config fields (`config.centralized`, config/default_config.py):
  epochs, lr (0 = client.lr), momentum, weight_decay (-1 = client.weight_decay), batch_size (0 =
  client.batch_size), schedule ('cosine' | 'constant' | 'poly': lr (1 - t / T) ** 0.9, the LADD release's): the
  centralized run (client.optimizer / rho / asam_eta and config.swa as above);
  accuracy, path, fractions, window: the federated run's reference and its rounds-to-X metric.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Dict, List, Optional

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_flat.tasks import base as tasks_lib
from fedjax_flat.algorithms import local as local_lib
# re-exported: the reference and rounds-to-X live with config.centralized (training/loop.py reads them there)
from fedjax_flat.config.centralized import (POLY_POWER, RESULT_FILE, fraction_key, read_reference,  # noqa: F401
                                            reference_accuracy, reference_path, rounds_to, rounds_to_centralized)
from fedjax_flat.evaluation.evaluator import Evaluator, RetrievalEvaluator, fixed_batch_size, make_validation_evaluator
from fedjax_flat.tasks import retrieval as ret_tasks
from fedjax_flat.data import batching
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data import sampling
from fedjax_flat.data.federated import lookup
from fedjax_flat.models import registry as model_registry
from fedjax_flat.data.transforms import pipeline as transforms
from fedjax_flat.config import validate as validate_lib
from fedjax_flat.optimizers.client import ASCENT_OPTIMIZERS, client_optimizer
from fedjax_flat.optimizers.schedules import client_hparams, swa_cyclic_lr
from fedjax_flat.training import init as init_lib


# ----------------------------------------------------------------------------------------------------
# The centralized run.


def union_indexed(data):
  """Every training client's examples as index rows into one item store, or None for data without a store:
  (rows [N, K] int32 (-1: empty), y [N, K, ...], store [I, *item], draw (fixed, count) or None).

  A FederatedDataset's rows index its `store`; a source's per-client stores (`client_indexed(k)`,
  data/sources/msls_stream.py) are concatenated and each client's rows shifted by its store's offset."""
  if getattr(data, 'store', None) is not None and hasattr(data, 'client_index'):
    return (np.asarray(data.x[data.client_index], np.int32), np.asarray(data.y)[data.client_index], data.store,
            data.draw)
  if not hasattr(data, 'client_indexed'):
    return None
  parts = [data.client_indexed(k) for k in range(data.num_clients)]
  offsets = np.cumsum([0] + [len(store) for _, _, store in parts[:-1]])
  rows = np.concatenate([np.where(r >= 0, r + o, -1) for (r, _, _), o in zip(parts, offsets)]).astype(np.int32)
  return rows, np.concatenate([y for _, y, _ in parts]), np.concatenate([st for _, _, st in parts]), data.draw


def epoch_draw_keys(seed, epoch, num_steps: int, batch_size: int):
  """[S, B] keys of an epoch's pool draws: the rounds' draw_keys with the union as client 0 and the epoch as the
  round, i.e. keyed by (seed, epoch, step, slot). seed: an int or the run's key (sampling.seed_key); traceable
  (epoch may be traced)."""
  return batching.draw_keys(sampling.seed_key(seed), epoch, jnp.zeros((1,), jnp.int32), num_steps, batch_size)[0]


def store_rows(arrays, idx, mask, keys, draw):
  """(rows [B, slots], y) of positions idx [B] (mask [B]) of index rows over a store (arrays: 'x' rows [N, K],
  'y' [N, K, ...]): with `draw` the first `fixed` columns and `count` drawn from the pool with keys [B]
  (batching.draw_columns, the rounds' draw), else all K; masked examples' rows empty (-1), y 0. Traceable."""
  return batching.drawn_rows(draw, keys, arrays['x'][idx], arrays['y'][idx], mask > 0)


def store_batch(arrays, idx, mask, keys, draw):
  """The batch {x, y, mask} of `store_rows` with the items looked up in arrays['store'] (federated.lookup; empty
  slots and masked examples are zeros, as in the round batches). Traceable."""
  rows, y = store_rows(arrays, idx, mask, keys, draw)
  return {'x': lookup(arrays['store'], rows, jnp), 'y': y, 'mask': mask}


def union(data):
  """All training clients' examples as one (x, y) (a FederatedDataset or a ClientDataSource); data over an item
  store: the first `count` pool columns (`take`; train() uses `union_indexed` and fresh draws instead)."""
  if hasattr(data, 'client_index') and hasattr(data, 'take'):
    return data.take(data.client_index)
  parts = [data.client_examples(k) for k in range(data.num_clients)]
  return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def hparams(config) -> Dict:
  c = config.centralized
  hp = {'epochs': int(c.epochs), 'lr': float(c.lr or config.client.lr), 'momentum': float(c.momentum),
        'weight_decay': float(config.client.weight_decay if c.weight_decay == -1 else c.weight_decay),
        'batch_size': int(c.batch_size or config.client.batch_size), 'schedule': c.schedule,
        'optimizer': config.client.optimizer}
  if config.client.optimizer in ASCENT_OPTIMIZERS:
    hp['rho'] = float(config.client.rho)
  if config.client.optimizer == 'asam':
    hp['asam_eta'] = float(config.client.asam_eta)
  if config.get('swa') is not None and config.swa.enabled:
    s = config.swa
    hp['swa'] = {'start_epoch': swa_start_epoch(hp['epochs'], s.start_fraction), 'cycle': int(s.cycle),
                 'lr1': float(s.lr1), 'lr2': float(s.lr2), 'average': bool(s.average), 'cyclic_lr': bool(s.cyclic_lr)}
  return hp


def swa_start_epoch(epochs: int, start_fraction: float) -> int:
  """s = floor(start_fraction * epochs): the 0-based epoch from which the SWA lr applies."""
  return int(math.floor(start_fraction * epochs + 1e-9))


def swa_averaged_epochs(hp) -> List[int]:
  """The 0-based epochs whose end-of-epoch weights the SWA model averages: the last epoch of every cycle from the
  start epoch s on (e >= s, (e - s + 1) % c == 0), where the cyclic lr has fallen to lr2 (SWA's "average at the
  end of each cycle"; torch.optim.swa_utils' update_parameters once per cycle)."""
  s = hp.get('swa')
  if not s or not s['average']:
    return []
  return [e for e in range(s['start_epoch'], hp['epochs']) if (e - s['start_epoch'] + 1) % s['cycle'] == 0]


def epoch_lrs(hp, epoch: int, steps_per_epoch: int) -> np.ndarray:
  """The learning rate of each step of `epoch` (0-based): the schedule over all steps (cosine / constant), or
  from the SWA start epoch on SWA's cyclic lr of the epoch (optimizers/schedules.swa_cyclic_lr, one value per
  epoch as the federated one is per round)."""
  s = hp.get('swa')
  if s and s['cyclic_lr'] and epoch >= s['start_epoch']:
    return np.full(steps_per_epoch, float(swa_cyclic_lr(s['lr1'], s['lr2'], s['cycle'])(epoch)), np.float32)
  steps = epoch * steps_per_epoch + np.arange(steps_per_epoch)
  total = hp['epochs'] * steps_per_epoch
  if hp['schedule'] == 'cosine':
    return np.asarray(optax.cosine_decay_schedule(hp['lr'], total)(steps), np.float32)
  if hp['schedule'] == 'poly':
    return np.asarray(optax.polynomial_schedule(hp['lr'], 0.0, POLY_POWER, total)(steps), np.float32)
  return np.full(steps_per_epoch, hp['lr'], np.float32)


def centralized_optimizer(config, hp) -> optax.GradientTransformationExtraArgs:
  """The federated clients' optimizer chain (optimizers/client.py: [SAM | ASAM] -> weight decay -> SGD with
  momentum), with the centralized run's momentum and weight decay; the lr of each step is passed in hparams."""
  cc = config.client.copy_and_resolve_references()
  cc.momentum, cc.weight_decay = hp['momentum'], hp['weight_decay']
  cc.base_optimizer, cc.lr_schedule = 'sgd', 'constant'     # the centralized schedule is epoch_lrs'
  return client_optimizer(cc)


def make_epoch_fn(model, task, hp, tx, augment_fn=None, *, indexed: bool = False, draw=None):
  """epoch(params, opt_state, arrays, perm [S, B], valid [S, B], lrs [S], key, seed_key, epoch) -> (params,
  opt_state, loss sum, units). arrays: {'x', 'y'} (batch = x[idx], y[idx]), or with `indexed` {'x' rows, 'y',
  'store'} (batch = store_batch, the pool drawn with epoch_draw_keys(seed_key, epoch) when `draw`); seed_key (the
  run's sampling.seed_key) and epoch (int32) are traced inputs (no recompilation per epoch), read only by
  indexed data. Every step is the federated client's step (algorithms/local.local_step) with hparams {lr, rho}."""
  loss_fn = local_lib.make_loss(model, task=task)
  rho = jnp.asarray(hp.get('rho', 0.0), jnp.float32)

  def epoch(params, opt_state, arrays, perm, valid, lrs, key, seed_key, epoch_idx):
    x, y = arrays['x'], arrays['y']
    if indexed:
      draw_keys = epoch_draw_keys(seed_key, epoch_idx, perm.shape[0], perm.shape[1])

    def body(carry, xs):
      params, opt_state = carry
      idx, mask, lr, step = xs
      rng = jax.random.fold_in(key, step)
      if indexed:
        batch = store_batch(arrays, idx, mask, draw_keys[step], draw)
      else:
        batch = {'x': x[idx], 'y': y[idx], 'mask': mask}
      if augment_fn is not None:
        batch = augment_fn(jax.random.fold_in(rng, 1), batch)
      local, m = local_lib.local_step(local_lib.LocalState(params, opt_state, params), batch, rng, loss_fn=loss_fn,
                                      tx=tx, hparams=client_hparams(lr, rho))
      return (local.params, local.opt_state), (m['loss_sum'], m['count'])
    (params, opt_state), (s, n) = jax.lax.scan(body, (params, opt_state),
                                               (perm, valid, lrs, jnp.arange(perm.shape[0])))
    return params, opt_state, jnp.sum(s), jnp.sum(n)
  return jax.jit(epoch, donate_argnums=(0, 1))


def train(config, workdir: Optional[str] = None, *, data=None, on_epoch=None, on_init=None) -> Dict:
  """Trains the centralized baseline; returns (and writes to WORKDIR/centralized.json) its result.

  on_epoch(epoch, params, swa_params or None): called after every epoch (1-based) with the end-of-epoch weights;
  on_init(params): called once with the initial weights (config.init's when it names some)."""
  validate_lib.validate_config(config)
  data = data if data is not None else data_registry.get_dataset(config.dataset, **config.data.to_dict())
  model = model_registry.get_model(config.model, data.num_classes, data.input_shape,
                                   compute_dtype=model_registry.compute_dtype(config), **config.model_kwargs.to_dict())
  task = tasks_lib.from_config(tasks_lib.task_of(data), config)   # e.g. config.segmentation's OHEM
  train_tf, eval_tf = transforms.make_transforms(config, data.num_classes)
  indexed = union_indexed(data)
  if indexed is None:
    x, y = union(data)
    arrays = {'x': jax.device_put(x), 'y': jax.device_put(np.asarray(y))}
  else:       # index rows + the store on the device; candidates drawn afresh at every visit (module docstring)
    rows, y, store, draw = indexed
    arrays = {'x': jax.device_put(rows), 'y': jax.device_put(np.asarray(y, batching.label_dtype(y.dtype))),
              'store': jax.device_put(store)}
  hp = hparams(config)
  n, b = len(y), hp['batch_size']
  steps = max(1, -(-n // b))
  tx = centralized_optimizer(config, hp)
  epoch_fn = make_epoch_fn(model, task, hp, tx, train_tf, indexed=indexed is not None,
                           draw=None if indexed is None else draw)
  averaged = set(swa_averaged_epochs(hp))
  if hp.get('swa') and hp['swa']['average'] and not averaged:
    logging.warning('centralized SWA never averages: start epoch %d + cycle %d > %d epochs; the result is the '
                    'plain model (lower config.swa.start_fraction or swa.cycle, or train more epochs)',
                    hp['swa']['start_epoch'], hp['swa']['cycle'], hp['epochs'])
  key = jax.random.key(config.seed)
  draw_key = sampling.seed_key(config.seed)     # the rounds' base key of the pool draws (epoch_draw_keys)
  params = model.init(jax.random.fold_in(key, 0), jnp.zeros((1,) + tuple(data.input_shape), jnp.float32))
  if init_lib.requested(config):      # config.init: a params file or another run's model (e.g. LADD's source model)
    params = jax.tree_util.tree_map(jnp.asarray, init_lib.initial_params(config, model, jax.device_get(params)))
    logging.info('centralized: initial params from %s', config.init.pretrained or config.init.checkpoint)
  elif config.get('init') is not None and config.init.get('reinit_classifier') == 'never':
    logging.warning('centralized: init.reinit_classifier=never but no init.pretrained / init.checkpoint: the run '
                    'starts from the random init (FTDA cells need the source model: --config.init.pretrained=...)')
  if on_init is not None:
    on_init(jax.device_get(params))
  opt_state = tx.init(params)
  tx_, ty_ = data.test_examples()
  # retrieval (FedVPR, Table 6.5's centralized row): Recall@K of the test queries against the test database
  make = RetrievalEvaluator if isinstance(task, ret_tasks.Retrieval) else Evaluator
  batch = config.eval_batch_size if make is Evaluator else fixed_batch_size(config.eval_batch_size)   # 'auto': measured
  evaluator = make(model, tx_, ty_, batch, preprocess=eval_tf, task=task)
  # the validation clients of a retrieval set (left out of the union), as the federated runs report them
  val_evaluator = make_validation_evaluator(config, model, data, task, eval_tf)
  records, t0 = [], time.time()
  swa_params, swa_n = None, 0
  logging.info('centralized: %d examples, %d epochs x %d steps of %d, %s, lr %g (%s), momentum %g, wd %g%s',
               n, hp['epochs'], steps, b, hp['optimizer'], hp['lr'], hp['schedule'], hp['momentum'],
               hp['weight_decay'], f", SWA {hp['swa']}" if hp.get('swa') else '')
  for e in range(hp['epochs']):
    order = np.random.default_rng([config.seed, e]).permutation(n)
    pad = steps * b - n
    perm = np.concatenate([order, np.zeros(pad, np.int64)]).reshape(steps, b).astype(np.int32)
    valid = np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)]).reshape(steps, b)
    params, opt_state, s, cnt = epoch_fn(params, opt_state, arrays, perm, valid, epoch_lrs(hp, e, steps),
                                         jax.random.fold_in(key, 1000 + e), draw_key, np.int32(e))
    if e in averaged:     # running mean of the recorded end-of-cycle weights
      swa_params = jax.tree_util.tree_map(
          lambda a, w: (a * swa_n + w) / (swa_n + 1), swa_params if swa_params is not None else params, params)
      swa_n += 1
    res = evaluator(params)
    rec = {'epoch': e + 1, 'train_loss': float(s) / max(float(cnt), 1.0), 'wall_s': time.time() - t0,
           **{f'test_{k}': v for k, v in res.items()}}
    if val_evaluator is not None:
      rec.update({f'val_{k}': v for k, v in val_evaluator(params).items() if k != 'count'})
    if swa_params is not None:
      rec.update({f'swa/test_{k}': v for k, v in evaluator(swa_params).items()})
    if not np.isfinite(rec['train_loss']):
      raise FloatingPointError(f'centralized training diverged at epoch {e + 1} (train loss {rec["train_loss"]}); '
                               'lower config.centralized.lr')
    records.append(rec)
    if on_epoch is not None:
      on_epoch(e + 1, jax.tree_util.tree_map(jnp.copy, params), swa_params)   # copy: params are donated next epoch
    logging.info('centralized epoch %d/%d: train loss %.4f, test accuracy %.4f%s (%.0f s)', e + 1, hp['epochs'],
                 rec['train_loss'], rec['test_accuracy'],
                 f", SWA {rec['swa/test_accuracy']:.4f}" if swa_params is not None else '', rec['wall_s'])
  # The reported model: the SWA average when one was taken (as the federated SWA run evaluates w_swa).
  final = 'swa/test_' if swa_params is not None else 'test_'
  extra = {}
  if hp.get('swa'):
    extra = {'swa_averages': swa_n, 'final_test_accuracy_base': records[-1]['test_accuracy'],
             'reported_model': 'swa' if swa_params is not None else 'base'}
  result = {'dataset': config.dataset, 'model': config.model, 'num_train_examples': int(n),
            'num_test_examples': int(len(ty_)), 'hparams': hp, 'seed': int(config.seed),
            'final_test_accuracy': records[-1][final + 'accuracy'], 'final_test_loss': records[-1][final + 'loss'],
            'best_test_accuracy': max(r[final + 'accuracy'] for r in records if final + 'accuracy' in r),
            'wall_time_s': time.time() - t0, **extra, 'epochs': records}
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    tmp = os.path.join(workdir, RESULT_FILE + '.tmp')
    with open(tmp, 'w') as f:
      json.dump(result, f, indent=2, default=float)
    os.replace(tmp, os.path.join(workdir, RESULT_FILE))
  return result
