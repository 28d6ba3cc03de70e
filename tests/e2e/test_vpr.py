"""FedVPR end to end on the synthetic stand-in: FedAvg trains the retrieval task through the usual trainer
(tuples mined inside the compiled round, one program for every round although client sizes differ, Recall@K
reported per evaluation), the validation clients evaluated per evaluation, the server / client optimizers compose,
and a trained model beats an untrained one."""
import math

import jax
import jax.numpy as jnp
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


def _recall_by_client(desc, y, client, threshold, ks=(1, 5, 10)):
  """Numpy Recall@K: each validation client's queries ranked against its own database, pooled over queries."""
  hits, n = {k: 0 for k in ks}, 0
  for g in np.unique(client):
    q, d = (client == g) & (y[:, 2] == 1), (client == g) & (y[:, 2] == 0)
    order = np.argsort(np.linalg.norm(desc[q][:, None] - desc[d][None], axis=-1), axis=1, kind='stable')
    close = np.linalg.norm(y[q][:, None, :2] - y[d][None, :, :2], axis=-1) <= threshold
    ranked = np.take_along_axis(close, order, axis=1)
    n += int(q.sum())
    for k in ks:
      hits[k] += int(np.any(ranked[:, :k], axis=1).sum())
  return {k: hits[k] / n for k in ks}


@pytest.mark.slow   # ~25 s; fast: the validation-clients trainer test below, tests/tasks/test_retrieval.py's trainer
def test_fedavg_trains_the_retrieval_task_with_one_program():
  t = trainers.make_trainer(tiny_config(rounds=2))
  assert len(set(t.data.client_sizes().tolist())) > 1        # clients of different sizes: padded and masked
  t.train()
  rec = t.records[-1] if t.records else None
  assert rec is not None
  for k in ('test_accuracy', 'test_recall@1', 'test_recall@5', 'test_recall@10', 'test_loss'):
    assert math.isfinite(rec[k])
  assert rec['test_recall@1'] <= rec['test_recall@5'] <= rec['test_recall@10'] <= 1.0
  fn = t.driver.block_fn if t.plan.device_rounds else t.driver.round_fn
  assert fn._cache_size() == 1


@pytest.mark.slow   # a second trainer (~24 s at load 1.3); fast: tests/evaluation/test_retrieval.py's groups test
def test_validation_clients_are_evaluated_at_every_evaluation():
  """data.val_clients through the trainer: the server model on the held-out clients' queries vs their own
  databases at every evaluation round (val_recall@K in the records that metrics.jsonl / csv and TensorBoard get),
  equal to numpy's Recall@K from the same model's descriptors; the summary (summary.json) selects the best
  validation round and gives that round's test numbers (the rule itself: tests/training/test_writers.py)."""
  c = tiny_config(rounds=2, clients_per_round=2)
  c.data.val_clients = 2
  t = trainers.make_trainer(c)
  assert len(t.data.val_groups) == 2 and t.plan.val_evaluator is not None
  summary = t.train()
  assert [r['round'] for r in t.records] == [1, 2]
  rec = t.records[-1]
  params = t.algorithm.eval_models(t.server_state)['global'][0]
  vx = t.plan.eval_transform(jnp.asarray(t.data.val_x))
  desc = np.asarray(jax.jit(lambda p, v: t.model.apply(p, v, train=False))(params, vx), np.float64)
  want = _recall_by_client(desc, np.asarray(t.data.val_y, np.float64), t.data.val_client, c.retrieval.threshold)
  for k in (1, 5, 10):
    assert rec[f'val_recall@{k}'] == pytest.approx(want[k])
  assert rec['val_accuracy'] == rec['val_recall@1'] and math.isfinite(rec['val_loss'])
  sel = summary['validation']
  best = max(t.records, key=lambda r: (r['val_recall@5'], -r['round']))
  assert sel['best_round'] == best['round'] and sel['selected_by'] == 'val_recall@5'
  assert sel['test_recall@1'] == pytest.approx(best['test_recall@1'])
  assert sel['val_recall@5'] == pytest.approx(best['val_recall@5'])
  assert summary['models']['global']['final_val_recall@1'] == pytest.approx(rec['val_recall@1'])


def test_trainer_evaluates_the_validation_clients_without_training():
  """The fast check of the trainer's wiring (no round compiled): with data.val_clients, Trainer.evaluate() of the
  initial model gives val_recall@K equal to numpy's per-client Recall@K; without validation clients, no val_*."""
  c = tiny_config(rounds=1, clients_per_round=2)
  c.data.val_clients = 2
  t = trainers.make_trainer(c)
  rec = t.evaluate()
  params = t.algorithm.eval_models(t.server_state)['global'][0]
  desc = np.asarray(t.model.apply(params, t.plan.eval_transform(jnp.asarray(t.data.val_x)), train=False), np.float64)
  want = _recall_by_client(desc, np.asarray(t.data.val_y, np.float64), t.data.val_client, c.retrieval.threshold)
  for k in (1, 5, 10):
    assert rec[f'val_recall@{k}'] == pytest.approx(want[k])
  t = trainers.make_trainer(tiny_config(rounds=1))
  assert t.plan.val_evaluator is None
  assert not [k for k in t.evaluate() if k.startswith('val_')]


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
