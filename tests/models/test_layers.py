"""models/layers.py's Dropout: the same bits as flax's nn.Dropout (its mask's threefry hash unrolled)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.models import cnn, layers
from fedjax_flat.models.registry import get_model


@pytest.mark.parametrize('shape,p', [((300,), 0.1), ((3, 1, 50), 0.5), ((10, 14, 14, 64), 0.75), ((2, 10, 128), 0.5)])
def test_bernoulli_is_jax_random_bernoulli_bit_for_bit(shape, p):
  keys = [jax.random.key(0), jax.random.fold_in(jax.random.key(3), 7), jax.random.PRNGKey(11)]
  jitted = jax.jit(lambda k: layers.bernoulli(k, p, shape))
  for key in keys:
    want = jax.random.bernoulli(key, p, shape)
    assert 0 < np.mean(want) < 1
    assert np.array_equal(jitted(key), want)
  assert np.array_equal(layers.bernoulli(keys[0], p, shape), jax.random.bernoulli(keys[0], p, shape))
  # under vmap over keys, as the engine's one-client-at-a-time step (a batch axis of 1) and a vmapped cohort
  ks = jax.random.split(jax.random.key(5), 3)
  got = jax.jit(jax.vmap(lambda k: layers.bernoulli(k, p, shape)))(ks)
  assert np.array_equal(got, jax.vmap(lambda k: jax.random.bernoulli(k, p, shape))(ks))


def test_bernoulli_other_prng_goes_through_jax_random():
  key = jax.random.key(1, impl='rbg')
  assert layers._threefry_words(key) is None
  assert np.array_equal(layers.bernoulli(key, 0.5, (4, 9)), jax.random.bernoulli(key, 0.5, (4, 9)))


class _Net(nn.Module):
  drop: type

  @nn.compact
  def __call__(self, x, train=True):
    x = self.drop(0.25, deterministic=not train)(x)
    x = nn.Dense(6)(x)
    x = self.drop(0.5, broadcast_dims=(0,), deterministic=not train)(x)
    return self.drop(0.0, deterministic=not train)(x)


def test_dropout_module_is_flax_dropout_bit_for_bit():
  x = jax.random.normal(jax.random.key(0), (5, 8))
  ref, ours = _Net(nn.Dropout), _Net(layers.Dropout)
  params = ref.init({'params': jax.random.key(1)}, x, train=False)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(ours.init(
      {'params': jax.random.key(1)}, x, train=False))

  def loss(net, p, x, key):
    return jnp.sum(net.apply(p, x, rngs={'dropout': key}) ** 2)
  for key in (jax.random.key(2), jax.random.key(3)):
    a = jax.jit(jax.value_and_grad(lambda p, x: loss(ref, p, x, key), argnums=(0, 1)))(params, x)
    b = jax.jit(jax.value_and_grad(lambda p, x: loss(ours, p, x, key), argnums=(0, 1)))(params, x)
    assert all(np.array_equal(u, v) for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
  assert np.array_equal(ours.apply(params, x, train=False), ref.apply(params, x, train=False))


@pytest.mark.parametrize('name,shape,classes', [('pfl_cnn', (32, 32, 3), 10), ('femnist_cnn', (28, 28, 1), 62)])
def test_cnn_training_step_is_unchanged_by_the_dropout_layer(monkeypatch, name, shape, classes):
  """The models' loss and gradients with dropout on, against the same models built with flax's nn.Dropout."""
  x = jax.random.normal(jax.random.key(0), (4,) + shape)
  y = jnp.arange(4) % classes

  def grads(model):
    params = model.init(jax.random.key(1), x)

    def loss(p):
      logits = model.apply(p, x, train=True, rng=jax.random.fold_in(jax.random.key(2), 9))
      return jnp.mean(-jax.nn.log_softmax(logits)[jnp.arange(4), y])
    return jax.jit(jax.value_and_grad(loss))(params)
  ours = grads(get_model(name, classes, shape))
  monkeypatch.setattr(cnn, 'Dropout', nn.Dropout)
  ref = grads(get_model(name, classes, shape))
  assert all(np.array_equal(u, v) for u, v in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(ref)))
