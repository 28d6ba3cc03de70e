"""FedFomo (algorithms/fedfomo.py): the weights against their formula, and engine rounds (two phases: federate on
the validation steps, then train and upload to the client's slot) against rounds by hand on 3 clients that come
back across rounds, each with its own validation examples."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.fedfomo import fomo_weights
from fedjax_flat.algorithms.local import make_loss
from fedjax_flat.algorithms.personalization import personal_params
from fedjax_flat.core import engine
from fedjax_flat.core.client_state import HostClientStateStore
from fedjax_flat.data import batching, validation_steps
from fedjax_flat.training import personalized_eval, trainers
from tests.algorithms.test_fedrep import MODEL, PARAMS0
from fedjax_flat.data.sources.feature_shift import load_digits_feature_shift
from tests.algorithms.test_fedsoup import fs_config
from tests.fixtures.baselines import B, DATA, E, LR, S, SCHEDULE, SIZES, WD, assert_tree_close, client_batches, config

tmap = jax.tree_util.tree_map
_LOSS = make_loss(MODEL)
_VAL = {k: (np.random.default_rng(10 + k).normal(size=(3 + k, 2, 1, 1)).astype(np.float32) + k,
            np.asarray([k % 3, (k + 1) % 3, k % 3, 1, 0][:3 + k], np.int32)) for k in range(3)}


class _WithVal:
  """The baselines' data plus a validation split per client (what data/validation_steps reads)."""

  def __init__(self, data):
    self.data, self.name = data, 'synthetic+val'

  def client_val_examples(self, k):
    return _VAL[k]

  def __getattr__(self, item):
    return getattr(self.data, item)


def test_fomo_weights_are_the_papers_formula():
  own, losses = 1.0, jnp.asarray([0.5, 1.5, 0.2, 0.1])
  dists = jnp.asarray([2.0, 1.0, 0.5, 0.0])              # the last: distance 0 (the client's own model)
  valid = jnp.asarray([True, True, True, True])
  raw = np.asarray([0.5 / 2.0, 0.0, 0.8 / 0.5, 0.0])
  np.testing.assert_allclose(fomo_weights(own, losses, dists, valid), raw / raw.sum(), rtol=1e-6)
  np.testing.assert_allclose(fomo_weights(own, losses, dists, jnp.asarray([False, True, False, True])), 0.0)
  np.testing.assert_allclose(fomo_weights(0.0, losses, dists, valid), 0.0)     # no improvement: all 0


def _round_batches(r):
  plan = batching.batch_plan(DATA.client_sizes(), batch_size=B, num_steps=S, epochs=E, with_client=True)
  rb = batching.make_round_batches(DATA, SCHEDULE[r], round_idx=r, seed=0, batch_size=B, num_steps=S, epochs=E,
                                   pad_clients_to=3, plan=plan)
  return validation_steps.append_validation_steps(rb, _WithVal(DATA), 'val', 2)


def _run(cfg):
  alg = registry.build_algorithm(cfg, MODEL, population=3)
  fn = engine.make_round_fn(alg, chunk=3)
  state = alg.server_init(tmap(jnp.copy, PARAMS0), jax.random.key(1))
  store = HostClientStateStore(alg.client_state_init(PARAMS0))
  for r in range(len(SCHEDULE)):
    rb = _round_batches(r)
    rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(3))
    state, new_cs, _ = fn(state, rb.as_dict(), store.gather(rb.client_ids), rngs, rb.num_examples,
                          rb.client_ids >= 0, r)
    store.scatter(rb.client_ids, new_cs)
  return state, store, alg


def _val_loss(w, k):
  x, y = _VAL[k]
  return float(_LOSS(w, {'x': x, 'y': y, 'mask': np.ones(len(y), np.float32)})[0])


