"""A Waterbirds-like synthetic on the embedded digits (`background_digits`, issue 52): the spurious feature is
the background, not the object's colour.

Two classes, as Waterbirds' birds: 'landbird' = digits 0-4 (class 0), 'waterbird' = digits 5-9 (class 1). Every
image is its 8x8 grey digit drawn over a background [8, 8, 3] of one of two kinds, each a fresh random field per
image: 'land' (place 0) smooth blobs (box-filtered noise) in a green-brown tint, 'water' (place 1) horizontal
waves of random period and phase in a blue tint; x = d + (1 - d) * background (d the digit's ink in [0, 1], the
background in [0, 0.5]): the digit stays on top, the background shows around it. Client k's training digits get
their class's place (0-4 on land, 5-9 on water) with probability rho_k, the other place otherwise; rho_k is
`strength` for every client, or drawn from [strength, strength_max] by the data seed (the dataset's
`client_rho`, as spurious_digits'). The shape predicts the class; the background predicts it with accuracy
rho_k.

Test split: a stratified `test_fraction` of the digits, subsampled (from the seed) to as many landbirds as
waterbirds, each shown on both backgrounds: the four groups have the same count and the background carries no
information. Groups as the `waterbirds` loader's (data/sources/spurious_real.py): group = 2 * class + place, 0
landbird/land, 1 landbird/water, 2 waterbird/land, 3 waterbird/water; labels y = [class, group] under the
`group_labelled` task, so that every evaluation record carries the worst-group accuracy (tasks/groups.py).
Clients: the training digits split by `dirichlet_split(alpha)` over the ten digits (alpha = inf: equal shares).
Everything is a function of the seed.
"""
from __future__ import annotations

import numpy as np

from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.data.partition import dirichlet_split
from fedjax_flat.data.registry import register
from fedjax_flat.data.sources import builtin
from fedjax_flat.data.sources.spurious import check_strengths, client_strengths, group_dataset
from fedjax_flat.data.sources.spurious_real import WATERBIRDS_GROUPS
from fedjax_flat.schema import DataValue

# The places' tints (RGB): land green-brown, water blue. With the texture they tell the backgrounds apart, as a
# forest from an ocean; the digit's ink adds the same to every channel, so blue minus green keeps the place's sign.
TINTS = np.array([[0.45, 0.55, 0.20], [0.15, 0.40, 0.85]], np.float32)
BACKGROUND_MAX = 0.5      # backgrounds in [0, 0.5]: the ink (up to 1) stays the brightest
SALT = 0xB6D


def classes(digits: np.ndarray) -> np.ndarray:
  """Digit -> class: 0 (landbird) for 0-4, 1 (waterbird) for 5-9."""
  return (np.asarray(digits) >= 5).astype(np.int64)


def backgrounds(place: np.ndarray, rng: np.random.Generator, size: int = 8) -> np.ndarray:
  """One fresh background [size, size, 3] in [0, BACKGROUND_MAX] per entry of place (0 land, 1 water)."""
  place = np.asarray(place, np.int64)
  n = len(place)
  noise = rng.random((n, size + 2, size + 2))
  blobs = sum(noise[:, i:i + size, j:j + size] for i in range(3) for j in range(3)) / 9.0   # 3x3 box filter
  lo, hi = blobs.min(axis=(1, 2), keepdims=True), blobs.max(axis=(1, 2), keepdims=True)
  blobs = (blobs - lo) / np.maximum(hi - lo, 1e-6)
  period = rng.uniform(2.5, 4.0, (n, 1, 1))
  phase = rng.uniform(0, 2 * np.pi, (n, 1, 1))
  rows = np.arange(size, dtype=np.float64)[None, :, None]
  waves = np.broadcast_to(0.5 + 0.5 * np.sin(2 * np.pi * rows / period + phase), (n, size, size))
  field = np.where(place[:, None, None] == 1, waves, blobs)
  return (BACKGROUND_MAX * field[..., None] * TINTS[place][:, None, None, :]).astype(np.float32)


