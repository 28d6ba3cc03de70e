"""digits32, the CIFAR-shaped stand-in built from the embedded digits (fedjax_flat/data/sources/digits32.py):
the digits' split kept, the image formula (bilinear upsampling, colour, background, noise), determinism."""
import numpy as np
import pytest

from fedjax_flat.data import registry
from fedjax_flat.data.sources import digits32
from fedjax_flat.data.sources.builtin import load_digits


def test_upsample_matrix_is_bilinear_and_keeps_constants():
  m = digits32._upsample_matrix(8, 32)
  np.testing.assert_allclose(m.sum(1), 1.0)                 # a constant image stays constant
  assert m.shape == (32, 8) and (m >= 0).all()
  # output pixel j sits at input position (j + 0.5) / 4 - 0.5: pixel 5 -> 0.875 (between 0 and 1)
  np.testing.assert_allclose(m[5, :2], [0.125, 0.875])
  np.testing.assert_allclose(m[0, 0], 1.0)                  # clamped at the border
  ramp = np.arange(8.0)
  np.testing.assert_allclose((m @ ramp)[2:30], (np.arange(32) + 0.5)[2:30] / 4 - 0.5)   # linear inside


def test_images_follow_the_formula_and_the_split_is_the_digits():
  ds = digits32.load_digits32(num_clients=10, alpha=0.5, noise=0.0, seed=3)
  base = load_digits(10, 0.5, seed=3)
  assert ds.x.shape == (len(base.x), 32, 32, 3) and ds.test_x.shape == (len(base.test_x), 32, 32, 3)
  np.testing.assert_array_equal(ds.y, base.y)
  np.testing.assert_array_equal(ds.client_index, base.client_index)
  np.testing.assert_array_equal(ds.client_offsets, base.client_offsets)
  np.testing.assert_array_equal(ds.test_y, base.test_y)
  # noise 0: every image is bg + (fg - bg) * upsampled shape, one colour pair per image
  m = digits32._upsample_matrix(8, 32)
  shape = m @ base.x[0, :, :, 0].astype(np.float64) @ m.T
  img = ds.x[0].astype(np.float64)
  lo, hi = np.unravel_index(np.argmin(shape), shape.shape), np.unravel_index(np.argmax(shape), shape.shape)
  bg_plus = img[lo] - (img[hi] - img[lo]) * shape[lo] / (shape[hi] - shape[lo])     # solve for bg and fg
  fg = bg_plus + (img[hi] - img[lo]) / (shape[hi] - shape[lo])
  np.testing.assert_allclose(img, bg_plus + (fg - bg_plus) * shape[..., None], atol=1e-5)
  assert (fg >= 0.6 - 1e-5).all() and (bg_plus <= 0.4 + 1e-5).all()   # a light stroke on a dark background


def test_noise_deterministic_and_registered():
  a = registry.get_dataset('digits32', num_clients=5, alpha=0.0, noise=0.2, seed=1)
  b = registry.get_dataset('digits32', num_clients=5, alpha=0.0, noise=0.2, seed=1)
  c = registry.get_dataset('digits32', num_clients=5, alpha=0.0, noise=0.2, seed=2)
  np.testing.assert_array_equal(a.x, b.x)
  assert not np.array_equal(a.x, c.x)
  clean = digits32.load_digits32(num_clients=5, alpha=0.0, noise=0.0, seed=1)
  resid = (a.x - clean.x).ravel()          # the same colours (drawn first), then N(0, 0.2^2) per pixel
  assert abs(resid.std() - 0.2) < 0.005 and abs(resid.mean()) < 0.005
  assert a.x.dtype == np.float32 and a.num_classes == 10


@pytest.mark.parametrize('alpha', [0.0, 0.5])
def test_cifar_standin_config_builds(alpha):
  from configs import cifar_standin
  cfg = cifar_standin.get_config(f'alpha={alpha},rounds=3')
  assert (cfg.dataset, cfg.model, cfg.rounds, cfg.data.alpha) == ('digits32', 'cifar_cnn', 3, alpha)
  with pytest.raises(ValueError, match='unknown keys'):
    cifar_standin.get_config('lr=1')
