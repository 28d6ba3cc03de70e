"""The grouping passes on the round engine: pre-training, classifier fine-tuning, Fisher accumulation.

Each pass is the engine's client program (`core/engine.run_clients`: vmap / chunked / sequential over
clients, lax.scan over padded, masked local steps) run over the whole population in blocks of clients, with
the engine's batching (`data/batching.make_round_batches`). The algorithm of a pass keeps nothing on the
server: what it returns for a client is its new "client state", here the client's estimator output.

  pretrain   every client trains the common init w_0 for e epochs (the run's client optimizer with SAM/ASAM
             off, lr `grouping.pretrain_lr` or client.lr), then returns its classifier vector (psi_clf) and
             its confidence vector on D_pub (psi_conf), both computed in the same program.
  finetune   t2v: only the probe's (re-initialized) classifier trains, with Task2Vec's optimizer (Adam, lr
             `grouping.probe_lr`, weight decay 1e-4); frozen leaves are restored after each step, so weight
             decay does not move them; returns the classifier leaves.
  fisher     t2v: one pass over the client's data, no training: sums the diagonal Fisher of the feature
             extractor (`estimators.fisher_sums`); returns the Task2Vec vector.

Batch order and keys come from (grouping seed, STREAM_ROUND, client id): the same stream definition as
training rounds, at a round index training never reaches. Results are cached in WORKDIR/grouping/ as .npz
(+ a readable .json of what determined them), keyed by a hash of everything that determines the result.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from typing import Any, Callable, Dict, Optional, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.core import engine
from fedjax_flat.data import sampling
from fedjax_flat.data import batching
from fedjax_flat.grouping import estimators
from fedjax_flat.algorithms import fedavg as fedavg_lib
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.optimizers.schedules import client_hparams
from fedjax_flat.models import pretrained

PROCEDURE = 'grouping-v1'         # changes when a pass computes something else: old cache files are ignored
STREAM_ROUND = 1_000_000_007      # the passes' batch / key stream (a round index no training reaches)
BLOCK = 32                        # clients per compiled call (rounded to the engine's chunk)


def _unused(*a, **k):
  raise RuntimeError('a grouping pass runs clients only: it has no server side')


def _pass_algorithm(name, client_init, client_step, client_final) -> FederatedAlgorithm:
  return FederatedAlgorithm(name, _unused, _unused, client_init, client_step, client_final, _unused, _unused)


def plain_client_cfg(client_cfg, lr: float = 0.0):
  """The client optimizer of the passes: the run's, with SAM/ASAM off and lr `lr` (0 = client.lr)."""
  import ml_collections
  cfg = ml_collections.ConfigDict(client_cfg.to_dict())
  cfg.optimizer = 'sgd'
  if lr:
    cfg.lr = float(lr)
  return cfg


# Task2Vec's classifier fitting (`_fit_classifier`: Adam, lr 4e-4, weight decay 1e-4): a gentle fit keeps the
# head from becoming certain on a one-class client, where the Fisher would vanish (benchmarks/studies/README.fedseq.md).
PROBE_WEIGHT_DECAY = 1e-4


def probe_client_cfg(client_cfg, lr: float):
  """The probe head's optimizer: Task2Vec's Adam(lr) with weight decay 1e-4, batch size of the run."""
  cfg = plain_client_cfg(client_cfg, lr)
  cfg.base_optimizer, cfg.momentum, cfg.weight_decay, cfg.grad_clip = 'adam', 0.0, PROBE_WEIGHT_DECAY, 0.0
  cfg.adam_b1, cfg.adam_b2, cfg.adam_eps = 0.9, 0.999, 1e-8
  return cfg


def hparams(client_cfg):
  """The broadcast client hparams of one-off local training: the client lr, no sharpness radius."""
  return client_hparams(client_cfg.lr, 0.0)


