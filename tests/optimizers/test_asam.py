"""Tests for fedjax_flat.optimizers.asam."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_flat.optimizers.asam import asam, default_adaptive_predicate
from fedjax_flat.optimizers.sam import sam


def _probe(p):
  """A grad_fn that returns its argument, so the returned updates are the ascent point w + e."""
  return p


def _dense_problem(seed=0):
  rng = np.random.RandomState(seed)
  params = {'Dense_0': {'kernel': jnp.asarray(rng.randn(3, 2), jnp.float32),
                        'bias': jnp.asarray(rng.randn(2) + 5.0, jnp.float32)}}
  x = jnp.asarray(rng.randn(6, 3), jnp.float32)
  y = jnp.asarray(rng.randn(6, 2), jnp.float32)

  def loss(p):
    pred = x @ p['Dense_0']['kernel'] + p['Dense_0']['bias']
    return 0.5 * jnp.mean(jnp.sum((pred - y) ** 2, axis=-1))

  return params, loss


def _np(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _expected_ascent(params, grads, rho, eta):
  """Reference-code ASAM in float64: T = |w| + eta on the kernel, 1 on the bias."""
  w, g = _np(params)['Dense_0'], _np(grads)['Dense_0']
  t_k, t_b = np.abs(w['kernel']) + eta, np.ones_like(w['bias'])
  gk, gb = t_k * g['kernel'], t_b * g['bias']
  n = np.sqrt(np.sum(gk ** 2) + np.sum(gb ** 2))
  return {'Dense_0': {'kernel': w['kernel'] + rho * t_k * gk / n,
                      'bias': w['bias'] + rho * t_b * gb / n}}


def test_default_predicate():
  params = {'Conv_0': {'kernel': 1, 'bias': 2}, 'GroupNorm_0': {'scale': 3, 'bias': 4},
            'Dense_0': {'kernel': 5, 'bias': 6}}
  marks = jax.tree_util.tree_map_with_path(default_adaptive_predicate, params)
  assert marks == {'Conv_0': {'kernel': True, 'bias': False},
                   'GroupNorm_0': {'scale': True, 'bias': False},
                   'Dense_0': {'kernel': True, 'bias': False}}


def test_closed_form_ascent_and_update():
  rho, eta, lr = 0.5, 0.01, 0.1
  params, loss = _dense_problem()
  grad_fn = jax.grad(loss)
  g = grad_fn(params)

  ascent, _ = asam(rho, eta).update(g, asam(rho, eta).init(params), params, grad_fn=_probe)
  expected = _expected_ascent(params, g, rho, eta)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), ascent, expected)
  # ||T^{-1} e||_2 = rho: the ASAM neighbourhood constraint is tight.
  w = _np(params)['Dense_0']
  e = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, ascent, _np(params))['Dense_0']
  tinv_e = np.concatenate([(e['kernel'] / (np.abs(w['kernel']) + eta)).ravel(), e['bias']])
  np.testing.assert_allclose(np.linalg.norm(tinv_e), rho, rtol=1e-4)

  tx = optax.chain(asam(rho, eta), optax.sgd(lr))
  updates, _ = tx.update(g, tx.init(params), params, grad_fn=grad_fn)
  new_params = optax.apply_updates(params, updates)
  g2 = grad_fn(jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), expected))
  jax.tree.map(lambda n, p, gg: np.testing.assert_allclose(n, p - lr * gg, rtol=1e-5, atol=1e-6),
               new_params, params, g2)


def test_bias_is_not_scaled():
  # Bias ~ 5 and kernel ~ 1: if T were applied to the bias, its perturbation would grow by ~5x.
  rho, eta = 0.5, 0.0
  params, loss = _dense_problem()
  g = jax.grad(loss)(params)
  ascent, _ = asam(rho, eta).update(g, asam(rho, eta).init(params), params, grad_fn=_probe)
  w, gn = _np(params)['Dense_0'], _np(g)['Dense_0']
  n = np.sqrt(np.sum((np.abs(w['kernel']) * gn['kernel']) ** 2) + np.sum(gn['bias'] ** 2))
  e_bias = np.asarray(ascent['Dense_0']['bias'], np.float64) - w['bias']
  np.testing.assert_allclose(e_bias, rho * gn['bias'] / n, rtol=1e-4)
  scaled = rho * w['bias'] ** 2 * gn['bias'] / n  # what a scaled bias would get (T = |b|)
  assert np.abs(e_bias - scaled).max() > 0.1


def test_predicate_all_false_is_sam():
  rho = 0.3
  params, loss = _dense_problem()
  grad_fn = jax.grad(loss)
  g = grad_fn(params)
  a_tx = optax.chain(asam(rho, 0.5, adaptive_predicate=lambda path, leaf: False), optax.sgd(0.1))
  s_tx = optax.chain(sam(rho), optax.sgd(0.1))
  ua, _ = a_tx.update(g, a_tx.init(params), params, grad_fn=grad_fn)
  us, _ = s_tx.update(g, s_tx.init(params), params, grad_fn=grad_fn)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), ua, us)


def _two_layer_problem():
  rng = np.random.RandomState(1)
  params = {'Dense_0': {'kernel': jnp.asarray(rng.randn(4, 3), jnp.float32)},
            'Dense_1': {'kernel': jnp.asarray(rng.randn(3, 2), jnp.float32)}}
  x = jnp.asarray(rng.randn(8, 4), jnp.float32)
  y = jnp.asarray(rng.randn(8, 2), jnp.float32)

  def loss(p):  # f(x) = W2 (W1 x), no biases: W1 -> a W1, W2 -> W2 / a leaves f unchanged
    pred = (x @ p['Dense_0']['kernel']) @ p['Dense_1']['kernel']
    return 0.5 * jnp.mean(jnp.sum((pred - y) ** 2, axis=-1))

  return params, loss


def _perturbed_loss(tx, params, loss):
  ascent, _ = tx.update(jax.grad(loss)(params), tx.init(params), params, grad_fn=_probe)
  return float(loss(ascent))


def test_asam_perturbed_loss_is_scale_invariant_sam_is_not():
  rho = 0.5
  params, loss = _two_layer_problem()
  a = 4.0
  rescaled = {'Dense_0': {'kernel': a * params['Dense_0']['kernel']},
              'Dense_1': {'kernel': params['Dense_1']['kernel'] / a}}
  np.testing.assert_allclose(loss(rescaled), loss(params), rtol=1e-5)  # same function

  asam_l, asam_l_resc = (_perturbed_loss(asam(rho, eta=0.0), p, loss) for p in (params, rescaled))
  sam_l, sam_l_resc = (_perturbed_loss(sam(rho), p, loss) for p in (params, rescaled))
  base = float(loss(params))
  assert asam_l > base  # the perturbation is an ascent step
  np.testing.assert_allclose(asam_l_resc, asam_l, rtol=1e-4)
  assert abs(sam_l_resc - sam_l) / sam_l > 0.05


def test_jit_traced_rho_zero_gradient_and_grad_fn_required():
  params, loss = _dense_problem()
  grad_fn = jax.grad(loss)
  g = grad_fn(params)

  @jax.jit
  def ascent(p, rho):
    tx = asam(rho, 0.01)
    return tx.update(grad_fn(p), tx.init(p), p, grad_fn=_probe, batch=None)[0]

  expected = _expected_ascent(params, g, 0.2, 0.01)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), ascent(params, 0.2),
               expected)
  # rho = 0 returns grad_fn(params) exactly.
  jax.tree.map(np.testing.assert_array_equal, ascent(params, 0.0), params)

  zeros = jax.tree.map(jnp.zeros_like, params)
  out, _ = asam(0.1).update(zeros, asam(0.1).init(params), params, grad_fn=lambda p: zeros)
  for leaf in jax.tree.leaves(out):
    np.testing.assert_array_equal(leaf, np.zeros_like(leaf))

  with pytest.raises(ValueError, match='grad_fn'):
    asam(0.1).update(g, asam(0.1).init(params), params)
