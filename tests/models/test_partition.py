"""The head/body split (models/partition.py): declared heads, masks, the representation before the head."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms.wrappers import local_norm
from fedjax_flat.models import partition
from fedjax_flat.models.registry import declared_head, get_model
from tests.fixtures import arrays


def _model(name, shape, **kw):
  m = get_model(name, 3, shape, **kw)
  return m, m.init(jax.random.key(0), jnp.zeros((1,) + shape))


def test_mlp_head_is_its_last_dense_and_z_is_the_hidden_layer():
  m, p = _model('mlp', (2, 2, 1), hidden=(4,))
  assert m.head == (('Dense_1',),)
  mask = partition.head_mask(m, p)
  assert mask == {'Dense_0': {'kernel': False, 'bias': False}, 'Dense_1': {'kernel': True, 'bias': True}}
  x = arrays.normal(1, (5, 2, 2, 1))
  logits, z = partition.representation(m, p, x)
  want_z = jax.nn.relu(x.reshape(5, -1) @ p['Dense_0']['kernel'] + p['Dense_0']['bias'])
  np.testing.assert_allclose(z, want_z, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(logits, z @ p['Dense_1']['kernel'] + p['Dense_1']['bias'], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(logits, m.apply(p, x), rtol=1e-6)
  # frozen(): the head's gradient is exactly 0, the body's is not; merge() picks leaves by the mask
  g = jax.grad(lambda q: jnp.sum(m.apply(partition.frozen(mask, q), x) ** 2))(p)
  assert float(jnp.abs(g['Dense_1']['kernel']).max()) == 0.0 and float(jnp.abs(g['Dense_0']['kernel']).max()) > 0
  merged = partition.merge(mask, jax.tree_util.tree_map(jnp.zeros_like, p), p)
  assert float(jnp.abs(merged['Dense_1']['kernel']).max()) == 0.0
  np.testing.assert_array_equal(merged['Dense_0']['kernel'], p['Dense_0']['kernel'])
  # the declaration follows the model's kwargs: two hidden layers -> Dense_2
  assert declared_head('mlp', {'hidden': (4, 4)}) == (('Dense_2',),)


@pytest.mark.slow   # a CNN's compile (CI time budget); the MLP case above checks the same at a tiny size
def test_digits_cnn_split_and_representation_under_jit_and_grad():
  m, p = _model('digits_cnn', (8, 8, 1), gn_groups=2)
  mask = partition.head_mask(m, p)
  flat = {'/'.join(partition.key_name(k) for k in path): v
          for path, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  assert {k for k, v in flat.items() if v} == {'Dense_1/kernel', 'Dense_1/bias'}
  x = arrays.normal(2, (4, 8, 8, 1))
  logits, z = jax.jit(lambda q, x: partition.representation(m, q, x))(p, x)
  assert z.shape == (4, p['Dense_1']['kernel'].shape[0])
  np.testing.assert_allclose(logits, z @ p['Dense_1']['kernel'] + p['Dense_1']['bias'], rtol=1e-4, atol=1e-5)
  # frozen(): the head's gradient is exactly 0, the body's is not
  g = jax.grad(lambda q: jnp.sum(m.apply(partition.frozen(mask, q), x) ** 2))(p)
  assert float(jnp.abs(g['Dense_1']['kernel']).max()) == 0.0
  assert float(jnp.abs(g['Conv_0']['kernel']).max()) > 0.0
  merged = partition.merge(mask, jax.tree_util.tree_map(jnp.zeros_like, p), p)
  assert float(jnp.abs(merged['Dense_1']['kernel']).max()) == 0.0
  np.testing.assert_array_equal(merged['Conv_0']['kernel'], p['Conv_0']['kernel'])


@pytest.mark.slow   # a ResNet's compile (CI time budget); the MLP and CNN cases above are the fast ones
def test_resnet_head_and_local_masks_reuse_the_same_predicate():
  m, p = _model('resnet20_gn', (8, 8, 3))
  select = partition.is_head_path(m.head)
  flags = local_norm.norm_flags(p, select)       # FedBN-style local masks take the head predicate as is
  assert flags == partition.head_flags(m, p) and sum(flags) == 2
  assert partition.representation(m, p, jnp.ones((2, 8, 8, 3)))[1].shape == (2, 64)


def test_a_model_without_a_declared_head_is_refused_in_one_line():
  m, p = _model('mlp', (2, 2, 1), hidden=())
  with pytest.raises(ValueError, match='whole model'):
    partition.head_mask(m, p)
  bare = m.__class__(**{**m.__dict__, 'head': ()})
  with pytest.raises(ValueError, match='declares no classifier head'):
    partition.head_mask(bare, p)
