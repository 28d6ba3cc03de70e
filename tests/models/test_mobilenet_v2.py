"""The inverted residual block shared by MobileNetV2-GN (models/mobilenet_v2.py) and DeepLabV3's BatchNorm backbone
(models/deeplabv3.py): each variant's parameter tree (its own names) and its output against the block's formula
written with lax convolutions and the norms by hand: [conv1x1 expand, norm, ReLU6] (t != 1), depthwise conv3x3
stride s, norm, ReLU6, conv1x1 project, norm, + x when s = 1 and cin = c."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.models.deeplabv3 import InvertedResidualBN
from fedjax_flat.models.mobilenet_v2 import InvertedResidual
from tests.fixtures import arrays

EPS = 1e-5


def _conv(x, k, strides=1, groups=1):
  """PyTorch-padded (k // 2) convolution, NHWC x HWIO."""
  p = k.shape[0] // 2
  return jax.lax.conv_general_dilated(x, k, (strides, strides), [(p, p), (p, p)], feature_group_count=groups,
                                      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
                                      precision=jax.lax.Precision.HIGHEST)


def _gn(x, scale, bias, groups):
  b, h, w, c = x.shape
  g = x.reshape(b, h, w, groups, c // groups)
  mu = g.mean(axis=(1, 2, 4), keepdims=True)
  var = ((g - mu) ** 2).mean(axis=(1, 2, 4), keepdims=True)
  return ((g - mu) / jnp.sqrt(var + EPS)).reshape(x.shape) * scale + bias


def _formula(x, units, strides, residual):
  """units: [(kernel, norm_fn, act)] in order; the depthwise one is the 3 x 3 kernel."""
  y = x
  for k, norm, act in units:
    depthwise = k.shape[0] == 3
    y = norm(_conv(y, k, strides if depthwise else 1, y.shape[-1] if depthwise else 1))
    y = jnp.clip(y, 0.0, 6.0) if act else y
  return x + y if residual else y


@pytest.mark.parametrize('strides,expand,cin,cout', [(1, 2, 8, 8), (2, 1, 8, 4)])
def test_groupnorm_block_is_the_formula(strides, expand, cin, cout):
  block = InvertedResidual(cout, strides, expand, gn_groups=2)
  x = arrays.normal(0, (2, 6, 6, cin))
  params = jax.jit(block.init)(jax.random.PRNGKey(1), x)['params']
  names = ['dw', 'project'] if expand == 1 else ['expand', 'dw', 'project']
  assert set(params) == {f'{n}_{p}' for n in names for p in ('conv', 'gn')}
  params = jax.tree_util.tree_map(lambda a: a + 0.1 * arrays.normal(2, a.shape), params)
  got, state = jax.jit(lambda p, x: block.apply({'params': p}, x, mutable=['intermediates']))(params, x)

  @jax.jit
  def want_fn(params, x):
    units = [(params[f'{n}_conv']['kernel'],
              lambda y, n=n: _gn(y, params[f'{n}_gn']['scale'], params[f'{n}_gn']['bias'], 2), n != 'project')
             for n in names]
    return _formula(x, units, strides, strides == 1 and cin == cout)
  want = want_fn(params, x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
  assert len(state['intermediates']['act']) == len(names) - 1      # ReLU6 outputs sown on the block itself


@pytest.mark.parametrize('strides,expand,cin,cout', [(1, 3, 4, 4), (2, 1, 4, 8)])
def test_batchnorm_block_is_the_formula(strides, expand, cin, cout):
  block = InvertedResidualBN(cout, strides, expand)
  x = arrays.normal(0, (2, 6, 6, cin))
  variables = jax.jit(lambda k, x: block.init(k, x, True))(jax.random.PRNGKey(1), x)
  names = ['dw', 'project'] if expand == 1 else ['expand', 'dw', 'project']
  assert set(variables['params']) == set(names) == set(variables['batch_stats'])
  assert all(set(variables['params'][n]) == {'conv', 'bn'} for n in names)
  noise = lambda t, s: jax.tree_util.tree_map(  # noqa: E731
      lambda a: a + 0.1 * jnp.abs(arrays.normal(s, a.shape)), t)
  params, stats = noise(variables['params'], 2), noise(variables['batch_stats'], 3)   # variances stay > 0
  got, state = jax.jit(lambda v, x: block.apply(v, x, True, mutable=['intermediates']))(
      {'params': params, 'batch_stats': stats}, x)

  @jax.jit
  def want_fn(params, stats, x):
    def bn(y, n):
      return (y - stats[n]['bn']['mean']) / jnp.sqrt(stats[n]['bn']['var'] + EPS) * params[n]['bn']['scale'] \
          + params[n]['bn']['bias']
    units = [(params[n]['conv']['kernel'], lambda y, n=n: bn(y, n), n != 'project') for n in names]
    return _formula(x, units, strides, strides == 1 and cin == cout)
  want = want_fn(params, stats, x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
  assert set(state['intermediates']) == set(names) - {'project'}   # sown by each ConvBNAct unit
