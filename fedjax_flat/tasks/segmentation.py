"""Semantic segmentation (FedDrive): label maps with a void index, OHEM losses, booster heads, mIoU.

The unit is a pixel. Training: the main head's loss plus `aux_weight` x each booster head's (BiSeNetV2),
optionally over the hardest pixels only (OHEM: 'topk' as FedDrive, 'thresh' as CoinCheung's BiSeNetV2).
Evaluation: an additive confusion matrix -> mIoU over the classes present and per-class IoU; logits are
upsampled to the label map first (a model evaluated at a lower resolution). Pixels are counted in integers
(int32 per batch: exact up to 2^31 pixels per cell; the evaluators add batches on the host in int64): a
float32 count stops at 2^24 = 16,777,216 (adding 1 no longer changes it), which one evaluation batch of
64 images at 512 x 512 already reaches.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import jax
import jax.numpy as jnp

from fedjax_flat.tasks.base import DenseClassification, _main_head, cross_entropy, register, resize_to_labels
from fedjax_flat.schema import Choice, Field, Flag, Int, Num, Pair, Section
from fedjax_flat.models.tiling import EVAL_MODES


OHEM_MODES = ('none', 'topk', 'thresh')


@register('segmentation')
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
  accuracy_name = 'pixel accuracy'      # eval_metrics' 'accuracy'; the headline is the mIoU (FedDrive's tables)
  headline = ('miou', 'mIoU')
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
    valid = w > 0               # evaluation masks are 0 / 1 (padding): a valid pixel counts once
    return {'loss_sum': jnp.sum(jnp.where(valid, loss * w, 0.0)),
            'correct': jnp.sum(valid & (pred == labels), dtype=jnp.int32),
            'count': jnp.sum(valid, dtype=jnp.int32), 'confusion': confusion_counts(labels, pred, valid, c)}

  def with_config(self, config) -> 'Segmentation':
    """This task with the run's loss settings (config.segmentation: OHEM, booster heads' weight)."""
    sc = config.get('segmentation') if hasattr(config, 'get') else None
    if sc is None:
      return self
    return dataclasses.replace(self, ohem=sc.ohem, ohem_fraction=float(sc.ohem_fraction),
                               ohem_thresh=float(sc.ohem_thresh), aux_weight=float(sc.aux_weight))

  def eval_metrics(self, sums) -> Dict[str, jax.Array]:
    out = super().eval_metrics(sums)
    out['miou'], out['iou'] = miou_from_confusion(sums['confusion'])
    return out


def confusion_counts(labels, pred, valid, num_classes: int):
  """[C, C] int32 pixel counts [true, predicted] of the valid pixels (a scatter-add of ones in int32: exact up to
  2^31 per cell, where float32 stops counting at 2^24)."""
  c = num_classes
  idx = jnp.where(valid, jnp.where(valid, labels, 0).astype(jnp.int32) * c + pred.astype(jnp.int32), 0).reshape(-1)
  return jnp.zeros((c * c,), jnp.int32).at[idx].add(valid.reshape(-1).astype(jnp.int32)).reshape(c, c)


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


# config.segmentation: declared with the code that reads it (config/schema.py collects it)
_TILE = "must be (height, width), integers >= 0 ((0, 0) = the model's input size)"


SECTION = Section('segmentation', (
    Field('ohem', Choice('topk', OHEM_MODES, sort=True), "'topk' (FedDrive: per image, the hardest ohem_fraction of "
          "pixels) | 'thresh' (CoinCheung: CE > -log(ohem_thresh)) | 'none'"),
    Field('ohem_fraction', Num(0.25, lo=0, lo_open=True, hi=1), "'topk': share of pixels kept"),
    Field('ohem_thresh', Num(0.7, lo=0, lo_open=True, hi=1, hi_open=True), "'thresh': probability threshold"),
    Field('aux_weight', Num(1.0, lo=0), "weight of each booster head's loss"),
    Field('eval_mode', Choice('full', EVAL_MODES, sort=True), "'full' | 'downscale' (input x eval_scale) | 'tiles'"),
    Field('eval_scale', Num(0.5, lo=0, lo_open=True, hi=1), "'downscale': input scale"),
    Field('eval_tile', Pair((0, 0), integer=True, lo_open=False, message=_TILE), "'tiles': window (0, 0 = the "
          "model's input size)"),
    Field('eval_overlap', Num(1 / 3, lo=0, hi=1, hi_open=True), "'tiles': overlap of the windows"),
    Field('by_test_client', Flag(True), "metrics per held-out test client group ('seen' / 'unseen') as well"),
    Field('predictions', Int(4, lo=0, hi=64), 'predictions.png: test images with true / predicted masks'),
), doc="the 'segmentation' task's loss (OHEM, booster heads) and evaluation (tasks/segmentation.py)")
