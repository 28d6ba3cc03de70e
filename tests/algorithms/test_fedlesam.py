"""FedLESAM, FedLESAM-S, FedLESAM-D (algorithms/fedlesam.py): the round engine against the paper's update rules
written as plain loops (tests/fixtures/baselines.py: 3 rounds, partial participation, so client 1 skips round 1
and its estimate spans two global updates), and one local step against the release code's rule re-implemented in
NumPy float64 (torch is not installed here)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from tests.fixtures.baselines import (LR, MODEL, PARAMS0, SCHEDULE, SIZES, WD, add, assert_tree_close,
                                      client_batches, config, grad, mean, run_engine, scale, sgd, sub, zeros)
from tests.fixtures.release_numpy import np_grad


def _norm(t):
  return float(np.sqrt(sum(float(jnp.sum(a * a)) for a in jax.tree_util.tree_leaves(t))))


def _layer_norm_sum(t):
  return sum(float(jnp.sqrt(jnp.sum(a * a))) for a in jax.tree_util.tree_leaves(t))


def _e(dg, rho, norm):
  n = _norm(dg) if norm == 'global' else _layer_norm_sum(dg)
  return scale(dg, -rho / (n + 1e-7))


def _reference(kind, rho, direction, norm, lamb=1.0, alpha=0.1, n_pop=3):
  """The paper's rounds: e_k from the client's own w^t - w_k^old (direction='client') or the server's last move."""
  w, w_last, dg = PARAMS0, {}, zeros()
  c, ck = zeros(), {k: zeros() for k in range(n_pop)}
  h, gk = zeros(), {k: zeros() for k in range(n_pop)}
  for r, ids in enumerate(SCHEDULE):
    ys, steps = [], []
    for k in ids:
      if direction == 'client':
        e = _e(sub(w, w_last[k]), rho, norm) if k in w_last else zeros()
      else:
        e = _e(dg, rho, norm)
      y, n = w, 0
      for b in client_batches(r, k):
        g = grad(add(y, e), b)                      # one pass, at the estimated ascent point
        if kind == 'scaffold':
          g = add(g, scale(sub(c, ck[k]), lamb))
        elif kind == 'dyn':
          g = add(g, scale(gk[k], -1.0), scale(sub(y, w), alpha))
        y = sgd(y, g)
        n += 1
      w_last[k] = w
      ys.append(y)
      steps.append(n)
    if kind == 'none':
      new_w = mean(ys, [SIZES[k] for k in ids])
    elif kind == 'scaffold':
      dcs = []
      for k, y, n in zip(ids, ys, steps):
        new = add(sub(ck[k], c), scale(sub(w, y), 1.0 / (n * LR)))
        dcs.append(sub(new, ck[k]))
        ck[k] = new
      new_w = mean(ys)
      c = add(c, scale(mean(dcs), len(ids) / n_pop))
    else:
      drifts = [sub(y, w) for y in ys]
      for k, d in zip(ids, drifts):
        gk[k] = sub(gk[k], scale(d, alpha))
      h = sub(h, scale(mean(drifts), alpha * len(ids) / n_pop))
      new_w = sub(mean(ys), scale(h, 1.0 / alpha))
    dg, w = sub(new_w, w), new_w
  return w, {'c': c, 'ck': ck, 'g': gk, 'w_last': w_last}


NAMES = {'none': 'fedlesam', 'scaffold': 'fedlesam_s', 'dyn': 'fedlesam_d'}


@pytest.mark.parametrize('kind', ['none', 'scaffold', 'dyn'])
@pytest.mark.parametrize('direction,norm', [('client', 'global'), ('server', 'layers')])
def test_rounds_follow_the_rule(kind, direction, norm):
  rho, lamb, alpha = 0.3, 0.7, 0.2
  extra = {'scaffold': {'lamb': lamb}, 'dyn': {'alpha': alpha}, 'none': {}}[kind]
  state, store, alg = run_engine(config(NAMES[kind], rho=rho, direction=direction, norm=norm, **extra))
  assert alg.extra_passes == 0.0 and alg.comm_down == (2.0 if kind == 'scaffold' else 1.0)
  want, ref = _reference(kind, rho, direction, norm, lamb=lamb, alpha=alpha)
  assert_tree_close(state['params'], want)
  if kind == 'scaffold':
    assert_tree_close(state['c'], ref['c'])
  if direction == 'client':   # client 1 last received w^1 (it skipped round 1), client 2 w^2
    cs = store.gather([1])
    assert float(cs['seen'][0]) == 1.0
    assert_tree_close(jax.tree_util.tree_map(lambda a: a[0], cs['w_last']), ref['w_last'][1])


def test_estimate_differs_from_plain_fedavg_and_rho_zero_is_fedavg():
  """The ascent matters (rho > 0 moves the result) and rho = 0 gives FedAvg exactly."""
  fedavg, _, _ = run_engine(config('fedavg'))
  zero, _, _ = run_engine(config('fedlesam', rho=0.0))
  assert_tree_close(zero['params'], fedavg['params'], rtol=0, atol=0)
  moved, _, _ = run_engine(config('fedlesam', rho=0.5))
  assert _norm(sub(moved['params'], fedavg['params'])) > 1e-4


