"""The coloured digits (data/sources/spurious.py): every image is its digit times its colour, the colour agrees
with the class at each client's own strength rho_k, the test split shows every digit in every colour, and the
group of every example is 2 * class + agrees."""
import numpy as np
import pytest

from fedjax_flat.config import validate
from fedjax_flat.data import registry
from fedjax_flat.data.sources import builtin
from fedjax_flat.data.sources import spurious as sp
from fedjax_flat.errors import ConfigError
from tests.fixtures.configs import set_fields
from configs import spurious as family


def _colour_of(x):
  """The colour index of coloured images [N, 8, 8, 3] (their brightest pixel's RGB over its grey value)."""
  flat = x.reshape(len(x), -1, 3)
  i = np.argmax(flat.sum(-1), axis=1)
  rgb = flat[np.arange(len(x)), i]
  rgb = rgb / rgb.max(axis=1, keepdims=True)
  return np.argmin(np.abs(rgb[:, None, :] - sp.COLOURS[None]).sum(-1), axis=1)


def test_images_groups_and_per_client_strength():
  ds = registry.get_dataset('spurious_digits', num_clients=6, strength=0.6, strength_max=1.0, seed=4)
  raw, target = builtin.digits_arrays()
  grey = raw.astype(np.float32) / 16.0
  colours = _colour_of(ds.x)
  cls, grp = ds.y[:, 0], ds.y[:, 1]
  np.testing.assert_array_equal(grp, 2 * cls + (colours == cls))
  # every image is a source digit of its class times its colour
  for x, c, col in list(zip(ds.x, cls, colours))[:40]:
    cand = grey[target == c][..., None] * sp.COLOURS[col]
    assert np.any(np.all(np.abs(cand - x[None]) < 1e-6, axis=(1, 2, 3)))
  rho = ds.client_rho
  assert rho.shape == (6,) and np.all((rho >= 0.6) & (rho <= 1.0)) and np.ptp(rho) > 0.05
  for k in range(6):
    agree = np.mean(ds.client_labels(k)[:, 1] % 2)
    n = len(ds.client_labels(k))
    assert abs(agree - rho[k]) < 4 * np.sqrt(rho[k] * (1 - rho[k]) / n) + 0.02
  # the same seed gives the same data; another seed other strengths
  again = registry.get_dataset('spurious_digits', num_clients=6, strength=0.6, strength_max=1.0, seed=4)
  np.testing.assert_array_equal(again.x, ds.x)
  assert not np.allclose(sp.client_strengths(6, 0.6, 1.0, 5), rho)


def test_balanced_test_split_and_test_strength():
  ds = registry.get_dataset('spurious_digits', num_clients=4, strength=1.0, test_fraction=0.1)
  assert np.all(ds.y[:, 1] % 2 == 1)                                  # strength 1: every digit in its colour
  n_digits = len(ds.test_y) // 10
  colours = _colour_of(ds.test_x)
  np.testing.assert_array_equal(colours, np.tile(np.arange(10), n_digits))   # every test digit in every colour
  np.testing.assert_array_equal(ds.test_y[:, 1], 2 * ds.test_y[:, 0] + (colours == ds.test_y[:, 0]))
  assert ds.task.num_groups == 20 and len(ds.group_names) == 20
  once = registry.get_dataset('spurious_digits', num_clients=4, strength=1.0, test_fraction=0.1, test_strength=0.0)
  assert len(once.test_y) == n_digits and np.all(once.test_y[:, 1] % 2 == 0)   # never the class's colour


@pytest.mark.parametrize('field,value,match', [
    ('strength_max', 0.5, 'strength_max'), ('test_strength', -0.5, 'test_strength'), ('strength', 1.5, 'strength')])
def test_bad_fields_are_refused_before_loading(field, value, match):
  c = set_fields(family.get_config('fedavg,strong'), {f'data.{field}': value})
  with pytest.raises(ConfigError, match=match):
    validate.validate_config(c)


def test_family_cells_validate():
  for cell in family.CELLS:
    validate.validate_config(family.get_config(cell))
  assert family.get_config('fedsam,weak').client.optimizer == 'sam'
  assert family.get_config('fedavg,weak').data.strength_max == -1.0
