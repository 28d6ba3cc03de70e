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

  def unit_losses(self, logits, labels, mask):
    return cross_entropy(logits, labels), mask.astype(jnp.float32)

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


_TASKS = {'classification': Classification, 'dense_classification': DenseClassification}


def register(name: str):
  """Registers a task class (a dataclass with the methods above) under `name` for `get_task`."""
  def deco(cls):
    _TASKS[name] = cls
    return cls
  return deco


TaskLike = Union[None, str, Classification]


def get_task(task: TaskLike = None, **kwargs):
  """A task instance from None (classification), a registered name (+ its fields) or an instance."""
  if task is None:
    return Classification()
  if isinstance(task, str):
    if task not in _TASKS:
      raise ValueError(f'task={task!r} is unknown; allowed: {sorted(_TASKS)}')
    return _TASKS[task](**kwargs)
  if kwargs:
    return dataclasses.replace(task, **kwargs)
  return task


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


OHEM_MODES = ('none', 'topk', 'thresh')


@dataclasses.dataclass(frozen=True)
class Segmentation(DenseClassification):
  """Semantic segmentation: y [B, H, W] train ids, `ignore_index` (255) = void; logits [B, H, W, C], or in
  training a tuple (main, aux_1, ..., aux_m) of heads (BiSeNetV2's booster heads), each [B, H, W, C].

  Training loss (FedDrive's `HardNegativeMining` + `output_aux`: the loss of every head, summed):
    L = sum_heads reduce(CE per pixel),  CE = 0 on void pixels (torch `ignore_index`)
    ohem='topk'   (FedDrive, the thesis' "OHEM on the top 25% of pixels"): per valid image, the mean of its
                  k = int(ohem_fraction * H * W) largest pixel losses over ALL its pixels (void pixels take part
                  with loss 0, so an image with fewer than k labelled pixels averages zeros in, as there)
    ohem='thresh' (CoinCheung/BiSeNet `OhemCELoss`): over the batch, the pixels whose CE exceeds
                  -log(ohem_thresh) (0.7), but at least n_min = n_valid // 16 of them (the hardest ones)
    ohem='none'   mean CE over the valid pixels
  Labels outside [0, C) other than ignore_index also count as void (as FedDrive's confusion matrix skips them).

  Evaluation (additive, `eval_sums`): the plain CE over valid pixels (so the Hessian tools see that
  loss), pixel accuracy and the C x C confusion matrix [true, predicted]; `eval_metrics` gives
    miou = mean over the classes PRESENT in the ground truth of IoU_c = TP_c / (TP_c + FP_c + FN_c)
           (FedDrive's StreamSegMetrics: absent classes are left out, not counted as 0)
    iou  = [C] per-class IoU, NaN for classes absent from the ground truth (array-valued)
  Logits smaller than the label map are bilinearly upsampled to it first (evaluation at reduced resolution).
  """
  name: str = 'segmentation'
  ignore_index: Optional[int] = 255
  ohem: str = 'topk'
  ohem_fraction: float = 0.25
  ohem_thresh: float = 0.7
  aux_weight: float = 1.0          # weight of each auxiliary (booster) head's loss; the reference adds them

  def valid_pixels(self, labels, mask, num_classes: int):
    w = self.valid_units(labels, mask)
    return jnp.where((labels >= 0) & (labels < num_classes), w, 0.0)

  def unit_losses(self, logits, labels, mask):
    logits = _main_head(logits)
    w = self.valid_pixels(labels, mask, logits.shape[-1])
    safe = jnp.where(w > 0, labels, 0)
    return cross_entropy(logits, safe), w

  def _head_loss(self, logits, labels, mask):
    """(sum of the selected pixel losses, their count) of one head. A jax.checkpoint region: the backward
    pass recomputes the softmax from the logits instead of keeping [B, H, W, C] log-probabilities per head."""
    return jax.checkpoint(self._head_loss_impl)(logits, labels, mask)

  def _head_loss_impl(self, logits, labels, mask):
    w = self.valid_pixels(labels, mask, logits.shape[-1])
    ce = jnp.where(w > 0, cross_entropy(logits, jnp.where(w > 0, labels, 0)), 0.0)
    if self.ohem == 'none':
      return jnp.sum(ce), jnp.sum(w)
    b = ce.shape[0]
    flat = ce.reshape(b, -1)
    if self.ohem == 'topk':
      k = max(1, int(self.ohem_fraction * flat.shape[1]))
      top = jax.lax.top_k(flat, k)[0]                       # [B, k] each image's k hardest pixels
      ex = mask.astype(jnp.float32)
      return jnp.sum(jnp.sum(top, -1) * ex), jnp.sum(ex) * k
    # 'thresh': pixels above the threshold, or the n_min hardest valid ones when fewer pass it.
    t = -jnp.log(jnp.float32(self.ohem_thresh))
    vals = jnp.where(w > 0, ce, -1.0).reshape(-1)
    n_valid = jnp.sum(w)
    n_min = jnp.floor(n_valid / 16.0)
    k_max = max(1, vals.shape[0] // 16)
    top = jax.lax.top_k(vals, k_max)[0]
    kth = top[jnp.clip(n_min.astype(jnp.int32) - 1, 0, k_max - 1)]
    n_hard = jnp.sum((vals > t).astype(jnp.float32))
    sel = jnp.where(n_hard < n_min, vals >= kth, vals > t) & (vals >= 0)
    sel = sel.astype(jnp.float32)
    return jnp.sum(vals * sel), jnp.sum(sel)

  def loss_sums(self, logits, labels, mask):
    """(count * sum_h w_h mean_h, count) with count the main head's selected pixels: the ratio is the
    reference's loss (sum over heads of each head's mean)."""
    heads = list(logits) if isinstance(logits, (tuple, list)) else [logits]
    s0, n0 = self._head_loss(heads[0], labels, mask)
    n0 = jnp.maximum(n0, 0.0)
    total = s0 / jnp.maximum(n0, 1.0)
    for aux in heads[1:]:
      s, n = self._head_loss(aux, labels, mask)
      total = total + self.aux_weight * s / jnp.maximum(n, 1.0)
    return total * n0, n0

  def eval_sums(self, logits, labels, mask) -> Dict[str, jax.Array]:
    logits = resize_to_labels(_main_head(logits), labels)
    c = logits.shape[-1]
    w = self.valid_pixels(labels, mask, c)
    loss = cross_entropy(logits, jnp.where(w > 0, labels, 0))
    pred = jnp.argmax(logits, -1)
    valid = w > 0
    idx = jnp.where(valid, jnp.where(valid, labels, 0).astype(jnp.int32) * c + pred, 0).reshape(-1)
    confusion = jnp.zeros((c * c,), jnp.float32).at[idx].add(w.reshape(-1)).reshape(c, c)
    return {'loss_sum': jnp.sum(jnp.where(valid, loss * w, 0.0)),
            'correct': jnp.sum(jnp.where(valid & (pred == labels), w, 0.0)),
            'count': jnp.sum(w), 'confusion': confusion}

  def eval_metrics(self, sums) -> Dict[str, jax.Array]:
    out = super().eval_metrics(sums)
    out['miou'], out['iou'] = miou_from_confusion(sums['confusion'])
    return out


def miou_from_confusion(confusion):
  """(mIoU over the classes present in the ground truth, per-class IoU with NaN for absent classes) from a
  [true, predicted] confusion matrix."""
  confusion = jnp.asarray(confusion, jnp.float32)
  tp = jnp.diag(confusion)
  gt = jnp.sum(confusion, axis=1)
  union = gt + jnp.sum(confusion, axis=0) - tp
  present = gt > 0
  iou = jnp.where(present, tp / jnp.maximum(union, 1.0), jnp.nan)
  miou = jnp.sum(jnp.where(present, iou, 0.0)) / jnp.maximum(jnp.sum(present), 1)
  return miou, iou


_TASKS['segmentation'] = Segmentation


def from_config(task, config):
  """The dataset's task with the run's loss settings (config.segmentation for a Segmentation task)."""
  sc = config.get('segmentation') if hasattr(config, 'get') else None
  if isinstance(task, Segmentation) and sc is not None:
    return dataclasses.replace(task, ohem=sc.ohem, ohem_fraction=float(sc.ohem_fraction),
                               ohem_thresh=float(sc.ohem_thresh), aux_weight=float(sc.aux_weight))
  return task
