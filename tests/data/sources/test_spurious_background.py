"""The Waterbirds-like digits (data/sources/spurious_background.py): every image is its digit over a background of
its place, each client's place agrees with the class at its own strength rho_k, the groups are 2 * class + place,
the test split is group-balanced (every test digit on both places), and everything follows the seed."""
import numpy as np
import pytest

from fedjax_flat.config import validate
from fedjax_flat.data import registry
from fedjax_flat.data.sources import builtin
from fedjax_flat.data.sources import spurious_background as sb
from fedjax_flat.data.sources.spurious_real import WATERBIRDS_GROUPS
from fedjax_flat.errors import ConfigError
from tests.fixtures.configs import set_fields
from configs import spurious as family


def _place_of(x):
  """0 (land) or 1 (water) from the pixels: blue above green over the image (the ink adds equally to both)."""
  return ((x[..., 2] - x[..., 1]).mean(axis=(1, 2)) > 0).astype(np.int64)


def test_backgrounds_are_fresh_fields_in_range_told_apart_by_their_tint():
  rng = np.random.default_rng(0)
  place = np.array([0, 1] * 50)
  bg = sb.backgrounds(place, rng)
  assert bg.shape == (100, 8, 8, 3) and bg.min() >= 0 and bg.max() <= sb.BACKGROUND_MAX + 1e-6
  np.testing.assert_array_equal(_place_of(bg), place)
  assert not np.allclose(bg[0], bg[2]) and not np.allclose(bg[1], bg[3])      # a fresh field per image
  # water: waves along the rows (every row constant), land: blobs (rows vary)
  assert np.allclose(np.ptp(bg[1::2], axis=2), 0) and np.ptp(bg[0::2], axis=2).max() > 0.05


def test_images_groups_and_per_client_strength():
  ds = registry.get_dataset('background_digits', num_clients=6, strength=0.6, strength_max=1.0, seed=4)
  raw, target = builtin.digits_arrays()
  grey = raw.astype(np.float32) / 16.0
  cls, grp = ds.y[:, 0], ds.y[:, 1]
  place = _place_of(ds.x)
  assert set(np.unique(cls)) == {0, 1} and ds.task.num_groups == 4 and ds.group_names == WATERBIRDS_GROUPS
  np.testing.assert_array_equal(grp, 2 * cls + place)
  assert ds.x.min() >= 0 and ds.x.max() <= 1
  # every image is a source digit of its class on top (full ink: 1 in every channel; elsewhere at least the ink)
  for x, c in list(zip(ds.x, cls))[:40]:
    cand = grey[sb.classes(target) == c]
    ink = cand >= 1.0
    fits = [np.all(x[m] == 1.0) and np.all(x.min(-1) >= g - 1e-6) for g, m in zip(cand, ink)]
    assert any(fits)
  rho = ds.client_rho
  assert rho.shape == (6,) and np.all((rho >= 0.6) & (rho <= 1.0)) and np.ptp(rho) > 0.05
  for k in range(6):
    lab = ds.client_labels(k)
    agree = np.mean(lab[:, 1] % 2 == lab[:, 0])       # place == class
    n = len(lab)
    assert abs(agree - rho[k]) < 4 * np.sqrt(rho[k] * (1 - rho[k]) / n) + 0.02, (k, agree, rho[k])
  again = registry.get_dataset('background_digits', num_clients=6, strength=0.6, strength_max=1.0, seed=4)
  np.testing.assert_array_equal(again.x, ds.x)
  np.testing.assert_array_equal(again.test_x, ds.test_x)
  other = registry.get_dataset('background_digits', num_clients=6, strength=0.6, strength_max=1.0, seed=5)
  assert not np.allclose(other.client_rho, rho)


def test_the_test_split_is_group_balanced_with_every_digit_on_both_places():
  ds = registry.get_dataset('background_digits', num_clients=4, strength=1.0, test_fraction=0.2)
  assert np.all(ds.y[:, 1] % 2 == ds.y[:, 0])               # strength 1: every training digit on its place
  counts = np.bincount(ds.test_y[:, 1], minlength=4)
  assert counts.min() == counts.max() > 0
  place = _place_of(ds.test_x)
  np.testing.assert_array_equal(place, np.tile([0, 1], len(place) // 2))
  np.testing.assert_array_equal(ds.test_y[:, 1], 2 * ds.test_y[:, 0] + place)
  ink = lambda x: x.min(-1) >= 1.0
  assert all(np.array_equal(ink(a), ink(b)) for a, b in zip(ds.test_x[0::2], ds.test_x[1::2]))   # the same digit


@pytest.mark.parametrize('field,value,match', [
    ('strength', 1.5, 'data.strength=1.5'),
    ('strength_max', 0.5, 'data.strength_max=0.5'),        # below strength 0.9
])
def test_bad_strengths_are_one_config_error_line(field, value, match):
  c = set_fields(family.get_config('fedavg,strong,background'), {f'data.{field}': value})
  with pytest.raises(ConfigError, match=match) as e:
    validate.validate_config(c)
  assert '\n' not in str(e.value)


def test_the_family_cells():
  assert family.get_config('fedavg,strong,background').dataset == 'background_digits'
  assert family.get_config('fedavg,none,background').data.strength == 0.5       # 1 / 2 places: no information
  assert family.get_config('fedsam,weak').dataset == 'spurious_digits'
  assert sum(c.endswith('background') for c in family.CELLS) == 6
