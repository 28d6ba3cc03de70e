"""Personalized and out-of-distribution evaluation, for every algorithm (FedSoup digest A4, part C).

Personalized model of client k: `algorithms/personalization.personal_params` (the global model unless the
algorithm registers a personalizer: FedSoup, local normalization).

Protocols (`evaluate_protocols`), each model evaluated on
  local             its own client's test split; 'acc_client_mean' (paper: average over clients) and
                    'acc_weighted' (pooled over all local test examples; the reference code's number)
  global            the held-out global test set balanced across training sources (paper's "global")
  ood_other_clients the union of the OTHER clients' local test splits (the reference code's "global")
  unseen            leave-one-client-out: the left-out client's data (only when the dataset has one)
  server            the server (global) model on the same sets, for reference
Metrics: accuracy and AUC (`auc`): binary AUC for 2 classes, micro-averaged one-vs-rest AUC otherwise, rank
based (Mann-Whitney, ties averaged), on softmax scores (or raw logits, as the reference code).

Fine-tuning (`finetune_epochs` K): after training, every client runs K extra local epochs of the client
optimizer (plain local training; the reference code keeps FedSoup's patching active during them) starting
from its personalized model, with all protocols evaluated after each epoch.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.data import batching
from fedjax_flat.evaluation.metrics import accuracy, auc
from fedjax_flat.optimizers.client import make_client_tx
from fedjax_flat.optimizers.schedules import client_hparams
from fedjax_flat.schema import Choice, Field, Flag, Int, Num, Section

tmap = jax.tree_util.tree_map


# ---------------------------------------------------------------------------------------------------------
# Protocols.

def make_predict_fn(model, preprocess=None, batch_size: int = 256):
  """predict(params, x) -> logits (numpy), one compiled program per run (fixed batch size)."""

  @jax.jit
  def one(params, x):
    x = x if preprocess is None else preprocess(x)
    return model.apply(params, x, train=False)

  def predict(params, x):
    x = np.asarray(x)
    n = len(x)
    if n == 0:
      return np.zeros((0, model.num_classes), np.float32)
    out = []
    for i in range(0, n, batch_size):
      chunk = x[i:i + batch_size]
      m = len(chunk)
      if m < batch_size:
        chunk = np.concatenate([chunk, np.zeros((batch_size - m,) + chunk.shape[1:], chunk.dtype)])
      out.append(np.asarray(one(params, chunk))[:m])
    return np.concatenate(out)
  return predict


@dataclasses.dataclass
class EvalSets:
  local: List[Tuple[np.ndarray, np.ndarray]]             # per client (x, y) test split
  global_: Optional[Tuple[np.ndarray, np.ndarray]]       # held-out global test set
  unseen: Optional[Tuple[np.ndarray, np.ndarray]] = None  # left-out client's data (LOO)


def eval_sets_from_data(data) -> EvalSets:
  local = []
  if getattr(data, 'client_test_offsets', None) is not None:
    local = [data.client_test_examples(k) for k in range(data.num_clients)]
  unseen = None
  if getattr(data, 'unseen_x', None) is not None:
    unseen = data.unseen_examples()
  return EvalSets(local=local, global_=data.test_examples(), unseen=unseen)


def _mean(v):
  v = [x for x in v if not (isinstance(x, float) and math.isnan(x))]
  return float(np.mean(v)) if v else float('nan')


def evaluate_protocols(predict, client_params: Sequence[Any], server_params, sets: EvalSets, *,
                       auc_scores: str = 'softmax', per_client: bool = True) -> dict:
  """All protocols for the personalized models `client_params[k]` (and the server model)."""
  k_clients = len(client_params)
  res: Dict[str, Any] = {'num_clients': k_clients}
  local_logits = []
  if sets.local:
    if len(sets.local) != k_clients:
      raise ValueError(f'{len(sets.local)} local test splits for {k_clients} client models')
    rows, all_l, all_y = [], [], []
    for k, (p, (x, y)) in enumerate(zip(client_params, sets.local)):
      lg = predict(p, x)
      local_logits.append(lg)
      rows.append({'client': k, 'n': int(len(y)), 'acc': accuracy(lg, y), 'auc': auc(lg, y, auc_scores)})
      all_l.append(lg)
      all_y.append(y)
    cat_l, cat_y = np.concatenate(all_l), np.concatenate(all_y)
    res['local'] = {'acc_client_mean': _mean([r['acc'] for r in rows]), 'acc_weighted': accuracy(cat_l, cat_y),
                    'auc_client_mean': _mean([r['auc'] for r in rows]), 'auc_pooled': auc(cat_l, cat_y, auc_scores)}
    if per_client:
      res['local']['per_client'] = rows
    # Code-style OOD: client k's model on the other clients' local test splits.
    if k_clients > 1:
      rows = []
      for k, p in enumerate(client_params):
        x = np.concatenate([sets.local[j][0] for j in range(k_clients) if j != k])
        y = np.concatenate([sets.local[j][1] for j in range(k_clients) if j != k])
        lg = predict(p, x)
        rows.append({'client': k, 'n': int(len(y)), 'acc': accuracy(lg, y), 'auc': auc(lg, y, auc_scores)})
      res['ood_other_clients'] = {'acc_client_mean': _mean([r['acc'] for r in rows]),
                                  'auc_client_mean': _mean([r['auc'] for r in rows])}
      if per_client:
        res['ood_other_clients']['per_client'] = rows
  for key, st in (('global', sets.global_), ('unseen', sets.unseen)):
    if st is None:
      continue
    x, y = st
    rows = []
    for k, p in enumerate(client_params):
      lg = predict(p, x)
      rows.append({'client': k, 'n': int(len(y)), 'acc': accuracy(lg, y), 'auc': auc(lg, y, auc_scores)})
    res[key] = {'acc_client_mean': _mean([r['acc'] for r in rows]),
                'auc_client_mean': _mean([r['auc'] for r in rows])}
    if per_client:
      res[key]['per_client'] = rows
  if server_params is not None:
    srv = {}
    for key, st in (('global', sets.global_), ('unseen', sets.unseen)):
      if st is not None:
        lg = predict(server_params, st[0])
        srv[f'{key}_acc'] = accuracy(lg, st[1])
        srv[f'{key}_auc'] = auc(lg, st[1], auc_scores)
    if sets.local:
      ls = [predict(server_params, x) for x, _ in sets.local]
      ys = [y for _, y in sets.local]
      srv['local_acc_client_mean'] = _mean([accuracy(l, y) for l, y in zip(ls, ys)])
      srv['local_acc_weighted'] = accuracy(np.concatenate(ls), np.concatenate(ys))
      srv['local_auc_pooled'] = auc(np.concatenate(ls), np.concatenate(ys), auc_scores)
    res['server'] = srv
  return res


def headline(res: dict) -> dict:
  """The flat numbers of a protocol result (for tables and the fine-tuning curve)."""
  out = {}
  for key in ('local', 'global', 'ood_other_clients', 'unseen'):
    if key in res:
      for m, v in res[key].items():
        if m != 'per_client':
          out[f'{key}_{m}'] = v
  return out


# ---------------------------------------------------------------------------------------------------------
# Fine-tuning after training.

def finetune_steps(params, batches, rng, *, tx, loss_fn, augment_fn=None):
  """params after one client-optimizer step per batch of `batches` [S, B, ...] from `params` (fresh optimizer
  state; step s draws from fold_in(rng, s); an all-padding step leaves the params unchanged). Traceable."""
  local = local_lib.LocalState(params, tx.init(params), params)

  def body(local, xs):
    batch, step = xs
    r = jax.random.fold_in(rng, step)
    if augment_fn is not None:
      batch = augment_fn(jax.random.fold_in(r, 1), batch)
    new, _ = local_lib.local_step(local, batch, r, loss_fn=loss_fn, tx=tx)
    valid = jnp.sum(batch['mask']) > 0     # a client without training examples keeps the model
    return tmap(lambda a, b: jnp.where(valid, a, b), new, local), None

  local, _ = jax.lax.scan(body, local, (batches, jnp.arange(batches['mask'].shape[0])))
  return local.params


def make_finetune_epoch(model, client_cfg, *, lr: float, man_zeta: float = 0.0, augment_fn=None):
  """epoch(params, batches [S, B, ...], rng) -> params: one local epoch of the client optimizer (jitted;
  fresh optimizer state; all-padding steps leave params unchanged)."""
  loss_fn = local_lib.make_loss(model, man_zeta=man_zeta)
  hparams = client_hparams(lr, client_cfg.rho)

  @jax.jit
  def epoch(params, batches, rng):
    return finetune_steps(params, batches, rng, tx=make_client_tx(client_cfg, hparams), loss_fn=loss_fn,
                          augment_fn=augment_fn)
  return epoch


def finetune_batches(x, y, batch_size: int, num_steps: int, rng: np.random.Generator) -> dict:
  pos, mask = batching.client_step_indices(len(y), batch_size, num_steps, epochs=1, local_steps=0, rng=rng)
  return {'x': x[pos], 'y': y[pos].astype(np.int32), 'mask': mask}


def finetune_and_evaluate(predict, model, client_params, server_params, sets: EvalSets, train_sets, *,
                          epochs: int, client_cfg, lr: float, batch_size: int, seed: int = 0,
                          man_zeta: float = 0.0, augment_fn=None, auc_scores: str = 'softmax'):
  """K epochs of local fine-tuning per client; returns (curve [{'epoch', headline...}], final params)."""
  epoch_fn = make_finetune_epoch(model, client_cfg, lr=lr, man_zeta=man_zeta, augment_fn=augment_fn)
  steps = max(1, max(int(math.ceil(len(y) / batch_size)) for _, y in train_sets))
  params = list(client_params)
  curve = []
  for e in range(1, epochs + 1):
    for k, (x, y) in enumerate(train_sets):
      if len(y) == 0:
        continue
      b = finetune_batches(x, y, batch_size, steps, np.random.default_rng([int(seed), e, k, 0xF17E]))
      params[k] = epoch_fn(params[k], b, jax.random.fold_in(jax.random.key(seed), e * 100003 + k))
    res = evaluate_protocols(predict, params, None, sets, auc_scores=auc_scores, per_client=False)
    curve.append({'epoch': e, **headline(res)})
  return curve, params


# config.personalized: declared with the code that reads it (config/schema.py collects it)
SECTION = Section('personalized', (
    Field('enabled', Flag(False), "evaluate personalized models at the end -> summary.json 'personalized'"),
    Field('finetune_epochs', Int(0, lo=0), 'K extra local epochs per client, protocols after each'),
    Field('finetune_lr', Num(0.0, lo=0), '0 = client.lr'),
    Field('finetune_batch_size', Int(0, lo=0), '0 = client.batch_size'),
    Field('auc_scores', Choice('softmax', ('softmax', 'logits'), sort=True),
          "'softmax' | 'logits' (the FedSoup reference code)"),
    Field('per_client', Flag(True), 'per-client rows in the summary'),
), doc='end-of-training personalized / OOD evaluation (evaluation/personalized.py)')