def test_perturbation_skips_batch_stats_and_zero_is_safe():
  from fedjax_flat.algorithms.fedlesam import perturbation
  tree = {'params': {'w': jnp.array([3.0, 4.0])}, 'batch_stats': {'mean': jnp.array([1.0])}}
  e = perturbation(tree, 0.5)
  np.testing.assert_allclose(e['params']['w'], [-0.3, -0.4], rtol=1e-6)
  assert float(e['batch_stats']['mean'][0]) == 0.0
  z = perturbation(jax.tree_util.tree_map(jnp.zeros_like, tree), 0.5, 'layers')
  assert all(float(jnp.abs(x).sum()) == 0.0 for x in jax.tree_util.tree_leaves(z))


# --- the release's rule, re-implemented in NumPy float64 from reading optimizer/LESAM*.py, client/fedlesam*.py ---

def _release_step(w, batch, g_update, rho, lr, wd, delta=None, lamb=0.0, max_norm=10.0):
  """LESAM.first_step (per-tensor norms summed), backward at w + e, second_step, clip_grad_norm_(10), SGD."""
  keys = ('kernel', 'bias')
  grad_norm = sum(np.linalg.norm(g_update[k]) for k in keys)
  e = {k: -g_update[k] * (rho / (grad_norm + 1e-7)) for k in keys}
  g = np_grad({k: w[k] + e[k] for k in keys}, batch['x'], batch['y'])
  if delta is not None:              # d/dw of lamb * sum(w * delta_list)
    g = {k: g[k] + lamb * delta[k] for k in keys}
  total = np.sqrt(sum(np.sum(g[k] ** 2) for k in keys))
  coef = max_norm / (total + 1e-6)
  if coef < 1:
    g = {k: g[k] * coef for k in keys}
  return {k: w[k] - lr * (g[k] + wd * w[k]) for k in keys}


def _ours(name, state_edit, cs_edit, batches, x_scale, **algo):
  c = config(name, rho=0.2, direction='server', norm='layers', **algo)
  c.client.grad_clip = 10.0
  alg = registry.build_algorithm(c, MODEL)
  state = state_edit(alg.server_init(PARAMS0, jax.random.key(0)))
  cs = cs_edit(alg.client_state_init(PARAMS0)) if alg.client_state_init is not None else None
  bcast = alg.broadcast(state, 0)
  local = alg.client_init(bcast, cs, jax.random.key(1))
  for b in batches:
    b = {**b, 'x': b['x'] * x_scale}
    local, _ = alg.client_step(bcast, local, b, jax.random.key(2))
  return local.params['Dense_0']


def _rel(got, want):
  return max(float(np.max(np.abs(np.asarray(got[k], np.float64) - want[k]) / (np.abs(want[k]) + 1e-30)))
             for k in want)


@pytest.mark.parametrize('kind', ['none', 'scaffold', 'dyn'])
def test_one_step_matches_release_rule(kind):
  rng = np.random.default_rng(0)
  rand = lambda: {'kernel': rng.normal(size=(2, 3)), 'bias': rng.normal(size=3)}  # noqa: E731
  u, cvec, ckvec, hk = rand(), rand(), rand(), rand()
  lamb = 0.3
  batches = client_batches(0, 1)[:2]
  # LESAM / LESAM-S: inputs x 30 so that clip_grad_norm_(10) acts; LESAM-D (whose alpha (w - w^t) term the release
  # keeps in weight decay, after the clip) without clipping.
  x_scale = 1.0 if kind == 'dyn' else 30.0
  w0 = {k: np.asarray(v, np.float64) for k, v in PARAMS0['Dense_0'].items()}
  tree = lambda d: {'Dense_0': {k: jnp.asarray(d[k], jnp.float32) for k in d}}  # noqa: E731

  def set_dg(s):
    return {**s, 'dg': tree(u), **({'c': tree(cvec)} if kind == 'scaffold' else {})}

  if kind == 'none':
    got = _ours('fedlesam', set_dg, lambda cs: cs, batches, x_scale)
    delta, wd, lam = None, WD, 0.0
  elif kind == 'scaffold':
    got = _ours('fedlesam_s', set_dg, lambda cs: {**cs, 'c': tree(ckvec)}, batches, x_scale, lamb=lamb)
    delta, wd, lam = {k: cvec[k] - ckvec[k] for k in u}, WD, lamb          # Local_VR_correction = c - c_i
  else:   # FedDyn's g_k = -lamb h_k; the release: delta_list = h_k - w^t, weight_decay + lamb
    got = _ours('fedlesam_d', set_dg, lambda cs: {**cs, 'g': tree({k: -lamb * hk[k] for k in hk})}, batches,
                x_scale, alpha=lamb)
    delta, wd, lam = {k: hk[k] - w0[k] for k in u}, WD + lamb, lamb
  w = w0
  for b in batches:
    w = _release_step(w, {'x': b['x'] * x_scale, 'y': b['y']}, u, 0.2, LR, wd, delta, lam)
  err = _rel(got, w)
  print(f'{NAMES[kind]}: max relative error vs the release rule {err:.2e}')
  assert err < 1e-5
