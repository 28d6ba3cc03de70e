"""On-device augmentation: exactness against numpy for the sampled parameters, determinism, jit and vmap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.data.transforms import augment as A

KEY = jax.random.PRNGKey(0)


def J(fn, *static):
  """Jitted version (one compile instead of many eager op compiles; also checks jit compatibility)."""
  return jax.jit(fn, static_argnums=static)


def _batch(b=8, h=12, w=10, c=3, seed=1):
  return jax.random.uniform(jax.random.PRNGKey(seed), (b, h, w, c))


def test_random_crop_matches_numpy_window():
  x = _batch()
  pad = 4
  out = np.asarray(J(A.random_crop, 2)(KEY, x, pad))
  offsets = np.asarray(A.sample_crop_offsets(KEY, x.shape[0], pad))
  assert offsets.min() >= 0 and offsets.max() <= 2 * pad
  xp = np.pad(np.asarray(x), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  for b, (oy, ox) in enumerate(offsets):
    np.testing.assert_array_equal(out[b], xp[b, oy:oy + 12, ox:ox + 10])
  assert out.shape == x.shape
  # Offsets differ across the batch (per-example randomness).
  assert len({tuple(o) for o in offsets}) > 1


def test_random_flip_exact():
  x = _batch(b=16)
  out = np.asarray(J(A.random_flip)(KEY, x))
  flips = np.asarray(jax.random.bernoulli(KEY, 0.5, (16,)))
  assert 0 < flips.sum() < 16
  for b in range(16):
    np.testing.assert_array_equal(out[b], np.asarray(x)[b, :, ::-1] if flips[b] else np.asarray(x)[b])


def test_normalize_and_constants():
  x = jnp.full((1, 2, 2, 3), 0.5)
  y = np.asarray(A.normalize(x, A.CIFAR10_MEAN, A.CIFAR10_STD))
  np.testing.assert_allclose(y[0, 0, 0], (0.5 - np.array(A.CIFAR10_MEAN)) / np.array(A.CIFAR10_STD),
                             rtol=1e-6)
  assert A.CIFAR100_MEAN == (0.5071, 0.4867, 0.4408) and A.CIFAR100_STD == (0.2675, 0.2565, 0.2761)
  assert A.IMAGENET_MEAN == (0.485, 0.456, 0.406) and A.IMAGENET_STD == (0.229, 0.224, 0.225)
  assert float(A.to_float(jnp.full((1, 1, 1, 1), 255, jnp.uint8))[0, 0, 0, 0]) == 1.0


def test_cutout_exact_square():
  b, h, w, size = 64, 16, 16, 6
  x = jnp.ones((b, h, w, 2))
  out = np.asarray(J(A.cutout, 2)(KEY, x, size))
  centers = np.asarray(J(A.sample_cutout_centers, 1, 2, 3)(KEY, b, h, w))
  inside = 0
  for i, (cy, cx) in enumerate(centers):
    y0, x0 = cy - size // 2, cx - size // 2
    expect = np.ones((h, w, 2), np.float32)
    expect[max(y0, 0):max(y0 + size, 0), max(x0, 0):max(x0 + size, 0)] = 0
    np.testing.assert_array_equal(out[i], expect)
    zeros = int((out[i, :, :, 0] == 0).sum())
    assert np.all(out[i, :, :, 1][out[i, :, :, 0] == 0] == 0)     # all channels of a pixel
    if y0 >= 0 and x0 >= 0 and y0 + size <= h and x0 + size <= w:
      assert zeros == size * size
      inside += 1
    else:
      assert zeros < size * size
  assert 0 < inside < b


def test_mixup_convex():
  x = _batch(b=6)
  yi = jnp.arange(6) % 4
  y = jax.nn.one_hot(yi, 4)
  keys = jax.random.split(KEY, 3)
  label_fn = A.make_label_augment('mixup', alpha=1.0, num_classes=4)

  @jax.jit
  def run(k):
    return dict(
        mix=A.mixup(k, x, y, 1.0), params=A.sample_mixup_params(k, 6, 1.0),
        mix04=A.mixup(k, x, y, 0.4), params04=A.sample_mixup_params(k, 6, 0.4),
        factory=label_fn(k, x, yi), off=A.mixup(k, x, y, 0.0),
        vmapped=jax.vmap(label_fn, in_axes=(0, None, None))(keys, x, yi),
        single=label_fn(keys[1], x, yi))
  r = jax.device_get(run(KEY))
  x, y = np.asarray(x), np.asarray(y)
  for mix, (lam, perm) in ((r['mix'], r['params']), (r['mix04'], r['params04'])):
    lam, perm = float(lam), np.asarray(perm)
    assert 0.0 <= lam <= 1.0 and sorted(perm.tolist()) == list(range(6))
    xm, ym = mix
    np.testing.assert_allclose(xm, lam * x + (1 - lam) * x[perm], atol=1e-6)
    np.testing.assert_allclose(ym, lam * y + (1 - lam) * y[perm], atol=1e-6)
    np.testing.assert_allclose(ym.sum(-1), 1.0, atol=1e-6)
  assert float(r['params'][0]) != float(r['params04'][0])
  # Integer labels through the factory give the same mix; alpha <= 0 disables mixing.
  np.testing.assert_allclose(r['factory'][1], r['mix'][1], atol=1e-6)
  np.testing.assert_array_equal(r['off'][0], x)
  # vmap over clients (one key each) equals the per-client call.
  assert r['vmapped'][0].shape == (3, 6, 12, 10, 3) and r['vmapped'][1].shape == (3, 6, 4)
  np.testing.assert_allclose(r['vmapped'][0][1], r['single'][0], atol=1e-6)
  np.testing.assert_allclose(r['vmapped'][1][1], r['single'][1], atol=1e-6)


def test_random_resized_crop():
  const = jnp.full((3, 20, 14, 3), 0.3)
  x = _batch(b=3, h=20, w=16)
  box = jnp.array([[2, 3, 8, 8]] * 3)

  @jax.jit
  def run(k):
    return dict(
        const=A.random_resized_crop(k, const, 8),
        # Full box (scale 1, ratio = the image's) is a plain resize.
        full=A.random_resized_crop(k, x, 8, (1.0, 1.0), (16 / 20, 16 / 20)),
        ref=jax.image.resize(x, (3, 8, 8, 3), 'linear'),
        boxes=A.sample_resized_crop_boxes(k, 256, 32, 32),
        # Impossible ranges fall back to torchvision's centre crop clamped to the ratio range.
        fallback=A.sample_resized_crop_boxes(k, 2, 32, 32, (1.0, 1.0), (2.0, 3.0)),
        # An integer box resampled at its own size is the numpy slice.
        window=A.crop_and_resize(x, box, 8))
  r = jax.device_get(run(KEY))
  assert r['const'].shape == (3, 8, 8, 3)
  np.testing.assert_allclose(r['const'], 0.3, atol=1e-5)
  np.testing.assert_allclose(r['full'], r['ref'], atol=1e-5)
  top, left, h, w = r['boxes'].T
  assert (top >= 0).all() and (left >= 0).all() and (top + h <= 32).all() and (left + w <= 32).all()
  area = h * w / 1024
  assert area.min() >= 0.05 and area.max() <= 1.0 and area.std() > 0.1
  assert (w / h).min() >= 0.6 and (w / h).max() <= 1.6
  np.testing.assert_array_equal(r['fallback'], [[8, 0, 16, 32]] * 2)
  np.testing.assert_allclose(r['window'], np.asarray(x)[:, 2:10, 3:11], atol=1e-5)


def _all_pipelines():
  return {
      'cifar10_cutout': (A.make_augment('cifar10_cutout'), (16, 16)),
      'landmarks': (A.make_augment('landmarks', out_size=12), (20, 16)),
  }


@pytest.mark.parametrize('name', ['cifar10_cutout', 'landmarks'])
def test_determinism_jit_vmap(name):
  fn, (h, w) = _all_pipelines()[name]
  fn = jax.jit(fn)
  x = _batch(b=4, h=h, w=w)
  a = fn(KEY, x)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(fn(KEY, x)))
  assert not np.allclose(np.asarray(a), np.asarray(fn(jax.random.PRNGKey(7), x)))
  # vmap over a client axis: client i with key i equals the call on client i alone.
  keys = jax.random.split(KEY, 2)
  xs = jnp.stack([x, x[::-1]])
  out = jax.jit(jax.vmap(fn))(keys, xs)
  for i in range(2):
    np.testing.assert_allclose(np.asarray(out[i]), np.asarray(fn(keys[i], xs[i])), atol=1e-5)


def test_factories():
  x = _batch(b=2, h=8, w=8)
  np.testing.assert_allclose(np.asarray(A.make_preprocess('cifar10')(x)),
                             np.asarray(A.normalize(x, A.CIFAR10_MEAN, A.CIFAR10_STD)), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(A.make_augment('none')(KEY, x)), np.asarray(x))
  assert jax.eval_shape(A.make_preprocess('landmarks', out_size=6), _batch(b=2, h=10, w=8)).shape == (2, 6, 6, 3)
  assert jax.jit(A.make_preprocess('landmarks', out_size=8, crop_padding=0))(x).shape == (2, 8, 8, 3)
  u8 = jnp.full((2, 8, 8, 3), 128, jnp.uint8)
  assert jax.eval_shape(A.make_augment('cifar100'), KEY, u8).dtype == jnp.float32
  with pytest.raises(ValueError, match='dataset'):
    A.make_augment('cifar')
  with pytest.raises(ValueError, match='unknown'):
    A.make_augment('autoaugment')
  with pytest.raises(ValueError, match='unknown options'):
    A.make_augment('cifar10', sise=8)
  with pytest.raises(ValueError, match='num_classes'):
    A.make_label_augment('mixup')(KEY, x, jnp.arange(2))
