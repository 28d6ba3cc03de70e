"""The paper's CIFAR CNN and the digits models: parameter counts, conv lowerings agree, MAN activations."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.models.base import num_params
from fedjax_flat.models.registry import get_model


@pytest.mark.parametrize('classes,expected', [(10, 797_962), (100, 815_332)])
def test_cifar_cnn_param_count(classes, expected):
  m = get_model('cifar_cnn', classes, (32, 32, 3))
  shapes = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  assert num_params(shapes) == expected


@pytest.mark.parametrize('name,shape', [('cifar_cnn', (32, 32, 3)), ('digits_cnn', (8, 8, 1))])
def test_im2col_and_lax_convolutions_agree(name, shape):
  a = get_model(name, 10, shape, conv_impl='im2col')
  b = get_model(name, 10, shape, conv_impl='lax')
  x = jax.random.normal(jax.random.key(1), (3,) + shape)
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
  x = jax.random.normal(jax.random.key(1), (5, 8, 8, 1))
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
  x = jax.random.normal(jax.random.key(0), shape)
  if ties:   # many tied maxima (and whole tied windows): the gradient goes to the FIRST one, as reduce_window
    x = jnp.round(x)
  mine = lambda v: layers.max_pool(v, (window, window), pool_impl='reshape')
  ref = lambda v: nn.max_pool(v, (window, window), strides=(window, window))
  dy = jax.random.normal(jax.random.key(1), ref(x).shape)
  tx = jax.random.normal(jax.random.key(2), x.shape)   # forward mode too (HVPs use it)

  def all_modes(pool):       # one compiled program per pooling (eager mode would compile every op)
    @jax.jit
    def run(x, dy, tx):
      y, vjp = jax.vjp(pool, x)
      return y, vjp(dy)[0], jax.jvp(pool, (x,), (tx,))[1]
    return run(x, dy, tx)
  for a, b in zip(all_modes(mine), all_modes(ref)):   # values, gradient, forward-mode derivative: exactly equal
    np.testing.assert_array_equal(a, b)


def test_reshape_max_pool_second_order_matches_without_ties():
  x = jax.random.normal(jax.random.key(0), (1, 4, 6, 2))
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
  x = jax.random.normal(jax.random.key(1), (3,) + shape)
  p = a.init(jax.random.key(0), x)
  np.testing.assert_array_equal(a.apply(p, x), b.apply(p, x))
  ga = jax.grad(lambda q: jnp.sum(a.apply(q, x) ** 2))(p)
  gb = jax.grad(lambda q: jnp.sum(b.apply(q, x) ** 2))(p)
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7), ga, gb)


@pytest.mark.parametrize('kernel,stride,padding,cin,hw', [
    (5, 1, 'VALID', 3, 32), (5, 1, 'VALID', 64, 14),     # the paper CNN's two convs
    (3, 1, 'SAME', 1, 8), (3, 2, 'SAME', 4, 9), (3, 2, 'VALID', 5, 11), (1, 2, 'SAME', 6, 7), (4, 3, 'SAME', 2, 10)])
def test_im2col_conv_equals_lax_conv(kernel, stride, padding, cin, hw):
  x = jax.random.normal(jax.random.key(0), (2, hw, hw + 1, cin))
  mods = {impl: layers.Conv(8, (kernel, kernel), strides=stride, padding=padding, conv_impl=impl)
          for impl in ('im2col', 'lax')}
  p = mods['lax'].init(jax.random.key(1), x)
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
