"""Spurious correlations on the embedded digits (`spurious_digits`, thesis §7.2.3): multi-class Coloured MNIST
(Arjovsky et al. 2019) with a per-client spurious strength, and the group assembly the real sets share
(data/sources/spurious_real.py: Waterbirds, CelebA blond).

Every class c has a majority colour COLOURS[c]. Client k gets its spurious strength rho_k: `strength` for
every client, or with `strength_max` >= strength drawn uniformly from [strength, strength_max] by the data seed
(`client_rho`; the fields are not called rho, which is SAM's client.rho). Each of
client k's training digits gets its class's colour with probability rho_k, else one of the 9 other colours
uniformly; the image is the 8x8 digit times the colour, [8, 8, 3] in [0, 1]. The shape alone predicts the
class; the colour predicts it with accuracy rho_k, so a model that leans on colour fails where colour and class
disagree. Test split (a stratified `test_fraction`, the same digits for every strength): `test_strength` = -1
(default) shows every test digit in every colour (colour independent of the class: 1 of 10 copies agrees), else
each test digit once, coloured as a training digit with strength test_strength.

Groups (tasks/groups.py): group = 2 * class + agree (agree = 1 when the colour is the class's majority colour),
20 groups; labels y [N, 2] = [class, group] under the `group_labelled` task, so that every evaluation record
carries the worst-group accuracy (training/evals/groups.py). Clients: the training digits split by
`dirichlet_split(alpha)` over the classes (alpha = inf: equal class shares).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.partition import dirichlet_split, iid_split
from fedjax_flat.data.registry import check_arg, register
from fedjax_flat.data.sources import builtin
from fedjax_flat.schema import DataValue
from fedjax_flat.tasks.groups import GroupLabelled

# Ten RGB colours of distinct hue (no two differ only in brightness); class c's majority colour is COLOURS[c].
COLOURS = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0],
                    [0.0, 1.0, 1.0], [1.0, 0.5, 0.0], [0.5, 0.0, 1.0], [0.0, 0.5, 1.0], [1.0, 1.0, 1.0]],
                   np.float32)
NUM_CLASSES = 10


def group_labels(y: np.ndarray, group: np.ndarray) -> np.ndarray:
  """[N] classes and [N] groups -> labels [N, 2] = [class, group] (the group_labelled task's)."""
  return np.stack([np.asarray(y, np.int32), np.asarray(group, np.int32)], axis=1)


def group_dataset(x, y, group, splits: Sequence[np.ndarray], test_x, test_y, test_group, *, num_classes: int,
                  num_groups: int, group_names: Sequence[str], name: str, **extra) -> FederatedDataset:
  """A federated dataset whose labels carry the group (y = [class, group]) under group_labelled(num_groups);
  `group_names[g]` names group g (the groups plug-in's summary); `extra` attributes are kept on the dataset."""
  ds = FederatedDataset.from_client_indices(
      np.asarray(x), group_labels(y, group), list(splits), np.asarray(test_x), group_labels(test_y, test_group),
      num_classes=int(num_classes), name=name, task=GroupLabelled(num_groups=int(num_groups)))
  ds.group_names = tuple(group_names)
  for k, v in extra.items():
    setattr(ds, k, v)
  return ds


def group_partition(groups: np.ndarray, num_clients: int, group_alpha: float, seed: int):
  """Clients of the real sets: an IID split (group_alpha = 0), or per-client group skew by the Dirichlet split
  over the groups (data/partition.dirichlet_split with alpha = group_alpha)."""
  if group_alpha == 0:
    return iid_split(len(groups), num_clients, seed=seed)
  return dirichlet_split(np.asarray(groups), num_clients, float(group_alpha), seed=seed)


def draw_colours(y: np.ndarray, strength, rng) -> np.ndarray:
  """The colour of each example: its class's with probability strength (scalar or per example), else one of the
  other colours uniformly."""
  y = np.asarray(y, np.int64)
  keep = rng.random(len(y)) < np.broadcast_to(np.asarray(strength, np.float64), y.shape)
  other = (y + 1 + rng.integers(0, NUM_CLASSES - 1, len(y))) % NUM_CLASSES   # never the class's own colour
  return np.where(keep, y, other)


def colour(images: np.ndarray, colours: np.ndarray) -> np.ndarray:
  """Grey images [N, 8, 8] in [0, 1] times their colours -> [N, 8, 8, 3] float32."""
  return (images[..., None] * COLOURS[colours][:, None, None, :]).astype(np.float32)


def client_strengths(num_clients: int, strength: float, strength_max: float, seed: int) -> np.ndarray:
  """rho_k of every client: strength, or uniform on [strength, strength_max] from (seed) when strength_max >= 0."""
  if strength_max < 0:
    return np.full(num_clients, float(strength))
  return np.random.default_rng([int(seed), 0x5C0]).uniform(float(strength), float(strength_max), num_clients)


def spurious_digits(images: np.ndarray, labels: np.ndarray, *, num_clients: int, strength: float,
                    strength_max: float = -1.0, test_strength: float = -1.0, alpha: float = float('inf'),
                    test_fraction: float = 0.2, seed: int = 0) -> FederatedDataset:
  """The coloured-digit federated dataset from grey images [N, 8, 8] in [0, 1] and labels [N] (module doc)."""
  rng = np.random.default_rng([int(seed), 0xC01])
  labels = np.asarray(labels, np.int64)
  test = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[
      :int(round(np.sum(labels == c) * test_fraction))] for c in range(NUM_CLASSES)]))
  train = np.setdiff1d(np.arange(len(labels)), test)
  splits = dirichlet_split(labels[train], num_clients, float(alpha), num_classes=NUM_CLASSES, seed=seed)
  rho_k = client_strengths(num_clients, strength, strength_max, seed)
  owner = np.full(len(train), -1, np.int64)
  for k, s in enumerate(splits):
    owner[s] = k
  # Examples no client holds (dirichlet_split's remainder) are never trained on; they get `strength` anyway.
  per_example = np.where(owner >= 0, rho_k[np.maximum(owner, 0)], strength)
  c_train = draw_colours(labels[train], per_example, rng)
  if test_strength < 0:                    # every test digit in every colour: colour independent of the class
    t_img = np.repeat(images[test], NUM_CLASSES, axis=0)
    t_y = np.repeat(labels[test], NUM_CLASSES)
    c_test = np.tile(np.arange(NUM_CLASSES), len(test))
  else:
    t_img, t_y = images[test], labels[test]
    c_test = draw_colours(t_y, test_strength, rng)
  names = [f'class{c}:{"majority" if a else "other"}_colour' for c in range(NUM_CLASSES) for a in (0, 1)]
  spread = f'{strength}' if strength_max < 0 else f'[{strength}, {strength_max}]'
  return group_dataset(
      colour(images[train], c_train), labels[train], 2 * labels[train] + (c_train == labels[train]), splits,
      colour(t_img, c_test), t_y, 2 * t_y + (c_test == t_y), num_classes=NUM_CLASSES, num_groups=2 * NUM_CLASSES,
      group_names=names, name=f'spurious_digits(strength={spread}, test_strength={test_strength})',
      client_rho=rho_k)


