"""The paper's CIFAR CNN and the digits models: parameter counts, conv lowerings agree, MAN activations."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.models.base import num_params
from fedjax_flat.models.registry import declared_head, get_model
from tests.fixtures.arrays import normal as _normal



@pytest.mark.parametrize('classes,expected', [(10, 797_962), (100, 815_332)])
def test_cifar_cnn_param_count(classes, expected):
  m = get_model('cifar_cnn', classes, (32, 32, 3))
  shapes = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  assert num_params(shapes) == expected


@pytest.mark.parametrize('name,shape', [('cifar_cnn', (32, 32, 3)), ('digits_cnn', (8, 8, 1))])
def test_im2col_and_lax_convolutions_agree(name, shape):
  a = get_model(name, 10, shape, conv_impl='im2col')
  b = get_model(name, 10, shape, conv_impl='lax')
  x = _normal(1, (3,) + shape)
  p = a.init(jax.random.key(0), x)
  np.testing.assert_allclose(jax.jit(a.apply)(p, x), jax.jit(b.apply)(p, x), rtol=1e-4, atol=1e-5)
  ga = jax.jit(jax.grad(lambda q: jnp.sum(a.apply(q, x) ** 2)))(p)     # jitted: one compile, not one per op
  gb = jax.jit(jax.grad(lambda q: jnp.sum(b.apply(q, x) ** 2)))(p)
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-3, atol=1e-4), ga, gb)


def test_torch_style_init_bounds():
  m = get_model('cifar_cnn', 10, (32, 32, 3))
  p = m.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  bound = 1 / np.sqrt(5 * 5 * 3)
  assert np.abs(p['Conv_0']['kernel']).max() <= bound and np.abs(p['Conv_0']['bias']).max() <= bound


def test_hidden_activations_exclude_logits():
  m = get_model('cifar_cnn', 10, (32, 32, 3))
  x = jnp.ones((2, 32, 32, 3))
  p = m.init(jax.random.key(0), x)
  logits, acts = m.apply(p, x, with_activations=True)
  assert logits.shape == (2, 10)
  assert sorted(a.shape[1:] for a in acts) == sorted([(28, 28, 64), (10, 10, 64), (384,), (192,)])
  assert all(float(a.min()) >= 0 for a in acts)   # post-ReLU


def test_unknown_model_error():
  with pytest.raises(ValueError, match="model='vit' is unknown"):
    get_model('vit', 10, (32, 32, 3))


def test_digits_cnn_groupnorm_option_for_fedbn():
  from fedjax_flat.algorithms.wrappers import local_norm
  plain = get_model('digits_cnn', 10, (8, 8, 1))
  gn = get_model('digits_cnn', 10, (8, 8, 1), gn_groups=4)
  z = jnp.zeros((1, 8, 8, 1))
  p0, p1 = plain.init(jax.random.key(0), z), gn.init(jax.random.key(0), z)
  assert num_params(p1) - num_params(p0) == 2 * (32 + 32)           # scale + bias of two GN(32) layers
  assert sum(local_norm.norm_flags(p1)) == 4 and sum(local_norm.norm_flags(p0)) == 0
  # GroupNorm statistics are per example: one example's logits do not depend on the rest of the batch.
  x = _normal(1, (5, 8, 8, 1))
  apply = jax.jit(gn.apply)
  np.testing.assert_allclose(apply(p1, x)[:1], apply(p1, x[:1]), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match='not divisible'):
    get_model('digits_cnn', 10, (8, 8, 1), gn_groups=5).init(jax.random.key(0), z)


def test_fedbn_on_digits_cnn_groupnorm_keeps_norm_local():
  from fedjax_flat.training import trainers
  from fedjax_flat.config.default_config import default_config
  c = default_config()
  c.dataset = 'digits_feature_shift'
  c.data.num_clients = 5
  c.model = 'digits_cnn'
  c.model_kwargs = {'gn_groups': 4}
  c.algorithm = 'fedbn'
  c.rounds, c.clients_per_round, c.eval_every, c.progress_every_s = 2, 5, 2, 1e9
  c.client.lr, c.client.batch_size = 0.05, 32
  t = trainers.make_trainer(c)
  init = jax.tree_util.tree_map(np.array, t.server_state['params'])
  t.train()
  srv = t.server_state['params']
  np.testing.assert_array_equal(srv['GroupNorm_0']['scale'], init['GroupNorm_0']['scale'])   # never aggregated
  assert not np.allclose(srv['Conv_0']['kernel'], init['Conv_0']['kernel'])


# --- Lowerings: max pooling (reshape + first-max JVP) and convolution (im2col) equal the lax ops. ---

import flax.linen as nn  # noqa: E402

from fedjax_flat.models import layers  # noqa: E402


@pytest.mark.parametrize('shape,window', [((2, 28, 28, 4), 2), ((3, 7, 9, 2), 2), ((2, 9, 10, 3), 3),
                                          ((4, 3, 10, 10, 2), 2)])
@pytest.mark.parametrize('ties', [False, True])
def test_reshape_max_pool_equals_reduce_window(shape, window, ties):
  x = _normal(0, shape)
  if ties:   # many tied maxima (and whole tied windows): the gradient goes to the FIRST one, as reduce_window
    x = jnp.round(x)
  mine = lambda v: layers.max_pool(v, (window, window), pool_impl='reshape')
  ref = lambda v: nn.max_pool(v, (window, window), strides=(window, window))
  dy = _normal(1, jax.eval_shape(ref, x).shape)
  tx = _normal(2, x.shape)   # forward mode too (HVPs use it)

  def all_modes(pool):       # one compiled program per pooling (eager mode would compile every op)
    @jax.jit
    def run(x, dy, tx):
      y, vjp = jax.vjp(pool, x)
      return y, vjp(dy)[0], jax.jvp(pool, (x,), (tx,))[1]
    return run(x, dy, tx)
  for a, b in zip(all_modes(mine), all_modes(ref)):   # values, gradient, forward-mode derivative: exactly equal
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('shape', [(2, 28, 28, 4), (3, 7, 9, 2)])
@pytest.mark.parametrize('ties', [False, True])
def test_fused_relu_max_pool_equals_relu_then_pool(shape, ties):
  # Ties: rounded values give tied maxima, zeros (relu'(0) = 0) and all-negative windows.
  x = _normal(0, shape)
  x = jnp.round(x) if ties else x
  fused = lambda v: layers.relu_max_pool(v, (2, 2), pool_impl='reshape')
  ref = lambda v: nn.max_pool(nn.relu(v), (2, 2), strides=(2, 2))      # reduce_window of the ReLU output
  dy = _normal(1, jax.eval_shape(ref, x).shape)
  tx = _normal(2, x.shape)

  def all_modes(f):
    @jax.jit
    def run(x, dy, tx):
      y, vjp = jax.vjp(f, x)
      return y, vjp(dy)[0], jax.jvp(f, (x,), (tx,))[1]
    return run(x, dy, tx)
  for a, b in zip(all_modes(fused), all_modes(ref)):    # values, gradient, forward mode: exactly equal
    np.testing.assert_array_equal(a, b)
  x2 = _normal(3, (1, 4, 6, 2))        # second order (HVPs), no ties
  h = lambda f: jax.hessian(lambda v: jnp.sum(jnp.sin(f(v)) ** 2))(x2)
  np.testing.assert_allclose(h(fused), h(ref), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('name,shape', [('cifar_cnn', (32, 32, 3)), ('digits_cnn', (8, 8, 1))])
def test_models_fused_relu_pool_same_bits_as_two_ops(name, shape):
  # fused_relu_pool=True vs the default two ops, and vs collecting 'intermediates' (MAN: always two ops).
  m = get_model(name, 10, shape, conv_impl='im2col', fused_relu_pool=True)
  ref = get_model(name, 10, shape, conv_impl='im2col', fused_relu_pool=False)
  x = _normal(1, (3,) + shape)
  p = m.init(jax.random.key(0), x)
  (vr, gr) = jax.jit(jax.value_and_grad(lambda q: jnp.sum(ref.apply(q, x) ** 2)))(p)
  fused = jax.jit(jax.value_and_grad(lambda q: jnp.sum(m.apply(q, x) ** 2)))
  unfused = jax.jit(jax.value_and_grad(lambda q: jnp.sum(m.apply(q, x, with_activations=True)[0] ** 2)))
  (va, ga), (vb, gb) = fused(p), unfused(p)
  np.testing.assert_array_equal(va, vb)
  np.testing.assert_array_equal(va, vr)
  jax.tree_util.tree_map(np.testing.assert_array_equal, ga, gb)
  jax.tree_util.tree_map(np.testing.assert_array_equal, ga, gr)


def test_reshape_max_pool_second_order_matches_without_ties():
  x = _normal(0, (1, 4, 6, 2))
  f = lambda pool: (lambda v: jnp.sum(jnp.sin(pool(v)) ** 2))
  mine = f(lambda v: layers.max_pool(v, (2, 2), pool_impl='reshape'))
  ref = f(lambda v: nn.max_pool(v, (2, 2), strides=(2, 2)))
  np.testing.assert_allclose(jax.hessian(mine)(x), jax.hessian(ref)(x), rtol=1e-5, atol=1e-6)


def test_pool_impl_resolution():
  assert layers.resolve_pool_impl('auto', 'lax') == 'lax'
  assert layers.resolve_pool_impl('auto', 'im2col') == 'reshape'
  assert layers.resolve_pool_impl('auto') == ('reshape' if jax.default_backend() == 'cpu' else 'lax')
  with pytest.raises(ValueError, match='pool_impl'):
    layers.resolve_pool_impl('argmax')


@pytest.mark.parametrize('name,shape', [('cifar_cnn', (32, 32, 3)), ('digits_cnn', (8, 8, 1))])
def test_model_pool_impls_agree(name, shape):
  a = get_model(name, 10, shape, conv_impl='im2col', pool_impl='reshape')
  b = get_model(name, 10, shape, conv_impl='im2col', pool_impl='lax')
  x = _normal(1, (3,) + shape)
  p = jax.jit(a.init)(jax.random.key(0), x)
  np.testing.assert_array_equal(jax.jit(a.apply)(p, x), jax.jit(b.apply)(p, x))
  ga = jax.jit(jax.grad(lambda q: jnp.sum(a.apply(q, x) ** 2)))(p)     # jitted: one compile, not one per op
  gb = jax.jit(jax.grad(lambda q: jnp.sum(b.apply(q, x) ** 2)))(p)
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7), ga, gb)


# The default suite keeps one case of each lowering path: the paper CNN's convs (two-stage patches below 16 input
# channels, one-stage above), SAME padding with a stride and an odd size, an even kernel with stride 3.
# slow: the other shapes run those same paths; the default suite covers them by the four kept cases.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize('kernel,stride,padding,cin,hw', [
    (5, 1, 'VALID', 3, 32), (5, 1, 'VALID', 64, 14),     # the paper CNN's two convs
    pytest.param(3, 1, 'SAME', 1, 8, marks=_SLOW), (3, 2, 'SAME', 4, 9),
    pytest.param(3, 2, 'VALID', 5, 11, marks=_SLOW), pytest.param(1, 2, 'SAME', 6, 7, marks=_SLOW),
    (4, 3, 'SAME', 2, 10)])
def test_im2col_conv_equals_lax_conv(kernel, stride, padding, cin, hw):
  x = _normal(0, (2, hw, hw + 1, cin))
  mods = {impl: layers.Conv(8, (kernel, kernel), strides=stride, padding=padding, conv_impl=impl)
          for impl in ('im2col', 'lax')}
  p = jax.jit(mods['lax'].init)(jax.random.key(1), x)
  outs, grads = {}, {}

  # One compiled program per lowering: op-by-op dispatch compiles every slice of im2col separately.
  def out_and_grad(m, q, v):
    y, vjp = jax.vjp(lambda q, v: m.apply(q, v), q, v)
    return y, vjp(jnp.cos(y))
  for impl, m in mods.items():
    outs[impl], grads[impl] = jax.jit(out_and_grad, static_argnums=0)(m, p, x)
  np.testing.assert_allclose(outs['im2col'], outs['lax'], rtol=1e-4, atol=1e-5)
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-4),
                         grads['im2col'], grads['lax'])


def test_man_convnet_matches_its_definition_and_torch():
  """MAN's Tiny-ImageNet ConvNet: 2,447,688 parameters, 5 sown ReLU outputs, and the same logits as the same
  network written in torch with the same weights (conv3x3 pad 1, GroupNorm(4), ReLU, maxpool2; fc stack)."""
  m = get_model('man_convnet', 200, (64, 64, 3))
  x = _normal(1, (2, 64, 64, 3))
  p = jax.jit(m.init)(jax.random.key(0), x)       # jitted: eager init and apply compile op by op
  assert num_params(p) == 2_447_688
  logits, acts = jax.jit(lambda q, v: m.apply(q, v, with_activations=True))(p, x)
  assert logits.shape == (2, 200)
  assert sorted(a.shape[1:] for a in acts) == sorted([(64, 64, 64), (32, 32, 64), (16, 16, 64), (512,), (384,)])
  torch = pytest.importorskip('torch')
  f = torch.nn.functional
  t = lambda a: torch.from_numpy(np.array(a, np.float32))  # noqa: E731
  y = t(x).permute(0, 3, 1, 2)
  for i in range(3):
    conv, gn = p[f'Conv_{i}'], p[f'GroupNorm_{i}']
    y = f.conv2d(y, t(conv['kernel']).permute(3, 2, 0, 1), t(conv['bias']), padding=1)
    y = f.max_pool2d(f.relu(f.group_norm(y, 4, t(gn['scale']), t(gn['bias']), eps=1e-5)), 2)
  y = y.permute(0, 2, 3, 1).reshape(2, -1)            # NHWC flatten, as the flax module
  for i in range(3):
    d = p[f'Dense_{i}']
    y = y @ t(d['kernel']) + t(d['bias'])
    y = f.relu(y) if i < 2 else y
  np.testing.assert_allclose(np.asarray(logits), y.numpy(), rtol=2e-4, atol=2e-4)


def test_mcmahan_cnn_param_count_by_formula():
  m = get_model('mcmahan_cnn', 62, (28, 28, 1))
  shapes = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
  per_layer = {k: num_params(v) for k, v in shapes.items()}
  # conv5x5 1->32, conv5x5 32->64, fc (7*7*64)->512, fc 512->62: weights + biases
  assert per_layer == {'Conv_0': 5 * 5 * 1 * 32 + 32, 'Conv_1': 5 * 5 * 32 * 64 + 64,
                       'Dense_0': 7 * 7 * 64 * 512 + 512, 'Dense_1': 512 * 62 + 62}
  assert num_params(shapes) == 832 + 51_264 + 1_606_144 + 31_806 == 1_690_046


def test_mcmahan_cnn_matches_its_definition():
  """conv5x5-32 SAME, ReLU, pool2, conv5x5-64 SAME, ReLU, pool2, fc512, ReLU, fc, written with lax ops."""
  m = get_model('mcmahan_cnn', 62, (28, 28, 1))
  x = _normal(1, (2, 28, 28, 1))
  p = jax.jit(m.init)(jax.random.key(0), x)       # jitted: eager init and apply compile op by op

  def conv(h, layer):
    y = jax.lax.conv_general_dilated(h, layer['kernel'], (1, 1), 'SAME',
                                     dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    return y + layer['bias']

  def pool(h):
    return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), 'VALID')

  h = pool(jax.nn.relu(conv(x, p['Conv_0'])))
  h = pool(jax.nn.relu(conv(h, p['Conv_1'])))
  assert h.shape == (2, 7, 7, 64)
  h = jax.nn.relu(h.reshape(2, -1) @ p['Dense_0']['kernel'] + p['Dense_0']['bias'])
  want = h @ p['Dense_1']['kernel'] + p['Dense_1']['bias']
  np.testing.assert_allclose(jax.jit(m.apply)(p, x), want, rtol=1e-4, atol=1e-5)
  logits, acts = jax.jit(lambda q, v: m.apply(q, v, with_activations=True))(p, x)
  assert sorted(a.shape[1:] for a in acts) == sorted([(28, 28, 32), (14, 14, 64), (512,)])


def test_mcmahan_cnn_head_is_last_dense():
  m = get_model('mcmahan_cnn', 62, (28, 28, 1))
  p = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
  (path,) = declared_head('mcmahan_cnn')
  assert path == ('Dense_1',) and p[path[0]]['kernel'].shape == (512, 62)


def test_man_convnet_release_measures_block_3_after_its_pooling():
  """model_kwargs.man_measure='release' (the MAN authors' code): the same network and logits, but block 3's sown
  activation is its max-pooled output (8x8, not 16x16): MAN's regularizer reads a different tensor."""
  x = _normal(1, (2, 32, 32, 3))
  paper, release = (get_model('man_convnet', 20, (32, 32, 3), man_measure=v) for v in ('paper', 'release'))
  p = paper.init(jax.random.key(0), x)
  lp, ap = paper.apply(p, x, with_activations=True)
  lr, ar = release.apply(p, x, with_activations=True)
  np.testing.assert_array_equal(np.asarray(lp), np.asarray(lr))
  assert [a.shape[1:] for a in ap][:3] == [(32, 32, 64), (16, 16, 64), (8, 8, 64)]
  assert [a.shape[1:] for a in ar][:3] == [(32, 32, 64), (16, 16, 64), (4, 4, 64)]
  pooled = ap[2].reshape(2, 4, 2, 4, 2, 64).max(axis=(2, 4))          # max_pool 2x2 of the paper's block-3 act
  np.testing.assert_allclose(np.asarray(ar[2]), np.asarray(pooled), rtol=1e-6)
  for a, b in zip(ap[:2] + ap[3:], ar[:2] + ar[3:]):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ValueError, match='man_measure'):
    bad = get_model('man_convnet', 20, (32, 32, 3), man_measure='after')
    bad.init(jax.random.key(0), x)
