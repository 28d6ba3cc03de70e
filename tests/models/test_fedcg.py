"""FedCG's network (models/fedcg.py) against its formulas: the GCN (eq. 5.13), the residual domain-specific layer
(eq. 5.12) as a hand-written sum, the convolution's per-domain kernels against lax's convolution, and the
test-time soft / hard domain weights from the student."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.models import fedcg
from fedjax_flat.models.registry import get_model
from tests.fixtures import arrays

D = 3


def _rand(key, shape, scale=1.0):
  return scale * arrays.normal(key, shape)


def test_gcn_equals_formula():
  a, v, w = np.asarray(_rand(1, (D, D))), np.asarray(_rand(2, (D, 5))), np.asarray(_rand(3, (5, 5)))
  want = np.maximum(a @ v @ w, 0.0)
  np.testing.assert_allclose(fedcg.gcn(a, v, w, relu=True), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(fedcg.gcn(a, v, w, relu=False), a @ v @ w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(fedcg.gcn(a, v, None, relu=False), a @ v, rtol=1e-5, atol=1e-6)
  # the bottleneck W = I + W1 W2, given as the pair (W1, W2): the same values as the formed matrix
  w1, w2 = np.asarray(_rand(4, (5, 2))), np.asarray(_rand(5, (2, 5)))
  np.testing.assert_allclose(fedcg.gcn(a, v, (w1, w2), relu=True),
                             np.maximum(a @ v @ (np.eye(5) + w1 @ w2), 0.0), rtol=1e-5, atol=1e-5)


def _model(**kw):
  base = dict(num_domains=D, hidden=(), channels=(), classifier_channels=(), classifier_hidden=4)
  base.update(kw)
  return get_model('fedcg_net', 4, (2, 3, 1), **base)


@pytest.mark.parametrize('relu,gcn_w,bottleneck', [(True, True, 0), (False, True, 0), (True, False, 0),
                                                   (True, True, 2)])
def test_residual_layer_equals_hand_written_sum(relu, gcn_w, bottleneck):
  """z' = x K_a + b_a + lambda sum_d w_d (x K_d + b_d), [K_d | b_d] = rows of relu(A V W)."""
  m = _model(gcn_relu=relu, gcn_w=gcn_w, gcn_bottleneck=bottleneck, lambda_init=0.7)
  x = _rand(4, (5, 2, 3, 1))
  params = m.init(jax.random.key(0), x)
  layer = m.layer_names[0]
  assert m.layer_names == ('ds_0',)
  net = jax.tree_util.tree_map(np.asarray, params['net'])
  if gcn_w:      # a non-trivial W (the init is the identity)
    key = 'gcn_w2' if bottleneck else 'gcn_w'
    net[layer][key] = net[layer][key] + 0.1 * np.asarray(_rand(5, net[layer][key].shape))
  a = np.abs(np.asarray(_rand(6, (D, D))))
  params = {'net': net, 'adjacency': {layer: a}, 'soft': np.float32(1.0)}
  w = np.asarray(jax.nn.softmax(_rand(7, (5, D))))
  logits, dl = m.apply_train(params, x, w)

  xf = np.asarray(x).reshape(5, -1)
  p = net[layer]
  if not gcn_w:
    wmat = None
  elif bottleneck:
    wmat = np.eye(p['nodes'].shape[1]) + p['gcn_w1'] @ p['gcn_w2']
  else:
    wmat = p['gcn_w']
  vhat = a @ p['nodes'] if wmat is None else a @ p['nodes'] @ wmat
  vhat = np.maximum(vhat, 0.0) if relu else vhat
  want = xf @ p['agnostic']['kernel'] + p['agnostic']['bias']
  for d in range(D):
    k = vhat[d, :6 * 4].reshape(6, 4)
    b = vhat[d, 6 * 4:]
    want = want + p['lam'] * w[:, d:d + 1] * (xf @ k + b)
  np.testing.assert_allclose(logits, want, rtol=2e-4, atol=2e-5)
  assert dl.shape == (5, D)
  np.testing.assert_allclose(m.refined(params)[layer], vhat, rtol=2e-4, atol=2e-5)


