"""Gradient inversion and the image metrics: PSNR / SSIM against NumPy written from their formulas, labels from
the bias gradient, the one-step delta, and a reconstruction far better than a random image."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.analysis import inversion as inv
from fedjax_flat.models.registry import get_model


def _np_ssim(x, y, data_range=1.0, win=7, sigma=1.5):
  """SSIM of two [H, W] images from Wang et al. (2004), window by window with explicit loops."""
  r = np.arange(win) - (win - 1) / 2
  g = np.exp(-r ** 2 / (2 * sigma ** 2))
  w2 = np.outer(g, g) / np.outer(g, g).sum()
  c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
  vals = []
  for i in range(x.shape[0] - win + 1):
    for j in range(x.shape[1] - win + 1):
      a, b = x[i:i + win, j:j + win], y[i:i + win, j:j + win]
      mx, my = (w2 * a).sum(), (w2 * b).sum()
      vx, vy = (w2 * (a - mx) ** 2).sum(), (w2 * (b - my) ** 2).sum()
      cxy = (w2 * (a - mx) * (b - my)).sum()
      vals.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2)))
  return np.mean(vals)


def test_ssim_and_psnr_match_their_formulas():
  rng = np.random.default_rng(0)
  x = rng.uniform(0, 1, (3, 9, 10, 2)).astype(np.float32)
  y = np.clip(x + rng.normal(0, 0.2, x.shape), 0, 1).astype(np.float32)
  y[2] = rng.uniform(0, 1, y[2].shape)                    # one unrelated pair
  got = np.asarray(inv.ssim(x, y, win_size=7))
  want = [np.mean([_np_ssim(x[n, ..., c].astype(np.float64), y[n, ..., c].astype(np.float64))
                   for c in range(2)]) for n in range(3)]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert got[0] > 0.5 and abs(got[2]) < 0.3
  np.testing.assert_allclose(np.asarray(inv.ssim(x, x)), 1.0, rtol=1e-5)
  # 11-wide default on 9x10 images: the largest odd window that fits, 9
  assert inv.ssim_window_size(9, 10) == 9
  np.testing.assert_allclose(np.asarray(inv.ssim(x[:1], y[:1])),
                             [np.mean([_np_ssim(x[0, ..., c], y[0, ..., c], win=9) for c in range(2)])],
                             rtol=1e-4)
  mse = ((x - y) ** 2).reshape(3, -1).mean(1)
  np.testing.assert_allclose(np.asarray(inv.psnr(x, y)), 10 * np.log10(1 / mse), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(inv.psnr(2 * x, 2 * y, data_range=2.0)), 10 * np.log10(1 / mse),
                             rtol=1e-5)


def test_labels_from_bias_gradient_and_gradient_from_delta():
  m = get_model('mlp', 10, (8, 8, 1), hidden=(16,))
  x = np.random.default_rng(1).uniform(0, 1, (1, 8, 8, 1)).astype(np.float32)
  params = m.init(jax.random.key(0), x)
  g = inv.batch_gradient(m.apply, params, x, np.array([7], np.int32))
  assert inv.infer_labels(g['Dense_1']['bias'], 1).tolist() == [7]
  lr, wd = 0.05, 4e-4
  delta = jax.tree_util.tree_map(lambda a, w: -lr * (a + wd * w), g, params)
  back = inv.gradient_from_delta(delta, lr, params, wd)
  for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(g)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.slow   # 13-25 s on 2 shared cores, mostly compiling the second-order program
def test_inversion_recovers_two_images_of_a_one_step_delta():
  """An MLP client's one-step SGD upload of two digits-like images: the reconstruction is far closer to the
  truth than a random image, and the cosine term falls to near 0."""
  m = get_model('mlp', 10, (8, 8, 1), hidden=(32,))
  rng = np.random.default_rng(2)
  x = np.zeros((2, 8, 8, 1), np.float32)              # two structured images: a bar and a block
  x[0, 1:7, 3:5] = 1.0
  x[1, 2:6, 1:7] = 0.7
  x += rng.uniform(0, 0.1, x.shape).astype(np.float32)
  y = np.array([1, 4], np.int32)
  params = m.init(jax.random.key(3), x[:1])
  lr = 0.1
  delta = jax.tree_util.tree_map(lambda a: -lr * a, inv.batch_gradient(m.apply, params, x, y))
  labels = inv.infer_labels(inv.gradient_from_delta(delta, lr)['Dense_1']['bias'], 2)
  assert labels.tolist() == [1, 4]
  out = inv.invert_gradients(m.apply, params, inv.gradient_from_delta(delta, lr), labels, x.shape,
                             jax.random.key(4), steps=200, lr=0.1, tv_weight=1e-3)
  cos = np.asarray(out['cosine'])
  assert cos.shape == (201,) and cos[-1] < 0.05 * cos[0]
  s = inv.score_reconstruction(out['x'], x)
  assert np.all(s['psnr'] > s['psnr_random'] + 10), s
  assert np.all(s['ssim'] > 0.8) and np.all(s['ssim_random'] < 0.3), s
  assert float(jnp.min(out['x'])) >= 0.0 and float(jnp.max(out['x'])) <= 1.0
