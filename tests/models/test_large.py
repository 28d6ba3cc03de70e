"""ResNet18-GN, ResNet34-GN, ResNet20-GN, MobileNetV2-GN (param counts, shapes, GN groups, MAN activations) and
pretrained-params loading. Param counts use `jax.eval_shape` (no FLOPs); forward passes run at batch 2."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.models.base import num_params
from fedjax_flat.models.registry import get_model, names
from fedjax_flat.models import mobilenet_v2, pretrained, resnet
from tests.fixtures import arrays


def _shapes(name, num_classes, input_shape, **kw):
  model = get_model(name, num_classes, input_shape, **kw)
  return model, jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1,) + tuple(input_shape)))


def _fake_params(shapes, seed=0):
  """Random params with the shapes of `shapes` drawn in numpy: running a model's real `init` compiles its
  whole forward pass plus one RNG kernel per leaf (10-40 s on a shared 2-core CPU), which these tests avoid.
  Kernels ~ N(0, 1/fan_in), GN scales 1, biases 0."""
  rng = np.random.default_rng(seed)

  def leaf(path, s):
    key = jax.tree_util.keystr(path)
    if "'scale'" in key:
      return jnp.ones(s.shape, s.dtype)
    if "'bias'" in key:
      return jnp.zeros(s.shape, s.dtype)
    fan_in = int(np.prod(s.shape[:-1]))
    return jnp.asarray(rng.normal(size=s.shape) / np.sqrt(fan_in), s.dtype)
  return jax.tree_util.tree_map_with_path(leaf, shapes)


def _conv(k, cin, cout):
  return k * k * cin * cout


def _gn(c):
  return 2 * c                       # scale + bias per channel, as BatchNorm's affine parameters


def _fc(cin, k):
  return cin * k + k


def _basic(cin, cout, proj):
  n = _conv(3, cin, cout) + _gn(cout) + _conv(3, cout, cout) + _gn(cout)
  return n + (_conv(1, cin, cout) + _gn(cout) if proj else 0)


def expected_resnet18(k, stem_kernel=3):
  n = _conv(stem_kernel, 3, 64) + _gn(64)
  cin = 64
  for w in (64, 128, 256, 512):
    n += _basic(cin, w, cin != w) + _basic(w, w, False)
    cin = w
  return n + _fc(512, k)


def expected_resnet34(k, stem_kernel=3):
  n = _conv(stem_kernel, 3, 64) + _gn(64)
  cin = 64
  for w, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
    n += _basic(cin, w, cin != w) + (blocks - 1) * _basic(w, w, False)
    cin = w
  return n + _fc(512, k)


def expected_resnet20(k, shortcut='A'):
  n = _conv(3, 3, 16) + _gn(16)
  cin = 16
  for w in (16, 32, 64):
    n += _basic(cin, w, shortcut == 'B' and cin != w) + 2 * _basic(w, w, False)
    cin = w
  return n + _fc(64, k)


def expected_mobilenet_v2(k):
  n = _conv(3, 3, 32) + _gn(32)
  cin = 32
  for t, c, reps, _ in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                        (6, 160, 3, 2), (6, 320, 1, 1)):
    for _ in range(reps):
      hidden = cin * t
      if t != 1:
        n += _conv(1, cin, hidden) + _gn(hidden)
      n += 9 * hidden + _gn(hidden)             # depthwise 3x3, one input channel per group
      n += _conv(1, hidden, c) + _gn(c)
      cin = c
  return n + _conv(1, 320, 1280) + _gn(1280) + _fc(1280, k)


def test_registered():
  assert {'resnet18_gn', 'resnet34_gn', 'resnet20_gn', 'mobilenet_v2_gn'} <= set(names())


def test_param_counts():
  # torchvision-style CIFAR ResNet18 with BatchNorm, 10 classes: 11,173,962.
  assert expected_resnet18(10) == 11_173_962
  assert num_params(_shapes('resnet18_gn', 10, (32, 32, 3))[1]) == 11_173_962
  assert num_params(_shapes('resnet18_gn', 100, (32, 32, 3))[1]) == expected_resnet18(100) == 11_220_132
  assert (num_params(_shapes('resnet18_gn', 10, (64, 64, 3), stem='imagenet')[1])
          == expected_resnet18(10, stem_kernel=7) == 11_181_642)
  # torchvision resnet34 (BN; GN has the same affine parameters): 21,797,672 for 1000 classes, ImageNet stem;
  # FedWMSAM's CIFAR100 ResNet-34 is it with a 100-class head.
  assert expected_resnet34(1000, stem_kernel=7) == 21_797_672
  assert expected_resnet34(100, stem_kernel=7) == 21_797_672 - _fc(512, 1000) + _fc(512, 100) == 21_335_972
  assert (num_params(_shapes('resnet34_gn', 100, (32, 32, 3), stem='imagenet')[1])
          == expected_resnet34(100, stem_kernel=7))
  assert num_params(_shapes('resnet34_gn', 100, (32, 32, 3))[1]) == expected_resnet34(100) == 21_328_292
  # He et al. ResNet20: "0.27M".
  assert num_params(_shapes('resnet20_gn', 10, (32, 32, 3))[1]) == expected_resnet20(10) == 269_722
  assert (num_params(_shapes('resnet20_gn', 10, (32, 32, 3), shortcut='B')[1])
          == expected_resnet20(10, 'B') == 272_474)
  # torchvision mobilenet_v2 (BN), 1000 classes: 3,504,872.
  assert expected_mobilenet_v2(1000) == 3_504_872
  assert num_params(_shapes('mobilenet_v2_gn', 1000, (64, 64, 3))[1]) == 3_504_872
  assert (num_params(_shapes('mobilenet_v2_gn', 2028, (64, 64, 3))[1])
          == expected_mobilenet_v2(2028) == 4_821_740)


def _gn_groups(model, params, x):
  """num_groups of every GroupNorm called in a forward pass."""
  seen = []

  def interceptor(next_fun, args, kwargs, context):
    if isinstance(context.module, nn.GroupNorm) and context.method_name == '__call__':
      seen.append((context.module.num_groups, args[0].shape[-1]))
    return next_fun(*args, **kwargs)
  with nn.intercept_methods(interceptor):
    jax.eval_shape(lambda p: model.apply(p, x), params)
  return seen


def test_gn_groups():
  x32 = jnp.zeros((1, 32, 32, 3))
  m, p = _shapes('resnet18_gn', 10, (32, 32, 3))
  seen = _gn_groups(m, p, x32)
  assert len(seen) == 1 + 8 * 2 + 3 and {g for g, _ in seen} == {2}
  m, p = _shapes('resnet20_gn', 10, (32, 32, 3), gn_groups=4)
  seen = _gn_groups(m, p, x32)
  assert len(seen) == 1 + 9 * 2 and {g for g, _ in seen} == {4}
  m, p = _shapes('mobilenet_v2_gn', 10, (64, 64, 3))
  seen = _gn_groups(m, p, jnp.zeros((1, 64, 64, 3)))
  assert len(seen) == 1 + (2 + 16 * 3) + 1 and {g for g, _ in seen} == {8}
  assert all(c % 8 == 0 for _, c in seen)
  with pytest.raises(ValueError, match='divisible'):
    _shapes('resnet20_gn', 10, (32, 32, 3), gn_groups=3)


def _check_acts(acts, n_acts, first_hw):
  assert len(acts) == n_acts
  assert all(a.shape[0] == 2 and float(a.min()) >= 0 for a in acts)
  # Sorted-key collection keeps depth order: spatial size never grows along the list.
  sizes = [a.shape[1] for a in acts]
  assert sizes == sorted(sizes, reverse=True)
  assert acts[0].shape[1] == first_hw


@pytest.mark.parametrize('name,num_classes,hw,n_acts,first_hw', [
    ('resnet18_gn', 10, 32, 1 + 8 * 2, 32),
    ('resnet34_gn', 100, 16, 1 + 16 * 2, 16),
    ('mobilenet_v2_gn', 7, 64, 1 + 1 + 16 * 2 + 1, 32),
])
def test_forward_and_activations(name, num_classes, hw, n_acts, first_hw):
  # lax convs: XLA compiles them ~5x faster than im2col (which the ResNet20 test below covers).
  model, shapes = _shapes(name, num_classes, (hw, hw, 3), conv_impl='lax')
  params = _fake_params(shapes)
  x = arrays.normal(1, (2, hw, hw, 3))
  logits, acts = jax.jit(lambda p, x: model.apply(p, x, with_activations=True))(params, x)
  assert logits.shape == (2, num_classes)
  assert np.all(np.isfinite(np.asarray(logits)))
  _check_acts(acts, n_acts, first_hw)
  if name == 'mobilenet_v2_gn':
    assert max(float(a.max()) for a in acts) <= 6.0          # ReLU6


def test_resnet20_forward_and_im2col_matches_lax():
  x = arrays.normal(1, (2, 32, 32, 3))
  m_col, shapes = _shapes('resnet20_gn', 100, (32, 32, 3), conv_impl='im2col')
  m_lax = get_model('resnet20_gn', 100, (32, 32, 3), conv_impl='lax')
  params = _fake_params(shapes)
  logits, acts = jax.jit(lambda p, x: m_col.apply(p, x, with_activations=True))(params, x)
  assert logits.shape == (2, 100)
  _check_acts(acts, 1 + 9 * 2, 32)
  ref = jax.jit(m_lax.apply)(params, x)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ref), atol=1e-4, rtol=1e-4)


def test_imagenet_stem_shapes():
  model, params = _shapes('resnet18_gn', 5, (64, 64, 3), stem='imagenet')
  out = jax.eval_shape(lambda p, x: model.apply(p, x, with_activations=True), params,
                       jnp.zeros((2, 64, 64, 3)))
  logits, acts = out
  assert logits.shape == (2, 5)
  assert acts[0].shape == (2, 32, 32, 64)          # conv7x7/2
  assert acts[1].shape == (2, 16, 16, 64)          # after maxpool3x3/2
  assert acts[-1].shape == (2, 2, 2, 512)


class _OneConv(nn.Module):
  impl: str

  @nn.compact
  def __call__(self, x):
    return resnet.conv(x, 4, 3, strides=2, conv_impl=self.impl)


@pytest.mark.parametrize('impl', ['im2col'])  # lax: covered by the ResNet20 im2col-vs-lax test
def test_torch_padding_strided(impl):
  # PyTorch Conv2d(k=3, stride=2, padding=1): symmetric (1, 1) padding also for even inputs.
  x = arrays.normal(0, (2, 8, 8, 3))
  mod = _OneConv(impl)
  kernel = arrays.normal(1, (3, 3, 3, 4))
  params = {'params': {'Conv_0': {'kernel': kernel}}}
  assert jax.tree_util.tree_structure(jax.eval_shape(mod.init, jax.random.PRNGKey(1), x)) == \
      jax.tree_util.tree_structure(params)

  @jax.jit
  def run(params):
    ref = jax.lax.conv_general_dilated(x, kernel, (2, 2), ((1, 1), (1, 1)),
                                       dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    return mod.apply(params, x), ref
  y, ref = run(params)
  assert y.shape == (2, 4, 4, 4)
  np.testing.assert_allclose(np.asarray(y), np.asarray(ref), atol=1e-5)


class _GN(nn.Module):
  @nn.compact
  def __call__(self, x):
    return resnet.group_norm(x, 2)


def test_group_norm_per_example():
  x = arrays.normal(0, (3, 2, 4, 4, 8)) * 3 + 1
  gn = _GN()
  params = {'params': {'GroupNorm_0': {'scale': jnp.ones(8), 'bias': jnp.zeros(8)}}}
  jax.eval_shape(gn.init, jax.random.PRNGKey(1), x[0])      # the names above are the module's
  y, y_vmap = jax.jit(lambda p: (gn.apply(p, x), jax.vmap(lambda t: gn.apply(p, t))(x)))(params)
  y = np.asarray(y)
  np.testing.assert_allclose(y, np.asarray(y_vmap), atol=1e-6)
  g = y.reshape(3, 2, 16, 2, 4)                      # [.., B, H*W, group, channels in group]
  np.testing.assert_allclose(g.mean(axis=(2, 4)), 0, atol=1e-5)
  np.testing.assert_allclose(g.var(axis=(2, 4)), 1, atol=1e-3)


def test_make_divisible():
  assert [mobilenet_v2.make_divisible(c) for c in (32, 16, 24, 1280)] == [32, 16, 24, 1280]
  assert mobilenet_v2.make_divisible(32 * 0.75) == 24 and mobilenet_v2.make_divisible(1280 * 1.4) == 1792


# ------------------------------------------------------------------------------------------- pretrained

@pytest.fixture(scope='module')
def r20():
  model, shapes = _shapes('resnet20_gn', 10, (32, 32, 3))
  return model, _fake_params(shapes)


@pytest.mark.parametrize('ext', ['msgpack', 'npz'])
def test_pretrained_round_trip(tmp_path, r20, ext):
  model, params = r20
  path = str(tmp_path / f'p.{ext}')
  pretrained.save_params(path, params)
  other = _fake_params(jax.eval_shape(lambda: params), seed=5)
  loaded = pretrained.load_pretrained(model, other, path, reinit_classifier=False)
  assert jax.tree_util.tree_structure(loaded) == jax.tree_util.tree_structure(params)
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded, params)
  # Default reinit: backbone from the file, classifier from the fresh init.
  loaded = pretrained.load_pretrained(model, other, path)
  np.testing.assert_array_equal(loaded['layer3_2']['conv2']['kernel'], params['layer3_2']['conv2']['kernel'])
  np.testing.assert_array_equal(loaded['classifier']['kernel'], other['classifier']['kernel'])


def test_pretrained_classifier_reinit_other_classes(tmp_path, r20):
  _, params = r20
  path = str(tmp_path / 'p.npz')
  pretrained.save_params(path, params)
  model100, shapes100 = _shapes('resnet20_gn', 100, (32, 32, 3))
  init100 = _fake_params(shapes100, seed=3)
  loaded = pretrained.load_pretrained(model100, init100, path)
  assert loaded['classifier']['kernel'].shape == (64, 100)
  np.testing.assert_array_equal(loaded['classifier']['kernel'], init100['classifier']['kernel'])
  np.testing.assert_array_equal(loaded['stem_conv']['kernel'], params['stem_conv']['kernel'])
  assert jax.eval_shape(model100.apply, loaded, jnp.zeros((1, 32, 32, 3))).shape == (1, 100)
  # Without reinit the classifier shape mismatch is an error naming the path.
  with pytest.raises(ValueError, match=r'classifier/kernel: file \(64, 10\) vs model \(64, 100\)'):
    pretrained.load_pretrained(model100, init100, path, reinit_classifier=False)


def test_pretrained_mismatch_message(tmp_path, r20):
  model, params = r20
  bad = jax.tree_util.tree_map(lambda a: a, params)
  bad['layer2_0']['conv1']['kernel'] = np.zeros((3, 3, 16, 31), np.float32)
  del bad['layer3_1']['gn2']['bias']
  bad['extra'] = {'w': np.zeros((2,), np.float32)}
  path = str(tmp_path / 'bad.msgpack')
  pretrained.save_params(path, bad)
  with pytest.raises(ValueError) as e:
    pretrained.load_pretrained(model, params, path)
  msg = str(e.value)
  assert 'layer2_0/conv1/kernel: file (3, 3, 16, 31) vs model (3, 3, 16, 32)' in msg
  assert 'missing in file layer3_1/gn2/bias' in msg
  assert 'unexpected in file extra/w' in msg


def test_pretrained_classifier_detection_without_name(tmp_path):
  model, shapes = _shapes('mlp', 3, (4, 4, 1), hidden=(8,))
  params = _fake_params(shapes)
  assert pretrained.find_classifier_key(params, 3) == 'Dense_1'
  many = {f'Dense_{i}': {'kernel': np.zeros((4, 3 if i in (2, 10) else 5))} for i in range(11)}
  assert pretrained.find_classifier_key(many, 3) == 'Dense_10'     # natural order, not sorted-key order
  path = str(tmp_path / 'mlp.npz')
  pretrained.save_params(path, params)
  model5, shapes5 = _shapes('mlp', 5, (4, 4, 1), hidden=(8,))
  init5 = _fake_params(shapes5, seed=1)
  loaded = pretrained.load_pretrained(model5, init5, path)
  np.testing.assert_array_equal(loaded['Dense_0']['kernel'], params['Dense_0']['kernel'])
  assert loaded['Dense_1']['kernel'].shape == (8, 5)
