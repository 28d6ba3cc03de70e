"""Test-time routing (evaluation/routed.py): images go to the nearest style centroid and are evaluated by their
cluster's model; the pooled confusion matrix equals the one computed image by image."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.data.transforms import fda
from fedjax_flat.evaluation import routed
from fedjax_flat.models import base
from fedjax_flat.tasks.segmentation import Segmentation


class PixelHead(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    return nn.Conv(3, (1, 1), name='head')(x)


MODEL = base.from_flax(PixelHead(), 'pixel', 3, (8, 8, 3))


def test_routes_follow_the_nearest_style_centroid():
  rng = np.random.default_rng(0)
  dark = (rng.random((3, 8, 8, 3)) * 60).astype(np.uint8)
  bright = (195 + rng.random((4, 8, 8, 3)) * 60).astype(np.uint8)
  x = np.concatenate([dark, bright, dark[:1]])
  styles = routed.image_styles(x)
  assert styles.shape == (8, 27)
  np.testing.assert_allclose(styles[0], np.asarray(fda.extract_styles(fda.to_unit(x[:1]))).reshape(-1), rtol=1e-6)
  centroids = np.stack([styles[:3].mean(0), styles[3:7].mean(0)])[::-1]      # cluster 0 = bright, 1 = dark
  np.testing.assert_array_equal(routed.routes(x, centroids), [1, 1, 1, 0, 0, 0, 0, 1])


def test_evaluate_routed_uses_each_images_cluster_model():
  rng = np.random.default_rng(1)
  x = rng.integers(0, 256, (7, 8, 8, 3), dtype=np.uint8)
  y = rng.integers(0, 3, (7, 8, 8)).astype(np.uint8)
  y[0, :2] = 255
  params = [MODEL.init(jax.random.PRNGKey(s), jnp.zeros((1, 8, 8, 3))) for s in (0, 1)]
  route_ids = np.array([0, 1, 1, 0, 1, 0, 0])
  prep = lambda a: jnp.asarray(a, jnp.float32) / 255.0  # noqa: E731
  task = Segmentation(ignore_index=255)
  got = routed.evaluate_routed(MODEL, lambda c: params[c], x, y, task, route_ids, prep=prep, batch_size=3)
  conf = np.zeros((3, 3))
  for i in range(7):
    pred = np.asarray(jnp.argmax(MODEL.apply(params[route_ids[i]], prep(x[i:i + 1])), -1))[0]
    valid = y[i] != 255
    np.add.at(conf, (y[i][valid].astype(int), pred[valid]), 1)
  iou = np.diag(conf) / (conf.sum(0) + conf.sum(1) - np.diag(conf))
  np.testing.assert_allclose(got['miou'], iou.mean(), rtol=1e-6)
  np.testing.assert_allclose(got['accuracy'], np.trace(conf) / conf.sum(), rtol=1e-6)
  np.testing.assert_array_equal(got['routes'], route_ids)
  # Every image under model 0: a different result (the routing matters).
  one = routed.evaluate_routed(MODEL, lambda c: params[0], x, y, task, np.zeros(7, int), prep=prep)
  assert not np.isclose(one['miou'], got['miou'])


def _two_style_set(rng, n_dark=3, n_bright=4):
  dark = (rng.random((n_dark, 8, 8, 3)) * 60).astype(np.uint8)
  bright = (195 + rng.random((n_bright, 8, 8, 3)) * 60).astype(np.uint8)
  x = np.concatenate([bright[:2], dark, bright[2:]])          # interleaved: routing must sort them out
  planted = np.array([0, 0] + [1] * n_dark + [0] * (n_bright - 2))     # cluster 0 = bright, 1 = dark
  y = rng.integers(0, 3, (len(x), 8, 8)).astype(np.uint8)
  y[1, :3] = 255
  return x, y, planted


def _per_image_confusion(params_of, x, y, route_ids, prep):
  conf = np.zeros((3, 3))
  for i in range(len(x)):
    pred = np.asarray(jnp.argmax(MODEL.apply(params_of(route_ids[i]), prep(x[i:i + 1])), -1))[0]
    valid = y[i] != 255
    np.add.at(conf, (y[i][valid].astype(int), pred[valid]), 1)
  return conf


def test_routed_evaluator_picks_each_batchs_cluster_model_inside_one_program():
  """RoutedEvaluator (the trainer's): stacked cluster models, one compiled program; the pooled metrics equal the
  image-by-image confusion matrix with each image under its own cluster's model, and evaluate_routed's."""
  x, y, planted = _two_style_set(np.random.default_rng(2))
  params = [MODEL.init(jax.random.PRNGKey(s), jnp.zeros((1, 8, 8, 3))) for s in (3, 4)]
  stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *params)
  prep = lambda a: jnp.asarray(a, jnp.float32) / 255.0  # noqa: E731
  task = Segmentation(ignore_index=255)
  ev = routed.RoutedEvaluator(MODEL, x, y, planted, task=task, preprocess=prep, batch_size=3)
  cids, idx, mask = ev.plan            # one cluster per batch, padded to 3: bright 4 -> 2 batches, dark 3 -> 1
  np.testing.assert_array_equal(cids, [0, 0, 1])
  np.testing.assert_array_equal(mask.sum(1), [3, 1, 3])
  assert all(set(planted[i[m > 0]]) == {c} for c, i, m in zip(cids, idx, mask))
  got = ev(stacked)
  conf = _per_image_confusion(lambda c: params[c], x, y, planted, prep)
  iou = np.diag(conf) / (conf.sum(0) + conf.sum(1) - np.diag(conf))
  np.testing.assert_allclose(got['miou'], iou.mean(), rtol=1e-6)
  np.testing.assert_allclose(got['accuracy'], np.trace(conf) / conf.sum(), rtol=1e-6)
  ref = routed.evaluate_routed(MODEL, lambda c: params[c], x, y, task, planted, prep=prep)
  np.testing.assert_allclose(got['miou'], ref['miou'], rtol=1e-6)
  np.testing.assert_allclose(got['loss'], ref['loss'], rtol=1e-5)
  # New models (a later round): same program, and the swap changes the result.
  swapped = ev(jax.tree_util.tree_map(lambda a: a[::-1], stacked))
  assert not np.isclose(swapped['miou'], got['miou'])
  assert ev.sums_fn._cache_size() == 1
  with pytest.raises(ValueError, match='one route per test image'):
    routed.RoutedEvaluator(MODEL, x, y, planted[:-1], task=task)
