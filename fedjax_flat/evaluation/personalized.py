"""Personalized and out-of-distribution evaluation, for every algorithm (FedSoup digest A4, part C).

Personalized model of client k (`personal_params`): what the algorithm's registered *personalizer* makes of
(server state, client k's persistent state). Default: the global model (FedAvg, FedProx, ...). FedSoup:
the client's patched model (algorithms/fedsoup.py). Local normalization (`with_local_norm`, FedBN-style):
the inner algorithm's personalized model with the client's own normalization parameters.

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

Round validation data (FedSoup's model selection needs each client's validation split after local training,
inside the round program). Without an engine change, the validation examples travel in the round batches:
an algorithm that declares the hyperparameter `val_source` ('val' | 'local_test') gets every client's
validation (or local test) examples appended as S_val extra steps AFTER its padded training steps, with a
per-example flag batch['split'] (0 = train, 1 = validation) on every step (`append_validation_steps`; the
Trainer calls it in prepare_round). S_val = ceil(max_k |val_k| / B) is fixed per run: no recompilation.
Caveat: the train augmentation (config.augment) is applied by the engine to those steps too.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.data import batching

tmap = jax.tree_util.tree_map

# ---------------------------------------------------------------------------------------------------------
# Personalizers: (algorithm, server_state, client_state or None) -> params of the client's personal model.

_PERSONALIZERS: Dict[str, Callable] = {}


def register_personalizer(name: str, fn: Callable) -> None:
  _PERSONALIZERS[name] = fn


def global_params(algorithm, server_state):
  return algorithm.eval_models(server_state)['global'][0]


def personal_params(algorithm, server_state, client_state):
  """Client's personalized model. Lookup by algorithm name, else by its base name before the first '+'
  (server wrappers such as '+swa' leave the client state alone), else the global model."""
  fn = _PERSONALIZERS.get(personalizer_name(algorithm.name))
  if fn is None:
    return global_params(algorithm, server_state)
  return fn(algorithm, server_state, client_state)


def personalizer_name(name: str) -> Optional[str]:
  """The longest '+'-prefix of `name` with a registered personalizer ('fedsoup+localnorm+swa' ->
  'fedsoup+localnorm'), or None."""
  parts = name.split('+')
  for i in range(len(parts), 0, -1):
    if '+'.join(parts[:i]) in _PERSONALIZERS:
      return '+'.join(parts[:i])
  return None


# ---------------------------------------------------------------------------------------------------------
# FedBN-style local normalization: normalization params (GroupNorm / LayerNorm / BatchNorm 'scale', 'bias')
# stay on the client and are never aggregated.

def _key_name(k) -> str:
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def is_batch_stats_path(path) -> bool:
  """BatchNorm running statistics: the 'batch_stats' half of a BatchNorm model's params (models/base.py)."""
  return bool(path) and _key_name(path[0]) == 'batch_stats'


def is_norm_path(path) -> bool:
  """Normalization params (scale, bias) and BatchNorm running statistics: FedBN keeps all of them local."""
  if is_batch_stats_path(path):
    return True
  names = [_key_name(k) for k in path]
  if not names or names[-1] not in ('scale', 'bias'):
    return False
  return any(('norm' in n.lower()) or n.lower().startswith(('gn', 'bn', 'ln')) for n in names[:-1])


