"""What a label means: the training loss over the valid units of a masked batch, and evaluation metrics.

A batch is {'x': [B, ...], 'y': [B, *label_shape], 'mask': [B]} with mask = 0 on padding examples. A task
turns model outputs `logits: [B, *label_shape, C]` into

  unit_losses(logits, y, mask) -> (loss [B, *label_shape], weight [B, *label_shape])
      the loss of every unit (an example, a token, a pixel) and its weight: 0 for padding examples and
      ignored units, else 1 (or a selection, e.g. OHEM's hardest pixels). The training loss is
      sum(loss * weight) / sum(weight): a mean over valid units, never a mean of batch means.
  unit_count(y, mask) -> the number of units the mean loss divides by (no model needed: the analysis
      tools normalize Hessians with it);
  eval_sums(logits, y, mask) -> {name: array}
      additive statistics of one batch (sums, counts, a confusion matrix), so that a split's metrics are
      exact over every valid unit whatever the batching;
  eval_metrics(sums) -> {'loss', 'accuracy', 'count', ...}
      the metrics from the summed statistics ('accuracy' is the task's headline metric's companion: the
      classification accuracy over valid units; tasks may add more, e.g. mIoU).
  training_inputs(forward, x, y, mask) -> (x, y)
      what the training pass runs on: the batch itself (default), or a part of it chosen from a
      gradient-free forward pass `forward(x)` (retrieval: the mined slots of each tuple, tasks/retrieval.py);
      training loss (algorithms/local.py) calls it before the model's pass with gradient.

Tasks are small frozen dataclasses (hashable: they key jit caches) with the hyperparameters of the labels
(ignore index), not of the model. Datasets name theirs (`FederatedDataset.task`, a `ClientDataSource`'s
`task` attribute); `get_task` resolves a name, an instance or None (classification).

  classification          y [B] int class ids, or [B, C] soft labels (mixup); unit = example
  dense_classification    y [B, ...] int, one class per position (tokens, pixels); unit = position;
                          positions whose label is `ignore_index` (if set) carry no loss and no metric
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Union

import jax
import jax.numpy as jnp

from fedjax_flat.registry import Registry


def cross_entropy(logits, labels):
  """Per-unit softmax cross-entropy in float32; labels are int class ids or soft label distributions."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  if labels.ndim == logits.ndim:
    return -jnp.sum(labels * logp, axis=-1)
  return -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _expand(mask, like):
  """The per-example mask [B] broadcast over the label dimensions of `like` [B, ...]."""
  mask = mask.astype(jnp.float32)
  return mask.reshape(mask.shape + (1,) * (like.ndim - mask.ndim))


@dataclasses.dataclass(frozen=True)
class Classification:
  """One label per example (int id, or a soft distribution from mixup)."""
  name: str = 'classification'
  # How tables, plots and the console name eval_metrics' 'accuracy', and the task's headline metric (an
  # eval_metrics key, its label): class attributes, not fields, so they key no jit cache. `metric_names`.
  accuracy_name = 'accuracy'
  headline = ('accuracy', 'accuracy')

  def unit_losses(self, logits, labels, mask):
    return cross_entropy(logits, labels), mask.astype(jnp.float32)

  def training_inputs(self, forward, x, labels, mask):
    """(x, labels) of the training pass (module docstring): the whole batch."""
    del forward, mask
    return x, labels

  def unit_count(self, labels, mask):
    """The number of units a batch's mean loss divides by (labels and mask only: no model needed)."""
    return jnp.sum(mask.astype(jnp.float32))

  def loss_sums(self, logits, labels, mask):
    """(sum of weighted unit losses, sum of weights): the loss is their ratio."""
    loss, weight = self.unit_losses(logits, labels, mask)
    # where(): a padded unit's logits may be anything (inf * 0 would be nan).
    return jnp.sum(jnp.where(weight > 0, loss * weight, 0.0)), jnp.sum(weight)

  def eval_sums(self, logits, labels, mask) -> Dict[str, jax.Array]:
    loss, weight = self.unit_losses(logits, labels, mask)
    hard = labels if labels.ndim < logits.ndim else jnp.argmax(labels, -1)
    correct = (jnp.argmax(logits, -1) == hard).astype(jnp.float32)
    valid = weight > 0
    return {'loss_sum': jnp.sum(jnp.where(valid, loss * weight, 0.0)),
            'correct': jnp.sum(jnp.where(valid, correct * weight, 0.0)),
            'count': jnp.sum(weight)}

  def eval_metrics(self, sums) -> Dict[str, jax.Array]:
    n = jnp.maximum(sums['count'], 1.0)
    return {'loss': sums['loss_sum'] / n, 'accuracy': sums['correct'] / n, 'count': sums['count']}


