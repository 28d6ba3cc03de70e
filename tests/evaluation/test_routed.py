"""Test-time routing (evaluation/routed.py): images go to the nearest style centroid and are evaluated by their
cluster's model; the pooled confusion matrix equals the one computed image by image."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

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