def norm_flags(params, select=is_norm_path) -> List[bool]:
  """Per-leaf flags (in tree_leaves order): True for the leaves `select(path)` picks (normalization params)."""
  return [select(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def norm_leaves(params, select=is_norm_path) -> list:
  flags = norm_flags(params, select)
  return [x for x, f in zip(jax.tree_util.tree_leaves(params), flags) if f]


def with_norm_leaves(params, leaves, select=is_norm_path):
  flags = norm_flags(params, select)
  flat, treedef = jax.tree_util.tree_flatten(params)
  it = iter(leaves)
  return jax.tree_util.tree_unflatten(treedef, [next(it) if f else x for x, f in zip(flat, flags)])


def zero_norm_leaves(params, select=is_norm_path):
  return with_norm_leaves(params, [jnp.zeros_like(x) for x in norm_leaves(params, select)], select)


def with_local_norm(alg, name: Optional[str] = None, select=is_norm_path):
  """Wraps an algorithm so the normalization params are local (FedBN, Li et al. 2021).

  `select(path)` says which leaves stay local: `is_norm_path` (FedBN: norm scale/bias, and BatchNorm running
  statistics when the model has them) or `is_batch_stats_path` (SiloBN, Andreux et al. 2020: statistics
  local, affine params shared; algorithms/silobn.py).

  Client state: {'norm': the client's norm leaves, 'seen': 0/1, 'inner': the inner algorithm's state}.
  client_init starts local training from the global model with the client's own norm params (the global
  ones on its first visit); the norm leaves of every params-shaped upload ('weighted' outputs with the
  params' tree structure, e.g. FedAvg's delta) are zeroed, so the server never aggregates them (they stay at
  their initial values on the server); the client keeps the norm leaves of the model it uploads
  (init - delta when the upload is a 'delta', else its trained params).
  The inner client_step / client_final get the original broadcast and must take the start point from
  local.init_params (FedAvg, FedProx, FedSoup do).
  A model without normalization layers makes this a no-op (no leaves).
  """
  inner_has_state = alg.client_state_init is not None
  name = name or f'{alg.name}+localnorm'

  def client_state_init(params):
    s = {'norm': [jnp.zeros_like(x) for x in norm_leaves(params, select)], 'seen': jnp.zeros((), jnp.float32)}
    if inner_has_state:
      s['inner'] = alg.client_state_init(params)
    return s

  def client_init(bcast, cs, rng, **kw):
    p = bcast['params']
    seen = cs['seen'] > 0
    leaves = [jnp.where(seen, a, b) for a, b in zip(cs['norm'], norm_leaves(p, select))]
    b2 = {**bcast, 'params': with_norm_leaves(p, leaves, select)}
    return alg.client_init(b2, cs.get('inner'), rng, **kw)

  def client_step(bcast, local, batch, rng, **kw):
    return alg.client_step(bcast, local, batch, rng, **kw)

  def client_final(bcast, local, cs, **kw):
    out, inner_cs = alg.client_final(bcast, local, cs.get('inner'), **kw)
    ptree = jax.tree_util.tree_structure(local.params)
    uploaded = local.params
    if isinstance(out.get('weighted'), dict) and 'delta' in out['weighted']:
      uploaded = tmap(lambda a, d: a - d, local.init_params, out['weighted']['delta'])

    def strip(t):
      return zero_norm_leaves(t, select) if jax.tree_util.tree_structure(t) == ptree else t
    weighted = out['weighted']
    if isinstance(weighted, dict):
      weighted = {k: strip(v) for k, v in weighted.items()}
    else:
      weighted = strip(weighted)
    new_cs = {'norm': norm_leaves(uploaded, select), 'seen': jnp.ones((), jnp.float32)}
    if inner_has_state:
      new_cs['inner'] = inner_cs
    return {**out, 'weighted': weighted}, new_cs

  inner_name = alg.name

  def personalizer(algorithm, server_state, cs):
    inner_cs = None if cs is None else cs.get('inner')
    base = personal_params(dataclasses.replace(algorithm, name=inner_name), server_state, inner_cs)
    if cs is None or not float(np.asarray(cs['seen'])) > 0:
      return base
    return with_norm_leaves(base, [jnp.asarray(x) for x in cs['norm']], select)

  register_personalizer(name, personalizer)
  return alg.replace(name=name, client_state_init=client_state_init, client_init=client_init,
                     client_step=client_step, client_final=client_final)


# ---------------------------------------------------------------------------------------------------------
# Validation steps in the round batches.

VAL_SOURCES = ('val', 'local_test')


def round_validation_source(config) -> Optional[str]:
  """'val' | 'local_test' if the configured algorithm declares the hyperparameter `val_source`, else None."""
  from fedjax_flat.algorithms import registry as alg_registry
  defaults = alg_registry.default_hparams(config.algorithm)
  if 'val_source' not in defaults:
    return None
  src = config.algo.get('val_source', defaults['val_source'])
  if src not in VAL_SOURCES:
    from fedjax_flat.errors import ConfigError
    raise ConfigError('algo.val_source', src, f'allowed values: {list(VAL_SOURCES)}')
  return src


def client_validation_examples(data, k: int, source: str):
  if source == 'val':
    return data.client_val_examples(k)
  return data.client_test_examples(k)


def check_validation_data(data, source: str) -> None:
  from fedjax_flat.errors import ConfigError
  if source == 'val' and not hasattr(data, 'client_val_examples'):
    raise ConfigError('algo.val_source', source, f"dataset {getattr(data, 'name', '?')!r} has no per-client "
                      "validation splits; use a dataset with them (digits_feature_shift) or "
                      "algo.val_source='local_test'")
  if source == 'local_test' and getattr(data, 'client_test_offsets', None) is None:
    raise ConfigError('algo.val_source', source, f"dataset {getattr(data, 'name', '?')!r} has no per-client "
                      'test splits')


def validation_num_steps(data, source: str, batch_size: int) -> int:
  check_validation_data(data, source)
  sizes = [len(client_validation_examples(data, k, source)[1]) for k in range(data.num_clients)]
  return max(1, int(math.ceil(max(sizes) / batch_size)))


@dataclasses.dataclass
class ValRoundBatches(batching.RoundBatches):
  split: np.ndarray = None   # [C, S + S_val, B] float32: 1 = validation example

  def as_dict(self):
    return {**super().as_dict(), 'split': self.split}


def append_validation_steps(rb, data, source: str, num_val_steps: int) -> ValRoundBatches:
  """Appends each client's validation examples (fixed order, masked padding) as the last steps."""
  c, s, b = rb.mask.shape
  vx = np.zeros((c, num_val_steps, b) + rb.x.shape[3:], rb.x.dtype)
  vy = np.zeros((c, num_val_steps, b), rb.y.dtype)
  vm = np.zeros((c, num_val_steps, b), np.float32)
  for i, k in enumerate(rb.client_ids):
    if k < 0:
      continue
    x, y = client_validation_examples(data, int(k), source)
    n = len(y)
    if n > num_val_steps * b:
      raise ValueError(f'client {k} has {n} validation examples > {num_val_steps} steps x {b}')
    vx[i].reshape((-1,) + vx.shape[3:])[:n] = x
    vy[i].reshape(-1)[:n] = y
    vm[i].reshape(-1)[:n] = 1.0
  split = np.concatenate([np.zeros_like(rb.mask), np.ones_like(vm)], axis=1)
  client = None if rb.client is None else batching.client_steps(rb.client_ids, split.shape[1])
  return ValRoundBatches(np.concatenate([rb.x, vx], 1), np.concatenate([rb.y, vy], 1),
                         np.concatenate([rb.mask, vm], 1), rb.num_examples, rb.client_ids, client=client,
                         split=split)


# ---------------------------------------------------------------------------------------------------------
# Metrics.

def _average_ranks(a: np.ndarray) -> np.ndarray:
  """1-based ranks with ties averaged (like scipy.stats.rankdata)."""
  _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
  upper = np.cumsum(counts)
  return (upper - (counts - 1) / 2.0)[inv.reshape(-1)]


def binary_auc(scores, labels) -> float:
  """ROC AUC = P(score_pos > score_neg) + P(tie)/2 (Mann-Whitney U); nan if a class is absent."""
  scores = np.asarray(scores, np.float64).reshape(-1)
  labels = np.asarray(labels).reshape(-1).astype(bool)
  n_pos = int(labels.sum())
  n_neg = len(labels) - n_pos
  if n_pos == 0 or n_neg == 0:
    return float('nan')
  ranks = _average_ranks(scores)
  return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _softmax(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def auc(logits, labels, scores: str = 'softmax') -> float:
  """Binary AUC (2 classes: score of class 1) or micro-averaged one-vs-rest AUC (>2 classes).

  scores='softmax' (probabilities) or 'logits' (the reference code's raw outputs). For 2 classes the two
  give the same AUC (p1 is monotone in logit1 - logit0)."""
  logits = np.asarray(logits)
  labels = np.asarray(labels).astype(np.int64)
  if len(labels) == 0:
    return float('nan')
  c = logits.shape[-1]
  s = _softmax(logits) if scores == 'softmax' else np.asarray(logits, np.float64)
  if c == 2:
    return binary_auc(s[:, 1] - (0.0 if scores == 'softmax' else s[:, 0]), labels == 1)
  onehot = labels[:, None] == np.arange(c)[None, :]
  return binary_auc(s.reshape(-1), onehot.reshape(-1))


def accuracy(logits, labels) -> float:
  labels = np.asarray(labels)
  if len(labels) == 0:
    return float('nan')
  return float(np.mean(np.argmax(logits, -1) == labels))


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

def make_finetune_epoch(model, client_cfg, *, lr: float, man_zeta: float = 0.0, augment_fn=None):
  """epoch(params, batches [S, B, ...], rng) -> params: one local epoch of the client optimizer (jitted;
  fresh optimizer state; all-padding steps leave params unchanged)."""
  from fedjax_flat.algorithms import local as local_lib
  from fedjax_flat.optimizers.client import make_client_tx
  loss_fn = local_lib.make_loss(model, man_zeta=man_zeta)
  hparams = {'lr': jnp.asarray(lr, jnp.float32), 'rho': jnp.asarray(client_cfg.rho, jnp.float32)}

  @jax.jit
  def epoch(params, batches, rng):
    tx = make_client_tx(client_cfg, hparams)
    local = local_lib.LocalState(params, tx.init(params), params)

    def body(local, xs):
      batch, step = xs
      r = jax.random.fold_in(rng, step)
      if augment_fn is not None:
        batch = {**batch, 'x': augment_fn(jax.random.fold_in(r, 1), batch['x'])}
      new, _ = local_lib.local_step(local, batch, r, loss_fn=loss_fn, tx=tx)
      valid = jnp.sum(batch['mask']) > 0
      return tmap(lambda a, b: jnp.where(valid, a, b), new, local), None

    local, _ = jax.lax.scan(body, local, (batches, jnp.arange(batches['mask'].shape[0])))
    return local.params
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


# ---------------------------------------------------------------------------------------------------------
# The Trainer's end-of-training hook.

def client_states_of(store) -> dict:
  """{client id: that client's state (numpy pytree)} for the clients seen (host or device store)."""
  if store is None:
    return {}
  d = store.state_dict()
  if d['states'] is None:
    return {}
  return {int(k): tmap(lambda a, i=i: np.asarray(a[i]), d['states']) for i, k in enumerate(d['ids'])}


def evaluate_trainer(trainer) -> dict:
  """config.personalized.enabled: every protocol on the clients' personalized models (+ fine-tuning)."""
  c = trainer.config
  pc = c.personalized
  data = trainer.data
  store_states = client_states_of(trainer.store)
  alg = trainer.algorithm
  client_params = [personal_params(alg, trainer.server_state, store_states.get(k))
                   for k in range(data.num_clients)]
  client_params = [tmap(jnp.asarray, p) for p in client_params]
  server_params = global_params(alg, trainer.server_state)
  predict = make_predict_fn(trainer.model, trainer.eval_transform, c.eval_batch_size)
  sets = eval_sets_from_data(data)
  res = evaluate_protocols(predict, client_params, server_params, sets, auc_scores=pc.auc_scores,
                           per_client=bool(pc.per_client))
  res['personal_model'] = personalizer_name(alg.name) or 'global'
  res['clients_with_state'] = len(store_states)
  if pc.finetune_epochs > 0:
    train_sets = [data.client_examples(k) for k in range(data.num_clients)]
    curve, _ = finetune_and_evaluate(
        predict, trainer.model, client_params, server_params, sets, train_sets, epochs=int(pc.finetune_epochs),
        client_cfg=c.client, lr=float(pc.finetune_lr or c.client.lr),
        batch_size=int(pc.finetune_batch_size or c.client.batch_size), seed=c.seed,
        man_zeta=float(c.man.zeta), augment_fn=trainer.train_transform, auc_scores=pc.auc_scores)
    res['finetune'] = curve
  return res
