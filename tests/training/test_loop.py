"""End-to-end: the run loop, determinism, recompilation, divergence, the binary and its files."""
import json
import os
import subprocess
import sys

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_flat.algorithms import ladd
from fedjax_flat.algorithms.common import client_parts
from fedjax_flat.config.default_config import default_config
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.evaluation import routed
from fedjax_flat.grouping import style_clusters
from fedjax_flat.models import base
from fedjax_flat.tasks.segmentation import Segmentation
from fedjax_flat.training import driver as driver_lib
from fedjax_flat.training import trainers
from fedjax_flat.training.evals import routed as evals_routed
from tests.fixtures.configs import small_config
from tests.fixtures.paths import REPO



def quantity_skew_data():
  return synthetic(8, [3, 17, 6, 9, 30, 1, 12, 5], input_shape=(4, 4, 1), num_classes=4, seed=3)


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_same_seed_same_params_other_seed_other_params():
  data = quantity_skew_data()
  p1 = trainers.make_trainer(small_config(), data=data)
  p1.train()
  p2 = trainers.make_trainer(small_config(), data=data)
  p2.train()
  p3 = trainers.make_trainer(small_config(seed=1), data=data)
  p3.train()
  a, b, c = (jax.tree_util.tree_leaves(t.server_state['params']) for t in (p1, p2, p3))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert any(not np.array_equal(x, z) for x, z in zip(a, c))


def test_no_recompilation_across_rounds_with_different_client_sizes():
  data = quantity_skew_data()
  t = trainers.make_trainer(small_config(rounds=6), data=data)
  host = driver_lib.HostDriver(t.plan)        # host-built rounds: one call of the round program each
  sizes = set()
  for r in range(6):
    rb = host.prepare_round(r)
    sizes.add(tuple(rb.num_examples.astype(int)))
    t.server_state, _ = host.run_round(t.server_state, t.store, r, rb)
  assert len(sizes) > 1, 'test needs rounds with different client sizes'
  assert host.round_fn._cache_size() == 1


def test_divergence_names_round_and_clients():
  data = quantity_skew_data()
  t = trainers.make_trainer(small_config(**{'client.lr': 1e30}), data=data)
  with pytest.raises(driver_lib.DivergenceError, match=r'round \d+: clients \[\d'):
    t.train()


def _train_binary(wd, *flags):
  cmd = [sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
         f'--config={os.path.join(REPO, "configs", "quickstart.py")}', f'--workdir={wd}',
         '--config.rounds=4', '--config.eval_every=2', '--config.summary_last_k=2', *flags]
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  return res, json.loads((wd / 'summary.json').read_text())


def test_train_binary_writes_all_files(tmp_path):
  wd = tmp_path / 'run'
  res, summary = _train_binary(wd)
  for f in ('config.json', 'metrics.jsonl', 'metrics.csv', 'metrics.png', 'summary.json', 'summary.md'):
    assert (wd / f).exists(), f
  assert any(p.name.startswith('events') for p in (wd / 'tensorboard').iterdir())
  recs = [json.loads(line) for line in (wd / 'metrics.jsonl').read_text().splitlines()]
  assert [r['round'] for r in recs] == [2, 4]
  for key in ('round', 'test_accuracy', 'test_loss', 'train_loss', 'elapsed_s', 'rounds_per_s'):
    assert key in recs[0]
  assert summary['reported_model'] == 'global'
  assert summary['final_test_accuracy'] == recs[-1]['test_accuracy']
  np.testing.assert_allclose(summary['mean_last_2_test_accuracy'], np.mean([r['test_accuracy'] for r in recs]))
  assert 'results:' in res.stdout and 'plot:' in res.stdout


