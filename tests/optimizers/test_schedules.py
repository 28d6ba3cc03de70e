"""Tests for fedjax_flat.optimizers.schedules."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ml_collections

from fedjax_flat.optimizers.schedules import client_hparams, client_round_hparams, rho_warmup, swa_cyclic_lr


def test_rho_warmup_values():
  f = rho_warmup(0.001, 0.201, 100)
  np.testing.assert_allclose(f(0), 0.001, rtol=1e-6)
  np.testing.assert_allclose(f(50), 0.101, rtol=1e-6)   # mid-way
  np.testing.assert_allclose(f(25), 0.051, rtol=1e-6)
  assert float(f(100)) == np.float32(0.201)            # exactly rho at T_s
  assert float(f(101)) == np.float32(0.201)
  assert float(f(10_000)) == np.float32(0.201)


def test_the_rounds_client_hparams_follow_both_schedules():
  """lr 0.1 decayed over 10 rounds with power 1 (poly_round), rho warmed up 0 -> 0.2 over 4 rounds: by hand."""
  cfg = ml_collections.ConfigDict({'lr': 0.1, 'rho': 0.2, 'rho0': 0.0, 'rho_warmup_rounds': 4,
                                   'lr_schedule': 'poly_round', 'lr_power': 1.0, 'lr_poly_max': 10})
  fn = client_round_hparams(cfg)
  for r, lr, rho in ((0, 0.1, 0.0), (2, 0.08, 0.1), (4, 0.06, 0.2), (9, 0.01, 0.2)):
    hp = fn(r)
    assert set(hp) == {'lr', 'rho'} and all(v.dtype == jnp.float32 and v.shape == () for v in hp.values())
    np.testing.assert_allclose([float(hp['lr']), float(hp['rho'])], [lr, rho], rtol=1e-6, atol=1e-8)
  fixed = client_hparams(0.05, 0.0)     # one-off local training: the same two float32 scalars
  assert float(fixed['lr']) == np.float32(0.05) and float(fixed['rho']) == 0.0 and fixed['lr'].dtype == jnp.float32


def test_rho_warmup_traceable_and_constant():
  f = rho_warmup(0.001, 0.2, 2000)
  vals = jax.jit(jax.vmap(f))(jnp.array([0, 1000, 2000, 5000]))
  np.testing.assert_allclose(vals, [0.001, 0.1005, 0.2, 0.2], rtol=1e-6)
  const = rho_warmup(0.001, 0.15, 0)  # T_s = 0: constant rho
  for t in (0, 1, 7):
    assert float(const(t)) == np.float32(0.15)
  assert float(jax.jit(const)(3)) == np.float32(0.15)
  with pytest.raises(ValueError):
    rho_warmup(0.001, 0.2, -1)


def test_swa_cyclic_lr_c4():
  f = swa_cyclic_lr(0.1, 0.02, 4)
  # t = 1/4, 2/4, 3/4, 1, 1/4, ...: (1-t) 0.1 + t 0.02
  expected = [0.08, 0.06, 0.04, 0.02, 0.08, 0.06, 0.04, 0.02, 0.08]
  np.testing.assert_allclose([float(f(i)) for i in range(9)], expected, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.vmap(f))(jnp.arange(9)), expected, rtol=1e-6)
  # Absolute round index: round 7500 starts a cycle (7500 mod 4 = 0).
  np.testing.assert_allclose(f(7500), 0.08, rtol=1e-6)
  np.testing.assert_allclose(f(7503), 0.02, rtol=1e-6)


def test_swa_cyclic_lr_c1_is_constant_gamma1():
  f = swa_cyclic_lr(0.01, 0.0001, 1)
  np.testing.assert_allclose([float(f(i)) for i in range(4)], [0.01] * 4, rtol=1e-7)
  np.testing.assert_allclose(jax.jit(f)(123), 0.01, rtol=1e-7)
  with pytest.raises(ValueError):
    swa_cyclic_lr(0.01, 0.0001, 0)


@pytest.mark.parametrize('T_s', [0, 1, 2, 3, 5])
def test_server_rho_schedule_against_the_release_lists(T_s):
  """Each schedule's rho_s(t) vs the release code's lists (transcribed in tests/fixtures/fedgloss_release.py), T = 9."""
  from tests.fixtures.fedgloss_release import release_server_rhos
  from fedjax_flat.optimizers.schedules import server_rho_schedule
  rho, rho_l, rho0, T = 0.01, 0.2, 0.001, 9
  got = {k: [float(server_rho_schedule(k, rho0, rho_l, rho, T_s)(t)) for t in range(T)]
         for k in ('release', 'linear', 'constant')}
  np.testing.assert_allclose(got['release'], release_server_rhos(rho, rho_l, rho0, T_s, T), rtol=1e-6)
  np.testing.assert_allclose(got['constant'], [rho] * T, rtol=1e-7)
  want_linear = [rho if T_s == 0 else rho0 + (rho - rho0) * min(t, T_s) / T_s for t in range(T)]
  np.testing.assert_allclose(got['linear'], want_linear, rtol=1e-6)
  if T_s > 1:   # the release's warm-up sits at ~rho_l, not between rho0 and rho
    assert got['release'][1] == pytest.approx(rho_l + (rho - rho0) / T_s)
    assert got['release'][T_s + 1] == pytest.approx(rho)
  with pytest.raises(ValueError, match='rho_server_schedule'):
    server_rho_schedule('cosine', rho0, rho_l, rho, T_s)
