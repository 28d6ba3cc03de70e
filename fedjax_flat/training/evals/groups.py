"""Group robustness (spurious correlations, thesis §7.2.3): a dataset that declares groups (its task is
`group_labelled`, tasks/groups.py: labels [class, group]) has `test_worst_group_acc`, `test_avg_group_acc` and
`test_group_acc/<g>` in every evaluation record, for every evaluated model ('swa/test_worst_group_acc', ...).
They come from the evaluator's one compiled pass (the task's per-group sums), not from a second pass; this plug-in
checks the groups before anything compiles (every test label's group in [0, num_groups); a group absent from the
test set is named in a warning, since its accuracy is then nan and left out of the worst) and writes summary.json
`groups` (the reported model's last worst / average / per-group accuracies with the group names and test counts)
and a line in summary.md naming the worst group."""
from __future__ import annotations

import math

import numpy as np
from absl import logging

from fedjax_flat.errors import DataFormatError
from fedjax_flat.tasks.groups import GroupLabelled, group_keys
from fedjax_flat.training.evals.registry import Evaluation, register


def _applies(plan) -> bool:
  return isinstance(plan.task, GroupLabelled)


def group_names(data, num_groups: int) -> list:
  names = list(getattr(data, 'group_names', ()) or ())
  return names if len(names) == num_groups else [str(g) for g in range(num_groups)]


def test_group_counts(data, num_groups: int) -> np.ndarray:
  ty = np.asarray(data.test_y)
  return np.bincount(ty[:, 1].astype(np.int64), minlength=num_groups)


def _check(plan) -> None:
  g = int(plan.task.num_groups)
  ty = np.asarray(plan.data.test_y)
  if ty.ndim != 2 or ty.shape[1] != 2:
    raise DataFormatError(f'dataset {plan.dataset_name!r}: the group_labelled task needs labels [class, group], '
                          f'got test labels of shape {ty.shape}')
  bad = (ty[:, 1] < 0) | (ty[:, 1] >= g)
  if np.any(bad):
    raise DataFormatError(f'dataset {plan.dataset_name!r}: test group {int(ty[np.argmax(bad), 1])} is outside '
                          f'[0, {g}) (the task declares num_groups={g})')
  counts = test_group_counts(plan.data, g)
  empty = [n for n, c in zip(group_names(plan.data, g), counts) if c == 0]
  if empty:
    logging.warning('groups: no test example in group(s) %s: their accuracy is nan and the worst group is taken '
                    'over the others', ', '.join(empty))


def _final(trainer, summary, reported):
  g = int(trainer.plan.task.num_groups)
  prefix = '' if reported == 'global' else f'{reported}/'
  last = next((r for r in reversed(trainer.recorder.records) if f'{prefix}test_worst_group_acc' in r), None)
  if last is None:
    return
  names = group_names(trainer.data, g)
  acc = [last[f'{prefix}test_{k}'] for k in group_keys(g)]
  finite = [i for i, a in enumerate(acc) if not math.isnan(a)]
  worst = min(finite, key=lambda i: acc[i]) if finite else None
  summary['groups'] = {
      'model': reported, 'round': last['round'], 'names': names,
      'test_counts': test_group_counts(trainer.data, g).tolist(), 'accuracy': acc,
      'worst_group_acc': last[f'{prefix}test_worst_group_acc'], 'avg_group_acc': last[f'{prefix}test_avg_group_acc'],
      'worst_group': None if worst is None else names[worst]}
  if worst is not None:
    summary.setdefault('facts', {})['groups'] = (
        f"groups: {reported} worst-group accuracy {acc[worst]:.3f} ({names[worst]}), average over the "
        f"{len(finite)} groups {summary['groups']['avg_group_acc']:.3f}, mean accuracy "
        f"{last[f'{prefix}test_accuracy']:.3f} (round {last['round']})")


register(Evaluation('groups', order=16, applies=_applies, check=_check, final=_final, models=('global',)))
