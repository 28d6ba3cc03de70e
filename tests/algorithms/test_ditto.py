"""Ditto (algorithms/ditto.py): engine rounds vs rounds computed by hand from the paper's Algorithm 1, two rounds vs
the release's arithmetic (litian96/ditto, flearn/trainers_MTL/ditto.py `train`, fedbase.py `simple_average`), on the
baselines' 3 unequal clients with partial participation and padding (tests/fixtures/baselines.py), the personal
models in a run's client evaluation, and a resumed run. TensorFlow is not installed here: the release's
arithmetic is written in NumPy from reading it, in float64, on the same tensors the engine sees."""
import jax
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.personalization import personal_params
from fedjax_flat.config import validate
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.errors import ConfigError
from tests.fixtures import resume
from tests.fixtures.baselines import (LR, PARAMS0, SCHEDULE, SIZES, add, assert_tree_close, client_batches, config,
                                      grad, local_sgd, mean, run_engine, scale, sub)
from tests.fixtures.configs import small_config
from tests.fixtures.release_numpy import KEYS, np_grad


def _row(store, k):
  return jax.tree_util.tree_map(lambda a: a[0], store.gather([k]))


def test_ditto_matches_hand_computed_rounds():
  """Global: FedAvg (SGD with coupled weight decay, example-weighted mean). Personal: the first s = 2 steps of
  v <- v - lr_p (grad F(v) + lam (v - w^t)), v starting from the w^t of the client's first visit."""
  lam, lr_p, s = 0.5, 0.05, 2
  state, store, alg = run_engine(config('ditto', lam=lam, personal_lr=lr_p, personal_steps=s))
  w, v = PARAMS0, {}
  for r, ids in enumerate(SCHEDULE):
    for k in ids:
      vk = v.get(k, w)
      for b in client_batches(r, k)[:s]:
        vk = sub(vk, scale(add(grad(vk, b), scale(sub(vk, w), lam)), lr_p))
      v[k] = vk
    w = mean([local_sgd(w, r, k) for k in ids], [SIZES[k] for k in ids])
  assert_tree_close(state['params'], w)
  for k in range(3):
    row = _row(store, k)
    assert float(row['seen']) == 1.0
    assert_tree_close(row['v'], v[k])
    assert_tree_close(personal_params(alg, state, row), v[k])
  assert_tree_close(personal_params(alg, state, None), w)       # never sampled: the global model


def _release_rounds(w0, rounds, lr, lam):
  """ditto.py's `train` (q = 0, no attack, no dynamic lam) on {'kernel', 'bias'} (float64): at each local
  iteration a personal step on local_models[idx] then a global SGD step (TF GradientDescentOptimizer) on the same
  batch; the global model moves by the uniform mean of the clients' differences."""
  glob = {k: w0[k].copy() for k in KEYS}
  local_models = {}
  for r in range(rounds):
    diffs = []
    for idx in SCHEDULE[r]:
      w_global_idx = {k: glob[k].copy() for k in KEYS}
      local_models.setdefault(idx, {k: glob[k].copy() for k in KEYS})    # round 0 visits every client: w^0
      for b in client_batches(r, idx):
        g = np_grad(local_models[idx], b['x'], b['y'])
        for k in KEYS:
          eff_grad = g[k] + lam * (local_models[idx][k] - glob[k])
          local_models[idx][k] = local_models[idx][k] - lr * eff_grad
        g = np_grad(w_global_idx, b['x'], b['y'])
        w_global_idx = {k: w_global_idx[k] - lr * g[k] for k in KEYS}
      diffs.append({k: w_global_idx[k] - glob[k] for k in KEYS})
    glob = {k: glob[k] + sum(d[k] for d in diffs) / len(diffs) for k in KEYS}     # simple_average
  return glob, local_models


def test_two_rounds_match_release_arithmetic():
  lam = 1.0                                               # the release's scripts: --lam=1
  cfg = config('ditto', lam=lam)
  cfg.client.weight_decay = 0.0                           # plain SGD, one learning rate for both models
  cfg.server.weighting = 'uniform'                        # simple_average
  state, store, _ = run_engine(cfg, rounds=2)
  w0 = {k: np.asarray(PARAMS0['Dense_0'][k], np.float64) for k in KEYS}
  glob, local_models = _release_rounds(w0, 2, LR, lam)
  for k in KEYS:
    np.testing.assert_allclose(np.asarray(state['params']['Dense_0'][k]), glob[k], rtol=5e-5, atol=5e-6)
    for c in range(3):
      np.testing.assert_allclose(np.asarray(_row(store, c)['v']['Dense_0'][k]), local_models[c][k], rtol=5e-5,
                                 atol=5e-6)


def test_declared_rules():
  assert registry.default_hparams('ditto') == {'lam': 0.1, 'personal_steps': 0, 'personal_lr': 0.0}
  for field, bad in (('lam', -0.5), ('personal_lr', -1.0), ('personal_steps', -2)):
    with pytest.raises(ConfigError, match=rf'algo.{field}.*{bad}') as e:
      validate.validate_config(config('ditto', **{field: bad}))
    assert '\n' not in str(e.value)


@pytest.mark.slow   # two runs of 4 rounds with every client evaluated (about 15 s)
def test_resumed_run_is_bit_identical_and_the_evaluations_read_the_personal_models(tmp_path):
  cfg = small_config(algorithm='ditto', rounds=4, eval_every=1, seed=2, **{
      'algo.lam': 0.3, 'data.num_clients': 5, 'client_eval.clients': 'all', 'personalized.enabled': True})
  data = synthetic(5, [6, 3, 8, 5, 7], input_shape=(3, 3, 1), num_classes=4, seed=0)
  t, fresh = resume.stopped_and_restored(cfg, data, tmp_path / 'ck', 2)
  summary = t.train()
  fresh.train()
  resume.assert_same_run(t, fresh)
  assert summary['personalized']['personal_model'] == 'ditto'        # config.personalized reads v_k too
  for a, b in zip(jax.tree_util.tree_leaves(t.store.state_dict()), jax.tree_util.tree_leaves(
      fresh.store.state_dict()), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  last = t.records[-1]
  assert {'clients_personal_acc_mean', 'clients_personal_acc_worst', 'clients_personal_loss_mean'} <= set(last)
  # the personal statistics are those of the clients' own v_k (or w^t before their first visit)
  prog = t.recorder.plugin_state['client_eval']
  states = {int(k): jax.tree_util.tree_map(lambda a, i=i: np.asarray(a[i]), t.store.state_dict()['states'])
            for i, k in enumerate(t.store.state_dict()['ids'])}
  res = prog(t.plan.algorithm.eval_models(t.server_state)['global'][0], personal=lambda ids: jax.tree_util.tree_map(
      lambda *a: np.stack(a), *[personal_params(t.plan.algorithm, t.server_state, states.get(int(k))) for k in ids]))
  has = res['n'] > 0
  assert last['clients_personal_acc_mean'] == pytest.approx(float(np.mean(res['personal_acc'][has])))
  assert last['clients_personal_loss_mean'] == pytest.approx(float(np.mean(res['personal_loss'][has])))
