"""The planted-domain digits (data/sources/planted_domains.py): every image's domain is known, the transforms are
exact, the clients hold their domains, labels are [digit, domain]."""
import numpy as np
import pytest
from sklearn import datasets as skd

from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config
from fedjax_flat.data import registry
from fedjax_flat.data.sources import planted_domains as pd
from fedjax_flat.errors import ConfigError


def test_transforms_are_exact():
  x = np.random.default_rng(0).uniform(0, 1, (3, 8, 8, 1)).astype(np.float32)
  np.testing.assert_array_equal(pd.transform(0, x), x)
  np.testing.assert_array_equal(pd.transform(1, x), 1 - x)
  np.testing.assert_array_equal(pd.transform(2, x)[0, :, :, 0], np.rot90(x[0, :, :, 0]))
  np.testing.assert_array_equal(pd.transform(3, x), 1 - pd.transform(2, x))
  np.testing.assert_array_equal(pd.transform(4, x)[1, :, :, 0], x[1, :, :, 0].T)
  assert pd.MAX_DOMAINS == 8


@pytest.mark.parametrize('per_client', [1, 2])
def test_domains_clients_and_labels(per_client):
  ds = registry.get_dataset('digits_domains', num_clients=8, num_domains=4, domains_per_client=per_client, seed=3)
  digits = skd.load_digits()
  src = digits.images.astype(np.float32) / 16.0
  assert ds.task == 'domain_labelled' and ds.y.shape[1] == 2 and ds.num_classes == 10
  assert len(ds.y) + len(ds.test_y) == len(src)
  # every image is a transform of a source digit of the same label, by its domain's transform
  for x, (label, d) in list(zip(ds.x, ds.y))[:60]:
    cands = src[digits.target == label][..., None]
    assert np.any(np.all(pd.transform(int(d), cands) == x[None], axis=(1, 2, 3)))
  # balanced domains in train and test
  for y in (ds.y, ds.test_y):
    counts = np.bincount(y[:, 1], minlength=4)
    assert counts.max() - counts.min() <= 10
  for k in range(8):
    doms = set(ds.client_labels(k)[:, 1].tolist())
    assert doms <= {(k + j) % 4 for j in range(per_client)}
  np.testing.assert_array_equal(registry.get_dataset('digits_domains', num_clients=8, seed=3).y,
                                registry.get_dataset('digits_domains', num_clients=8, seed=3).y)


def test_config_rules():
  c = default_config()
  c.dataset = 'digits_domains'
  c.data.num_domains = 9
  with pytest.raises(ConfigError, match='num_domains'):
    validate.validate_config(c)
  c.data.num_domains = 4
  c.data.domains_per_client = 5
  with pytest.raises(ConfigError, match='domains_per_client'):
    validate.validate_config(c)
