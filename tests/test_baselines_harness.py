"""Shared harness for the baseline tests: a tiny linear softmax model, 3 clients of unequal sizes, and the
round engine next to plain-Python reference rounds written from the papers' update rules.

The references use only `grad(w, batch)` (the exact gradient of the masked mean cross-entropy on the valid
examples of a step) and explicit arithmetic for every update rule: no optax, no algorithm code.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.local import make_loss
from fedjax_flat.core import engine
from fedjax_flat.core.client_state import HostClientStateStore
from fedjax_flat.data import batching
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.models.registry import get_model
from fedjax_flat.config.default_config import default_config

SIZES = [3, 10, 4]           # client 1 runs 3 steps per epoch, the others 1 (padding steps in between)
B, E, LR, WD = 4, 2, 0.1, 1e-3
SCHEDULE = [[0, 1, 2], [2, 0], [1, 2]]   # clients per round (padded to 3): partial participation, padding
DATA = synthetic(3, SIZES, input_shape=(2, 1, 1), num_classes=3, seed=1)
MODEL = get_model('mlp', 3, (2, 1, 1), hidden=())
PARAMS0 = MODEL.init(jax.random.key(0), jnp.zeros((1, 2, 1, 1)))
S = batching.padded_num_steps(DATA.client_sizes(), B, epochs=E)
_LOSS = make_loss(MODEL)
tmap = jax.tree_util.tree_map


def config(algorithm, *, optimizer='sgd', rho=0.05, **algo):
  c = default_config()
  c.dataset, c.model, c.algorithm = 'synthetic', 'mlp', algorithm
  c.data.num_clients = len(SIZES)
  c.client.optimizer, c.client.rho = optimizer, rho
  c.client.lr, c.client.weight_decay, c.client.batch_size, c.client.local_epochs = LR, WD, B, E
  c.engine.strategy = 'vmap'
  for k, v in algo.items():
    c.algo[k] = v
  return c


def round_batches(r):
  return batching.make_round_batches(DATA, SCHEDULE[r], round_idx=r, seed=0, batch_size=B, num_steps=S,
                                     epochs=E, pad_clients_to=3)


def client_batches(r, k):
  """The valid steps of client k in round r, as exact batches (the same examples the engine sees)."""
  rb = round_batches(r)
  i = list(rb.client_ids).index(k)
  out = []
  for s in range(S):
    m = rb.mask[i, s] > 0
    if m.any():
      out.append({'x': rb.x[i, s][m], 'y': rb.y[i, s][m], 'mask': np.ones(int(m.sum()), np.float32)})
  return out


def full_batch(k):
  x, y = DATA.client_examples(k)
  return {'x': x, 'y': y, 'mask': np.ones(len(y), np.float32)}


@jax.jit
def grad(w, batch):
  return jax.grad(lambda p: _LOSS(p, batch)[0])(w)


def sam_grad(w, batch, rho):
  g = grad(w, batch)
  n = np.sqrt(sum(float(jnp.sum(a * a)) for a in jax.tree_util.tree_leaves(g)))
  return grad(tmap(lambda p, a: p + rho * a / (n + 1e-12), w, g), batch)


def sgd(w, g, lr=LR, wd=WD):
  """torch-style SGD step with coupled weight decay: w - lr (g + wd w)."""
  return tmap(lambda p, a: p - lr * (a + wd * p), w, g)


def add(*ts):
  return tmap(lambda *xs: sum(xs), *ts)


def sub(a, b):
  return tmap(lambda x, y: x - y, a, b)


def scale(t, s):
  return tmap(lambda x: s * x, t)


def mean(ts, weights=None):
  w = np.ones(len(ts)) if weights is None else np.asarray(weights, np.float64)
  w = w / w.sum()
  return tmap(lambda *xs: sum(wi * x for wi, x in zip(w, xs)), *ts)


def zeros():
  return tmap(jnp.zeros_like, PARAMS0)


def run_engine(cfg, rounds=len(SCHEDULE)):
  """Runs the algorithm through the real round engine; returns (server_state, store, algorithm)."""
  alg = registry.build_algorithm(cfg, MODEL)
  fn = engine.make_round_fn(alg, chunk=3)           # donating, as in training (catches aliased state buffers)
  state = alg.server_init(tmap(jnp.copy, PARAMS0), jax.random.key(1))
  store = HostClientStateStore(alg.client_state_init(PARAMS0)) if alg.client_state_init is not None else None
  for r in range(rounds):
    rb = round_batches(r)
    cs = store.gather(rb.client_ids) if store is not None else None
    rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))
    state, new_cs, _ = fn(state, rb.as_dict(), cs, rngs, rb.num_examples, rb.client_ids >= 0, r)
    if store is not None:
      store.scatter(rb.client_ids, new_cs)
  return state, store, alg


def assert_tree_close(got, want, rtol=2e-5, atol=2e-6):
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol,
                                                                 atol=atol), got, want)


def test_harness_shapes():
  assert S == 6 and [len(client_batches(0, k)) for k in range(3)] == [2, 6, 2]
