"""The centralized upper bound, and a federated run's rounds to reach a fraction of it.

`train(config, workdir)` trains the config's model on the union of every training client's examples (one
dataset, no federation): SGD with momentum and weight decay (PyTorch-style coupled, as the clients), a
cosine-annealed learning rate over all steps (the FedSeq chapter's centralized runs: cosine annealing,
momentum 0.9), the config's augmentation and the dataset's task (loss, metrics). Every epoch is one compiled
program (a scan over its batches, gathered from the device copy of the data by a permutation keyed by
(seed, epoch)); the test set is evaluated after every epoch. Writes WORKDIR/centralized.json:
  {"final_test_accuracy": ..., "best_test_accuracy": ..., "epochs": [...per-epoch metrics...], "hparams": ...}

`rounds_to_centralized(records, config, model)`: for each fraction f of `config.centralized.fractions`
(default 0.7, 0.9) the first evaluated round whose test accuracy, averaged over the last
`config.centralized.window` evaluations (1 = the evaluation itself; the FedSeq release averages 5), reaches
f * the centralized accuracy; None when never reached. The centralized accuracy is
`config.centralized.accuracy` or the `final_test_accuracy` of `config.centralized.path` (a centralized run's
JSON or its workdir). The round resolution is `eval_every` (and every round of the last `eval_every_last`).

Config fields (`config.centralized`, config/default_config.py):
  epochs, lr (0 = client.lr), momentum, weight_decay (-1 = client.weight_decay), batch_size (0 =
  client.batch_size), schedule ('cosine' | 'constant'): the centralized run;
  accuracy, path, fractions, window: the federated run's reference and its rounds-to-X metric.
"""
from __future__ import annotations

import json
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
from fedjax_flat.config.centralized import RESULT_FILE, read_reference, reference_path  # noqa: F401 (re-exported)
from fedjax_flat.evaluation.evaluator import Evaluator
from fedjax_flat.data import registry as data_registry
from fedjax_flat.models import registry as model_registry
from fedjax_flat.data.transforms import pipeline as transforms
from fedjax_flat.config import validate as validate_lib

def reference_accuracy(config):
  """(accuracy, source) of the configured centralized reference, or (None, None)."""
  c = config.get('centralized')
  if c is None:
    return None, None
  if c.path:
    return read_reference(c.path), os.path.abspath(reference_path(c.path))
  if c.accuracy:
    return float(c.accuracy), 'config.centralized.accuracy'
  return None, None


def fraction_key(f: float) -> str:
  return f'rounds_to_{100 * f:g}pct_centralized'


def rounds_to(records: List[Dict], key: str, target: float, window: int = 1) -> Optional[int]:
  """The first record's round where the mean of `key` over the last `window` records (fewer at the start)
  reaches target."""
  accs = []
  for rec in records:
    if rec.get(key) is None:
      continue
    accs.append(float(rec[key]))
    if np.mean(accs[-window:]) >= target:
      return int(rec['round'])
  return None


def rounds_to_centralized(records: List[Dict], config, model: str = 'global') -> Dict:
  """summary.json fields: the centralized reference and the rounds to each fraction of it ({} if none)."""
  acc, source = reference_accuracy(config)
  if acc is None:
    return {}
  key = ('' if model == 'global' else f'{model}/') + 'test_accuracy'
  c = config.centralized
  out = {'centralized_accuracy': acc, 'centralized_source': source, 'rounds_to_centralized_window': int(c.window),
         'rounds_to_centralized_model': model}
  for f in c.fractions:
    out[fraction_key(f)] = rounds_to(records, key, f * acc, int(c.window))
  return out


# ----------------------------------------------------------------------------------------------------
# The centralized run.


def union(data):
  """All training clients' examples as one (x, y) (a FederatedDataset or a ClientDataSource)."""
  if hasattr(data, 'client_index') and hasattr(data, 'x'):
    return data.x[data.client_index], data.y[data.client_index]
  parts = [data.client_examples(k) for k in range(data.num_clients)]
  return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def hparams(config) -> Dict:
  c = config.centralized
  return {'epochs': int(c.epochs), 'lr': float(c.lr or config.client.lr), 'momentum': float(c.momentum),
          'weight_decay': float(config.client.weight_decay if c.weight_decay == -1 else c.weight_decay),
          'batch_size': int(c.batch_size or config.client.batch_size), 'schedule': c.schedule}


