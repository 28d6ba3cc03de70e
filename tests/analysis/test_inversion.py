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


def _client_tx(optimizer, lr, rho=0.0, weight_decay=0.0, momentum=0.0):
  import ml_collections
  from fedjax_flat.optimizers.client import make_client_tx
  cfg = ml_collections.ConfigDict({'optimizer': optimizer, 'weight_decay': weight_decay, 'momentum': momentum,
                                   'base_optimizer': 'sgd', 'asam_eta': 0.0})
  return make_client_tx(cfg, {'lr': lr, 'rho': rho})


def _tiny():
  m = get_model('mlp', 10, (4, 4, 1), hidden=(8,))
  rng = np.random.default_rng(0)
  x = rng.uniform(0, 1, (4, 4, 4, 1)).astype(np.float32)
  y = np.array([1, 4, 4, 7], np.int32)
  return m, m.init(jax.random.key(1), x[:1]), x, y


def _sub(a, b):
  return jax.tree_util.tree_map(lambda u, v: np.asarray(u) - np.asarray(v), a, b)


def _close(a, b, **kw):
  for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), **kw)


def test_local_update_is_the_client_optimizers_steps():
  """local_update against the formulas: one SGD step is -lr (g + wd w); one SAM step is -lr (grad at
  w + rho g / ||g|| + wd w); three SGD-momentum steps over minibatches of 2 follow the heavy-ball recursion on the
  slices 0, 1, 0."""
  m, w, x, y = _tiny()
  lr, wd, rho = 0.1, 1e-2, 0.05
  grad = lambda p, xb, yb: inv.batch_gradient(m.apply, p, xb, yb)   # noqa: E731
  got = inv.local_update(m.apply, w, x, y, _client_tx('sgd', lr, weight_decay=wd))
  _close(got, jax.tree_util.tree_map(lambda g, p: -lr * (g + wd * p), grad(w, x, y), w), rtol=1e-4, atol=1e-7)

  g = grad(w, x, y)
  norm = np.sqrt(sum(float(np.sum(np.square(a))) for a in jax.tree_util.tree_leaves(g)))
  w_adv = jax.tree_util.tree_map(lambda p, a: p + rho * a / (norm + 1e-12), w, g)
  want = jax.tree_util.tree_map(lambda a, p: -lr * (a + wd * p), grad(w_adv, x, y), w)
  got = inv.local_update(m.apply, w, x, y, _client_tx('sam', lr, rho=rho, weight_decay=wd))
  _close(got, want, rtol=1e-4, atol=1e-7)

  mu, p, buf = 0.9, w, None
  for s in range(3):
    sl = slice(2 * (s % 2), 2 * (s % 2) + 2)
    gs = grad(p, x[sl], y[sl])
    buf = gs if buf is None else jax.tree_util.tree_map(lambda b, a: a + mu * b, buf, gs)
    p = jax.tree_util.tree_map(lambda q, b: q - lr * b, p, buf)
  got = inv.local_update(m.apply, w, x, y, _client_tx('sgd', lr, momentum=mu), steps=3, batch_size=2)
  _close(got, _sub(p, w), rtol=1e-4, atol=1e-7)
  with pytest.raises(ValueError, match='batch_size=3 must divide the 4 images'):
    inv.local_update(m.apply, w, x, y, _client_tx('sgd', lr), batch_size=3)


def test_dp_observed_clips_then_adds_the_noise():
  rng = np.random.default_rng(5)
  up = {'a': jnp.asarray(rng.normal(size=(200, 100)), jnp.float32), 'b': jnp.asarray(rng.normal(size=7), jnp.float32)}
  norm = np.sqrt(sum(float(np.sum(np.square(v))) for v in up.values()))
  clipped = inv.dp_observed(up, jax.random.key(0), clip=2.0, noise_std=0.0)
  _close(clipped, jax.tree_util.tree_map(lambda v: v * (2.0 / norm), up), rtol=1e-5)
  same = inv.dp_observed(up, jax.random.key(0), clip=10 * norm, noise_std=0.0)
  _close(same, up, rtol=0, atol=0)
  noisy = inv.dp_observed(up, jax.random.key(0), clip=2.0, noise_std=0.3)
  noise = np.asarray(noisy['a'] - clipped['a']).ravel()
  assert abs(noise.std() - 0.3) < 0.01 and abs(noise.mean()) < 0.01
  again = inv.dp_observed(up, jax.random.key(0), clip=2.0, noise_std=0.3)
  _close(noisy, again, rtol=0, atol=0)    # the key decides the noise


@pytest.mark.slow   # second-order autodiff through two SAM steps: ~20-40 s on 2 shared cores
def test_inversion_of_a_two_step_sam_upload():
  """A SAM client's upload of two local steps (what FedSAM sends, not a gradient): inverting it through the
  unrolled SAM steps recovers the two images far better than a random image; DP noise of the size a
  release carries (std >> the clipped upload's coordinates) leaves only a random image."""
  m = get_model('mlp', 10, (8, 8, 1), hidden=(32,))
  rng = np.random.default_rng(2)
  x = np.zeros((2, 8, 8, 1), np.float32)
  x[0, 1:7, 3:5] = 1.0
  x[1, 2:6, 1:7] = 0.7
  x += rng.uniform(0, 0.1, x.shape).astype(np.float32)
  y = np.array([1, 4], np.int32)
  params = m.init(jax.random.key(3), x[:1])
  upload = inv.ClientUpload(m.apply, tx=_client_tx('sam', 0.1, rho=0.05), steps=2)
  delta = upload(params, x, y)
  out = inv.invert_upload(upload, params, delta, y, x.shape, jax.random.key(4), steps=200, lr=0.1, tv_weight=1e-3)
  cos = np.asarray(out['cosine'])
  assert cos[-1] < 0.05 * cos[0] and out['nonfinite_steps'] == 0
  s = inv.score_reconstruction(out['x'], x)
  assert np.all(s['psnr'] > s['psnr_random'] + 10), s
  noisy = inv.dp_observed(delta, jax.random.key(7), clip=0.1, noise_std=0.1)
  out = inv.invert_upload(upload, params, noisy, y, x.shape, jax.random.key(4), steps=200, lr=0.1, tv_weight=1e-3)
  s = inv.score_reconstruction(out['x'], x)
  assert np.all(s['psnr'] < s['psnr_random'] + 5), s
