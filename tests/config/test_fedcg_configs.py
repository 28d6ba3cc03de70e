"""configs/fedcg.py (thesis Tables 5.9-5.11) and configs/fedcg_digits.py (the planted-domain stand-in): the
published numbers, the settings each cell stands for, and one-line errors for settings the tables do not have."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.config import families as config_strings
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError
from fedjax_flat.models.registry import get_model
from tests.fixtures.paths import REPO


def cfg(spec):
  return config_strings.load_config(os.path.join(REPO, 'configs', spec))


@pytest.mark.parametrize('cell,acc', [
    ('celeba,table=5.9,separate', 33.61), ('celeba,table=5.9,gcn,U,W=0,relu=0', 84.39),
    ('celeba,table=5.9,gcn,H,relu=0', 84.25), ('celeba,table=5.9,residual,H', 89.57),
    ('celeba,table=5.10,all,eye,D=3,soft=0', 88.59), ('celeba,table=5.10,all,rand,D=2,soft=0', 88.73),
    ('celeba,table=5.10,all,eye,D=4,soft=1', 88.67), ('celeba,table=5.10,last,eye,D=32,soft=1', 88.40),
    ('celeba,table=5.10,all,eye,kmeans,D=2,soft=0', 88.36), ('celeba,table=5.10,all,eye,kmeans,D=3,soft=0', 87.97),
    ('celeba,table=5.10,all,eye,kmeans,D=4,soft=0', 87.21),
    ('celeba,fedavg', 86.88), ('celeba,fedcg', 89.18), ('femnist,fedavg', 77.81), ('femnist,fedcg', 83.41),
    ('femnist,fedprox', 75.00), ('femnist,scaffold', 84.20)])
def test_published_numbers(cell, acc):
  c = cfg(f'fedcg.py:{cell}')
  assert c.published.accuracy == acc
  validate_config(c)


def test_cells_stand_for_their_rows():
  c = cfg('fedcg.py:celeba,table=5.9,residual,H')
  assert (c.algo.domains, c.algo.adjacency_init, c.algo.adjacency_update) == ('oracle', 'hamming', 'fixed')
  assert (c.model_kwargs.num_domains, c.model_kwargs.domain_layers, c.model_kwargs.residual,
          c.model_kwargs.gcn_w, c.model_kwargs.gcn_relu) == (32, 'all', True, True, True)
  c = cfg('fedcg.py:celeba,table=5.9,separate')       # D independent models: A = I, no W, no ReLU, no agnostic
  assert (c.algo.adjacency_init, c.model_kwargs.residual, c.model_kwargs.gcn_w, c.model_kwargs.gcn_relu) == \
      ('identity', False, False, False)
  c = cfg('fedcg.py:celeba,table=5.10,all,rand,D=3,soft=0')
  assert (c.algo.domains, c.algo.adjacency_init, c.algo.adjacency_update, c.algo.soft) == \
      ('discovered', 'random', 'distance', False)
  assert (c.model_kwargs.num_domains, c.model_kwargs.domain_layers) == (3, 'all')
  a, b = cfg('fedcg.py:celeba,fedcg'), cfg('fedcg.py:celeba,table=5.10,last,eye,D=4,soft=1')
  assert {**a.to_dict(), 'published': None} == {**b.to_dict(), 'published': None}   # Table 5.11's FedCG setting
  a = cfg('fedcg.py:celeba,table=5.10,all,eye,kmeans,D=3,soft=0')
  b = cfg('fedcg.py:celeba,table=5.10,all,eye,D=3,soft=0')
  assert (a.algo.domains, b.algo.domains, a.grouping.pretrain_epochs) == ('kmeans', 'discovered', 10)
  a.algo.domains, a.grouping.pretrain_epochs = 'discovered', b.grouping.pretrain_epochs   # the K-means row = the Clf
  assert {**a.to_dict(), 'published': None} == {**b.to_dict(), 'published': None}  # row but for the domains
  c = cfg('fedcg.py:femnist,scaffold')
  assert (c.dataset, c.model, c.model_kwargs.domain_layers, c.algorithm) == ('femnist', 'fedcg_net', 'none',
                                                                            'scaffold')


@pytest.mark.parametrize('bad,token', [
    ('celeba,fedprox', 'method'), ('femnist,table=5.9', 'dataset'), ('celeba,table=5.10,all,eye,D=5,soft=0', 'D'),
    ('celeba,table=5.10,all,rand,soft=1', 'rand'), ('celeba,table=5.9,gcn,eye', 'A'),
    ('celeba,table=5.9,residual,U,W=0', 'Table 5.9 has no such row'), ('celeba,table=5.12', 'table'),
    ('celeba,table=5.10,last,eye,kmeans,D=4,soft=1', 'layers'), ('celeba,table=5.10,all,rand,kmeans,soft=0', 'A'),
    ('celeba,table=5.10,all,eye,kmeans,D=3,soft=1', 'soft'), ('celeba,fedcg,kmeans', 'clusters'),
    ('celeba,table=5.9,residual,H,kmeans', 'clusters')])
def test_settings_the_tables_do_not_have(bad, token):
  with pytest.raises(config_strings.ConfigStringError, match=token):
    cfg(f'fedcg.py:{bad}')


def test_stand_in_cells():
  c = cfg('fedcg_digits.py:fedavg')
  assert (c.algorithm, c.model_kwargs.domain_layers, c.dataset) == ('fedavg', 'none', 'digits_domains')
  c = cfg('fedcg_digits.py:fedcg,oracle,H,fixed,W=0')
  assert (c.algo.domains, c.algo.adjacency_init, c.algo.adjacency_update, c.model_kwargs.gcn_w) == \
      ('oracle', 'hamming', 'fixed', False)
  validate_config(c)
  with pytest.raises(config_strings.ConfigStringError, match='D >= 4'):
    cfg('fedcg_digits.py:fedcg,oracle,D=2')
  c = cfg('fedcg_digits.py:fedcg')
  c.model_kwargs.domain_layers = 'none'
  with pytest.raises(ConfigError, match='domain_layers'):
    validate_config(c)


def test_stand_in_kmeans_and_same_size_fedavg():
  c = cfg('fedcg_digits.py:fedcg,kmeans')
  assert (c.algo.domains, c.grouping.pretrain_epochs, c.model_kwargs.num_domains) == ('kmeans', 5, 4)
  validate_config(c)
  wide, fedcg_net = cfg('fedcg_digits.py:fedavg,width=267'), cfg('fedcg_digits.py:fedcg,oracle')
  assert (wide.algorithm, tuple(wide.model_kwargs.hidden)) == ('fedavg', (267,))
  with pytest.raises(config_strings.ConfigStringError, match='width'):
    cfg('fedcg_digits.py:fedavg,width=0')
  n = {}
  for name, c in (('wide', wide), ('fedavg', cfg('fedcg_digits.py:fedavg')), ('fedcg', fedcg_net)):
    model = get_model(c.model, 10, (8, 8, 1), **c.model_kwargs.to_dict())
    p = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8, 8, 1)))   # shapes only: no compile
    n[name] = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(p))
  # 64*h + h + 10*h + 10 (+ the unused 'soft' scalar): h = 64 -> 4,811, h = 267 -> 20,036 ~ FedCG's 20,040
  assert n == {'wide': 20036, 'fedavg': 4811, 'fedcg': 20040}
