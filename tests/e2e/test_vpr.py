"""FedVPR end to end on the synthetic stand-in: FedAvg trains the retrieval task through the usual trainer
(tuples mined inside the compiled round, one program for every round although client sizes differ, Recall@K
reported per evaluation), the server / client optimizers compose, and a trained model beats an untrained one."""
import math

import numpy as np
import pytest

from configs import quickstart_vpr
from fedjax_flat.config.default_config import segmentation_data
from fedjax_flat.training import trainers
from tests.fixtures.configs import set_fields

TINY = dict(num_cities=2, city_size=150.0, sequences_per_city=10, seq_len=5, queries_per_city=24, image_size=16,
            view_m=16.0, test_sequences=6, test_queries=10, split_radius=60.0, num_positives=2, num_candidates=4)


def tiny_config(**over):
  c = quickstart_vpr.get_config()
  c.data = segmentation_data('vpr_synthetic', **TINY)
  c.model_kwargs = {'norm': 'gn', 'base_width': 4, 'gn_groups': 2, 'conv_impl': 'auto'}
  c.rounds, c.clients_per_round, c.eval_every = 3, 3, 1
  c.client.batch_size = 4
  c.retrieval.num_negatives = 2
  c.progress_every_s = 1e9
  return set_fields(c, over)


def test_fedavg_trains_the_retrieval_task_with_one_program():
  t = trainers.make_trainer(tiny_config())
  assert len(set(t.data.client_sizes().tolist())) > 1        # clients of different sizes: padded and masked
  t.train()
  rec = t.records[-1] if t.records else None
  assert rec is not None
  for k in ('test_accuracy', 'test_recall@1', 'test_recall@5', 'test_recall@10', 'test_loss'):
    assert math.isfinite(rec[k])
  assert rec['test_recall@1'] <= rec['test_recall@5'] <= rec['test_recall@10'] <= 1.0
  fn = t.block_fn if t.device_rounds else t.round_fn
  assert fn._cache_size() == 1


@pytest.mark.slow   # three more compilations (CI time budget): run with `pytest -m slow`
@pytest.mark.parametrize('over', [{'server.optimizer': 'adam', 'server.lr': 0.01},
                                  {'server.optimizer': 'adagrad', 'server.lr': 0.05},
                                  {'server.optimizer': 'sgd', 'server.momentum': 0.9, 'client.optimizer': 'sam',
                                   'client.rho': 0.05}])
def test_server_and_client_optimizers_compose(over):
  t = trainers.make_trainer(tiny_config(rounds=2, **over))
  t.train()
  assert math.isfinite(t.records[-1]['test_recall@1'])


@pytest.mark.slow   # about a minute of training on 2 idle cores
def test_trained_model_beats_untrained_on_the_stand_in():
  c = quickstart_vpr.get_config()
  c.rounds, c.eval_every, c.progress_every_s = 20, 20, 1e9
  t = trainers.make_trainer(c)
  before = t.evaluate()['test_recall@1']
  t.train()
  after = t.records[-1]['test_recall@1']
  assert after >= before + 0.15, (before, after)
  assert np.isfinite(t.records[-1]['test_loss'])