# slow: the batch-size measurement is a third of this binary run; the default suite covers the recorded choice by
# tests/evaluation/test_evaluator.py::test_auto_batch_size_is_measured_once_and_recorded (the same summary writer)
# and the value 'auto' by test_eval_batch_size_auto_is_a_valid_config
@pytest.mark.slow
def test_train_binary_records_the_measured_eval_batch_size(tmp_path):
  _, summary = _train_binary(tmp_path / 'run', '--config.eval_batch_size=auto')
  ev = summary['evaluation']           # eval_batch_size='auto': the measured choice is recorded
  assert ev['auto'] and str(ev['batch_size']) in ev['images_per_s'] and ev['sample'] > 0


def test_quickstart_learns():
  """A shortened quickstart improves far beyond chance on the held-out digits."""
  from configs import quickstart
  c = quickstart.get_config()
  c.rounds = 40        # seed 0: 0.44 at round 30, 0.85 at 35 (noisy early rounds at alpha=0.5)
  c.progress_every_s = 1e9
  t = trainers.make_trainer(c)
  s = t.train()
  assert t.records[0]['test_accuracy'] < s['final_test_accuracy']
  assert s['final_test_accuracy'] > 0.6


def test_eval_clients_reports_accuracy_on_sampled_clients():
  data = quantity_skew_data()
  t = trainers.make_trainer(small_config(eval_clients=True), data=data)
  t.train()
  rec = t.records[-1]
  assert 0.0 <= rec['clients_mean_accuracy'] <= 1.0 and 'clients_weighted_accuracy' in rec
  # Check against a direct evaluation of the global model on those clients' data.
  import jax.numpy as jnp
  params = t.server_state['params']
  accs = []
  for k in t.recorder.last_clients:
    x, y = data.client_examples(int(k))
    accs.append(float(jnp.mean(jnp.argmax(t.model.apply(params, x), -1) == y)))
  np.testing.assert_allclose(rec['clients_mean_accuracy'], np.mean(accs), rtol=1e-6)


def test_eval_every_last_evaluates_each_final_round_and_summary_averages_them():
  """The papers' protocol: evaluate every round of the last N rounds and report their mean."""
  t = trainers.make_trainer(small_config(rounds=12, eval_every=5, eval_every_last=4, summary_last_k=4),
                   data=quantity_skew_data())
  s = t.train()
  assert [r['round'] for r in t.records] == [5, 9, 10, 11, 12]
  np.testing.assert_allclose(s['models']['global']['mean_last_4_test_accuracy'],
                             np.mean([r['test_accuracy'] for r in t.records[-4:]]))
  from fedjax_flat.config import validate
  with pytest.raises(validate.ConfigError, match='eval_every_last'):
    validate.validate_config(small_config(eval_every_last=-1))


def test_console_train_loss_is_the_recorded_train_loss(caplog):
  """The progress line's train_loss and metrics.jsonl's are one quantity: the mean client training loss of the
  rounds since the previous evaluation (not the last round's loss, as the console once printed)."""
  import logging
  import re
  t = trainers.make_trainer(small_config(rounds=6, eval_every=3, progress_every_s=0.0), data=quantity_skew_data())
  assert t.plan.device_rounds      # blocks of rounds in one program: each block returns its rounds' results
  losses = []
  step = t.driver.step
  t.driver.step = lambda *a: (lambda out: losses.extend(out[1]) or out)(step(*a))
  with caplog.at_level(logging.INFO, logger='absl'):
    t.train()
  printed = {int(m.group(1)): float(m.group(2)) for m in
             (re.search(r'round (\d+)/6 .* train_loss ([0-9.]+)', rec.getMessage()) for rec in caplog.records) if m}
  recorded = {rec['round']: rec['train_loss'] for rec in t.records}
  assert sorted(recorded) == [3, 6] and set(recorded) <= set(printed)
  for r in recorded:
    assert printed[r] == pytest.approx(recorded[r], abs=5e-5)
  per_round = [res['train_loss'] for res in losses]          # the record: the mean of its three rounds
  assert len(per_round) == 6 and per_round[2] != pytest.approx(recorded[3])
  assert recorded[3] == pytest.approx(np.mean(per_round[:3])) and recorded[6] == pytest.approx(np.mean(per_round[3:]))


