"""`group_labelled`: classification whose examples carry a group id (spurious correlations, thesis §7.2.3).

Labels y [B, 2] = [class, group] (int), group in [0, num_groups). The loss is classification's on y[:, 0], so any
algorithm and model train on these data as on plain classification data. The evaluation adds, in the same pass
(the per-group sums are two [num_groups] vectors beside the usual sums, so one compiled program serves every
group): `group_acc/<g>` (the accuracy on the examples of group g), `avg_group_acc` (their mean over the groups
present) and `worst_group_acc` (their minimum over the groups present; Sagawa et al. 2020's worst-group
accuracy). A group with no example in the evaluated split reports nan and is left out of the mean and the
minimum. Datasets: `spurious_digits`, `waterbirds`, `celeba_blond` (data/sources/spurious.py).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from fedjax_flat.tasks.base import Classification, register
from fedjax_flat.tasks.domains import classes


def group_keys(num_groups: int):
  """The metric names of the per-group accuracies, in group order."""
  return [f'group_acc/{g}' for g in range(int(num_groups))]


@register('group_labelled')
@dataclasses.dataclass(frozen=True)
class GroupLabelled(Classification):
  name: str = 'group_labelled'
  num_groups: int = 1

  def unit_losses(self, logits, labels, mask):
    return super().unit_losses(logits, classes(labels), mask)

  def eval_sums(self, logits, labels, mask):
    sums = super().eval_sums(logits, classes(labels), mask)
    # One-hot of the group, zero on padding: every group's sums come from the same batch pass.
    onehot = (labels[..., 1].astype(jnp.int32)[:, None] == jnp.arange(self.num_groups)[None, :])
    w = onehot.astype(jnp.float32) * mask.astype(jnp.float32)[:, None]
    correct = (jnp.argmax(logits, -1) == classes(labels)).astype(jnp.float32)
    sums['group_correct'] = jnp.sum(w * correct[:, None], axis=0)
    sums['group_count'] = jnp.sum(w, axis=0)
    return sums

  def eval_metrics(self, sums):
    out = super().eval_metrics({k: sums[k] for k in ('loss_sum', 'correct', 'count')})
    present = sums['group_count'] > 0
    acc = jnp.where(present, sums['group_correct'] / jnp.maximum(sums['group_count'], 1.0), jnp.nan)
    out['worst_group_acc'] = jnp.min(jnp.where(present, acc, jnp.inf))
    out['worst_group_acc'] = jnp.where(jnp.any(present), out['worst_group_acc'], jnp.nan)
    out['avg_group_acc'] = jnp.sum(jnp.where(present, acc, 0.0)) / jnp.maximum(jnp.sum(present), 1)
    out['avg_group_acc'] = jnp.where(jnp.any(present), out['avg_group_acc'], jnp.nan)
    for g, key in enumerate(group_keys(self.num_groups)):
      out[key] = acc[g]
    return out