def _reference(release=False):
  grad = jax.jit(jax.grad(lambda p, b: _LOSS(p, b)[0]))
  w, models, seen, personal, aff = PARAMS0, {}, set(), {}, {k: np.zeros(3) for k in range(3)}
  for r, ids in enumerate(SCHEDULE):
    for i in ids:                                  # phase 0: federate with every other filled slot (M = N - 1)
      theta = personal.get(i, w)
      others = [j for j in sorted(seen) if j != i]
      own = _val_loss(theta, i)
      raw, gains = {}, {}
      for j in others:
        d = np.sqrt(sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(jax.tree_util.tree_leaves(models[j]),
                                                                        jax.tree_util.tree_leaves(theta))))
        gains[j] = (own - _val_loss(models[j], i)) / d if d > 0 else 0.0
        raw[j] = max(0.0, gains[j])
      tot = sum(raw.values())
      ws = {j: (v / tot if tot > 0 else 0.0) for j, v in raw.items()}
      for j in ws:
        aff[i][j] += gains[j] if release else ws[j]      # the release: the raw gains, negatives included
      personal[i] = tmap(lambda t, *ms: t + sum(ws[j] * (m - t) for j, m in zip(others, ms)),
                         theta, *[models[j] for j in others])
    trained = {}
    for i in ids:                                  # phase 1: train and upload
      y = personal[i]
      for b in client_batches(r, i):
        g = grad(y, b)
        y = tmap(lambda p, a: p - LR * (a + WD * p), y, g)
      trained[i] = personal[i] = y
    for i in ids:
      models[i] = trained[i]
      seen.add(i)
    p = np.asarray([SIZES[k] for k in ids], np.float64)
    p /= p.sum()
    w = tmap(lambda *xs: sum(pi * x for pi, x in zip(p, xs)), *[trained[i] for i in ids])
  return w, models, personal, aff


@pytest.mark.parametrize('affinity', ['paper', 'release'])
def test_fedfomo_matches_hand_computed_rounds(affinity):
  state, store, alg = _run(config('fedfomo', models=2, epsilon=0.0, val_source='val', affinity=affinity))
  assert alg.num_phases == 2
  w, models, personal, aff = _reference(release=affinity == 'release')
  assert_tree_close(state['params'], w, rtol=5e-5, atol=5e-6)
  for k in range(3):
    assert_tree_close(tmap(lambda s: s[k], state['models']), models[k], rtol=5e-5, atol=5e-6)
    cs = tmap(lambda a: a[0], store.gather([k]))
    assert_tree_close(personal_params(alg, state, cs), personal[k], rtol=5e-5, atol=5e-6)
    np.testing.assert_allclose(cs['affinity'], aff[k], rtol=1e-4, atol=1e-6)
  assert sum(float(np.sum(a)) for a in aff.values()) > 0          # some model was really federated
  if affinity == 'release':     # the rules differ: some gain was negative (its weight was clipped to 0)
    assert any(float(np.min(a)) < 0 for a in aff.values()), aff


# slow [1]: the default suite covers exploration with filled slots by [2] (more slots than one)
@pytest.mark.parametrize('models', [pytest.param(1, marks=pytest.mark.slow), 2])
def test_fedfomo_exploration_is_deterministic_and_uses_only_filled_slots(models):
  cfg = config('fedfomo', models=models, epsilon=1.0, val_source='val')
  a, _, _ = _run(cfg)
  b, _, _ = _run(cfg)
  assert_tree_close(a['params'], b['params'], rtol=0, atol=0)
  np.testing.assert_array_equal(np.asarray(a['seen']), [1.0, 1.0, 1.0])


@pytest.fixture(scope='module')
def digits():
  return load_digits_feature_shift(4, seed=0)


# --- Through the Trainer: the round batches carry the validation steps and the client ids ('client_ids'). ---

def test_fedfomo_end_to_end_fills_the_slots_of_the_clients_it_trained(digits):
  c = fs_config('fedfomo', **{'rounds': 2, 'clients_per_round': 2, 'algo.models': 3, 'personalized.enabled': True})
  t = trainers.make_trainer(c, data=digits)
  rb = t.driver.prepare_round(0)
  assert rb.client is not None and (rb.client == rb.client_ids[:, None]).all()
  s = t.train()
  states = personalized_eval.client_states_of(t.store)
  trained = sorted(states)
  np.testing.assert_array_equal(np.flatnonzero(np.asarray(t.server_state['seen'])), trained)
  for k in trained:                 # slot k holds client k's last trained model, its personal model
    assert_tree_close(tmap(lambda a: a[k], t.server_state['models']), states[k]['personal'], rtol=0, atol=0)
  assert s['personalized']['personal_model'] == 'fedfomo'
