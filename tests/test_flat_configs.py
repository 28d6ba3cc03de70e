"""The flat-minima paper configs: they load, validate, and carry the published hyperparameters and numbers."""
import importlib.util
import os

import pytest

from fedjax_flat.server.swa import swa_start_round
from fedjax_flat.training import paper_hparams
from fedjax_flat.training.validate import validate_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = [f'{d}_cnn_{m}{s}' for d in ('cifar10', 'cifar100') for m in paper_hparams.METHODS for s in ('', '_swa')]
NAMES += [f'{d}_cnn_{m}' for d in ('cifar10', 'cifar100') for m in ('fedgloss', 'naive_fedgloss')]
NAMES += [f'{d}_resnet20_fedavg_wima' for d in ('cifar10', 'cifar100')] + ['landmarks_mobilenet_fedavg_wima']
NAMES += [f'pam_resnet18_{m}' for m in paper_hparams.METHODS] + [f'landmarks_mobilenet_{m}' for m in paper_hparams.METHODS]


def load(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, 'configs', name + '.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.parametrize('name', NAMES)
def test_config_validates_and_documents_its_command(name):
  mod = load(name)
  c = mod.get_config()
  validate_config(c)
  assert f'--config=configs/{name}.py' in mod.__doc__
  assert 'Reproduces' in mod.__doc__ and 'published' in mod.__doc__
  if c.swa.enabled:
    assert swa_start_round(c) == int(0.75 * c.rounds)


@pytest.mark.parametrize('dataset', ['cifar10', 'cifar100'])
def test_cifar_configs_use_table_a2_and_quote_table_4_3(dataset):
  for method in paper_hparams.METHODS:
    for swa in ('', '_swa'):
      mod = load(f'{dataset}_cnn_{method}{swa}')
      c = mod.get_config()
      assert (c.dataset, c.model, c.data.alpha, c.clients_per_round) == (dataset, 'cifar_cnn', 0.0, 5)
      assert (c.augment, c.normalize) == ('cifar', dataset)
      want = paper_hparams.client_optimizer(dataset, 0.0, method)
      assert (c.client.optimizer, c.client.rho, c.client.asam_eta) == (want['optimizer'], want['rho'],
                                                                         want['asam_eta'])
      key = method + ('+swa' if swa else '')
      for alpha in {'cifar10': (0.0, 0.05, 100.0), 'cifar100': (0.0, 0.5, 1000.0)}[dataset]:
        for cpr in (5, 10, 20):
          assert f'{paper_hparams.published(dataset, alpha, key, cpr):.2f}' in mod.__doc__
        if method != 'fedavg':   # the per-alpha radius override is spelled out
          rho = paper_hparams.client_optimizer(dataset, alpha, method)['rho']
          assert f'--config.data.alpha={alpha:g} --config.client.rho={rho:g}' in mod.__doc__


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
