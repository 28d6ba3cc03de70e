"""ff.register_model: Flax Linen and NNX modules as pure init / apply (models/user.py)."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fedjax_flat as ff
from fedjax_flat.errors import BadInputError
from fedjax_flat.models import registry as model_registry
from fedjax_flat.models import user
from fedjax_flat.registry import DuplicateName
from tests.fixtures.configs import small_config


class LinenMLP(nn.Module):
  num_classes: int = 10

  @nn.compact
  def __call__(self, x):             # no `train`: called without it
    x = x.reshape(x.shape[0], -1)
    return nn.Dense(self.num_classes, name='out')(nn.relu(nn.Dense(16, name='hidden')(x)))


class NnxMLP(nnx.Module):
  def __init__(self, num_classes, input_shape, *, rngs):
    self.hidden = nnx.Linear(math.prod(input_shape), 16, rngs=rngs)
    self.out = nnx.Linear(16, num_classes, rngs=rngs)

  def __call__(self, x):
    return self.out(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))


class NnxDropout(nnx.Module):
  def __init__(self, num_classes, input_shape, *, rngs):
    self.hidden = nnx.Linear(math.prod(input_shape), 16, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)
    self.out = nnx.Linear(16, num_classes, rngs=rngs)

  def __call__(self, x):
    h = nnx.relu(self.hidden(x.reshape(x.shape[0], -1)))
    self.sow(nnx.Intermediate, 'act', h)
    return self.out(self.drop(h))


@pytest.fixture(autouse=True)
def _clean_registry():
  before = set(model_registry.names())
  yield
  for name in set(model_registry.names()) - before:
    model_registry.MODELS._entries.pop(name)


def _config(model, **over):
  c = small_config(model=model, **over)
  c.model_kwargs = {}
  return c


def _linen_init(config):
  """The Linen model's initial params in a run of `config` (the plan's init key: fold_in(key(seed), 0))."""
  model = model_registry.get_model(config.model, 10, (8, 8, 1))
  return model.init(jax.random.fold_in(jax.random.key(config.seed), 0), jnp.zeros((1, 8, 8, 1)))


def _nnx_copy(linen_params):
  """An NnxMLP instance holding the Linen model's values: NNX's Linear is Linen's Dense (kernel [in, out])."""
  m = NnxMLP(10, (8, 8, 1), rngs=nnx.Rngs(1))
  for layer in ('hidden', 'out'):
    for leaf in ('kernel', 'bias'):
      getattr(getattr(m, layer), leaf)[...] = jnp.asarray(linen_params[layer][leaf])
  return m


@pytest.mark.parametrize('optimizer', ['sgd', 'sam'])
def test_an_nnx_model_trains_as_the_equivalent_linen_model(optimizer):
  over = {'client.optimizer': optimizer, 'client.rho': 0.05} if optimizer == 'sam' else {}
  ff.register_model('linen_mlp', LinenMLP)
  linen = ff.train('fedavg', _config('linen_mlp', **over))
  ff.register_model('nnx_copy', _nnx_copy(_linen_init(_config('linen_mlp'))))
  mine = ff.train('fedavg', _config('nnx_copy', **over))
  assert set(mine.params) == {'hidden', 'out'} and set(mine.params['hidden']) == {'kernel', 'bias'}
  for layer in ('hidden', 'out'):
    for leaf in ('kernel', 'bias'):
      np.testing.assert_allclose(mine.params[layer][leaf], linen.params[layer][leaf], rtol=1e-5, atol=1e-6)
  assert mine.summary['final_test_accuracy'] == pytest.approx(linen.summary['final_test_accuracy'], abs=1e-6)
  assert [r['round'] for r in mine.records] == [r['round'] for r in linen.records] == [2, 4]
  if optimizer == 'sam':     # the Hessian tools on the NNX model: the same spectrum as the Linen one
    eig = {}
    for name, r in (('linen', linen), ('nnx', mine)):
      batches = ff.analysis.make_fixed_batches(r.data.test_x, r.data.test_y, batch_size=64)
      hvp = ff.analysis.make_hvp(r.model, r.params, batches)
      pairs = ff.analysis.top_eigenpairs(hvp, ff.analysis.param_dim(r.params), k=1, num_steps=10)
      eig[name] = float(pairs.eigenvalues[0])
    assert eig['nnx'] > 0 and eig['nnx'] == pytest.approx(eig['linen'], rel=1e-3)


