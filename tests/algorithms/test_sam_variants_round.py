"""FedAvg with the cheaper sharpness-aware clients (sam_every, looksam, ksam) through the real round engine, against a
hand-run reference of their formulas on each client's valid steps."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.core import engine
from tests.fixtures.baselines import (_LOSS, MODEL, PARAMS0, SCHEDULE, add, assert_tree_close, client_batches, config,
                                      grad, mean, round_batches, run_engine, sam_grad, scale, sgd, sub)

RHO = 0.1


def _norm(t):
  return float(np.sqrt(sum(float(jnp.sum(a * a)) for a in jax.tree_util.tree_leaves(t))))


def _dot(a, b):
  return float(sum(float(jnp.sum(x * y)) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))))


@pytest.mark.parametrize('kind', ['sam_every', 'looksam'])
def test_fedavg_round_matches_formula(kind):
  k, alpha = 2, 0.5
  cfg = config('fedavg', optimizer=kind, rho=RHO)
  cfg.client.sam_every = cfg.client.looksam_k = k
  cfg.client.looksam_alpha = alpha
  state, _, _ = run_engine(cfg)
  x = PARAMS0
  for r, ids in enumerate(SCHEDULE):
    models, sizes = [], []
    for c in ids:
      y, g_v = x, None
      batches = client_batches(r, c)
      for t, b in enumerate(batches):
        g = grad(y, b)
        if t % k == 0:
          d = sam_grad(y, b, RHO)
          g_v = sub(d, scale(g, _dot(g, d) / (_dot(g, g) + 1e-12)))
        elif kind == 'sam_every':
          d = g
        else:
          d = add(g, scale(g_v, alpha * _norm(g) / (_norm(g_v) + 1e-12)))
        y = sgd(y, d)
      models.append(y)
      sizes.append(sum(len(b['y']) for b in batches))
    x = mean(models, sizes)
  assert_tree_close(state['params'], x)


def test_one_compiled_round_program_across_rounds_and_steps():
  cfg = config('fedavg', optimizer='looksam', rho=RHO)
  cfg.client.looksam_k = 2
  alg = registry.build_algorithm(cfg, MODEL)
  fn = engine.make_round_fn(alg, chunk=3)
  state = alg.server_init(jax.tree_util.tree_map(jnp.copy, PARAMS0), jax.random.key(1))
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))
  for r in range(len(SCHEDULE)):
    rb = round_batches(r)
    state, _, _ = fn(state, rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, r)
  assert fn._cache_size() == 1


def _ksam_grad(w, b, rho, fraction, descent):
  """K-SAM by hand: the k = max(1, round(fraction n)) highest-loss examples (ties: lower index) give the ascent
  direction; the gradient at the ascent point is theirs too (descent='subset', Ni et al. 2022) or the whole
  batch's (descent='full')."""
  n = len(b['y'])
  losses = [float(_LOSS(w, {k: v[i:i + 1] for k, v in b.items()})[0]) for i in range(n)]
  keep = sorted(sorted(range(n), key=lambda i: -losses[i])[:max(1, int(round(fraction * n)))])
  subset = {k: v[keep] for k, v in b.items()}
  g_s = grad(w, subset)
  return grad(add(w, scale(g_s, rho / (_norm(g_s) + 1e-12))), subset if descent == 'subset' else b)


@pytest.mark.parametrize('descent', ['subset', 'full'])
def test_fedavg_round_with_ksam_matches_formula(descent):
  fraction = 0.5
  cfg = config('fedavg', optimizer='ksam', rho=RHO)
  cfg.client.ascent_fraction = fraction
  cfg.client.ksam_descent = descent
  state, _, _ = run_engine(cfg)
  x = PARAMS0
  for r, ids in enumerate(SCHEDULE):
    models, sizes = [], []
    for c in ids:
      y = x
      batches = client_batches(r, c)
      for b in batches:
        y = sgd(y, _ksam_grad(y, b, RHO, fraction, descent))
      models.append(y)
      sizes.append(sum(len(b['y']) for b in batches))
    x = mean(models, sizes)
  assert_tree_close(state['params'], x)