def test_no_residual_is_the_domain_mixture_only():
  m = _model(residual=False, gcn_w=False, gcn_relu=False)
  x = _rand(4, (5, 2, 3, 1))
  params = m.init(jax.random.key(0), x)
  assert 'agnostic' not in params['net']['ds_0'] and 'lam' not in params['net']['ds_0']
  hard = jax.nn.one_hot(jnp.array([0, 1, 2, 1, 0]), D)
  logits, _ = m.apply_train(params, x, hard)        # A = I: separate per-domain linear models
  v = np.asarray(params['net']['ds_0']['nodes'])
  xf = np.asarray(x).reshape(5, -1)
  for i, d in enumerate([0, 1, 2, 1, 0]):
    np.testing.assert_allclose(logits[i], xf[i] @ v[d, :24].reshape(6, 4) + v[d, 24:], rtol=1e-5, atol=1e-6)


def test_domain_specific_convolution_equals_lax_conv():
  """Every layer domain-specific ('all'): the conv layer's per-domain kernels, applied through im2col patches,
  equal lax's SAME convolution with kernel [3, 3, cin, cout] of each domain."""
  m = get_model('fedcg_net', 3, (4, 4, 2), num_domains=2, channels=(3,), hidden=(5,), domain_layers='all',
                residual=False, gcn_w=False, gcn_relu=False, classifier_channels=(2,), classifier_hidden=0)
  assert m.layer_names == ('ds_0', 'ds_1', 'ds_2')
  x = _rand(1, (2, 4, 4, 2))
  params = m.init(jax.random.key(3), x)
  v = params['net']['ds_0']['nodes']
  assert v.shape == (2, 9 * 2 * 3 + 3)
  for d in range(2):
    w = jax.nn.one_hot(jnp.array([d, d]), 2)
    _, acts = m.apply_train(params, x, w, with_activations=True)
    kern = v[d, :54].reshape(3, 3, 2, 3)
    want = jax.lax.conv_general_dilated(x, kern, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    np.testing.assert_allclose(acts[0], jax.nn.relu(want + v[d, 54:]), rtol=1e-4, atol=1e-5)


def test_soft_and_hard_test_time_weights():
  m = _model()
  x = _rand(4, (6, 2, 3, 1))
  params = m.init(jax.random.key(0), x)
  params['adjacency'] = {'ds_0': jnp.abs(_rand(8, (D, D)))}     # distinct domains (a uniform A would merge them)
  dl = m.classifier_apply(params['net']['student'], x)
  soft = jax.nn.softmax(dl)
  hard = jax.nn.one_hot(jnp.argmax(dl, -1), D)
  np.testing.assert_allclose(m.apply(params, x), m.apply_train(params, x, soft)[0], rtol=1e-5, atol=1e-6)
  hard_params = {**params, 'soft': jnp.float32(0.0)}
  np.testing.assert_allclose(m.apply(hard_params, x), m.apply_train(params, x, hard)[0], rtol=1e-5, atol=1e-6)
  assert not np.allclose(m.apply(hard_params, x), m.apply(params, x))
  np.testing.assert_allclose(fedcg.domain_weights(dl, 1.0), soft, rtol=1e-6)
  np.testing.assert_allclose(fedcg.domain_weights(dl, 0.0), hard)


def test_parameter_count():
  """MLP 64 -> 16 -> 10 with the last layer domain-specific (D = 3, full W): every block counted by hand."""
  m = get_model('fedcg_net', 10, (8, 8, 1), num_domains=3, hidden=(16,), classifier_channels=(),
                classifier_hidden=8)
  p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
  q = 16 * 10 + 10
  want = {'layer_0': 64 * 16 + 16, 'ds_1': 3 * q + q * q + (16 * 10 + 10) + 1, 'student': 64 * 8 + 8 + 8 * 3 + 3}
  got = {k: sum(int(a.size) for a in jax.tree_util.tree_leaves(v)) for k, v in p['net'].items()}
  assert got == want
  assert p['adjacency']['ds_1'].shape == (3, 3) and p['soft'].shape == ()


def test_bad_kwargs():
  with pytest.raises(ValueError, match='domain_layers'):
    get_model('fedcg_net', 10, (8, 8, 1), domain_layers='first')
