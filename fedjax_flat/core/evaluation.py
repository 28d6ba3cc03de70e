"""Jitted, batched evaluation: exact metrics over every valid unit of padded, masked batches.

What the metrics are is the task's (fedjax_flat/tasks.py): each batch gives additive sums (loss, correct,
count, or a confusion matrix), summed over the batches, then turned into metrics once.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat import tasks as tasks_lib
from fedjax_flat.data.batching import make_eval_batches


def make_eval_fn(model, preprocess=None, jit: bool = True, task=None):
  """eval(params, batches [nb, B, ...]) -> the task's metrics: {'loss', 'accuracy', 'count', ...}.

  Jitted unless jit=False. Classification: example-weighted loss and accuracy over the valid examples.
  """
  task = tasks_lib.get_task(task)

  def one(params, batch):
    x = batch['x'] if preprocess is None else preprocess(batch['x'])
    logits = model.apply(params, x, train=False)
    return task.eval_sums(logits, batch['y'], batch['mask'])

  def evaluate(params, batches):
    sums = jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), jax.lax.map(lambda b: one(params, b), batches))
    return task.eval_metrics(sums)
  return jax.jit(evaluate) if jit else evaluate


class Evaluator:
  """Holds the fixed test batches on device; evaluates any params with one compiled program."""

  def __init__(self, model, x, y, batch_size: int = 256, preprocess=None, task=None):
    self.batches = jax.device_put(make_eval_batches(np.asarray(x), np.asarray(y), batch_size))
    self.fn = make_eval_fn(model, preprocess, task=task)

  def __call__(self, params):
    """Scalar metrics as floats; array-valued ones (per-class IoU, ...) as lists."""
    out = {}
    for k, v in jax.device_get(self.fn(params, self.batches)).items():
      out[k] = float(v) if np.ndim(v) == 0 else np.asarray(v).tolist()
    return out


class ClientEvaluator:
  """The global model on each sampled client's own training data (one compiled program per run).

  Every client is padded to the population's largest client, so the shape never changes across rounds.
  Returns per-client accuracy/loss and their example-weighted and plain means.
  """

  def __init__(self, model, data, batch_size: int = 256, preprocess=None, task=None):
    self.data = data
    max_n = int(np.max(data.client_sizes()))
    self.batch_size = min(batch_size, max(max_n, 1))
    self.nb = max(1, -(-max_n // self.batch_size))
    self.fn = jax.jit(jax.vmap(make_eval_fn(model, preprocess, jit=False, task=task), in_axes=(None, 0)))

  def _client_batches(self, k):
    x, y = (self.data.client_examples(k) if not hasattr(self.data, 'client_indices')
            else (self.data.x[self.data.client_indices(k)], self.data.y[self.data.client_indices(k)]))
    b = make_eval_batches(np.asarray(x), np.asarray(y), self.batch_size)
    pad = self.nb - b['mask'].shape[0]
    return {key: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for key, v in b.items()}

  def __call__(self, params, client_ids):
    rows = [self._client_batches(int(k)) for k in client_ids]
    stacked = {key: np.stack([r[key] for r in rows]) for key in rows[0]}
    res = jax.device_get(self.fn(params, stacked))
    n = res['count']
    return {'client_accuracy': res['accuracy'], 'client_loss': res['loss'], 'client_count': n,
            'clients_mean_accuracy': float(np.mean(res['accuracy'])),
            'clients_weighted_accuracy': float(np.sum(res['accuracy'] * n) / max(np.sum(n), 1.0)),
            'clients_mean_loss': float(np.mean(res['loss']))}