@dataclasses.dataclass(frozen=True)
class DenseClassification(Classification):
  """One class per position of a label array [B, ...] (tokens of a sequence, pixels of a label map).

  The loss and the metrics average over valid positions of valid examples; positions labelled
  `ignore_index` (padding tokens, void pixels) count nowhere.
  """
  name: str = 'dense_classification'
  ignore_index: Optional[int] = None

  def valid_units(self, labels, mask):
    w = jnp.broadcast_to(_expand(mask, labels), labels.shape)
    if self.ignore_index is not None:
      w = jnp.where(labels == self.ignore_index, 0.0, w)
    return w

  def unit_count(self, labels, mask):
    return jnp.sum(self.valid_units(labels, mask))

  def unit_losses(self, logits, labels, mask):
    w = self.valid_units(labels, mask)
    # Ignored positions may hold an out-of-range id (255 on a 19-class map): gather a safe id instead.
    safe = jnp.where(w > 0, labels, 0)
    return cross_entropy(logits, safe), w


# name -> task class; every module of tasks/ registers its tasks (segmentation.py, next_token.py).
TASKS = Registry('task', package='fedjax_flat.tasks')
register = TASKS.register
register('classification')(Classification)
register('dense_classification')(DenseClassification)


TaskLike = Union[None, str, Classification]


def get_task(task: TaskLike = None, **kwargs):
  """A task instance from None (classification), a registered name (+ its fields) or an instance."""
  if task is None:
    return Classification()
  if isinstance(task, str):
    if task not in TASKS:
      raise ValueError(f'task={task!r} is unknown; allowed: {TASKS.names()}')
    return TASKS.get(task)(**kwargs)
  if kwargs:
    return dataclasses.replace(task, **kwargs)
  return task


def metric_names(task) -> Dict[str, str]:
  """What a run's results call their metrics (summary.json `metric_names`, read by the writers and the report):
  'accuracy' (the name of eval_metrics' accuracy: 'pixel accuracy', 'R@1'), 'headline' (the record key of the
  task's headline metric without the model prefix: 'test_miou') and 'headline_label' ('mIoU')."""
  key, label = task.headline
  return {'accuracy': task.accuracy_name, 'headline': f'test_{key}', 'headline_label': label}


def task_of(data) -> Classification:
  """The task a dataset declares (`data.task`: a name or an instance), classification when it declares none."""
  return get_task(getattr(data, 'task', None))


def _main_head(logits):
  """Training-mode models may return (main, *auxiliary heads); metrics are the main head's."""
  return logits[0] if isinstance(logits, (tuple, list)) else logits


def resize_to_labels(logits, labels):
  """Logits [B, h, w, C] bilinearly resized to the label map's [H, W] when they differ (a model evaluated
  on a downscaled image, FedDrive's `use_test_resize`); the identity otherwise."""
  if logits.shape[1:-1] == labels.shape[1:]:
    return logits
  shape = (logits.shape[0],) + tuple(labels.shape[1:]) + (logits.shape[-1],)
  return jax.image.resize(logits.astype(jnp.float32), shape, 'bilinear')


def from_config(task, config):
  """The dataset's task with the run's loss settings (a task's `with_config`, e.g. config.segmentation)."""
  return task.with_config(config) if hasattr(task, 'with_config') else task
