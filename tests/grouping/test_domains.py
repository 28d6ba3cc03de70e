"""K-means client domains (grouping/domains.py): each client's training images get its cluster; on planted
domains with one domain per client the clusters of locally trained models are measured against the planted ones."""
import numpy as np

from fedjax_flat.algorithms.fedcg import purity
from fedjax_flat.config.default_config import default_config
from fedjax_flat.data.sources.planted_domains import load_digits_domains
from fedjax_flat.grouping import domains
from fedjax_flat.models.registry import get_model


def test_client_domain_labels():
  data = load_digits_domains(num_clients=8, num_domains=4, seed=0)
  labels = np.array([3, 2, 1, 0, 3, 2, 1, 0])
  out = domains.client_domain_labels(data, labels)
  for k in range(8):
    assert (out.client_labels(k)[:, 1] == labels[k]).all()
    np.testing.assert_array_equal(out.client_labels(k)[:, 0], data.client_labels(k)[:, 0])
  np.testing.assert_array_equal(out.test_y, data.test_y)        # the test domains are kept
  assert not (data.y[:, 1] == out.y[:, 1]).all()                 # the input is not modified in place


def test_kmeans_domains_on_planted_clients():
  c = default_config()
  c.dataset, c.model = 'digits_domains', 'fedcg_net'
  c.client.lr, c.client.batch_size = 0.1, 16
  c.grouping.pretrain_epochs = 3
  c.grouping.seed = 0
  data = load_digits_domains(num_clients=8, num_domains=2, seed=0)     # identity vs inverted digits
  model = get_model('fedcg_net', 10, data.input_shape, hidden=(16,), domain_layers='none')
  out, labels, info = domains.kmeans_domains(c, model, data, 2, 'net/layer_1')
  planted = [int(data.client_labels(k)[0, 1]) for k in range(8)]
  assert labels.shape == (8,) and set(labels.tolist()) <= {0, 1}
  assert purity(labels, planted, 2, 2) == 1.0
  for k in range(8):
    assert (out.client_labels(k)[:, 1] == labels[k]).all()
