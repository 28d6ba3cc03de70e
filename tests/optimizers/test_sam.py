"""Tests for fedjax_flat.optimizers.sam."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from fedjax_flat.optimizers.sam import sam

# Quadratic L(w) = 0.5 w^T A w - b^T w, so grad L(w) = A w - b.
A = np.array([[3.0, 1.0], [1.0, 2.0]])
B = np.array([1.0, -1.0])
W0 = np.array([1.0, 2.0])


def quad_loss(w):
  return 0.5 * w @ jnp.asarray(A, jnp.float32) @ w - jnp.asarray(B, jnp.float32) @ w


quad_grad = jax.grad(quad_loss)


def closed_form_ascent(w, rho):
  """w + e with e = rho g / ||g||, in float64."""
  g = A @ w - B
  return w + rho * g / np.linalg.norm(g)


def step(tx, params, grad_fn, state=None, **extra):
  if state is None:
    state = tx.init(params)
  updates, state = tx.update(grad_fn(params), state, params, grad_fn=grad_fn, **extra)
  return optax.apply_updates(params, updates), state


def test_quadratic_closed_form_ascent_and_update():
  rho, lr = 0.3, 0.1
  w = jnp.asarray(W0, jnp.float32)
  # g = A w0 - b = [4, 6]; the probe grad_fn(p) = p exposes the ascent point w + e.
  updates, _ = sam(rho).update(quad_grad(w), sam(rho).init(w), w, grad_fn=lambda p: p)
  expected_ascent = W0 + rho * np.array([4.0, 6.0]) / np.sqrt(52.0)
  np.testing.assert_allclose(updates, expected_ascent, rtol=1e-6)
  np.testing.assert_allclose(closed_form_ascent(W0, rho), expected_ascent, rtol=1e-12)

  # sam + sgd: w <- w - lr (A (w + e) - b).
  tx = optax.chain(sam(rho), optax.sgd(lr))
  new_w, state = step(tx, w, quad_grad)
  expected = W0 - lr * (A @ expected_ascent - B)
  np.testing.assert_allclose(new_w, expected, rtol=1e-6)
  # ...which is not the plain SGD step.
  assert np.abs(np.asarray(new_w) - (W0 - lr * (A @ W0 - B))).max() > 1e-2
  assert int(state[0].count) == 1


def test_weight_decay_uses_unperturbed_params():
  rho, lr, wd = 0.3, 0.1, 0.5
  w = jnp.asarray(W0, jnp.float32)
  tx = optax.chain(sam(rho), optax.add_decayed_weights(wd), optax.sgd(lr))
  new_w, _ = step(tx, w, quad_grad)
  ascent = closed_form_ascent(W0, rho)
  expected = W0 - lr * (A @ ascent - B + wd * W0)
  wrong = W0 - lr * (A @ ascent - B + wd * ascent)  # decay on w + e
  np.testing.assert_allclose(new_w, expected, rtol=1e-6)
  assert np.abs(np.asarray(new_w) - wrong).max() > 1e-3


def test_matches_optax_contrib_sam_opaque_over_several_steps():
  rho, lr = 0.05, 0.1
  mine = optax.chain(sam(rho), optax.sgd(lr, momentum=0.9))
  ref = optax.contrib.sam(
      optax.sgd(lr, momentum=0.9),
      optax.chain(optax.contrib.normalize(), optax.sgd(rho)),
      sync_period=2, opaque_mode=True)
  w_mine = w_ref = jnp.asarray(W0, jnp.float32)
  s_mine, s_ref = mine.init(w_mine), ref.init(w_ref)
  for _ in range(5):
    w_mine, s_mine = step(mine, w_mine, quad_grad, s_mine)
    # optax's opaque mode calls grad_fn(params, i), i = adversarial step index.
    u, s_ref = ref.update(quad_grad(w_ref), s_ref, w_ref, grad_fn=lambda p, i: quad_grad(p))
    w_ref = optax.apply_updates(w_ref, u)
    np.testing.assert_allclose(w_mine, w_ref, rtol=1e-5, atol=1e-6)
  # The trajectory actually moved (nonzero gradients at every step).
  assert np.abs(np.asarray(w_mine) - W0).max() > 0.1


def test_jit_with_traced_rho():
  lr = 0.1

  @jax.jit
  def one_step(w, rho):
    tx = optax.chain(sam(rho), optax.sgd(lr))
    return step(tx, w, quad_grad)[0]

  w = jnp.asarray(W0, jnp.float32)
  for rho in (0.3, 0.7):
    expected = W0 - lr * (A @ closed_form_ascent(W0, rho) - B)
    np.testing.assert_allclose(one_step(w, jnp.float32(rho)), expected, rtol=1e-6)
  assert one_step._cache_size() == 1  # rho is traced: one compilation for both values.


def test_rho_schedule_uses_update_count():
  lr = 0.1
  schedule = lambda count: 0.1 * (count + 1)  # 0.1 at step 0, 0.2 at step 1
  tx = optax.chain(sam(schedule), optax.sgd(lr))
  w = jnp.asarray(W0, jnp.float32)
  w1, state = step(tx, w, quad_grad)
  w2, state = step(tx, w1, quad_grad, state)
  e1 = W0 - lr * (A @ closed_form_ascent(W0, 0.1) - B)
  e2 = e1 - lr * (A @ closed_form_ascent(e1, 0.2) - B)
  np.testing.assert_allclose(w1, e1, rtol=1e-6)
  np.testing.assert_allclose(w2, e2, rtol=1e-5)
  assert int(state[0].count) == 2


def _dense_problem():
  """Flax-like params for a linear model y = x @ kernel + bias with MSE loss."""
  rng = np.random.RandomState(0)
  params = {'Dense_0': {'kernel': jnp.asarray(rng.randn(3, 2), jnp.float32),
                        'bias': jnp.asarray(rng.randn(2), jnp.float32)}}
  x = jnp.asarray(rng.randn(5, 3), jnp.float32)
  y = jnp.asarray(rng.randn(5, 2), jnp.float32)

  def loss(p):
    pred = x @ p['Dense_0']['kernel'] + p['Dense_0']['bias']
    return 0.5 * jnp.mean(jnp.sum((pred - y) ** 2, axis=-1))

  return params, loss


def test_pytree_of_dicts_uses_one_global_norm():
  rho, lr = 0.2, 0.05
  params, loss = _dense_problem()
  grad_fn = jax.grad(loss)
  tx = optax.chain(sam(rho), optax.sgd(lr))
  new_params, _ = step(tx, params, grad_fn)

  flat_w, unravel = ravel_pytree(params)
  flat_g = np.asarray(ravel_pytree(grad_fn(params))[0], np.float64)
  e = rho * flat_g / np.linalg.norm(flat_g)  # one norm over kernel AND bias
  g2 = ravel_pytree(grad_fn(unravel(jnp.asarray(np.asarray(flat_w) + e, jnp.float32))))[0]
  expected = np.asarray(flat_w) - lr * np.asarray(g2)
  assert jax.tree.structure(new_params) == jax.tree.structure(params)
  np.testing.assert_allclose(ravel_pytree(new_params)[0], expected, rtol=1e-5, atol=1e-6)

  # A per-leaf norm would put the perturbation elsewhere: check that the ascent point is global.
  ascent, _ = sam(rho).update(grad_fn(params), sam(rho).init(params), params,
                              grad_fn=lambda p: p)
  np.testing.assert_allclose(ravel_pytree(ascent)[0], np.asarray(flat_w) + e, rtol=1e-5)
  np.testing.assert_allclose(
      np.linalg.norm(np.asarray(ravel_pytree(ascent)[0]) - np.asarray(flat_w)), rho, rtol=1e-5)


def test_rho_zero_is_plain_sgd_exactly():
  params, loss = _dense_problem()
  grad_fn = jax.grad(loss)
  w_sam, _ = step(optax.chain(sam(0.0), optax.sgd(0.05, momentum=0.9)), params, grad_fn)
  w_sgd, _ = step(optax.sgd(0.05, momentum=0.9), params, grad_fn)
  jax.tree.map(np.testing.assert_array_equal, w_sam, w_sgd)
  # Also with a traced rho = 0 inside jit.
  f = jax.jit(lambda p, r: step(optax.chain(sam(r), optax.sgd(0.05)), p, grad_fn)[0])
  jax.tree.map(np.testing.assert_array_equal, f(params, jnp.float32(0.0)),
               step(optax.sgd(0.05), params, grad_fn)[0])


def test_zero_gradient_gives_no_nan():
  params = {'Dense_0': {'kernel': jnp.zeros((3, 2)), 'bias': jnp.zeros(2)}}
  grad_fn = jax.grad(lambda p: 0.5 * sum(jnp.sum(l ** 2) for l in jax.tree.leaves(p)))
  tx = optax.chain(sam(0.05), optax.sgd(0.1))
  updates, _ = tx.update(grad_fn(params), tx.init(params), params, grad_fn=grad_fn)
  for leaf in jax.tree.leaves(updates):
    np.testing.assert_array_equal(leaf, np.zeros_like(leaf))


def test_ignores_other_extra_args_and_requires_grad_fn():
  w = jnp.asarray(W0, jnp.float32)
  tx = optax.chain(sam(0.3), optax.sgd(0.1))
  new_w, _ = step(tx, w, quad_grad, batch=jnp.ones(3), rng=jax.random.key(0))
  np.testing.assert_allclose(new_w, W0 - 0.1 * (A @ closed_form_ascent(W0, 0.3) - B), rtol=1e-6)
  with pytest.raises(ValueError, match='grad_fn'):
    tx.update(quad_grad(w), tx.init(w), w)


def test_client_adam_is_torch_adam_with_coupled_weight_decay():
  """client.base_optimizer='adam' = torch.optim.Adam(lr, betas, eps, weight_decay) written out by hand."""
  import ml_collections
  from fedjax_flat.optimizers.client import make_client_tx
  cfg = ml_collections.ConfigDict(dict(optimizer='sgd', base_optimizer='adam', momentum=0.0, weight_decay=0.01,
                                       adam_b1=0.9, adam_b2=0.99, adam_eps=1e-8, grad_clip=0.0, asam_eta=0.0))
  lr = 0.05
  tx = make_client_tx(cfg, {'lr': jnp.float32(lr), 'rho': jnp.float32(0.0)})
  a = jnp.array([1.0, -2.0, 0.5])
  loss = lambda w: 0.5 * jnp.sum(a * w['w'] ** 2)
  w = {'w': jnp.array([1.0, 1.0, -3.0])}
  state = tx.init(w)
  wn, m, v = np.array(w['w'], np.float64), np.zeros(3), np.zeros(3)
  for t in range(1, 6):
    g = jax.grad(loss)(w)
    u, state = tx.update(g, state, w)
    w = optax.apply_updates(w, u)
    gn = np.array(a, np.float64) * wn + 0.01 * wn          # torch: grad += weight_decay * p
    m = 0.9 * m + 0.1 * gn
    v = 0.99 * v + 0.01 * gn ** 2
    wn = wn - lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-8)
    np.testing.assert_allclose(w['w'], wn, rtol=1e-5, atol=1e-6)