def training_algorithm(model, client_cfg, summarize: Callable, *, trainable: Optional[Sequence[str]] = None,
                       task=None):
  """FedAvg's local training from bcast['params'] on the task's loss (tasks/base.py; None = classification);
  client_final returns summarize(params) as the client's state. trainable: '/'-joined leaf paths that train
  (None = all); the others get no gradient and are restored after every step."""
  import optax
  loss = local_lib.make_loss(model, task=task)
  if trainable is not None:
    full_loss = loss

    def loss(p, batch, rng=None):     # gradients flow into the trainable leaves only
      return full_loss(estimators.merge(jax.lax.stop_gradient(p), estimators.subtree(p, trainable)), batch, rng)
  base = fedavg_lib.fedavg(model, loss, *client_parts(client_cfg), optax.identity())

  def client_step(bcast, local, batch, rng):
    new, m = base.client_step(bcast, local, batch, rng)
    if trainable is not None:
      new = new._replace(params=estimators.merge(local.params, estimators.subtree(new.params, trainable)))
    return new, m

  def client_final(bcast, local, client_state):
    del bcast, client_state
    return {'weighted': {}, 'uniform': {}}, summarize(local.params)
  return base.replace(name='grouping_pretrain', client_step=client_step, client_final=client_final)


def fisher_algorithm(apply_fn, feature_paths, *, mode: str):
  """No training: sums the Fisher terms of every batch; the client state in is its fine-tuned classifier
  ({path: leaf}); the state out is its Task2Vec vector."""
  def client_init(bcast, client_state, rng):
    del rng
    params = estimators.merge(bcast['params'], client_state)
    zeros = {p: jnp.zeros(v.shape, jnp.float32) for p, v in estimators.subtree(params, feature_paths).items()}
    return {'params': params, 'sums': zeros, 'count': jnp.zeros((), jnp.float32)}

  def client_step(bcast, local, batch, rng):
    del bcast
    sums, count = estimators.fisher_sums(apply_fn, local['params'], batch, rng, feature_paths=feature_paths,
                                         mode=mode)
    new = {**local, 'sums': jax.tree_util.tree_map(jnp.add, local['sums'], sums), 'count': local['count'] + count}
    return new, {'loss_sum': jnp.zeros((), jnp.float32), 'count': count}

  def client_final(bcast, local, client_state):
    del bcast, client_state
    mean = {p: s / jnp.maximum(local['count'], 1.0) for p, s in local['sums'].items()}
    return {'weighted': {}, 'uniform': {}}, estimators.task2vec_vector(mean)
  return _pass_algorithm('grouping_fisher', client_init, client_step, client_final)


def _block_fn(alg, bcast, batches, states, rngs, weights, valid, *, chunk, unroll, augment_fn):
  _, new_states, _ = engine.run_clients(alg, bcast, batches, states, rngs, weights, valid, chunk=chunk,
                                        unroll=unroll, augment_fn=augment_fn)
  return new_states


def run_pass(alg: FederatedAlgorithm, bcast, data, client_states=None, *, batch_size: int, epochs: int,
             seed: int, strategy: str = 'auto', clients_per_chunk: int = 0, unroll=1, augment_fn=None,
             label: str = 'pass', block: int = BLOCK, progress_every_s: float = 10.0):
  """Runs `alg` on every client of `data` (blocks of clients, one compiled program); returns the stacked
  new client states, leaves [K, ...] as numpy. client_states: leaves [K, ...] given to each client."""
  k = data.num_clients
  sizes = np.asarray(data.client_sizes())
  strategy = engine.resolve_strategy(strategy)
  block = engine.padded_cohort(strategy, min(k, block), clients_per_chunk)
  chunk = engine.chunk_size(strategy, block, clients_per_chunk)
  steps = batching.padded_num_steps(sizes, batch_size, epochs=epochs)
  plan = batching.batch_plan(sizes, batch_size=batch_size, num_steps=steps, epochs=epochs, shuffle=True)
  fn = jax.jit(functools.partial(_block_fn, alg, chunk=chunk, unroll=unroll, augment_fn=augment_fn))
  key = jax.random.key(int(seed))
  outs, t0, last = [], time.time(), time.time()
  for start in range(0, k, block):
    ids = np.arange(start, min(start + block, k))
    rb = batching.make_round_batches(data, ids, round_idx=STREAM_ROUND, seed=seed, batch_size=batch_size,
                                     num_steps=steps, epochs=epochs, pad_clients_to=block, plan=plan)
    rows = np.minimum(np.arange(start, start + block), k - 1)        # padding rows repeat the last client
    states = (None if client_states is None
              else jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a)[rows]), client_states))
    rngs = sampling.client_keys_jit(key, jnp.asarray(STREAM_ROUND, jnp.int32), jnp.asarray(rb.client_ids))
    new = fn(bcast, rb.as_dict(), states, rngs, jnp.asarray(rb.num_examples), jnp.asarray(rb.client_ids >= 0))
    outs.append(jax.tree_util.tree_map(lambda a: np.asarray(a)[:len(ids)], jax.device_get(new)))
    now = time.time()
    if now - last >= progress_every_s or ids[-1] == k - 1:
      done = int(ids[-1]) + 1
      logging.info('grouping %s: %d/%d clients, %.1f s (ETA %.0f s)', label, done, k, now - t0,
                   (now - t0) / done * (k - done))
      last = now
  return jax.tree_util.tree_map(lambda *a: np.concatenate(a, axis=0), *outs)


