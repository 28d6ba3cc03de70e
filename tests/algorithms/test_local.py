"""MAN (algorithms/local.py:make_loss with man_zeta) against a hand computation on a tiny MLP.

Convention checked here: loss = CE + zeta * sum_l mean(a_l^2), the mean over the valid examples and the
layer's units, hidden post-ReLU outputs only (logits excluded), zeta as written in the paper's Eq. 15 (the
reference code multiplies by mu_mean / 2: pass zeta = mu_mean / 2 to reproduce a run of that code).
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_flat.algorithms.local import LocalState, local_step, make_loss, man_coefficient, masked_step
from fedjax_flat.config.default_config import default_config
from fedjax_flat.optimizers.client import make_client_tx
from fedjax_flat.models.registry import get_model
from fedjax_flat.optimizers.sam import sam

ZETA = 0.3


def setup():
  model = get_model('mlp', 3, (2, 1, 1), hidden=(4, 3))
  params = model.init(jax.random.key(0), jnp.zeros((1, 2, 1, 1)))
  rng = np.random.default_rng(0)
  batch = {'x': rng.normal(size=(5, 2, 1, 1)).astype(np.float32), 'y': np.array([0, 2, 1, 1, 0], np.int32),
           'mask': np.array([1, 1, 1, 1, 0], np.float32)}   # the last example is padding
  return model, params, batch


def hand_loss(params, batch, zeta):
  """Forward pass written out: h1 = relu(x W0 + b0), h2 = relu(h1 W1 + b1), z = h2 W2 + b2."""
  x = batch['x'].reshape(batch['x'].shape[0], -1)
  m = batch['mask']
  n = jnp.sum(m)
  h1 = jax.nn.relu(x @ params['Dense_0']['kernel'] + params['Dense_0']['bias'])
  h2 = jax.nn.relu(h1 @ params['Dense_1']['kernel'] + params['Dense_1']['bias'])
  z = h2 @ params['Dense_2']['kernel'] + params['Dense_2']['bias']
  logp = z - jax.scipy.special.logsumexp(z, axis=-1, keepdims=True)
  ce = -jnp.sum(m * logp[jnp.arange(len(m)), batch['y']]) / n
  act = jnp.sum(m * jnp.mean(h1 ** 2, axis=1)) / n + jnp.sum(m * jnp.mean(h2 ** 2, axis=1)) / n
  return ce + zeta * act


def test_man_loss_and_gradient_equal_hand_computation():
  model, params, batch = setup()
  loss = make_loss(model, man_zeta=ZETA)

  @jax.jit
  def everything(params, batch):
    return (loss(params, batch), hand_loss(params, batch, ZETA), hand_loss(params, batch, 0.0),
            jax.grad(lambda p: loss(p, batch)[0])(params), jax.grad(hand_loss)(params, batch, ZETA),
            make_loss(model)(params, batch)[0])

  (got, (loss_sum, count)), want, want_ce, g, g_hand, plain = everything(params, batch)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert float(count) == 4.0
  # loss_sum (the logged training loss) is the cross-entropy only, without the regularizer.
  np.testing.assert_allclose(loss_sum / count, want_ce, rtol=1e-6)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g, g_hand)
  # zeta = 0 is the plain cross-entropy; the regularizer is positive.
  np.testing.assert_allclose(plain, want_ce, rtol=1e-6)
  assert float(got) > float(plain)


def test_zeta_conventions():
  """config.man.convention: 'paper' applies zeta as Eq. 15's coefficient, 'code' as the release's mu_mean / 2;
  the loss with the code's mu_mean = 2 zeta equals the paper's with zeta."""
  assert man_coefficient(0.15) == 0.15 and man_coefficient(0.15, 'paper') == 0.15
  assert man_coefficient(0.15, 'code') == 0.075 and man_coefficient(0.2, 'code') == 0.1
  model, params, batch = setup()
  paper = make_loss(model, man_zeta=man_coefficient(ZETA, 'paper'))(params, batch)[0]
  code = make_loss(model, man_zeta=man_coefficient(2 * ZETA, 'code'))(params, batch)[0]
  np.testing.assert_allclose(float(code), float(paper), rtol=1e-7)
  np.testing.assert_allclose(float(paper), float(hand_loss(params, batch, ZETA)), rtol=1e-5)
  with pytest.raises(ValueError, match="'paper', 'code'"):
    man_coefficient(0.1, 'half')


def test_logits_are_not_regularized():
  model, params, batch = setup()
  _, acts = model.apply(params, batch['x'], with_activations=True)
  assert [a.shape for a in acts] == [(5, 4), (5, 3)]


def test_man_is_inside_both_sam_passes():
  """One SAM step: g1 = grad(CE + zeta R)(w), eps = rho g1/||g1||, w' = w - lr grad(CE + zeta R)(w + eps)."""
  model, params, batch = setup()
  rho, lr = 0.2, 0.1
  loss = make_loss(model, man_zeta=ZETA)
  tx = optax.chain(sam(rho), optax.sgd(lr))
  local = LocalState(params, tx.init(params), params)
  f = lambda p: hand_loss(p, batch, ZETA)

  @jax.jit
  def both(params):
    new, _ = local_step(local, batch, None, loss_fn=loss, tx=tx)
    g1 = jax.grad(f)(params)
    norm = jnp.sqrt(sum(jnp.sum(x ** 2) for x in jax.tree_util.tree_leaves(g1)))
    w_adv = jax.tree_util.tree_map(lambda w, g: w + rho * g / norm, params, g1)
    want = jax.tree_util.tree_map(lambda w, g: w - lr * g, params, jax.grad(f)(w_adv))
    plain, _ = local_step(local, batch, None, loss_fn=make_loss(model), tx=tx)
    return new.params, want, plain.params

  new, want, plain = both(params)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), new, want)
  # ... and differs from SAM on the plain cross-entropy.
  assert not np.allclose(plain['Dense_0']['kernel'], new['Dense_0']['kernel'])


