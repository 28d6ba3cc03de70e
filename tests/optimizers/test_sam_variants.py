"""Tests for the cheaper sharpness-aware optimizers: sam_every.py and looksam.py, against their formulas."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ml_collections import ConfigDict

from fedjax_flat.config.default_config import default_config
from fedjax_flat.errors import ConfigError
from fedjax_flat.optimizers.client import SECTION, client_optimizer, gradient_passes
from fedjax_flat.optimizers.looksam import looksam
from fedjax_flat.optimizers.sam import sam
from fedjax_flat.optimizers.sam_every import sam_every

# Quadratic L(w) = 0.5 w^T A w - b^T w, grad L(w) = A w - b.
A = np.array([[3.0, 1.0], [1.0, 2.0]])
B = np.array([1.0, -1.0])
W0 = np.array([1.0, 2.0])
RHO, LR = 0.3, 0.1


def quad_grad(w):
  return jnp.asarray(A, jnp.float32) @ w - jnp.asarray(B, jnp.float32)


def grad64(w):
  return A @ w - B


def sam_grad64(w):
  g = grad64(w)
  return grad64(w + RHO * g / np.linalg.norm(g))


def run(tx, steps):
  w = jnp.asarray(W0, jnp.float32)
  state = tx.init(w)
  step = jax.jit(lambda w, s: tx.update(quad_grad(w), s, w, grad_fn=quad_grad))
  out = []
  for _ in range(steps):
    u, state = step(w, state)
    w = optax.apply_updates(w, u)
    out.append(np.asarray(w))
  return out, state


def test_sam_every_formula_three_steps():
  got, state = run(optax.chain(sam_every(RHO, 2), optax.sgd(LR)), 3)
  w, want = W0, []
  for t in range(3):
    w = w - LR * (sam_grad64(w) if t % 2 == 0 else grad64(w))
    want.append(w)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert int(state[0].count) == 3


def test_looksam_formula_three_steps():
  k, alpha = 2, 0.7
  got, state = run(optax.chain(looksam(RHO, k, alpha), optax.sgd(LR)), 3)
  w, want, g_v = W0, [], None
  for t in range(3):
    g = grad64(w)
    if t % k == 0:
      g_s = sam_grad64(w)
      g_v = g_s - (g @ g_s) / (g @ g) * g
      d = g_s
    else:
      d = g + alpha * np.linalg.norm(g) / np.linalg.norm(g_v) * g_v
    w = w - LR * d
    want.append(w)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # g_v is orthogonal to the gradient it was split from (step 2's).
  g2 = grad64(want[1])
  g_v2 = sam_grad64(want[1]) - (g2 @ sam_grad64(want[1])) / (g2 @ g2) * g2
  np.testing.assert_allclose(np.asarray(state[0].g_v), g_v2, rtol=1e-4)
  assert abs(g2 @ g_v2) < 1e-9


@pytest.mark.parametrize('make', [lambda: sam_every(RHO, 1), lambda: looksam(RHO, 1, 0.7)])
def test_k1_is_sam_exactly(make):
  ref, _ = run(optax.chain(sam(RHO), optax.sgd(LR)), 4)
  got, _ = run(optax.chain(make(), optax.sgd(LR)), 4)
  np.testing.assert_array_equal(np.stack(got), np.stack(ref))


def test_looksam_alpha0_is_sam_every():
  ref, _ = run(optax.chain(sam_every(RHO, 3), optax.sgd(LR)), 5)
  got, _ = run(optax.chain(looksam(RHO, 3, 0.0), optax.sgd(LR)), 5)
  np.testing.assert_array_equal(np.stack(got), np.stack(ref))


def test_sam_every_large_k_is_sgd_after_first_step():
  got, _ = run(optax.chain(sam_every(RHO, 100), optax.sgd(LR)), 3)
  w = W0 - LR * sam_grad64(W0)
  for t in (1, 2):
    w = w - LR * grad64(w)
    np.testing.assert_allclose(got[t], w, rtol=1e-5)


def test_one_compile_for_all_steps():
  tx = optax.chain(looksam(RHO, 3, 0.5), optax.sgd(LR))
  traces = []

  @jax.jit
  def step(w, s):
    traces.append(1)
    return tx.update(quad_grad(w), s, w, grad_fn=quad_grad)
  w = jnp.asarray(W0, jnp.float32)
  s = tx.init(w)
  for _ in range(6):
    u, s = step(w, s)
    w = optax.apply_updates(w, u)
  assert len(traces) == 1


def test_zero_gradient_gives_no_nan():
  tx = looksam(RHO, 2, 0.7)
  w = jnp.zeros(2)
  s = tx.init(w)
  for _ in range(3):
    u, s = tx.update(jnp.zeros(2), s, w, grad_fn=lambda p: jnp.zeros(2))
    assert np.all(np.isfinite(np.asarray(u)))


def test_bad_k_raises():
  with pytest.raises(ValueError, match='k=0'):
    sam_every(RHO, 0)
  with pytest.raises(ValueError, match='k=0'):
    looksam(RHO, 0, 0.5)


def _client(**kw):
  c = ConfigDict(dict(optimizer='sgd', weight_decay=0.0, momentum=0.0, lr_schedule='constant', sam_every=2,
                      looksam_k=5, looksam_alpha=0.7, asam_eta=0.0))
  c.update(kw)
  return c


def test_gradient_passes_are_averages():
  assert gradient_passes(_client(optimizer='sam_every', sam_every=4)) == 1.25
  assert gradient_passes(_client(optimizer='looksam', looksam_k=5)) == 1.2
  assert gradient_passes(_client(optimizer='sam')) == 2


def test_client_optimizer_chain_matches_formula():
  tx = client_optimizer(_client(optimizer='sam_every', sam_every=2))
  w = jnp.asarray(W0, jnp.float32)
  s = tx.init(w)
  hp = {'lr': LR, 'rho': RHO}
  for t in range(2):
    u, s = tx.update(quad_grad(w), s, w, hparams=hp, grad_fn=quad_grad)
    w = optax.apply_updates(w, u)
  want = W0 - LR * sam_grad64(W0)
  want = want - LR * grad64(want)
  np.testing.assert_allclose(w, want, rtol=1e-5)


@pytest.mark.parametrize('field,value,kind,lo', [('sam_every', 0, 'sam_every', 1), ('looksam_k', 0, 'looksam', 1),
                                                 ('looksam_alpha', -0.5, 'looksam', 0)])
def test_bad_config_values_are_one_line_config_errors(field, value, kind, lo):
  cfg = default_config()
  cfg.client.optimizer = kind
  cfg.client[field] = value
  with pytest.raises(ConfigError, match=rf'client\.{field}={value} is invalid: must be >= {lo}$'):
    SECTION.validate(cfg)
  cfg.client.optimizer = 'sgd'     # read only by its own optimizer: set away from its default, refused (issue 48)
  with pytest.raises(ConfigError, match=rf"client\.{field}={value} is invalid: is read only with "
                                        rf"client\.optimizer='{kind}'"):
    SECTION.validate(cfg)
  cfg.client[field] = SECTION.field(field).rule.default
  SECTION.validate(cfg)
