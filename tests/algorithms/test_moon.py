"""MOON (algorithms/moon.py): the contrastive term against its formula, and engine rounds against rounds by hand
(a hand-written forward pass of the one-hidden-layer MLP, its representation z = relu(x W0 + b0), cosine
similarities by hand, per-client previous models) on the baselines' 3 clients that come back across rounds."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms.moon import contrastive_terms
from fedjax_flat.errors import ConfigError
from fedjax_flat.config import validate
from tests.algorithms.test_fedrep import PARAMS0, _run
from tests.fixtures.baselines import LR, SCHEDULE, SIZES, WD, assert_tree_close, client_batches, config

tmap = jax.tree_util.tree_map


def test_contrastive_term_is_the_papers_formula():
  rng = np.random.default_rng(0)
  z, zg, zp = (rng.normal(size=(5, 4)) for _ in range(3))
  tau = 0.7
  cos = lambda a, b: np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))  # noqa: E731
  want = -np.log(np.exp(cos(z, zg) / tau) / (np.exp(cos(z, zg) / tau) + np.exp(cos(z, zp) / tau)))
  np.testing.assert_allclose(contrastive_terms(jnp.asarray(z), jnp.asarray(zg), jnp.asarray(zp), tau), want,
                             rtol=1e-5)
  # z_prev = z_glob: both similarities equal, l_con = log 2 whatever z
  np.testing.assert_allclose(contrastive_terms(jnp.asarray(z), jnp.asarray(zg), jnp.asarray(zg), tau),
                             np.log(2.0), rtol=1e-6)
  # a zero representation (dead ReLUs): finite value and gradient
  g = jax.grad(lambda a: jnp.sum(contrastive_terms(a, jnp.asarray(zg), jnp.asarray(zp), tau)))(jnp.zeros((5, 4)))
  assert np.isfinite(np.asarray(g)).all()


def _hand_loss(w, batch, glob, prev, mu, tau):
  x = batch['x'].reshape(len(batch['y']), -1)
  rep = lambda p: jax.nn.relu(x @ p['Dense_0']['kernel'] + p['Dense_0']['bias'])  # noqa: E731
  z = rep(w)
  logits = z @ w['Dense_1']['kernel'] + w['Dense_1']['bias']
  ce = -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(batch['y'])), batch['y']])
  nrm = lambda a: jnp.sqrt(jnp.maximum(jnp.sum(a * a, -1), 1e-16))  # noqa: E731   (torch's eps: a dead ReLU layer)
  cos = lambda a, b: jnp.sum(a * b, -1) / (nrm(a) * nrm(b))  # noqa: E731
  sg, sp = cos(z, rep(glob)) / tau, cos(z, rep(prev)) / tau
  return ce + mu * jnp.mean(-(sg - jnp.logaddexp(sg, sp)))


def _reference(mu, tau):
  w, prevs = PARAMS0, {}
  g = jax.jit(jax.grad(_hand_loss), static_argnums=())
  for r, ids in enumerate(SCHEDULE):
    outs = []
    for k in ids:
      y, prev = w, prevs.get(k, w)
      for b in client_batches(r, k):
        gr = g(y, b, w, prev, mu, tau)
        y = tmap(lambda p, a: p - LR * (a + WD * p), y, gr)
      prevs[k] = y
      outs.append(y)
    p = np.asarray([SIZES[k] for k in ids], np.float64)
    p /= p.sum()
    w = tmap(lambda *xs: sum(pi * x for pi, x in zip(p, xs)), *outs)
  return w


@pytest.mark.parametrize('mu,tau', [(1.0, 0.5), (5.0, 0.2)])
def test_moon_matches_hand_computed_rounds(mu, tau):
  state, store, _ = _run(config('moon', mu=mu, tau=tau))
  assert_tree_close(state['params'], _reference(mu, tau), rtol=5e-5, atol=5e-6)
  # the previous local model of client 1 (last seen in round 2) is kept in its state
  assert float(np.asarray(store.gather([1])['seen'])[0]) == 1.0


def test_moon_with_mu_zero_is_fedavg():
  moon, _, _ = _run(config('moon', mu=0.0))
  avg, _, _ = _run(config('fedavg'))
  assert_tree_close(moon['params'], avg['params'])


def test_moon_hparams_are_checked():
  cfg = config('moon', tau=0.0)
  with pytest.raises(ConfigError, match='algo.tau'):
    validate.validate_config(cfg)
  cfg = config('moon')
  cfg.man.zeta = 0.1
  with pytest.raises(ConfigError, match='man.zeta'):
    validate.validate_config(cfg)