def test_masked_step_freezes_the_other_leaves_and_trains_the_rest_like_local_step():
  """Frozen leaves stay bit-identical under weight decay, momentum and SAM's ascent; with every leaf trainable
  masked_step is local_step."""
  model = get_model('mlp', 3, (2, 2, 1), hidden=(4,))
  p = model.init(jax.random.key(0), jnp.zeros((1, 2, 2, 1)))
  batch = {'x': jax.random.normal(jax.random.key(1), (6, 2, 2, 1)), 'y': jnp.asarray([0, 1, 2, 0, 1, 2]),
           'mask': jnp.ones(6)}
  cfg = default_config().client
  cfg.optimizer, cfg.rho, cfg.lr, cfg.momentum, cfg.weight_decay = 'sam', 0.05, 0.1, 0.9, 0.01
  tx = make_client_tx(cfg, {'lr': 0.1, 'rho': 0.05})
  loss = make_loss(model)
  local = LocalState(p, tx.init(p), p)
  head = {'Dense_0': {'kernel': False, 'bias': False}, 'Dense_1': {'kernel': True, 'bias': True}}
  new, _ = masked_step(local, batch, None, loss_fn=loss, tx=tx, trainable=head)
  for leaf in ('kernel', 'bias'):
    np.testing.assert_array_equal(np.asarray(new.params['Dense_0'][leaf]), np.asarray(p['Dense_0'][leaf]))
    assert not np.allclose(new.params['Dense_1'][leaf], p['Dense_1'][leaf])
  every = jax.tree_util.tree_map(lambda _: True, head)
  a, _ = masked_step(local, batch, None, loss_fn=loss, tx=tx, trainable=every)
  b, _ = local_step(local, batch, None, loss_fn=loss, tx=tx)
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a.params, b.params)
