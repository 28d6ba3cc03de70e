"""training/trainers.make_trainer: the trainer a config needs; a FedCG config with algo.domains='kmeans' gets its
training data from grouping/domains.py's pass (each client's cluster in the labels' domain column) and trains on
them through experiments/train.py's path (training/run.py), the pass cached in WORKDIR/grouping/."""
import glob
import os

import numpy as np
import pytest

from fedjax_flat.algorithms.fedcg import purity
from fedjax_flat.config.default_config import default_config
from fedjax_flat.data.sources.planted_domains import load_digits_domains
from fedjax_flat.grouping import domains
from fedjax_flat.training import loop, run


def _config(**algo):
  c = default_config()
  c.dataset, c.model, c.algorithm = 'digits_domains', 'fedcg_net', 'fedcg'
  c.data.num_clients, c.data.num_domains, c.data.seed = 8, 2, 0
  c.model_kwargs = {'num_domains': 2, 'hidden': (16,), 'classifier_channels': (), 'classifier_hidden': 8}
  for k, v in algo.items():
    c.algo[k] = v
  c.client.lr, c.client.batch_size = 0.1, 16
  c.grouping.pretrain_epochs = 3
  c.clients_per_round, c.rounds, c.eval_every = 4, 2, 2
  c.progress_every_s = 1e9
  return c


def test_kmeans_domains_are_a_config_value(tmp_path):
  c, wd = _config(domains='kmeans'), str(tmp_path / 'run')
  t, checkpointer, _ = run.open_run(c, wd)          # what experiments/train.py runs (training/run.py)
  try:
    assert isinstance(t, loop.Trainer)
    assert glob.glob(os.path.join(wd, 'grouping', '*.npz'))   # the pass is cached with the run
    raw = load_digits_domains(num_clients=8, num_domains=2, seed=0)
    _, labels, _ = domains.kmeans_from_config(c, raw, wd)
    np.testing.assert_array_equal(t.client_domains, labels)
    planted = [int(raw.client_labels(k)[0, 1]) for k in range(8)]
    assert purity(labels, planted, 2, 2) == 1.0               # identity vs inverted clients: found
    for k in range(8):                                          # the rounds read this column (algorithms/fedcg.py)
      assert (t.data.client_labels(k)[:, 1] == labels[k]).all()
      np.testing.assert_array_equal(t.data.client_labels(k)[:, 0], raw.client_labels(k)[:, 0])
    np.testing.assert_array_equal(t.data.test_y, raw.test_y)    # test domains: the planted ones (purity)
  finally:
    checkpointer.close()


@pytest.mark.slow
def test_kmeans_domains_run_through_train(tmp_path):
  """The whole run (pass, rounds, evaluation, files) of a k-means-domain config; rerun: resumed, pass cached."""
  c, wd = _config(domains='kmeans'), str(tmp_path / 'run')
  s = run.run(c, wd)
  assert s['rounds_completed'] == 2 and np.isfinite(s['final_test_accuracy'])
  cached = sorted(glob.glob(os.path.join(wd, 'grouping', '*.npz')))
  assert cached and os.path.exists(os.path.join(wd, 'summary.json'))
  c.rounds = 3
  s = run.run(c, wd)
  assert s['resumed_from_round'] == 2 and s['rounds_completed'] == 3
  assert sorted(glob.glob(os.path.join(wd, 'grouping', '*.npz'))) == cached