def test_an_nnx_class_is_initialised_from_the_runs_key_and_its_apply_is_pure():
  model = user.as_model('drop', NnxDropout, 3, (2, 2))
  x = jnp.ones((5, 2, 2))
  p0, p0_again = (model.init(jax.random.key(0), x) for _ in range(2))
  p1 = model.init(jax.random.key(1), x)
  assert jax.tree_util.tree_structure(p0) == jax.tree_util.tree_structure({'hidden': {'bias': 0, 'kernel': 0},
                                                                            'out': {'bias': 0, 'kernel': 0}})
  np.testing.assert_array_equal(p0['hidden']['kernel'], p0_again['hidden']['kernel'])
  assert not np.array_equal(p0['hidden']['kernel'], p1['hidden']['kernel'])
  step = jax.jit(lambda p, k: model.apply(p, x, train=True, rng=k))
  a, a_again, b = step(p0, jax.random.key(3)), step(p0, jax.random.key(3)), step(p0, jax.random.key(4))
  np.testing.assert_array_equal(a, a_again)          # dropout: a function of the key alone
  assert not np.array_equal(a, b)
  ev = model.apply(p0, x)                            # evaluation: no dropout, every row the same input
  np.testing.assert_array_equal(ev, jnp.broadcast_to(ev[:1], ev.shape))
  out, acts = jax.jit(lambda p: model.apply(p, x, with_activations=True))(p0)
  assert len(acts) == 1 and acts[0].shape == (5, 16) and bool((acts[0] >= 0).all())
  g = jax.grad(lambda p: step(p, jax.random.key(3)).sum())(p0)
  assert jax.tree_util.tree_structure(g) == jax.tree_util.tree_structure(p0)


def test_a_linen_instance_and_a_factory_taking_model_kwargs():
  ff.register_model('inst', LinenMLP(num_classes=4))
  m = model_registry.get_model('inst', 4, (3,))
  assert m.apply(m.init(jax.random.key(0), jnp.zeros((1, 3))), jnp.zeros((2, 3))).shape == (2, 4)
  ff.register_model('wide', lambda num_classes, width: LinenMLP(num_classes=num_classes * width))
  m = model_registry.get_model('wide', 2, (3,), width=3)
  assert m.apply(m.init(jax.random.key(0), jnp.zeros((1, 3))), jnp.zeros((2, 3))).shape == (2, 6)
  with pytest.raises(BadInputError, match=r"model 'wide': config.model_kwargs \['depth'\] are not arguments"):
    model_registry.get_model('wide', 2, (3,), width=3, depth=2)


def test_bad_models_are_one_line():
  class WithBN(nnx.Module):
    def __init__(self, num_classes, input_shape, *, rngs):
      self.bn = nnx.BatchNorm(input_shape[-1], rngs=rngs)

    def __call__(self, x):
      return self.bn(x)
  ff.register_model('bn', WithBN)
  with pytest.raises(BadInputError, match="model 'bn': NNX BatchNorm") as e:
    model_registry.get_model('bn', 2, (3,))
  assert '\n' not in str(e.value)
  ff.register_model('not_a_module', lambda num_classes: 'oops')
  with pytest.raises(BadInputError, match='returned str, not a Flax Linen or NNX module'):
    model_registry.get_model('not_a_module', 2, (3,))
  with pytest.raises(BadInputError, match='a Flax Linen or NNX module'):
    ff.register_model('x', 3)
  with pytest.raises(DuplicateName, match="'digits_cnn' is already registered"):
    ff.register_model('digits_cnn', LinenMLP)
