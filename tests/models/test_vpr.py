"""vpr_resnet18 (models/vpr.py): GeM against its formula, unit-norm descriptors for any leading axes, the
parameter count of ResNet18 up to layer3 (torchvision's 2,782,784 + GeM's p), BatchNorm with masked tuples,
and ImageNet-style weights of a full ResNet18 loaded through config.init.pretrained."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_flat.models import base, pretrained, registry, vpr
from fedjax_flat.training import init as init_lib
from tests.fixtures import arrays


def test_gem_equals_its_formula():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
  for p in (1.0, 3.0, 4.5):
    ref = np.mean(np.maximum(x, 1e-6) ** p, axis=(1, 2)) ** (1 / p)
    np.testing.assert_allclose(np.asarray(vpr.gem(jnp.asarray(x), p)), ref, rtol=1e-5)
  # p = 1 is average pooling of the positive part; large p tends to max pooling.
  np.testing.assert_allclose(np.asarray(vpr.gem(jnp.asarray(np.abs(x)), 1.0)), np.abs(x).mean((1, 2)), rtol=1e-5)
  big = np.asarray(vpr.gem(jnp.asarray(np.abs(x) + 0.1), 60.0))
  np.testing.assert_allclose(big, (np.abs(x) + 0.1).max((1, 2)), rtol=0.05)


@pytest.mark.parametrize('norm', ['gn', 'bn'])
def test_descriptors_have_unit_norm_for_any_leading_axes(norm):
  m = registry.get_model('vpr_resnet18', 1, (3, 16, 16, 3), norm=norm, base_width=4)
  params = m.init(jax.random.key(0), jnp.zeros((1, 3, 16, 16, 3)))
  x = arrays.uniform(1, (2, 3, 16, 16, 3))
  apply = jax.jit(lambda p, v: m.apply(p, v, train=False))
  d = apply(params, x)
  assert d.shape == (2, 3, 16)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(d), axis=-1), 1.0, atol=1e-5)
  # A tuple is the images one by one: the leading axes are only a batch.
  np.testing.assert_allclose(np.asarray(apply(params, x[1])), np.asarray(d[1]), atol=1e-5)
  assert registry.uses_batch_stats('vpr_resnet18', {'norm': norm}) == (norm == 'bn')


def test_gem_p_is_a_learned_parameter_initialised_to_3():
  m = registry.get_model('vpr_resnet18', 1, (16, 16, 3), base_width=4)
  params = m.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))
  assert params['gem'].tolist() == [3.0]            # a trainable leaf of params (no separate collection)
  x = jnp.asarray(np.random.default_rng(1).uniform(0.1, 2.0, (2, 3, 3, 4)), jnp.float32)
  g = jax.grad(lambda p: jnp.sum(vpr.gem(x, p)))(jnp.float32(3.0))
  # d/dp of (mean x^p)^(1/p), numerically
  f = lambda p: np.sum(np.mean(np.asarray(x, np.float64) ** p, axis=(1, 2)) ** (1 / p))  # noqa: E731
  np.testing.assert_allclose(float(g), (f(3.0 + 1e-5) - f(3.0 - 1e-5)) / 2e-5, rtol=1e-3)


def test_parameter_count_is_resnet18_up_to_layer3_plus_p():
  m = registry.get_model('vpr_resnet18', 1, (32, 32, 3))
  for norm in ('gn', 'bn'):
    m = registry.get_model('vpr_resnet18', 1, (32, 32, 3), norm=norm)
    params = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
    assert base.num_trainable_params(params) == 2_782_784 + 1
  with pytest.raises(ValueError, match='norm'):
    registry.get_model('vpr_resnet18', 1, (32, 32, 3), norm='ln')


def test_batch_norm_masks_padding_tuples():
  m = registry.get_model('vpr_resnet18', 1, (2, 16, 16, 3), norm='bn', base_width=4)
  params = m.init(jax.random.key(0), jnp.zeros((1, 2, 16, 16, 3)))
  x = arrays.uniform(1, (3, 2, 16, 16, 3))
  junk = x.at[2].set(100.0)
  mask = jnp.array([1.0, 1.0, 0.0])
  apply = jax.jit(lambda p, v: m.apply(p, v, train=True, mask=mask, with_batch_stats=True))
  a, sa = apply(params, x)
  b, sb = apply(params, junk)
  np.testing.assert_allclose(np.asarray(a[:2]), np.asarray(b[:2]), atol=1e-5)
  for u, v in zip(jax.tree_util.tree_leaves(sa), jax.tree_util.tree_leaves(sb)):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), atol=1e-5)


def test_imagenet_resnet18_weights_load_through_init_pretrained(tmp_path):
  # A full ResNet18 with the ImageNet stem (what converted torchvision weights look like here).
  # Shapes from eval_shape, values random: no 11M-parameter initialisation in the test.
  full = registry.get_model('resnet18_gn', 1000, (32, 32, 3), stem='imagenet')
  rng = np.random.default_rng(3)
  fill = lambda s: rng.normal(size=s.shape).astype(np.float32)  # noqa: E731
  src = jax.tree_util.tree_map(fill, jax.eval_shape(full.init, jax.random.key(3), jnp.zeros((1, 32, 32, 3))))
  assert 'layer4_1' in src and 'classifier' in src
  path = str(tmp_path / 'resnet18_imagenet_conv4.npz')
  pretrained.save_params(path, vpr.backbone_params(src))
  m = registry.get_model('vpr_resnet18', 1, (32, 32, 3))
  fresh = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, np.float32),
                                 jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3))))
  fresh['gem'] = np.full((1,), 3.0, np.float32)
  cfg = ml_collections.ConfigDict({'init': {'checkpoint': '', 'pretrained': path, 'reinit_classifier': 'always',
                                            'classifier_key': 'gem'}})
  got = init_lib.initial_params(cfg, m, fresh)
  np.testing.assert_array_equal(got['layer3_1']['conv2']['kernel'], src['layer3_1']['conv2']['kernel'])
  np.testing.assert_array_equal(got['stem_conv']['kernel'], src['stem_conv']['kernel'])
  assert got['gem'].tolist() == [3.0]
  assert 'layer4_0' not in got


@pytest.mark.parametrize('norm, width', [('gn', 8), ('bn', 4)])
def test_kwargs_for_params_reads_norm_and_width_from_the_tree(norm, width):
  """What data.cluster_params' vpr_resnet18 is built with (data/sources/msls.py): the norm and base width of
  the params tree, so that it fits the file; {} for a tree without the stem."""
  m = registry.get_model('vpr_resnet18', 1, (16, 16, 3), norm=norm, base_width=width)
  shapes = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1, 16, 16, 3)))
  assert vpr.kwargs_for_params(shapes) == {'norm': norm, 'base_width': width}
  assert vpr.kwargs_for_params({'dense': {'kernel': np.zeros((2, 2))}}) == {}