def make_epoch_fn(model, task, hp, steps_per_epoch, augment_fn=None):
  """epoch(params, opt_state, x, y, perm [S, B], valid [S, B], key) -> (params, opt_state, loss sum, units)."""
  total = hp['epochs'] * steps_per_epoch
  lr = (optax.cosine_decay_schedule(hp['lr'], total) if hp['schedule'] == 'cosine' else hp['lr'])
  tx = optax.chain(optax.add_decayed_weights(hp['weight_decay']),
                   optax.sgd(lr, momentum=hp['momentum'] or None))
  loss_fn = local_lib.make_loss(model, task=task)

  def epoch(params, opt_state, x, y, perm, valid, key):
    def body(carry, xs):
      params, opt_state = carry
      idx, mask, step = xs
      rng = jax.random.fold_in(key, step)
      batch = {'x': x[idx], 'y': y[idx], 'mask': mask}
      if augment_fn is not None:
        a = jax.random.fold_in(rng, 1)
        batch = augment_fn(a, batch)
      (_, (s, n)), g = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng)
      updates, opt_state = tx.update(g, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), (s, n)
    (params, opt_state), (s, n) = jax.lax.scan(body, (params, opt_state),
                                               (perm, valid, jnp.arange(perm.shape[0])))
    return params, opt_state, jnp.sum(s), jnp.sum(n)
  return tx, jax.jit(epoch, donate_argnums=(0, 1))


def train(config, workdir: Optional[str] = None, *, data=None) -> Dict:
  """Trains the centralized baseline; returns (and writes to WORKDIR/centralized.json) its result."""
  validate_lib.validate_config(config)
  data = data if data is not None else data_registry.get_dataset(config.dataset, **config.data.to_dict())
  model = model_registry.get_model(config.model, data.num_classes, data.input_shape, **config.model_kwargs.to_dict())
  task = tasks_lib.task_of(data)
  train_tf, eval_tf = transforms.make_transforms(config, data.num_classes)
  x, y = union(data)
  hp = hparams(config)
  n, b = len(y), hp['batch_size']
  steps = max(1, -(-n // b))
  tx, epoch_fn = make_epoch_fn(model, task, hp, steps, train_tf)
  key = jax.random.key(config.seed)
  params = model.init(jax.random.fold_in(key, 0), jnp.zeros((1,) + tuple(data.input_shape), jnp.float32))
  opt_state = tx.init(params)
  tx_, ty_ = data.test_examples()
  evaluator = Evaluator(model, tx_, ty_, config.eval_batch_size, preprocess=eval_tf, task=task)
  xd, yd = jax.device_put(x), jax.device_put(np.asarray(y))
  records, t0 = [], time.time()
  logging.info('centralized: %d examples, %d epochs x %d steps of %d, lr %g (%s), momentum %g, wd %g',
               n, hp['epochs'], steps, b, hp['lr'], hp['schedule'], hp['momentum'], hp['weight_decay'])
  for e in range(hp['epochs']):
    order = np.random.default_rng([config.seed, e]).permutation(n)
    pad = steps * b - n
    perm = np.concatenate([order, np.zeros(pad, np.int64)]).reshape(steps, b).astype(np.int32)
    valid = np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)]).reshape(steps, b)
    params, opt_state, s, cnt = epoch_fn(params, opt_state, xd, yd, perm, valid, jax.random.fold_in(key, 1000 + e))
    res = evaluator(params)
    rec = {'epoch': e + 1, 'train_loss': float(s) / max(float(cnt), 1.0), 'wall_s': time.time() - t0,
           **{f'test_{k}': v for k, v in res.items()}}
    if not np.isfinite(rec['train_loss']):
      raise FloatingPointError(f'centralized training diverged at epoch {e + 1} (train loss {rec["train_loss"]}); '
                               'lower config.centralized.lr')
    records.append(rec)
    logging.info('centralized epoch %d/%d: train loss %.4f, test accuracy %.4f (%.0f s)', e + 1, hp['epochs'],
                 rec['train_loss'], rec['test_accuracy'], rec['wall_s'])
  result = {'dataset': config.dataset, 'model': config.model, 'num_train_examples': int(n),
            'num_test_examples': int(len(ty_)), 'hparams': hp, 'seed': int(config.seed),
            'final_test_accuracy': records[-1]['test_accuracy'], 'final_test_loss': records[-1]['test_loss'],
            'best_test_accuracy': max(r['test_accuracy'] for r in records), 'wall_time_s': time.time() - t0,
            'epochs': records}
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    tmp = os.path.join(workdir, RESULT_FILE + '.tmp')
    with open(tmp, 'w') as f:
      json.dump(result, f, indent=2, default=float)
    os.replace(tmp, os.path.join(workdir, RESULT_FILE))
  return result
