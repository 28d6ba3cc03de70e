"""ResNet18 with BatchNorm (`resnet18_bn`): parameter and statistics counts by formula (= torchvision's CIFAR
ResNet18, 11,173,962 trainable for 10 classes), shapes, running statistics updated in training and used in
evaluation, padded examples kept out of the statistics, the 'batch_stats' registration. The GN ResNets are
tested in tests/models/test_large.py."""
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.models import base, registry
from fedjax_flat.models.resnet import BNBlock, ResNetBN
from tests.models.test_large import expected_resnet18
from tests.fixtures import arrays


def _bn_channels():
  """BN layers' channels: stem 64; per stage 2 blocks x 2 BN of width w, plus the projection's BN (stages 2-4)."""
  return 64 + sum(4 * w + (w if w != 64 else 0) for w in (64, 128, 256, 512))


def test_counts_equal_the_formula_and_the_gn_model():
  m = registry.get_model('resnet18_bn', 10, (32, 32, 3))
  shapes = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  assert set(shapes) == {'params', 'batch_stats'}
  assert base.num_trainable_params(shapes) == expected_resnet18(10) == 11_173_962
  assert _bn_channels() == 4_800 and base.num_params(shapes['batch_stats']) == 2 * 4_800
  m100 = registry.get_model('resnet18_bn', 100, (32, 32, 3))
  s100 = jax.eval_shape(m100.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  assert base.num_trainable_params(s100) == expected_resnet18(100) == 11_220_132
  mi = registry.get_model('resnet18_bn', 10, (64, 64, 3), stem='imagenet')
  si = jax.eval_shape(mi.init, jax.random.key(0), jnp.zeros((1, 64, 64, 3)))
  assert base.num_trainable_params(si) == expected_resnet18(10, stem_kernel=7)
  assert registry.uses_batch_stats('resnet18_bn', {}) and not registry.uses_batch_stats('resnet18_gn', {})
  assert m.head == (('classifier',),)


def test_batch_statistics_in_training_running_ones_in_evaluation():
  """Small widths (same code path): train mode normalizes with the batch's moments and moves the running ones
  by momentum; evaluation uses the running ones; masked (padding) examples change neither."""
  net = ResNetBN(stage_sizes=(1, 1), widths=(4, 8), stem_width=4, num_classes=3, bn_momentum=0.9,
                 conv_impl='lax')
  m = base.from_flax(net, 'tiny_bn', 3, (8, 8, 3), batch_stats=True)
  params = jax.jit(m.init)(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))
  assert set(params['batch_stats']) == {'stem_bn', 'layer1_0', 'layer2_0'}
  x = arrays.normal(1, (4, 8, 8, 3)) * 2.0 + 1.0
  train = jax.jit(lambda p, v, mask: m.apply(p, v, train=True, mask=mask, with_batch_stats=True))
  logits, stats = train(params, x, jnp.ones((4,)))
  assert logits.shape == (4, 3)
  # stem BN: running mean moves from 0 towards the batch mean of the stem conv's output by (1 - momentum)
  h = jax.lax.conv_general_dilated(jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))),
                                   params['params']['stem_conv']['kernel'], (1, 1), 'VALID',
                                   dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  np.testing.assert_allclose(np.asarray(stats['stem_bn']['mean']), 0.1 * np.asarray(h.mean((0, 1, 2))),
                             rtol=1e-4, atol=1e-5)
  # evaluation with the initial running statistics (mean 0, var 1) differs from the batch-normalized output
  ev = jax.jit(lambda p, v: m.apply(p, v, train=False))(params, x)
  assert not np.allclose(np.asarray(ev), np.asarray(logits), atol=1e-3)
  # padding: a masked example's values change neither the others' outputs nor the statistics
  mask = jnp.array([1.0, 1.0, 1.0, 0.0])
  a, sa = train(params, x, mask)
  b, sb = train(params, x.at[3].set(50.0), mask)
  np.testing.assert_allclose(np.asarray(a[:3]), np.asarray(b[:3]), atol=1e-5)
  for u, v in zip(jax.tree_util.tree_leaves(sa), jax.tree_util.tree_leaves(sb)):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), atol=1e-5)


def test_bn_block_projection_only_where_the_shape_changes():
  x = jnp.ones((2, 8, 8, 4))
  same = jax.eval_shape(lambda: BNBlock(4, conv_impl='lax').init(jax.random.key(0), x, use_running_average=False))
  block = BNBlock(8, strides=2, conv_impl='lax')
  down = jax.jit(lambda: block.init(jax.random.key(0), x, use_running_average=False))()
  assert 'shortcut_conv' not in same['params'] and 'shortcut_bn' in down['batch_stats']
  y = jax.jit(lambda v: block.apply(down, v, use_running_average=True))(x)
  assert y.shape == (2, 4, 4, 8) and bool(jnp.all(y >= 0))
