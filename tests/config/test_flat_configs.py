"""The flat-minima paper configs: they load, validate, and carry the published hyperparameters and numbers."""
import importlib.util
import os

import pytest

from fedjax_flat.algorithms.wrappers.swa import swa_start_round
from fedjax_flat.config import paper_hparams
from fedjax_flat.config.validate import validate_config
from tests.fixtures.paths import REPO

ALPHAS = {'cifar10': (0.0, 0.05, 100.0), 'cifar100': (0.0, 0.5, 1000.0)}


def load(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, 'configs', name + '.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.parametrize('dataset', ['cifar10', 'cifar100'])
def test_cifar_cells_use_table_a2_and_carry_table_4_3(dataset):
  mod = load('fedsam_cifar')
  for method in paper_hparams.METHODS:
    for swa in ('', ',swa'):
      for alpha in ALPHAS[dataset]:
        for cpr in (5, 10, 20):
          c = mod.get_config(f'{dataset},{method}{swa},alpha={alpha:g},clients={cpr}')
          validate_config(c)
          assert (c.dataset, c.model, c.data.alpha, c.clients_per_round) == (dataset, 'cifar_cnn', alpha, cpr)
          assert (c.augment, c.normalize, c.swa.enabled) == ('cifar', dataset, bool(swa))
          want = paper_hparams.client_optimizer(dataset, alpha, method)
          assert (c.client.optimizer, c.client.rho, c.client.asam_eta) == (want['optimizer'], want['rho'],
                                                                             want['asam_eta'])
          pub = paper_hparams.published(dataset, alpha, method + ('+swa' if swa else ''), cpr)
          assert c.published.accuracy == pub and 'Table 4.3' in c.published.source
          assert f'{pub:.2f}' in mod.__doc__
          if swa:
            assert swa_start_round(c) == int(0.75 * c.rounds)


def test_table_a2_lookup():
  assert paper_hparams.client_optimizer('cifar10', 0, 'fedsam') == {'optimizer': 'sam', 'rho': 0.1, 'asam_eta': 0.0}
  assert paper_hparams.client_optimizer('cifar100', 0.5, 'fedasam') == {'optimizer': 'asam', 'rho': 0.5,
                                                                        'asam_eta': 0.2}
  assert paper_hparams.client_optimizer('cifar10', 100, 'fedsam')['rho'] == 0.02
  assert paper_hparams.published('cifar10', 0.0, 'fedasam+swa', 5) == 76.44
  with pytest.raises(KeyError, match='Table A.2 has alpha'):
    paper_hparams.client_optimizer('cifar10', 0.3, 'fedsam')



def test_quickstart_fedgloss_exposes_algo_hparams():
  c = load('quickstart_fedgloss').get_config()
  validate_config(c)
  assert dict(c.algo) == {'rho_server': 0.15, 'beta': 10.0, 'admm': True, 'dual_variant': 'release',
                          'population': 0, 'rho_server_schedule': 'constant'}