class _Head(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    return nn.Conv(3, (1, 1), name='head')(nn.relu(nn.Conv(4, (1, 1), name='enc')(x)))


def test_evaluate_routed_scores_each_test_image_under_its_style_clusters_model():
  """The routed evaluation plug-in (training/evals/routed.py) on a tiny two-cluster LADD state (fast: a stand-in
  holding   what it reads): images of two styles, routed to their style's centroid, each scored by its cluster's model
  (LADD(all), two cluster models that differ); the reported 'routed/test_*' = the image-by-image confusion
  matrix with the known routes, and differs from scoring every image under one cluster's model."""
  model = base.from_flax(_Head(), 'head', 3, (8, 8, 3))
  rng = np.random.default_rng(0)
  dark = (rng.random((3, 8, 8, 3)) * 60).astype(np.uint8)
  bright = (195 + rng.random((3, 8, 8, 3)) * 60).astype(np.uint8)
  x = np.concatenate([dark[:1], bright, dark[1:]])
  planted = np.array([1, 0, 0, 0, 1, 1])                   # cluster 0 = bright, cluster 1 = dark
  y = rng.integers(0, 3, (6, 8, 8)).astype(np.uint8)
  styles = routed.image_styles(x)
  centroids = np.stack([styles[planted == c].mean(0) for c in (0, 1)])
  clusters = style_clusters.StyleClustering(2, np.array([0, 1]), centroids, {}, 0.0)
  params = [model.init(jax.random.PRNGKey(s), jnp.zeros((1, 8, 8, 3))) for s in (0, 1)]
  alg = ladd.ladd(model, *client_parts(default_config().client), optax.sgd(1.0), num_clusters=2, cluster_layers='all')
  state = alg.server_init(params[0], None)
  state['cluster'] = [jnp.stack(a) for a in zip(*[jax.tree_util.tree_leaves(p) for p in params])]
  prep = lambda a: jnp.asarray(a, jnp.float32) / 255.0  # noqa: E731
  task = Segmentation(ignore_index=255)
  fake = types.SimpleNamespace(
      plan=types.SimpleNamespace(style_clusters=clusters, style_fda_b=1, eval_transform=prep, placement=None),
      recorder=types.SimpleNamespace(plugin_state={}), algorithm=alg, server_state=state, model=model, task=task,
      config=types.SimpleNamespace(eval_batch_size=4), data=types.SimpleNamespace(test_examples=lambda: (x, y)))
  got = evals_routed.evaluate(fake)
  np.testing.assert_array_equal(fake.recorder.plugin_state['routed'].route_ids, planted)

  def confusion(route_ids):
    conf = np.zeros((3, 3))
    for i in range(6):
      pred = np.asarray(jnp.argmax(model.apply(params[route_ids[i]], prep(x[i:i + 1])), -1))[0]
      np.add.at(conf, (y[i].astype(int).ravel(), pred.ravel()), 1)
    return conf
  conf = confusion(planted)
  iou = np.diag(conf) / (conf.sum(0) + conf.sum(1) - np.diag(conf))
  np.testing.assert_allclose(got['routed/test_miou'], iou.mean(), rtol=1e-6)
  np.testing.assert_allclose(got['routed/test_accuracy'], np.trace(conf) / conf.sum(), rtol=1e-6)
  conf0 = confusion(np.zeros(6, int))
  iou0 = np.diag(conf0) / (conf0.sum(0) + conf0.sum(1) - np.diag(conf0))
  assert not np.isclose(got['routed/test_miou'], iou0.mean())
  # One cluster (FedAvg + self-training) or no clusters: nothing routed to report.
  fake.plan.style_clusters = style_clusters.StyleClustering(1, np.array([0, 0]), centroids[:1], {}, 0.0)
  assert evals_routed.evaluate(fake) == {}
  fake.plan.style_clusters = None
  assert evals_routed.evaluate(fake) == {}
