"""Next-token prediction: the task of the Shakespeare (characters) and StackOverflow (words) datasets.

A batch holds token ids x [B, T] and the targets y [B, T] (x shifted by one: y[t] = x[t + 1]); the model
returns logits [B, T, V] over the extended vocabulary (words + pad / oov / bos / eos). Id layout (TFF's
`get_special_tokens`): pad = 0, vocabulary 1..n, oov = n + 1 (.. n + num_oov), bos, eos.

What counts where (each unit = one target position of a valid example):

  loss                 cross-entropy over targets != pad (FedJAX's `train_loss`: `per_token_loss *= targets != pad`).
                       TFF's Keras models mask on the *input* (Embedding(mask_zero=True)) instead, which also
                       counts the one position per short sentence whose input is eos and whose target is pad;
                       the task sees only targets, so that position is not counted here.
  accuracy             the headline metric: targets outside `accuracy_excludes` (TFF's StackOverflow
                       'accuracy_without_out_of_vocab_or_end_of_sentence' = pad, oov, bos, eos; TFF's
                       Shakespeare task excludes only pad); argmax over the full vocabulary.
  accuracy_no_pad      targets != pad (TFF's plain 'accuracy').
  accuracy_in_vocab    FedJAX's 'accuracy_in_vocab': targets != pad and != eos, the prediction an argmax
                       over the non-special ids only (pad/bos/eos/oov never predicted), so an oov target
                       is always a mistake.
  oov_rate             the fraction of non-pad targets that are oov.
  tokens               the number of non-pad targets (the loss's units).

`correct` (used by the Hessian tools as accuracy * units) counts the non-pad targets, so every accuracy that
divides by the loss's units is TFF's plain 'accuracy'.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from fedjax_flat.tasks import base as tasks


@tasks.register('next_token')
@dataclasses.dataclass(frozen=True)
class NextToken(tasks.DenseClassification):
  """Per-position next-token classification with pad / oov / bos / eos ids (module docstring)."""
  name: str = 'next_token'
  ignore_index: Optional[int] = 0          # pad: no loss, no metric
  oov_ids: Tuple[int, ...] = ()
  bos_id: Optional[int] = None
  eos_id: Optional[int] = None
  accuracy_excludes: Tuple[str, ...] = ('pad', 'oov', 'bos', 'eos')   # which special ids the headline skips

  def __post_init__(self):
    bad = set(self.accuracy_excludes) - {'pad', 'oov', 'bos', 'eos'}
    if bad or 'pad' not in self.accuracy_excludes:
      raise ValueError(f'accuracy_excludes={self.accuracy_excludes!r}: a subset of pad, oov, bos, eos that '
                       'contains pad')
    if self.ignore_index is None:
      raise ValueError('NextToken needs the pad id (ignore_index)')

  def _ids(self, which) -> Tuple[int, ...]:
    out = []
    for w in which:
      out += {'pad': [self.ignore_index], 'oov': list(self.oov_ids),
              'bos': [] if self.bos_id is None else [self.bos_id],
              'eos': [] if self.eos_id is None else [self.eos_id]}[w]
    return tuple(out)

  @staticmethod
  def _is_any(labels, ids):
    hit = jnp.zeros(labels.shape, bool)
    for i in ids:
      hit = hit | (labels == i)
    return hit

  def eval_sums(self, logits, labels, mask) -> Dict[str, jax.Array]:
    loss, w = self.unit_losses(logits, labels, mask)        # w: valid example and target != pad
    valid = w > 0
    pred = jnp.argmax(logits, -1)
    hit = (pred == labels) & valid
    head = valid & ~self._is_any(labels, self._ids(self.accuracy_excludes))
    special = self._ids(('pad', 'oov', 'bos', 'eos'))
    in_vocab_logits = logits.at[..., jnp.asarray(special, jnp.int32)].set(-jnp.inf) if special else logits
    in_vocab_ok = valid & ~self._is_any(labels, self._ids(('eos',)))
    oov = valid & self._is_any(labels, self.oov_ids)
    f = lambda b: jnp.sum(b.astype(jnp.float32))    # noqa: E731
    return {'loss_sum': jnp.sum(jnp.where(valid, loss * w, 0.0)), 'tokens': jnp.sum(w),
            'correct': f(hit), 'correct_head': f(hit & head), 'count': f(head),
            'correct_in_vocab': f((jnp.argmax(in_vocab_logits, -1) == labels) & in_vocab_ok),
            'count_in_vocab': f(in_vocab_ok), 'oov': f(oov)}

  def eval_metrics(self, sums) -> Dict[str, jax.Array]:
    div = lambda a, b: sums[a] / jnp.maximum(sums[b], 1.0)    # noqa: E731
    # 'count' (the headline accuracy's units) weights per-client accuracies in the client evaluator.
    return {'loss': div('loss_sum', 'tokens'), 'accuracy': div('correct_head', 'count'),
            'accuracy_no_pad': div('correct', 'tokens'), 'accuracy_in_vocab': div('correct_in_vocab', 'count_in_vocab'),
            'oov_rate': div('oov', 'tokens'), 'tokens': sums['tokens'], 'count': sums['count']}