def compose(images: np.ndarray, place: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Grey digits [N, 8, 8] in [0, 1] over fresh backgrounds of their places -> [N, 8, 8, 3] float32."""
  d = np.asarray(images, np.float32)[..., None]
  return (d + (1.0 - d) * backgrounds(place, rng, images.shape[1])).astype(np.float32)


def draw_places(y: np.ndarray, strength, rng: np.random.Generator) -> np.ndarray:
  """Each example's place: its class's (place = class) with probability strength (scalar or per example), else
  the other."""
  y = np.asarray(y, np.int64)
  keep = rng.random(len(y)) < np.broadcast_to(np.asarray(strength, np.float64), y.shape)
  return np.where(keep, y, 1 - y)


def background_digits(images: np.ndarray, digits: np.ndarray, *, num_clients: int, strength: float,
                      strength_max: float = -1.0, alpha: float = float('inf'), test_fraction: float = 0.2,
                      seed: int = 0) -> FederatedDataset:
  """The Waterbirds-like federated dataset from grey images [N, 8, 8] in [0, 1] and digits [N] (module doc)."""
  rng = np.random.default_rng([int(seed), SALT])
  digits = np.asarray(digits, np.int64)
  test = np.sort(np.concatenate([rng.permutation(np.flatnonzero(digits == c))[
      :int(round(np.sum(digits == c) * test_fraction))] for c in range(10)]))
  train = np.setdiff1d(np.arange(len(digits)), test)
  splits = dirichlet_split(digits[train], num_clients, float(alpha), num_classes=10, seed=seed)
  rho_k = client_strengths(num_clients, strength, strength_max, seed)
  owner = np.full(len(train), -1, np.int64)
  for k, s in enumerate(splits):
    owner[s] = k
  # Examples no client holds (dirichlet_split's remainder) are never trained on; they get `strength` anyway.
  y_train = classes(digits[train])
  p_train = draw_places(y_train, np.where(owner >= 0, rho_k[np.maximum(owner, 0)], strength), rng)
  # The test digits: as many of each class (a seeded subsample of the larger), each on both places.
  y_test = classes(digits[test])
  n = int(min(np.sum(y_test == 0), np.sum(y_test == 1)))
  keep = np.sort(np.concatenate([rng.permutation(test[y_test == c])[:n] for c in (0, 1)]))
  t_img = np.repeat(images[keep], 2, axis=0)
  t_y = np.repeat(classes(digits[keep]), 2)
  t_place = np.tile(np.array([0, 1]), len(keep))
  spread = f'{strength}' if strength_max < 0 else f'[{strength}, {strength_max}]'
  return group_dataset(
      compose(images[train], p_train, rng), y_train, 2 * y_train + p_train, splits,
      compose(t_img, t_place, rng), t_y, 2 * t_y + t_place, num_classes=2, num_groups=4,
      group_names=WATERBIRDS_GROUPS, name=f'background_digits(strength={spread})', client_rho=rho_k)


def load_background_digits(num_clients: int = 20, strength: float = 0.9, strength_max: float = -1.0,
                           alpha: float = float('inf'), *, test_fraction: float = 0.2,
                           seed: int = 0) -> FederatedDataset:
  raw, target = builtin.digits_arrays()
  return background_digits(raw.astype(np.float32) / 16.0, target, num_clients=num_clients, strength=strength,
                           strength_max=strength_max, alpha=alpha, test_fraction=test_fraction, seed=seed)


RULES = {
    'strength': DataValue(None, 'number', lo=0, hi=1, what="spurious strength: the share of a client's digits on "
                          "their class's background (the lower end of the range when strength_max is set)"),
    'strength_max': DataValue(None, 'number', lo=-1, hi=1,
                              what='-1: every client has strength; else rho_k ~ U[strength, strength_max]'),
}


@register('background_digits', task='group_labelled', rules=RULES, check=check_strengths)
def _background_digits(num_clients=20, strength=0.9, strength_max=-1.0, alpha=float('inf'), test_fraction=0.2,
                       seed=0, **unused):
  del unused
  return load_background_digits(int(num_clients), float(strength), float(strength_max), float(alpha),
                                test_fraction=float(test_fraction), seed=int(seed))
