"""DeepLabV3-MobileNetV2 (models/deeplabv3.py): parameter count against torchvision's formula, output shape,
BatchNorm statistics, dropout only in training, and LADD's cluster-layer selections on it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import ladd
from fedjax_flat.models import base
from fedjax_flat.models.registry import get_model, uses_batch_stats
from tests.fixtures import arrays


def _head_params(cin, c, classes, rates=3):
  """torchvision DeepLabHead(cin, classes): ASPP (1x1, `rates` dilated 3x3, pooling 1x1, projection 1x1; BN each),
  conv3x3 + BN, conv1x1 with bias."""
  convs = cin * c + rates * cin * c * 9 + cin * c + (rates + 2) * c * c + c * c * 9
  bns = (rates + 4) * 2 * c
  return convs + bns + c * classes + classes


def _model_and_params():
  model = get_model('deeplabv3_mobilenetv2', num_classes=19, input_shape=(64, 64, 3))
  return model, model.init(jax.random.PRNGKey(0), jnp.zeros((1, 64, 64, 3)))


@pytest.fixture(scope='module')
def model_and_shapes():
  """The parameters' shapes only (the init traced, nothing computed): what the counting and naming tests read."""
  model = get_model('deeplabv3_mobilenetv2', num_classes=19, input_shape=(64, 64, 3))
  return model, jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 64, 64, 3))))


def test_parameter_count(model_and_shapes):
  model, params = model_and_shapes
  assert model.batch_stats and uses_batch_stats('deeplabv3_mobilenetv2', {})
  backbone = sum(int(x.size) for k, v in params['params'].items() if k.startswith('features')
                 for x in jax.tree_util.tree_leaves(v))
  assert backbone == 2_223_872                                   # torchvision mobilenet_v2 without its classifier
  assert _head_params(1280, 256, 19) == 10_428_691
  assert base.num_trainable_params(params) == 2_223_872 + 10_428_691 == 12_652_563
  assert sorted(k for k in params['params'] if k.startswith('features'))[-1] == 'features_18'


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_forward_shapes_statistics_and_dropout():
  model, params = _model_and_params()
  x = arrays.normal(1, (2, 64, 64, 3))
  logits = model.apply(params, x, train=False)
  assert logits.shape == (2, 64, 64, 19) and bool(jnp.all(jnp.isfinite(logits)))
  np.testing.assert_array_equal(np.asarray(model.apply(params, x, train=False)), np.asarray(logits))
  (a, stats) = model.apply(params, x, train=True, rng=jax.random.PRNGKey(2), mask=jnp.ones(2), with_batch_stats=True)
  b = model.apply(params, x, train=True, rng=jax.random.PRNGKey(3), mask=jnp.ones(2))
  assert a.shape == logits.shape and not np.allclose(np.asarray(a), np.asarray(b))     # dropout in training
  moved = {jax.tree_util.keystr(p): not np.allclose(np.asarray(u), np.asarray(v)) for (p, u), v in
           zip(jax.tree_util.tree_flatten_with_path(stats)[0], jax.tree_util.tree_leaves(params['batch_stats']))}
  # Every variance moves. Means stay 0 exactly where a bias-free 1x1 conv reads a BatchNorm output of zero batch
  # mean (an 'expand' conv after a non-residual block's projection): that is the formula, not a missing update.
  assert all(v for k, v in moved.items() if k.endswith("['var']"))
  assert all(v or "['expand']" in k for k, v in moved.items())


def test_ladd_cluster_layers(model_and_shapes):
  _, params = model_and_shapes
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]

  def picked(which):
    return [p for p, f in zip(paths, ladd.leaf_flags(params, ladd.cluster_layer_select(which))) if f]
  assert picked('cls') == ["['params']['classifier']['head']['bias']", "['params']['classifier']['head']['kernel']"]
  dec = picked('decoder')
  # the release's 'decoder': every conv of the head (1x1, 3 dilated, pooling, projection, 3x3, classifier)
  assert len(dec) == 9 and all("['classifier']" in p and "['bn']" not in p for p in dec)
  bn = picked('bn')
  assert bn and all("['bn']" in p for p in bn)
