"""`domain_labelled`: one class per example, with the example's domain carried next to its label.

Labels y [B, 2] = [class, domain] (int). The loss and every metric are classification's on y[:, 0] (so any
algorithm and model train on these data as on plain classification data); the domain column is read only by
what needs it: FedCG's oracle domains (algorithms/fedcg.py) and the purity of discovered domains. Datasets
with domains: `digits_domains` (planted, data/sources/planted_domains.py) and `celeba` (the 32 attribute
domains, data/sources/celeba.py).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from fedjax_flat.tasks.base import Classification, register


def classes(labels):
  """The class column of [B, 2] labels ([B] labels are returned as they are)."""
  return labels[..., 0] if labels.ndim == 2 else labels


def domains(labels):
  """The domain column of [B, 2] labels."""
  return labels[..., 1].astype(jnp.int32)


@register('domain_labelled')
@dataclasses.dataclass(frozen=True)
class DomainLabelled(Classification):
  name: str = 'domain_labelled'

  def unit_losses(self, logits, labels, mask):
    return super().unit_losses(logits, classes(labels), mask)

  def eval_sums(self, logits, labels, mask):
    return super().eval_sums(logits, classes(labels), mask)


def purity(assigned, truth, num_assigned, num_true):
  """Purity of an assignment against known domains (FedCG's discovered domains, LADD's style clusters): the sum over
  assigned groups of the count of their majority true domain / N (numpy)."""
  assigned, truth = np.asarray(assigned).reshape(-1), np.asarray(truth).reshape(-1)
  if not len(assigned):
    return 0.0
  table = np.zeros((num_assigned, num_true), np.int64)
  np.add.at(table, (assigned, truth), 1)
  return float(table.max(axis=1).sum() / len(assigned))