# Cache.
def fingerprint(*arrays) -> str:
  h = hashlib.sha256()
  for a in arrays:
    a = np.ascontiguousarray(np.asarray(a))
    h.update(f'{a.dtype.str}{a.shape}'.encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]


def params_fingerprint(params) -> str:
  flat = pretrained.flatten(jax.device_get(params))
  return fingerprint(np.frombuffer(json.dumps(sorted(flat)).encode(), np.uint8),
                     *[np.asarray(flat[k]) for k in sorted(flat)])


def data_fingerprint(data) -> str:
  """In-memory data: every array; out-of-memory sources: client sizes, names and test labels."""
  if hasattr(data, 'x') and hasattr(data, 'client_index'):
    store = getattr(data, 'store', None)           # items the examples index (data/federated.py)
    return fingerprint(data.x, data.y, data.client_index, data.client_offsets, data.test_y,
                       *(() if store is None else (store,)))
  names = json.dumps(list(getattr(data, 'client_names', None) or [])).encode()
  return fingerprint(np.asarray(data.client_sizes()), np.frombuffer(names, np.uint8),
                     np.asarray(data.test_examples()[1]))


def cache_key(spec: Dict[str, Any]) -> str:
  return hashlib.sha256(json.dumps({'procedure': PROCEDURE, **spec}, sort_keys=True,
                                   default=str).encode()).hexdigest()[:20]


def cache_path(workdir: str, kind: str, key: str) -> str:
  return os.path.join(workdir, 'grouping', f'{kind}-{key}.npz')


def load_cached(path: str, names: Sequence[str], num_clients: int) -> Optional[Dict[str, np.ndarray]]:
  """The arrays `names` of a cache file, each [num_clients, d] and finite; None (with a warning when the
  file exists) if anything is off: such a file is recomputed, never trusted."""
  if not os.path.exists(path):
    return None
  try:
    with np.load(path, allow_pickle=False) as z:
      out = {n: np.asarray(z[n]) for n in names}
    for n, a in out.items():
      if a.ndim != 2 or a.shape[0] != num_clients or not np.all(np.isfinite(a)):
        raise ValueError(f'{n}: shape {a.shape}, finite={bool(np.all(np.isfinite(a)))}')
    return out
  except Exception as e:  # noqa: BLE001 -- a truncated / foreign file: recompute
    logging.warning('grouping cache %s is unreadable or does not fit (%s: %s); recomputing', path,
                    type(e).__name__, str(e)[:200])
    return None


def save_cached(path: str, arrays: Dict[str, np.ndarray], spec: Dict[str, Any]) -> None:
  """Atomic write of the .npz and a readable .json of the spec beside it (process 0 only)."""
  if jax.process_index() != 0:
    return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'wb') as f:
    np.savez(f, **arrays)
  os.replace(tmp, path)
  with open(path[:-4] + '.json', 'w') as f:
    json.dump({'procedure': PROCEDURE, **spec}, f, indent=1, sort_keys=True, default=str)
