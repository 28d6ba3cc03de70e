"""K-means client domains (grouping/domains.py): each client's training images get its cluster; on planted
domains with one domain per client the clusters of locally trained models are measured against the planted ones."""
import numpy as np

from fedjax_flat.algorithms import registry
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


def _kmeans_config(domains='kmeans'):
  c = default_config()
  c.dataset, c.model, c.algorithm = 'digits_domains', 'fedcg_net', 'fedcg'
  c.data.num_clients = 8
  c.data.num_domains = 2
  c.model_kwargs = {'num_domains': 2, 'hidden': (16,), 'classifier_channels': (), 'classifier_hidden': 8}
  c.algo.domains = domains
  c.client.lr, c.client.batch_size = 0.1, 16
  c.grouping.pretrain_epochs = 3
  return c


def test_requested_reads_the_config_value():
  assert domains.requested(registry.declared(_kmeans_config()))
  assert not domains.requested(registry.declared(_kmeans_config('oracle')))
  assert not domains.requested(registry.declared(_kmeans_config('discovered')))
  c = default_config()                    # an algorithm without the need 'client_domains'
  c.algorithm = 'fedavg'
  assert not domains.requested(registry.declared(c))
  assert not domains.requested(None)


def test_kmeans_from_config_is_the_pass_on_the_plain_body():
  """The config's pass = kmeans_domains on fedcg_net without domain-specific layers, its output layer as the
  representation, k = model_kwargs.num_domains: same clusters, the planted ones here."""
  c = _kmeans_config()
  data = load_digits_domains(num_clients=8, num_domains=2, seed=0)
  out, labels, _ = domains.kmeans_from_config(c, data)
  model = get_model('fedcg_net', 10, data.input_shape, num_domains=2, hidden=(16,), classifier_channels=(),
                    classifier_hidden=8, domain_layers='none')
  _, by_hand, _ = domains.kmeans_domains(c, model, data, 2, 'net/layer_1')
  np.testing.assert_array_equal(labels, by_hand)
  planted = [int(data.client_labels(k)[0, 1]) for k in range(8)]
  assert purity(labels, planted, 2, 2) == 1.0
  for k in range(8):
    assert (out.client_labels(k)[:, 1] == labels[k]).all()
