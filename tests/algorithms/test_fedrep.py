"""FedRep (algorithms/fedrep.py) through the real round engine vs rounds computed by
hand from its update rule, on the baselines' 3 unequal clients with a one-hidden-layer MLP (body Dense_0,
head Dense_1: models/partition.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms.local import make_loss
from fedjax_flat.algorithms.personalization import personal_params
from fedjax_flat.config import validate
from fedjax_flat.errors import ConfigError
from fedjax_flat.models.registry import get_model
from fedjax_flat.training import personalized_eval, trainers
from fedjax_flat.data.sources.feature_shift import load_digits_feature_shift
from tests.algorithms.test_fedsoup import fs_config
from tests.fixtures.baselines import (LR, SCHEDULE, SIZES, WD, assert_tree_close, client_batches, config,
                                     run_engine)

MODEL = get_model('mlp', 3, (2, 1, 1), hidden=(3,))
PARAMS0 = MODEL.init(jax.random.key(0), jnp.zeros((1, 2, 1, 1)))
_LOSS = make_loss(MODEL)
tmap = jax.tree_util.tree_map


@jax.jit
def _grad(w, batch):
  return jax.grad(lambda p: _LOSS(p, batch)[0])(w)


def _sgd(w, batch, part):
  """One torch-style SGD step (coupled weight decay) on the leaves of `part` ('Dense_0' body / 'Dense_1' head)."""
  g = _grad(w, batch)
  return {**w, part: tmap(lambda p, a: p - LR * (a + WD * p), w[part], g[part])}


def _run(cfg, rounds=len(SCHEDULE)):
  """The baselines' engine loop on this file's MLP (also used by the FedBABU and MOON tests)."""
  return run_engine(cfg, rounds, model=MODEL, params0=PARAMS0)


def _reference(head_epochs, rounds=len(SCHEDULE)):
  """FedRep by hand: per client, head_epochs passes on the head (body frozen), then one on the body."""
  w, heads = PARAMS0, {}
  for r in range(rounds):
    bodies = []
    for k in SCHEDULE[r]:
      y = {**w, 'Dense_1': heads.get(k, w['Dense_1'])}
      for _ in range(head_epochs):
        for b in client_batches(r, k):
          y = _sgd(y, b, 'Dense_1')
      for b in client_batches(r, k):
        y = _sgd(y, b, 'Dense_0')
      heads[k] = y['Dense_1']
      bodies.append(y['Dense_0'])
    p = np.asarray([SIZES[k] for k in SCHEDULE[r]], np.float64)
    p /= p.sum()
    w = {**w, 'Dense_0': tmap(lambda *xs: sum(pi * x for pi, x in zip(p, xs)), *bodies)}
  return w, heads


@pytest.mark.parametrize('head_epochs', [0, 1, 2])
def test_fedrep_matches_hand_computed_rounds(head_epochs):
  state, store, alg = _run(config('fedrep', head_epochs=head_epochs))
  assert alg.num_phases == head_epochs + 1
  want, heads = _reference(head_epochs)
  assert_tree_close(state['params'], want)           # body aggregated; server head untouched (= init)
  np.testing.assert_array_equal(state['params']['Dense_1']['kernel'], PARAMS0['Dense_1']['kernel'])
  for k, h in heads.items():                          # each client's personal model: the body + its own head
    mine = personal_params(alg, state, tmap(lambda a: a[0], store.gather([k])))
    assert_tree_close(mine['Dense_1'], h)
    assert_tree_close(mine['Dense_0'], want['Dense_0'])
  if head_epochs:                                     # the heads really differ between clients
    assert not np.allclose(heads[0]['kernel'], heads[1]['kernel'])


# --- Through the Trainer with the personalized evaluation (the digits, a one-hidden-layer MLP). ---

@pytest.fixture(scope='module')
def digits():
  return load_digits_feature_shift(4, seed=0)


@pytest.mark.slow   # the Trainer with the personalized evaluation (CI time budget); the rounds are checked above
def test_fedrep_end_to_end(digits):
  rep = trainers.make_trainer(fs_config('fedrep', **{'rounds': 2, 'algo.head_epochs': 1,
                                                     'personalized.enabled': True}), data=digits)
  s = rep.train()
  states = personalized_eval.client_states_of(rep.store)
  heads = [np.asarray(st['norm'][0]) for _, st in sorted(states.items())]     # each client's own head
  assert len(heads) == 4 and not np.allclose(heads[0], heads[1])
  assert s['personalized']['personal_model'] == 'fedrep'


@pytest.mark.parametrize('name', ['fedrep', 'fedbabu', 'moon'])
def test_a_model_without_a_declared_head_is_a_config_error(name):
  cfg = config(name)
  cfg.model = 'char_lstm'
  with pytest.raises(ConfigError, match='declares no head'):
    validate.validate_config(cfg)
  validate.validate_config(config(name))            # the MLP declares its head: fine