def load_spurious_digits(num_clients: int = 20, strength: float = 0.9, strength_max: float = -1.0,
                         test_strength: float = -1.0, alpha: float = float('inf'), *, test_fraction: float = 0.2,
                         seed: int = 0) -> FederatedDataset:
  raw, target = builtin.digits_arrays()
  return spurious_digits((raw.astype(np.float32) / 16.0), target, num_clients=num_clients, strength=strength,
                         strength_max=strength_max, test_strength=test_strength, alpha=alpha,
                         test_fraction=test_fraction, seed=seed)


def check_strengths(data: dict) -> None:
  """strength_max against strength (the per-client strengths' range), for every spurious source."""
  strength = data.get('strength')
  strength = 0.9 if strength is None else strength
  strength_max = data.get('strength_max')
  if strength_max is not None:
    check_arg('strength_max', strength_max, strength_max == -1 or strength <= strength_max <= 1,
              f'-1 (every client has strength={strength}) or a number in [strength={strength}, 1]')


def _check(data: dict) -> None:
  check_strengths(data)
  test_strength = data.get('test_strength')
  if test_strength is not None:
    check_arg('test_strength', test_strength, test_strength == -1 or 0 <= test_strength <= 1,
              '-1 (every test digit in every colour) or a number in [0, 1]')


RULES = {
    'strength': DataValue(None, 'number', lo=0, hi=1, what="spurious strength: the share of a client's digits in "
                          "their class's colour (the lower end of the range when strength_max is set)"),
    'strength_max': DataValue(None, 'number', lo=-1, hi=1,
                              what='-1: every client has strength; else rho_k ~ U[strength, strength_max]'),
    'test_strength': DataValue(None, 'number', lo=-1, hi=1, what='-1: every test digit in every colour; else the '
                               "test split's spurious strength"),
}


@register('spurious_digits', task='group_labelled', rules=RULES, check=_check)
def _spurious_digits(num_clients=20, strength=0.9, strength_max=-1.0, test_strength=-1.0, alpha=float('inf'),
                     test_fraction=0.2, seed=0, **unused):
  del unused
  return load_spurious_digits(int(num_clients), float(strength), float(strength_max), float(test_strength),
                              float(alpha), test_fraction=float(test_fraction), seed=int(seed))

