"""configs/fedcg.py (thesis Tables 5.9-5.11) and configs/fedcg_digits.py (the planted-domain stand-in): the
published numbers, the settings each cell stands for, and one-line errors for settings the tables do not have."""
import os

import pytest

from fedjax_flat.config import families as config_strings
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError
from tests.fixtures.paths import REPO


def cfg(spec):
  return config_strings.load_config(os.path.join(REPO, 'configs', spec))


@pytest.mark.parametrize('cell,acc', [
    ('celeba,table=5.9,separate', 33.61), ('celeba,table=5.9,gcn,U,W=0,relu=0', 84.39),
    ('celeba,table=5.9,gcn,H,relu=0', 84.25), ('celeba,table=5.9,residual,H', 89.57),
    ('celeba,table=5.10,all,eye,D=3,soft=0', 88.59), ('celeba,table=5.10,all,rand,D=2,soft=0', 88.73),
    ('celeba,table=5.10,all,eye,D=4,soft=1', 88.67), ('celeba,table=5.10,last,eye,D=32,soft=1', 88.40),
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
  c = cfg('fedcg.py:femnist,scaffold')
  assert (c.dataset, c.model, c.model_kwargs.domain_layers, c.algorithm) == ('femnist', 'fedcg_net', 'none',
                                                                            'scaffold')


@pytest.mark.parametrize('bad,token', [
    ('celeba,fedprox', 'method'), ('femnist,table=5.9', 'dataset'), ('celeba,table=5.10,all,eye,D=5,soft=0', 'D'),
    ('celeba,table=5.10,all,rand,soft=1', 'rand'), ('celeba,table=5.9,gcn,eye', 'A'),
    ('celeba,table=5.9,residual,U,W=0', 'Table 5.9 has no such row'), ('celeba,table=5.12', 'table')])
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
