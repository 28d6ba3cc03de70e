"""Segmentation augmentations on the device: against a numpy resize -> pad -> crop reference, label values
preserved (only original ids or 255), shapes, determinism, one compile under vmap + scan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.data.transforms import augment as A
from fedjax_flat.data.transforms.transform import Transform

KEY = jax.random.PRNGKey(0)


def _pair(b=4, h=20, w=36, seed=0, ids=(0, 3, 7, 11, 18, 255)):
  rng = np.random.default_rng(seed)
  x = rng.random((b, h, w, 3)).astype(np.float32)
  # Blocky label maps so that nearest-neighbour resampling is well defined.
  blocks = rng.choice(np.array(ids, np.uint8), (b, h // 4 + 1, w // 4 + 1))
  y = np.repeat(np.repeat(blocks, 4, 1), 4, 2)[:, :h, :w]
  return x, y


def _np_resize(x, y, oh, ow):
  """Independent reference: half-pixel bilinear (edges replicated, no antialias) and nearest, numpy float64."""
  h, w = y.shape

  def coords(n_out, n_in):
    src = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
    i0 = np.floor(src).astype(int)
    return np.clip(i0, 0, n_in - 1), np.clip(i0 + 1, 0, n_in - 1), src - i0, np.clip(
        np.floor((np.arange(n_out) + 0.5) * n_in / n_out).astype(int), 0, n_in - 1)

  r0, r1, wr, rn = coords(oh, h)
  c0, c1, wc, cn = coords(ow, w)
  xr = x[r0] * (1 - wr)[:, None, None] + x[r1] * wr[:, None, None]
  xo = xr[:, c0] * (1 - wc)[None, :, None] + xr[:, c1] * wc[None, :, None]
  return xo, y[rn][:, cn]


def test_scale_crop_equals_resize_pad_crop_reference():
  x, y = _pair()
  crop = (16, 24)
  f = jax.jit(lambda k: (A.random_scale_crop_pair(k, x, y, crop, (0.4, 1.6)),
                         A.sample_scale_crop(k, 4, 20, 36, crop, (0.4, 1.6))))
  for seed in range(3):
    (xo, yo), p = f(jax.random.PRNGKey(seed))
    p = jax.tree_util.tree_map(np.asarray, p)
    for b in range(4):
      ih, iw = (int(round(v)) for v in p['extent'][b])
      # The release's cv2 rule: size ceil(H s); pad (crop - size) // 2 + 1 each side when smaller; crop.
      ph = (crop[0] - ih) // 2 + 1 if ih < crop[0] else 0
      pw = (crop[1] - iw) // 2 + 1 if iw < crop[1] else 0
      rx, ry = _np_resize(x[b].astype(np.float64), y[b], ih, iw)
      rx = np.pad(rx, ((ph, ph), (pw, pw), (0, 0)))
      ry = np.pad(ry, ((ph, ph), (pw, pw)), constant_values=255)
      sh, sw = int(p['offset'][b][0]) + ph, int(p['offset'][b][1]) + pw
      assert 0 <= sh <= rx.shape[0] - crop[0] and 0 <= sw <= rx.shape[1] - crop[1]
      np.testing.assert_allclose(np.asarray(xo[b]), rx[sh:sh + crop[0], sw:sw + crop[1]], atol=2e-5)
      np.testing.assert_array_equal(np.asarray(yo[b]), ry[sh:sh + crop[0], sw:sw + crop[1]])


def test_scale_sampling_follows_the_release_rule():
  p = jax.jit(lambda k: A.sample_scale_crop(k, 4000, 1024, 2048, (512, 1024), (0.5, 1.5)))(KEY)
  s = np.asarray(p['scale'])[:, 0]
  assert 0.5 <= s.min() and s.max() <= 1.5 and abs(s.mean() - 1.0) < 0.02
  ext = np.asarray(p['extent'])
  np.testing.assert_array_equal(ext, np.ceil(ext))        # ceil(H s), ceil(W s): integer sizes
  # scale 0.5 of 1024 x 2048 is exactly the 512 x 1024 crop: no padding, offset 0.
  q = jax.jit(lambda k: A.sample_scale_crop(k, 2, 1024, 2048, (512, 1024), (0.5, 0.5)))(KEY)
  np.testing.assert_array_equal(np.asarray(q['offset']), 0)


@pytest.mark.parametrize('mode,scale', [('scale_crop', (0.5, 1.5)), ('scale_crop', (0.2, 0.4)),
                                        ('resized_crop', (0.5, 2.0))])
def test_label_values_preserved_and_shapes(mode, scale):
  x, y = _pair(b=6, ids=(1, 4, 9, 13))
  f = jax.jit(lambda k: A.random_scale_crop_pair(k, x, y, (16, 28), scale, mode))
  for seed in range(4):
    xo, yo = f(jax.random.PRNGKey(seed))
    assert xo.shape == (6, 16, 28, 3) and yo.shape == (6, 16, 28) and yo.dtype == y.dtype
    assert set(np.unique(np.asarray(yo))) <= {1, 4, 9, 13, 255}
    assert float(xo.min()) >= 0.0 and float(xo.max()) <= 1.0
  if scale == (0.2, 0.4):       # always smaller than the crop: padding is ignore / zero
    assert (np.asarray(yo)[:, 0, :] == 255).all() and (np.asarray(xo)[:, 0, :, :] == 0).all()
  else:
    assert (np.asarray(yo) != 255).mean() > 0.5


def test_identity_and_determinism():
  x, y = _pair()
  xo, yo = jax.jit(lambda k: A.random_scale_crop_pair(k, x, y, (20, 36), (1.0, 1.0)))(KEY)
  np.testing.assert_allclose(np.asarray(xo), x, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(yo), y)
  xs, ys = jax.jit(lambda a, b: A.resize_pair(a, b, (20, 36)))(x, y)
  np.testing.assert_allclose(np.asarray(xs), x, atol=1e-6)
  aug = jax.jit(A.make_seg_augment(crop=(12, 20), scale=(0.5, 2.0), jitter=0.3))
  batch = {'x': (x * 255).astype(np.uint8), 'y': y, 'mask': np.ones(4, np.float32)}
  a, b, c = aug(KEY, batch), aug(KEY, batch), aug(jax.random.PRNGKey(1), batch)
  np.testing.assert_array_equal(np.asarray(a['x']), np.asarray(b['x']))
  np.testing.assert_array_equal(np.asarray(a['y']), np.asarray(b['y']))
  assert not np.array_equal(np.asarray(a['x']), np.asarray(c['x']))


def test_resized_crop_mode_uses_the_torchvision_boxes():
  x, y = _pair(b=3)
  crop = (10, 18)
  (xo, yo), boxes = jax.jit(lambda k: (A.random_scale_crop_pair(k, x, y, crop, (0.3, 1.0), 'resized_crop'),
                                       A.sample_resized_crop_boxes(k, 3, 20, 36, (0.3, 1.0), (3 / 4, 4 / 3))))(KEY)
  boxes = np.asarray(boxes)
  for b, (top, left, bh, bw) in enumerate(boxes):
    rx, ry = _np_resize(x[b, top:top + bh, left:left + bw].astype(np.float64), y[b, top:top + bh, left:left + bw],
                        *crop)
    # Inside the box the bilinear taps may read one pixel beyond it (the full image is the source).
    np.testing.assert_array_equal(np.asarray(yo[b]), ry)
    np.testing.assert_allclose(np.asarray(xo[b])[1:-1, 1:-1], rx[1:-1, 1:-1], atol=0.35)


def test_flip_pair_is_joint():
  x, y = _pair(b=16)
  y = (x[..., 0] * 10).astype(np.uint8)               # the label is a function of the pixel
  xo, yo = jax.jit(A.random_flip_pair)(KEY, x, y)
  np.testing.assert_array_equal(np.asarray(yo), (np.asarray(xo)[..., 0] * 10).astype(np.uint8))
  flipped = [not np.array_equal(np.asarray(xo[b]), x[b]) for b in range(16)]
  assert 0 < sum(flipped) < 16


def test_color_jitter_formula_and_range():
  x, _ = _pair(b=5)
  out = np.asarray(jax.jit(lambda k, a: A.color_jitter(k, a, 0.4))(KEY, x))
  keys = jax.random.split(KEY, 3)
  f = [np.asarray(jax.random.uniform(k, (5, 1, 1, 1), minval=0.6, maxval=1.4)) for k in keys]
  ref = np.clip(x * f[0], 0, 1)
  ref = np.clip(74 / 255 + (ref - 74 / 255) * f[1], 0, 1)
  m = np.stack([np.array([[1 + 2 * r, 1 - r, 1 - r], [1 - r, 1 + 2 * r, 1 - r], [1 - r, 1 - r, 1 + 2 * r]]) / 3
                for r in f[2][:, 0, 0, 0]])
  ref = np.clip(np.einsum('bhwc,bcd->bhwd', ref, m), 0, 1)     # the release's saturation matrix
  np.testing.assert_allclose(out, ref, atol=1e-5)
  np.testing.assert_allclose(np.asarray(jax.jit(lambda k, a: A.color_jitter(k, a, 0.0))(KEY, x)), x, atol=1e-6)


def test_make_seg_augment_contract_and_one_compile_under_vmap_scan():
  x, y = _pair(b=4, h=24, w=40)
  aug = A.make_seg_augment(crop=(16, 32), scale=(0.5, 1.5), mean=A.FEDDRIVE_MEAN, std=A.FEDDRIVE_STD)
  assert isinstance(aug, Transform) and not aug.needs_client   # (rng, batch) -> batch; no style bank
  traces = []

  def client(key, xb, yb, mb):                         # scan over S steps of one client, as the engine
    def body(c, s):
      traces.append(1)
      out = aug(jax.random.fold_in(key, s), {'x': xb[s], 'y': yb[s], 'mask': mb[s]})
      return c + jnp.sum(out['y'] == 255), (out['x'], out['y'])
    return jax.lax.scan(body, 0, jnp.arange(xb.shape[0]))

  run = jax.jit(jax.vmap(client))
  xs = np.broadcast_to((x * 255).astype(np.uint8), (2, 3) + x.shape)       # [clients, steps, B, H, W, 3]
  ys = np.broadcast_to(y, (2, 3) + y.shape)
  ms = np.ones((2, 3, 4), np.float32)
  keys = jax.random.split(KEY, 2)
  _, (xo, yo) = run(keys, xs, ys, ms)
  _, (xo2, _) = run(jax.random.split(jax.random.PRNGKey(9), 2), xs, ys, ms)
  assert len(traces) == 1                              # traced once, reused for new keys
  assert xo.shape == (2, 3, 4, 16, 32, 3) and xo.dtype == jnp.float32 and yo.dtype == jnp.int32
  assert float(xo.min()) >= -1.0 and float(xo.max()) <= 1.0           # (x - 0.5) / 0.5
  assert set(np.unique(np.asarray(yo))) <= set(np.unique(y)) | {255}
  assert not np.array_equal(np.asarray(xo[0, 0]), np.asarray(xo[1, 0]))   # clients draw differently
  pre = A.make_seg_preprocess()
  np.testing.assert_allclose(np.asarray(pre(np.full((1, 2, 2, 3), 255, np.uint8))), 1.0)


def test_bad_shapes_and_modes():
  x, y = _pair()
  with pytest.raises(ValueError, match='label maps'):
    A.random_scale_crop_pair(KEY, x, y[:, :-1], (8, 8))
  with pytest.raises(ValueError, match='mode'):
    A.make_seg_augment(crop=(8, 8), mode='random')
