"""FedBABU (algorithms/fedbabu.py): the head stays bit-identical to its init through FL, the body is FedAvg with
the head frozen (= FedRep without head epochs), and the Trainer's personalized fine-tuning runs after it."""
import numpy as np

from fedjax_flat.training import trainers
from tests.algorithms.test_fedrep import PARAMS0, _reference, _run, digits, tmap  # noqa: F401  (digits: fixture)
from tests.algorithms.test_fedsoup import fs_config
from tests.fixtures.baselines import assert_tree_close, config


def test_fedbabu_head_is_bit_identical_to_its_init_and_the_body_is_fedavg_with_a_frozen_head():
  cfg = config('fedbabu')
  cfg.server.momentum = 0.9                           # a server optimizer that would move a zero-delta leaf
  state, _, _ = _run(cfg)
  for leaf in ('kernel', 'bias'):
    np.testing.assert_array_equal(np.asarray(state['params']['Dense_1'][leaf]), np.asarray(PARAMS0['Dense_1'][leaf]))
  plain, _, _ = _run(config('fedbabu'))
  want, _ = _reference(0)
  assert_tree_close(plain['params'], want)
  assert not np.allclose(plain['params']['Dense_0']['kernel'], PARAMS0['Dense_0']['kernel'])


def test_fedrep_without_head_epochs_is_fedbabu():
  rep, _, _ = _run(config('fedrep', head_epochs=0))
  babu, _, _ = _run(config('fedbabu'))
  assert_tree_close(rep['params'], babu['params'], rtol=0, atol=0)


def test_fedbabu_end_to_end(digits):  # noqa: F811
  babu = trainers.make_trainer(fs_config('fedbabu', **{'rounds': 2, 'personalized.enabled': True,
                                                       'personalized.finetune_epochs': 1}), data=digits)
  p0 = tmap(np.asarray, babu.server_state['params'])
  s = babu.train()
  np.testing.assert_array_equal(np.asarray(babu.server_state['params']['Dense_1']['kernel']), p0['Dense_1']['kernel'])
  assert len(s['personalized']['finetune']) == 1
