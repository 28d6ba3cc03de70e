"""Fisher-weighted merging (algorithms/fedfisher.py): FedAvg-shaped rounds through the real engine against the
merge written from Matena & Raffel 2022 in NumPy: each client's diagonal empirical Fisher from one example at a time
(a Python loop over its exact batches), floored at eps, then w* = sum_k N_k F_k w_k / sum_k N_k F_k."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms.local import make_loss
from tests.fixtures.baselines import MODEL, PARAMS0, SCHEDULE, SIZES, client_batches, config, run_engine, sgd

tmap = jax.tree_util.tree_map
_LOSS = make_loss(MODEL)
SERVER_LR, EPS = 0.8, 1e-4
_EX_GRAD = jax.jit(jax.grad(lambda p, one: _LOSS(p, one)[1][0]))   # one example's NLL gradient
_GRAD = jax.jit(jax.grad(lambda p, b: _LOSS(p, b)[0]))


def _client(w, r, k):
  """Local SGD from w; the Fisher: each example's squared NLL gradient at the model its step starts from."""
  fsum, n = tmap(lambda x: np.zeros(x.shape, np.float64), w), 0
  for b in client_batches(r, k):
    for i in range(len(b['y'])):
      one = {'x': b['x'][i:i + 1], 'y': b['y'][i:i + 1], 'mask': np.ones(1, np.float32)}
      g = _EX_GRAD(w, one)
      fsum = tmap(lambda s, a: s + np.asarray(a, np.float64) ** 2, fsum, g)
      n += 1
    w = sgd(w, _GRAD(w, b))
  return w, tmap(lambda s: np.maximum(s / n, EPS), fsum)


@pytest.mark.slow   # ~10-20 s on 2 shared cores (an engine run / a 128-unit alignment)
def test_fedfisher_rounds_equal_the_fisher_weighted_merge_in_numpy():
  c = config('fedfisher', fisher_eps=EPS)
  c.server.lr = SERVER_LR
  state, _, alg = run_engine(c)
  assert alg.extra_passes == 1.0
  w = PARAMS0
  for r, ids in enumerate(SCHEDULE):
    outs = [_client(w, r, k) for k in ids]
    num = tmap(lambda *xs: sum(SIZES[k] * f * np.asarray(m, np.float64) for k, m, f in zip(ids, xs[::2], xs[1::2])),
               *[t for m, f in outs for t in (m, f)])
    den = tmap(lambda *fs: sum(SIZES[k] * f for k, f in zip(ids, fs)), *[f for _, f in outs])
    merged = tmap(lambda a, b: a / b, num, den)
    w = tmap(lambda g, m: jnp.asarray(np.asarray(g, np.float64) - SERVER_LR * (np.asarray(g, np.float64) - m),
                                      jnp.float32), w, merged)
  for a, b in zip(jax.tree_util.tree_leaves(state['params']), jax.tree_util.tree_leaves(w)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
  # the Fisher weighting matters: the last round's example-weighted plain mean is another model
  plain = sum(SIZES[k] * np.asarray(jax.tree_util.tree_leaves(m)[0], np.float64) for k, (m, _) in zip(ids, outs))
  assert not np.allclose(plain / sum(SIZES[k] for k in ids), jax.tree_util.tree_leaves(merged)[0], atol=1e-4)
