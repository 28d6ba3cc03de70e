"""FedSoup: the soup arithmetic and acceptance rule on hand-made models, and end-to-end runs."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from fedjax_flat.algorithms import fedsoup as fs
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.training import personalized_eval
from fedjax_flat.models.base import Model
from fedjax_flat.training import trainers
from fedjax_flat.config.default_config import default_config
from tests.fixtures.configs import set_fields


def test_running_mean_is_exact_mean():
  models = [{'a': jnp.array([float(i), -2.0 * i]), 'b': jnp.array(i ** 2, jnp.float32)} for i in range(1, 6)]
  soup = jax.tree_util.tree_map(jnp.zeros_like, models[0])
  count = 0.0
  for m in models:
    soup, count = fs.soup_add(soup, count, m, jnp.bool_(True))
  assert float(count) == 5
  np.testing.assert_allclose(soup['a'], [3.0, -6.0], rtol=1e-6)
  np.testing.assert_allclose(soup['b'], np.mean([i ** 2 for i in range(1, 6)]), rtol=1e-6)
  # Rejected candidates leave the soup alone.
  soup2, count2 = fs.soup_add(soup, count, {'a': jnp.array([1e3, 1e3]), 'b': jnp.array(1e3)}, jnp.bool_(False))
  assert float(count2) == 5
  np.testing.assert_allclose(soup2['a'], soup['a'])


def test_candidates_hand_computed():
  soup, count = {'w': jnp.array(2.0)}, 2.0        # the mean of the soup {1, 3}
  w, w_plus = fs.soup_candidates(soup, count, {'w': jnp.array(5.0)}, {'w': jnp.array(8.0)})
  assert float(w['w']) == pytest.approx((1 + 3 + 5) / 3)
  assert float(w_plus['w']) == pytest.approx((1 + 3 + 5 + 8) / 4)
  # Empty soup: W = theta_l, W+ = (theta_l + theta_g) / 2.
  w, w_plus = fs.soup_candidates({'w': jnp.array(0.0)}, 0.0, {'w': jnp.array(5.0)}, {'w': jnp.array(8.0)})
  assert float(w['w']) == 5.0 and float(w_plus['w']) == 6.5


def test_acceptance_rule_ge_and_strict():
  assert bool(fs.soup_accept(3.0, 3.0, strict=False)) and not bool(fs.soup_accept(3.0, 3.0, strict=True))
  assert bool(fs.soup_accept(4.0, 3.0, strict=False)) and bool(fs.soup_accept(4.0, 3.0, strict=True))
  assert not bool(fs.soup_accept(2.0, 3.0, strict=False)) and not bool(fs.soup_accept(2.0, 3.0, strict=True))


# --- The client side of the algorithm on a hand-made linear model: logits = x @ W. ---

LINEAR = Model('linear', init=lambda rng, x: {'W': jnp.zeros((2, 2))},
               apply=lambda p, x, train=False, rng=None, with_activations=False: x @ p['W'],
               num_classes=2, input_shape=(2,))
IDENT = {'W': 3.0 * jnp.eye(2)}                  # right on every one-hot example
ANTI = {'W': jnp.array([[0.0, 1.0], [1.0, 0.0]])}  # wrong on every one-hot example
VAL = {'x': jnp.eye(2), 'y': jnp.array([0, 1]), 'mask': jnp.ones(2), 'split': jnp.ones(2)}


def _client_cfg():
  c = default_config().client
  c.weight_decay = 0.0
  return c


def _alg(strict=False, start=0):
  ccfg = _client_cfg()
  return fs.fedsoup(LINEAR, local_lib.make_loss(LINEAR), *client_parts(ccfg), optax.sgd(1.0),
                    start=start, strict=strict, name='fedsoup')


def _client_round(alg, theta_l, theta_g, state, round_idx=5):
  """One client with a hand-set trained model theta_l: only validation steps (no training)."""
  server = alg.server_init(theta_g, None)
  bcast = alg.broadcast(server, jnp.asarray(round_idx))
  local = alg.client_init(bcast, state, jax.random.key(0))
  local = local._replace(params=theta_l)
  local, m = alg.client_step(bcast, local, VAL, jax.random.key(1))
  assert float(m['count']) == 0.0                # validation steps are not training steps
  np.testing.assert_array_equal(local.params['W'], theta_l['W'])
  out, new_state = alg.client_final(bcast, local, state)
  uploaded = jax.tree_util.tree_map(lambda g, d: g - d, theta_g, out['weighted']['delta'])
  return uploaded, new_state, out


def test_client_accepts_global_when_it_helps():
  alg = _alg()
  state = alg.client_state_init(IDENT)
  up, st, out = _client_round(alg, ANTI, IDENT, state)
  # W = ANTI (0/2 right), W+ = (ANTI + IDENT)/2 (2/2 right) -> accept; upload W+; soup = {IDENT}.
  np.testing.assert_allclose(up['W'], (ANTI['W'] + IDENT['W']) / 2)
  np.testing.assert_allclose(st['soup']['W'], IDENT['W'])
  assert float(st['count']) == 1.0 and float(out['uniform']['accepted']) == 1.0
  np.testing.assert_allclose(st['personal']['W'], up['W'])


def test_client_rejects_global_when_it_hurts():
  alg = _alg()
  state = alg.client_state_init(IDENT)
  bad = {'W': 10.0 * ANTI['W']}                           # the global model is the bad one
  up, st, _ = _client_round(alg, IDENT, bad, state)       # W+ = (IDENT + bad)/2: 0/2 right; W: 2/2
  np.testing.assert_allclose(up['W'], IDENT['W'])        # W = theta_l (empty soup)
  assert float(st['count']) == 0.0
  np.testing.assert_allclose(st['soup']['W'], 0.0)


def test_tie_accepted_by_ge_rejected_by_strict():
  theta_g = {'W': 2.0 * jnp.eye(2)}
  for strict, accepted in ((False, 1.0), (True, 0.0)):
    alg = _alg(strict=strict)
    up, st, _ = _client_round(alg, IDENT, theta_g, alg.client_state_init(IDENT))
    assert float(st['count']) == accepted
    expect = (IDENT['W'] + theta_g['W']) / 2 if accepted else IDENT['W']
    np.testing.assert_allclose(up['W'], expect, rtol=1e-6)


def test_patching_with_an_existing_soup():
  alg = _alg()
  soup = {'W': jnp.array([[1.0, 0.0], [0.0, 1.0]])}
  state = {**alg.client_state_init(IDENT), 'soup': soup, 'count': jnp.array(3.0)}
  up, st, _ = _client_round(alg, ANTI, IDENT, state)
  # W = (3 soup + ANTI)/4 = [[.75,.25],[.25,.75]] (2/2 right); W+ = (3 soup + ANTI + IDENT)/5 (2/2) -> accept.
  np.testing.assert_allclose(up['W'], (3 * soup['W'] + ANTI['W'] + IDENT['W']) / 5, rtol=1e-6)
  np.testing.assert_allclose(st['soup']['W'], (3 * soup['W'] + IDENT['W']) / 4, rtol=1e-6)
  assert float(st['count']) == 4.0


def test_before_start_uploads_the_local_model():
  alg = _alg(start=10)
  up, st, out = _client_round(alg, ANTI, IDENT, alg.client_state_init(IDENT), round_idx=9)
  np.testing.assert_allclose(up['W'], ANTI['W'])
  assert float(st['count']) == 0.0 and float(out['uniform']['accepted']) == 0.0


def test_missing_validation_steps_is_an_error():
  alg = _alg()
  bcast = alg.broadcast(alg.server_init(IDENT, None), jnp.asarray(0))
  local = alg.client_init(bcast, alg.client_state_init(IDENT), None)
  with pytest.raises(ValueError, match='validation examples'):
    alg.client_step(bcast, local, {k: v for k, v in VAL.items() if k != 'split'}, jax.random.key(0))


# --- End to end on the feature-shift digits (MLP, few rounds). ---

def fs_config(algorithm='fedsoup', **over):
  c = default_config()
  c.dataset = 'digits_feature_shift'
  c.data = ml_collections.ConfigDict({'num_clients': 4, 'seed': 0})
  c.model = 'mlp'
  c.model_kwargs = ml_collections.ConfigDict({'hidden': (32,)})
  c.algorithm = algorithm
  c.rounds = 4
  c.clients_per_round = 4
  c.client.lr = 0.1
  c.client.batch_size = 64
  c.eval_every = 2
  c.progress_every_s = 1e9
  return set_fields(c, over)


@pytest.fixture(scope='module')
def fs_data():
  from fedjax_flat.data.sources.feature_shift import load_digits_feature_shift
  return load_digits_feature_shift(4, seed=0)


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_fedsoup_never_started_equals_fedavg(fs_data):
  """Validation steps must not perturb training: a soup that never starts is exactly FedAvg."""
  a = trainers.make_trainer(fs_config('fedsoup', **{'algo.start_round': 100, 'rounds': 1}), data=fs_data)
  a.train()
  b = trainers.make_trainer(fs_config('fedavg', rounds=1), data=fs_data)
  b.train()
  for x, y in zip(jax.tree_util.tree_leaves(a.server_state['params']),
                  jax.tree_util.tree_leaves(b.server_state['params'])):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  assert a.records[-1]['train_loss'] == pytest.approx(b.records[-1]['train_loss'], rel=1e-5)


def test_fedsoup_end_to_end_with_personalized_evaluation(fs_data):
  c = fs_config(**{'rounds': 3, 'algo.start_fraction': 0.34, 'personalized.enabled': True,
                   'personalized.finetune_epochs': 1, 'algo.persist_opt_state': True, 'client.momentum': 0.5})
  t = trainers.make_trainer(c, data=fs_data)
  assert t.plan.val_source == 'val' and t.plan.val_steps == 1
  rb = t.driver.prepare_round(0)
  assert rb.x.shape[1] == t.plan.num_steps + 1 and rb.split[:, -1].all() and not rb.split[:, :-1].any()
  s = t.train()
  states = personalized_eval.client_states_of(t.store)
  assert sorted(states) == [0, 1, 2, 3]
  counts = [float(st['count']) for st in states.values()]
  assert all(0 <= n <= 2 for n in counts)              # rounds 1 and 2 (start = floor(0.34 * 3) = 1)
  # Persisted momentum buffers are non-zero after training.
  assert all(max(float(np.abs(a).sum()) for a in jax.tree_util.tree_leaves(st['opt_state'])) > 0
             for st in states.values())
  p = s['personalized']
  assert p['personal_model'] == 'fedsoup' and p['clients_with_state'] == 4
  for key in ('local', 'global', 'ood_other_clients', 'server'):
    assert key in p
  assert 0.2 < p['local']['acc_weighted'] <= 1.0 and 0.5 < p['local']['auc_pooled'] <= 1.0
  assert len(p['finetune']) == 1 and 'global_acc_client_mean' in p['finetune'][0]
  # The personalized model of client k is its last patched upload.
  k0 = states[0]['personal']
  assert not np.allclose(jax.tree_util.tree_leaves(k0)[0],
                         jax.tree_util.tree_leaves(t.server_state['params'])[0])
  assert 0.0 <= float(t.server_state['soup_accept_rate']) <= 1.0


def test_fedsoup_local_test_source_and_strict(fs_data):
  c = fs_config(**{'algo.val_source': 'local_test', 'algo.strict': True, 'algo.start_round': 1, 'rounds': 2})
  t = trainers.make_trainer(c, data=fs_data)
  local = max(len(fs_data.client_test_examples(k)[1]) for k in range(4))
  assert t.plan.val_steps == -(-local // 64)
  t.train()
  assert all(float(st['count']) <= 1 for st in personalized_eval.client_states_of(t.store).values())


def test_config_errors_name_the_field():
  from fedjax_flat.config import validate
  for field, value in (('algo.val_source', 'train'), ('algo.start_fraction', 1.5), ('algo.strict', 1)):
    c = fs_config(**{field: value})
    with pytest.raises(validate.ConfigError) as e:
      validate.validate_config(c)
    assert e.value.field == field
  c = fs_config(**{'personalized.auc_scores': 'probits'})
  with pytest.raises(validate.ConfigError, match='personalized.auc_scores'):
    validate.validate_config(c)
  # A dataset without validation splits: named before anything is compiled.
  c = fs_config(dataset='digits', clients_per_round=4)
  c.data = ml_collections.ConfigDict({'num_clients': 4, 'alpha': 0.0})
  with pytest.raises(validate.ConfigError, match='no per-client validation'):
    trainers.make_trainer(c)
