"""The paper's CIFAR CNN and the digits models: parameter counts, conv lowerings agree, MAN activations."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.models import get_model, num_params


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
  np.testing.assert_allclose(a.apply(p, x), b.apply(p, x), rtol=1e-4, atol=1e-5)
  ga = jax.grad(lambda q: jnp.sum(a.apply(q, x) ** 2))(p)
  gb = jax.grad(lambda q: jnp.sum(b.apply(q, x) ** 2))(p)
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
  from fedjax_flat.core import personalized
  plain = get_model('digits_cnn', 10, (8, 8, 1))
  gn = get_model('digits_cnn', 10, (8, 8, 1), gn_groups=4)
  z = jnp.zeros((1, 8, 8, 1))
  p0, p1 = plain.init(jax.random.key(0), z), gn.init(jax.random.key(0), z)
  assert num_params(p1) - num_params(p0) == 2 * (32 + 32)           # scale + bias of two GN(32) layers
  assert sum(personalized.norm_flags(p1)) == 4 and sum(personalized.norm_flags(p0)) == 0
  # GroupNorm statistics are per example: one example's logits do not depend on the rest of the batch.
  x = jax.random.normal(jax.random.key(1), (5, 8, 8, 1))
  np.testing.assert_allclose(gn.apply(p1, x)[:1], gn.apply(p1, x[:1]), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match='not divisible'):
    get_model('digits_cnn', 10, (8, 8, 1), gn_groups=5).init(jax.random.key(0), z)


def test_fedbn_on_digits_cnn_groupnorm_keeps_norm_local():
  from fedjax_flat.training import loop
  from fedjax_flat.training.default_config import default_config
  c = default_config()
  c.dataset = 'digits_feature_shift'
  c.data.num_clients = 5
  c.model = 'digits_cnn'
  c.model_kwargs = {'gn_groups': 4}
  c.algorithm = 'fedbn'
  c.rounds, c.clients_per_round, c.eval_every, c.progress_every_s = 2, 5, 2, 1e9
  c.client.lr, c.client.batch_size = 0.05, 32
  t = loop.Trainer(c)
  init = jax.tree_util.tree_map(np.array, t.server_state['params'])
  t.train()
  srv = t.server_state['params']
  np.testing.assert_array_equal(srv['GroupNorm_0']['scale'], init['GroupNorm_0']['scale'])   # never aggregated
  assert not np.allclose(srv['Conv_0']['kernel'], init['Conv_0']['kernel'])
