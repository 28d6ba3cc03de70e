"""Server optimizers: hand-computed FedAvg/FedAvgM/FedAdam/FedAdagrad/FedYogi updates (Reddi et al., Alg. 2, and
the torch release-code form), and optax where the two coincide."""
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from fedjax_flat.optimizers.server import fedopt_adaptive, make_server_tx
from fedjax_flat.config.default_config import default_config
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError

# Three rounds of pseudo-gradients for a 4-parameter "model" (two leaves).
DELTAS = [np.array([0.5, -0.2, 0.0, 3.0], np.float32), np.array([-0.1, -0.4, 0.2, 2.0], np.float32),
          np.array([0.3, 0.1, -0.6, -1.0], np.float32)]
W0 = np.array([1.0, 2.0, -1.0, 0.5], np.float32)


def _tree(v):
  return {'a': jnp.asarray(v[:3]), 'b': jnp.asarray(v[3:])}


def _flat(t):
  return np.concatenate([np.asarray(t['a']), np.asarray(t['b'])])


def _run(tx):
  w = _tree(W0)
  st = tx.init(w)
  out = []
  for d in DELTAS:
    u, st = tx.update(_tree(d), st, w)
    w = optax.apply_updates(w, u)
    out.append(_flat(w))
  return out


def _server(**kw):
  c = default_config().server
  for k, v in kw.items():
    c[k] = v
  return make_server_tx(c)


def _reddi(kind, lr, b1, b2, tau):
  """Reddi et al. 2021, Algorithm 2, in their sign convention (Delta_R = -Delta, x + eta m/(sqrt v + tau))."""
  x, m, v = W0.astype(np.float64), np.zeros(4), np.full(4, tau * tau)
  out = []
  for d in DELTAS:
    dr = -d.astype(np.float64)
    m = b1 * m + (1 - b1) * dr
    if kind == 'adam':
      v = b2 * v + (1 - b2) * dr ** 2
    elif kind == 'adagrad':
      v = v + dr ** 2
    else:
      v = v - (1 - b2) * dr ** 2 * np.sign(v - dr ** 2)
    x = x + lr * m / (np.sqrt(v) + tau)
    out.append(x)
  return out


def _torch(kind, lr, b1, b2, eps):
  """torch.optim.Adam / Adagrad (initial_accumulator_value=0) as in the FedSAM release code (grad = Delta)."""
  x, m, v = W0.astype(np.float64), np.zeros(4), np.zeros(4)
  out = []
  for t, d in enumerate(DELTAS, start=1):
    g = d.astype(np.float64)
    if kind == 'adagrad':
      v = v + g * g
      x = x - lr * g / (np.sqrt(v) + eps)
    else:
      m = b1 * m + (1 - b1) * g
      v = b2 * v + (1 - b2) * g * g if kind == 'adam' else v - (1 - b2) * g * g * np.sign(v - g * g)
      x = x - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    out.append(x)
  return out


def _close(got, want, rtol=1e-5, atol=1e-6):
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def test_fedavg_is_w_minus_delta():
  got = _run(_server(optimizer='sgd', lr=1.0))
  w = W0.copy()
  for g, d in zip(got, DELTAS):
    w = w - d
    np.testing.assert_allclose(g, w, rtol=1e-6)


def test_fedavgm_hand_computed_and_optax():
  beta, lr = 0.9, 0.5
  got = _run(_server(optimizer='sgd', lr=lr, momentum=beta))
  w, v, want = W0.astype(np.float64), np.zeros(4), []
  for d in DELTAS:
    v = beta * v + d
    w = w - lr * v
    want.append(w)
  _close(got, want)
  _close(got, _run(optax.sgd(lr, momentum=beta)))


def test_fedavgm_nesterov_hand_computed():
  # server.nesterov (declared in optimizers/server.SECTION): w <- w - lr (d + beta v), v <- beta v + d
  beta, lr = 0.9, 0.5
  got = _run(_server(optimizer='sgd', lr=lr, momentum=beta, nesterov=True))
  w, v, want = W0.astype(np.float64), np.zeros(4), []
  for d in DELTAS:
    v = beta * v + d
    w = w - lr * (d + beta * v)
    want.append(w)
  _close(got, want)
  assert default_config().server.nesterov is False


def test_server_nesterov_is_a_validated_field():
  c = default_config()
  c.server.nesterov = True
  validate_config(c)
  d = default_config().to_dict()
  d['server']['nesterov'] = 'yes'
  with pytest.raises(ConfigError, match=r"server\.nesterov='yes' is invalid: must be True or False"):
    validate_config(ml_collections.ConfigDict(d))


@pytest.mark.parametrize('kind,lr,b1,b2,tau', [('adam', 0.1, 0.9, 0.99, 1e-3), ('adam', 1.0, 0.9, 0.99, 0.1),
                                               ('adagrad', 0.1, 0.0, 0.0, 1e-2), ('adagrad', 0.1, 0.5, 0.0, 1e-2),
                                               ('yogi', 0.1, 0.9, 0.99, 1e-3)])
def test_reddi_form_matches_algorithm_2(kind, lr, b1, b2, tau):
  kw = dict(optimizer=kind, lr=lr, eps=tau, adaptive_form='reddi')
  kw.update(momentum=b1) if kind == 'adagrad' else kw.update(b1=b1, b2=b2)
  _close(_run(_server(**kw)), _reddi(kind, lr, b1, b2, tau))


@pytest.mark.parametrize('kind,eps', [('adam', 0.1), ('adagrad', 0.01), ('yogi', 1e-3)])
def test_torch_form_matches_release_code(kind, eps):
  got = _run(_server(optimizer=kind, lr=0.1, eps=eps, adaptive_form='torch'))
  _close(got, _torch(kind, 0.1, 0.9, 0.99, eps))


def test_against_optax_where_they_coincide():
  # torch-form Adam == optax.adam (bias correction, eps outside the sqrt).
  _close(_run(fedopt_adaptive('adam', 0.1, b1=0.9, b2=0.99, tau=0.1, form='torch')),
         _run(optax.adam(0.1, b1=0.9, b2=0.99, eps=0.1)))
  # Reddi-form Adam with b1 = b2 = 0 has nothing to bias-correct: optax.adam(b1=0, b2=0).
  _close(_run(fedopt_adaptive('adam', 0.1, b1=0.0, b2=0.0, tau=1e-3)),
         _run(optax.adam(0.1, b1=0.0, b2=0.0, eps=1e-3)))
  # torch-form Yogi == optax's Yogi transform started from zero accumulators.
  from optax._src.transform import scale_by_yogi
  _close(_run(fedopt_adaptive('yogi', 0.1, b1=0.9, b2=0.99, tau=1e-3, form='torch')),
         _run(optax.chain(scale_by_yogi(0.9, 0.99, 1e-3, initial_accumulator_value=0.0), optax.scale(-0.1))))
  # Adagrad: optax puts eps inside the sqrt and starts at 0.1, so it is NOT the torch/Reddi rule ...
  ours = _run(fedopt_adaptive('adagrad', 0.1, b1=0.0, tau=0.01, form='torch'))
  theirs = _run(optax.adagrad(0.1, initial_accumulator_value=0.0, eps=0.01))
  assert np.max(np.abs(ours[0] - theirs[0])) > 1e-3
  # ... except as eps -> 0 (from a zero accumulator), where both are Delta / sqrt(sum Delta^2).
  _close(_run(fedopt_adaptive('adagrad', 0.1, b1=0.0, tau=1e-12, form='torch')),
         _run(optax.adagrad(0.1, initial_accumulator_value=0.0, eps=1e-12)))
