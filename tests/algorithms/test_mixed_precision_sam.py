"""FedSAM (FedAvg with client.optimizer='sam') under engine.compute_dtype='bfloat16': one round's server update
against float32's, through the real round engine (tests/fixtures/baselines.py's clients and schedule).

Tolerances: the update Delta = w_1 - w_0 (three clients, 2 local epochs of SAM steps) in bfloat16 has a norm
within 2% of float32's and a cosine >= 0.995 with it (measured: 0.11% and 0.999996; the bfloat16 - float32
difference, 0.0024, is 2% of SAM's own effect on the update, 0.108, for |Delta| = 0.77); the server state, its
parameters and the update are float32.
"""
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.models.registry import get_model
from tests.fixtures.baselines import config, run_engine

NORM_RTOL, COSINE = 0.02, 0.995


def _flat(t):
  return np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(t)])


def _round(dtype, optimizer):
  model = get_model('mlp', 3, (2, 1, 1), hidden=(32,), compute_dtype=dtype)
  p0 = model.init(jax.random.key(0), jnp.zeros((1, 2, 1, 1)))
  state, _, _ = run_engine(config('fedavg', optimizer=optimizer, rho=0.1), rounds=1, model=model, params0=p0)
  assert {a.dtype for a in jax.tree.leaves(state)
          if jnp.issubdtype(a.dtype, jnp.floating)} == {jnp.dtype(jnp.float32)}
  return _flat(state['params']) - _flat(p0)


def test_fedsam_round_update_in_bf16_is_float32s_within_tolerance():
  d32, d16 = _round('float32', 'sam'), _round('bfloat16', 'sam')
  assert np.linalg.norm(d32) > 0
  rel = abs(np.linalg.norm(d16) - np.linalg.norm(d32)) / np.linalg.norm(d32)
  cos = d16 @ d32 / (np.linalg.norm(d16) * np.linalg.norm(d32))
  assert rel <= NORM_RTOL and cos >= COSINE, (rel, cos)
  assert not np.array_equal(d16, d32)            # the bfloat16 round did compute in bfloat16
  # SAM's ascent moved the update: the bf16 difference is far smaller than SAM's own effect
  sgd = _round('float32', 'sgd')
  assert np.linalg.norm(d16 - d32) < 0.2 * np.linalg.norm(d32 - sgd), (np.linalg.norm(d16 - d32),
                                                                       np.linalg.norm(d32 - sgd))
