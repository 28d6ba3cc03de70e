"""Config families (configs/<family>.py:<string>): every declared cell builds and validates, carries the
published number transcribed from the digests, equals the per-file configs it replaced, and a bad string is
one line naming the token and the allowed ones (exit 2 from the binary)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from fedjax_flat.algorithms.wrappers.swa import swa_start_round
from fedjax_flat.training import packing
from fedjax_flat.training import checkpoint
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError
from tests.fixtures.paths import REPO

CONFIGS = os.path.join(REPO, 'configs')
# Families whose cells reproduce a paper table (each cell must carry a published number or say it diverged).
PAPER_FAMILIES = ('fedsam_cifar', 'fedsam_pam', 'fedsam_landmarks', 'fedgloss_cifar', 'fedgloss_sota', 'wima',
                  'man_cifar100',
                  'baselines_cifar_cnn', 'fedseq', 'fedcg', 'fedsoup_table1', 'fedvpr')
# digits stand-ins: no paper number applies
STAND_INS = ('baselines_digits', 'fedsoup_digits', 'fedseq_digits', 'fedcg_digits',
             'dp',      # configs/dp.py: pfl-research's recipe and the digits DP cells (no paper table)
             'system',  # configs/system.py: the virtual clock's digits cells (no paper table)
             'flat_cost',   # configs/flat_cost.py: issue 38's study cells (no paper table)
             'spurious',    # configs/spurious.py: the coloured digits of thesis 7.2.3 (no paper table)
             'cross_device')   # configs/cross_device.py: issue 50's protocol (no paper table)
# Families with cells of a paper table beside published settings whose tables could not be read (configs/flat2024.py:
# FedWMSAM / FedSWA numbers; the FedLESAM, FedGF and FedNSAM settings without one): a cell carries a number or nothing.
PARTLY_PUBLISHED = ('flat2024',)
SEG_FAMILIES = ('feddrive', 'ladd')   # mIoU instead of accuracy: tests/config/test_{feddrive,ladd}_configs.py


def load(name):
  spec = importlib.util.spec_from_file_location('family_' + name, os.path.join(CONFIGS, name + '.py'))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def families():
  return sorted(f[:-3] for f in os.listdir(CONFIGS) if f.endswith('.py') and hasattr(load(f[:-3]), 'CELLS'))


def cfg(spec):
  return config_strings.load_config(os.path.join(CONFIGS, spec))


def test_every_family_is_known():
  assert set(families()) == set(PAPER_FAMILIES) | set(STAND_INS) | set(SEG_FAMILIES) | set(PARTLY_PUBLISHED)


@pytest.mark.parametrize('name', PAPER_FAMILIES + STAND_INS + PARTLY_PUBLISHED)
def test_every_cell_builds_validates_and_documents(name):
  mod = load(name)
  assert mod.CELLS and len(set(mod.CELLS)) == len(mod.CELLS), 'cells must be distinct'
  assert f'configs/{name}.py' in mod.__doc__          # the command / grammar is in the docstring
  seen = set()
  for cell in mod.CELLS:
    c = mod.get_config(cell)
    validate_config(c)
    if c.swa.enabled and 'start=' not in cell:      # start=: Table 4.12's SWA start rounds
      assert swa_start_round(c) == int(0.75 * c.rounds)
    pub = c.published.to_dict()
    if name in PARTLY_PUBLISHED and not pub:
      pass
    elif name in PAPER_FAMILIES + PARTLY_PUBLISHED:
      assert pub.get('source'), cell
      assert 'accuracy' in pub or 'diverged' in pub['source'], cell
      if 'accuracy' in pub:
        assert 0 < pub['accuracy'] <= 100 and f"{pub['accuracy']:.2f}".rstrip('0').rstrip('.') in \
            mod.__doc__.replace('+-', ' '), (cell, pub)   # the docstring's table shows the number
    else:
      assert pub == {}, cell
    # Distinct cells are distinct settings (or the same setting under another table's number).
    key = json.dumps({k: v for k, v in c.to_dict().items() if k != 'published'}, sort_keys=True, default=str)
    seen.add((key, json.dumps(pub, sort_keys=True)))
  assert len(seen) == len(mod.CELLS)
  if name in PARTLY_PUBLISHED:
    assert any(mod.get_config(cell).published.to_dict() for cell in mod.CELLS), name


@pytest.mark.parametrize('spec,source,acc,extra', [
    ('fedsam_cifar.py:cifar10,fedasam,swa', 'Table 4.3', 76.44, {}),
    ('fedsam_cifar.py:cifar100,fedsam,alpha=0.5,clients=20', 'Table 4.3', 46.05, {}),
    ('fedsam_cifar.py:cifar100,fedavg,alpha=1000,clients=10,epochs=2', 'E=2', 48.64, {}),
    ('fedsam_cifar.py:cifar100,fedasam,swa,alpha=0,table=4.1', 'Table 4.1', 42.01,
     {'lambda_max': 24.57, 'lambda_ratio_1_5': 1.51, 'centralized_accuracy': 55.96}),
    ('fedsam_cifar.py:cifar100,fedavg,alpha=1000,epochs=2,table=4.1', 'Table 4.1', 48.72,
     {'lambda_max': 118.35, 'lambda_ratio_1_5': 1.30}),
    ('fedsam_cifar.py:cifar100,fedavg,mixup,alpha=0', 'Table 4.7', 29.91, {'centralized_accuracy': 58.01}),
    ('fedsam_cifar.py:cifar100,fedsam,swa,mixup,alpha=1000', 'Table 4.7', 52.9, {}),
    ('fedsam_cifar.py:cifar10,fedasam,swa,cutout,alpha=0.05,clients=20', 'Table 4.7', 71.09, {}),
    ('fedsam_cifar.py:cifar10,fedavg,swa,noavg', 'Table 4.11', 61.41, {}),
    ('fedsam_cifar.py:cifar100,fedasam,swa,cycle=1,alpha=0.5,clients=20', 'Table 4.11', 47.95, {}),
    ('fedsam_cifar.py:cifar100,fedavg,swa,start=1000', 'Table 4.12', 24.53, {}),
    ('fedsam_cifar.py:cifar10,fedavg,swa,start=2500,alpha=100', 'Table 4.12', 81.49, {}),
    ('fedsam_cifar.py:cifar10,fedasam,swa,alpha=0,clients=20,cifarc', 'Fig. 4.13', 76.36, {}),
    ('fedsam_pam.py:fedsam,swa,clients=20', 'Table 4.4', 54.67, {}),
    ('fedsam_pam.py:fedasam,epochs=2', 'Table 4.4', 49.33, {}),
    ('fedsam_landmarks.py:fedasam,swa', 'Table 4.9', 67.17, {}),
    ('fedgloss_cifar.py:cifar100,sgd,alpha=0.5', 'Table 4.15', 47.9,
     {'accuracy_std': 0.5, 'lambda_max': 107.35, 'lambda_max_std': 7.5}),
    ('fedgloss_cifar.py:cifar10,naive_fedgloss,alpha=0.05', 'Table 4.20', 84.4, {'lambda_max': 2.75}),
    ('fedgloss_cifar.py:cifar100,alpha=1000,noadmm', 'Table 4.17', 55.8, {'lambda_max': 13.9}),
    ('fedgloss_cifar.py:cifar10,sgd,alpha=0.05', 'Table 4.19', 75.5,
     {'rounds_to_target': 3800, 'bits_to_target_B': 0.4, 'target_accuracy': 65.7}),
    ('fedgloss_sota.py:cifar100,fedgloss,sam', 'Table 4.16', 47.2,
     {'accuracy_std': 0.2, 'rounds_to_target': 1900, 'bits_to_target_B': 0.2, 'target_accuracy': 37.4}),
    ('fedgloss_sota.py:cifar10,fedsmoo,sam', 'Table 4.16', 75.3, {'rounds_to_target': 2400, 'bits_to_target_B': 0.5}),
    ('fedgloss_sota.py:cifar10,fedavg', 'Table 4.16', 72.6, {'rounds_to_target': 10000, 'bits_to_target_B': 1}),
    ('fedgloss_sota.py:landmarks,fedgloss,sam', 'Table 4.18', 59.7,
     {'accuracy_std': 1.2, 'rounds_to_target': 200, 'bits_to_target_B': 0.2, 'target_accuracy': 56.3}),
    ('fedgloss_sota.py:landmarks,fedprox', 'never reached', 55.0, {'target_accuracy': 56.3}),
    ('baselines_cifar_cnn.py:dataset=cifar10,algo=fedsmoo,client=sam,table=4.15', 'Table 4.19', 81.3,
     {'rounds_to_target': 1900, 'bits_to_target_B': 0.4, 'target_accuracy': 59.9}),
    ('baselines_cifar_cnn.py:dataset=cifar100,algo=fedavg,client=sam,table=4.15', 'Table 4.13', 28.7,
     {'lambda_local_1': 0.1, 'lambda_global_1': 238.5, 'lambda_local_5': 15.3, 'lambda_global_5': 142.6}),
    ('fedgloss_cifar.py:cifar10', 'Table 4.13', 83.9, {'lambda_local_4': 207.8, 'lambda_global_4': 4.0}),
    ('wima.py:cifar10', 'Table 4.22', 69.95, {}),
    ('wima.py:cifar100,scaffold,nowima,alpha=0.5', 'Table 4.22', 50.93, {}),
    ('wima.py:cifar100,mime_sgd,alpha=0.5', 'Table 4.22', 40.37, {}),
    ('wima.py:cifar10,fedavgm,nowima', 'Table 4.22', 73.32, {}),
    ('wima.py:cifar100,feddyn', 'Table 4.22', 8.48, {}),
    ('wima.py:landmarks,scaffold', 'Table 4.23', 68.30, {}),
    ('wima.py:pam,fedavgm', 'Table 4.22', 61.63, {}),
    ('wima.py:pam,feddyn,nowima', 'Table 4.22', 57.42, {}),
    ('wima.py:femnist', 'Table 4.22', 85.06, {}),
    ('wima.py:femnist,mimelite,nowima', 'Table 4.22', 86.82, {}),
    ('wima.py:cifar100,window=10', 'Table 4.24', 25.70, {}),
    ('wima.py:cifar10,alpha=0.05,subset=classifier,batch=20', 'Table 4.25', 71.01, {}),
    ('man_cifar100.py:fedspeed,man,iid', 'MAN', 55.89, {'accuracy_std': 0.41}),
    ('man_cifar100.py:fedavg,dir0.6', 'MAN', 40.39, {'accuracy_std': 0.59, 'target_accuracy': 50.0}),
    ('man_cifar100.py:fedsam,man,dir0.6', 'Tables 1-2', 52.62,
     {'rounds_to_target': 281, 'lambda_max': 30.05, 'hessian_trace': 2918}),
    ('man_cifar100.py:tiny_imagenet,feddc,man,dir0.3', 'Table 1', 35.70,
     {'rounds_to_target': 73, 'target_accuracy': 28.0}),
    ('man_cifar100.py:feddc,man,iid', 'MAN', 56.77, {'accuracy_std': 0.31}),
    ('man_cifar100.py:tiny_imagenet,feddc,man,iid', 'Tiny-ImageNet', 36.53, {'accuracy_std': 0.03}),
    ('man_cifar100.py:tiny_imagenet,fedavg,dir0.6', 'Tiny-ImageNet', 24.41, {'accuracy_std': 0.41}),
    ('baselines_cifar_cnn.py:cifar10,scaffold,asam', 'Table 4.8', 77.78, {}),
    ('baselines_cifar_cnn.py:dataset=cifar100,algo=fedsmoo,alpha=0.5,table=4.15', 'Table 4.15', 51.7,
     {'accuracy_std': 0.46, 'lambda_max': 29.23}),
    ('baselines_cifar_cnn.py:dataset=cifar100,algo=fedadagrad,eta_g=0.01,alpha=1000', 'Table 4.2', 51.44, {}),
    ('baselines_cifar_cnn.py:cifar10,fedavgm,sam,swa=1,clients=20,alpha=100', 'Table 4.6', 86.79, {}),
    ('fedsoup_table1.py:camelyon17,moon,leave_out=3', 'Table 1, camelyon17 moon', 70.61,
     {'accuracy_std': 1.54, 'local_acc': 85.71, 'local_auc': 91.98, 'global_auc': 79.27}),
    ('fedsoup_table1.py:retina,fedfomo,leave_out=0', 'Table 1, retina fedfomo', 59.9,
     {'local_acc': 89.70, 'local_acc_std': 0.0, 'global_auc': 63.82, 'global_auc_std': 1.14}),
    ('fedsoup_table1.py:retina,fedbabu,leave_out=-1', 'Table 1, retina fedbabu', 77.65, {'local_auc': 95.10}),
    ('fedsoup_table1.py:camelyon17_release,fedsoup,leave_out=0', 'Table 1, camelyon17 fedsoup', 72.87,
     {'local_acc': 85.71, 'model': 'personalized'}),
])
def test_published_numbers(spec, source, acc, extra):
  pub = cfg(spec).published
  assert source in pub.source and pub.accuracy == acc
  for k, v in extra.items():
    assert pub[k] == v


def test_fedsam_cifar_ablation_cells_set_their_knobs():
  """Tables 4.7 / 4.11 / 4.12 and Fig. 4.13 change exactly their knob of the Table 4.3 setting."""
  base = cfg('fedsam_cifar.py:cifar100,fedsam,swa').to_dict()

  def diff(spec):
    c = cfg(spec).to_dict()
    return {k for k in c if k != 'published' and c[k] != base[k]}
  assert diff('fedsam_cifar.py:cifar100,fedsam,swa,mixup') == {'augment'}
  assert cfg('fedsam_cifar.py:cifar100,fedsam,swa,mixup').augment == 'cifar_mixup'
  assert cfg('fedsam_cifar.py:cifar10,fedavg,cutout').augment == 'cifar_cutout'
  c = cfg('fedsam_cifar.py:cifar100,fedsam,swa,noavg')
  assert diff('fedsam_cifar.py:cifar100,fedsam,swa,noavg') == {'swa'} and not c.swa.average and c.swa.cyclic_lr
  c = cfg('fedsam_cifar.py:cifar100,fedsam,swa,cycle=1')
  assert (c.swa.cycle, c.swa.average, c.swa.start_fraction) == (1, True, 0.75)
  c = cfg('fedsam_cifar.py:cifar100,fedavg,swa,start=5000')
  assert swa_start_round(c) == 5000 and c.swa.cycle == 20 and c.rounds == 20000
  c = cfg('fedsam_cifar.py:cifar10,fedsam,swa,clients=20,cifarc')
  assert (c.corruption_eval.name, tuple(c.corruption_eval.severities)) == ('cifar10_c', (5,))
  assert cfg('fedsam_cifar.py:cifar100,fedsam,clients=20,cifarc').corruption_eval.name == 'cifar100_c'
  for bad, needle in (('cifar10,noavg', 'need swa'), ('cifar10,fedsam,swa,start=500', 'method'),
                      ('cifar10,fedavg,swa,start=1000', 'start=1000'), ('cifar10,fedavg,swa,cycle=5', 'cycle=5'),
                      ('cifar10,fedavg,swa,mixup,noavg', 'no table combines'),
                      ('cifar10,fedavg,table=4.1', 'dataset'), ('cifar10,fedavg,cifarc', 'clients=5'),
                      ('cifar100,fedavg,alpha=0.5,table=4.1', 'alpha=0.5')):
    with pytest.raises(ConfigError, match=needle):
      cfg('fedsam_cifar.py:' + bad)


def test_wima_table_4_22_rows_map_to_their_algorithms():
  c = cfg('wima.py:cifar10,fedavgm')
  assert (c.algorithm, c.server.momentum, c.server.lr, c.wima.enabled) == ('fedavg', 0.9, 1.0, True)
  sgd, sgdm = cfg('wima.py:cifar10,mime_sgd'), cfg('wima.py:cifar10,mime_sgdm')
  assert (sgd.algorithm, sgd.algo.beta, sgdm.algorithm, sgdm.algo.beta) == ('mime', 0.0, 'mime', 0.9)
  c = cfg('wima.py:cifar100,adabest,nowima,alpha=0.5')
  assert (c.algorithm, c.algo.mu, c.algo.beta, c.model, c.client.lr) == ('adabest', 0.02, 0.9, 'resnet20_gn', 0.1)
  assert cfg('wima.py:cifar10,feddyn').published.to_dict() == {}       # N/A in the table
  with pytest.raises(ConfigError, match='landmarks'):
    cfg('wima.py:landmarks,fedcm')


def test_wima_pam_and_femnist_settings():
  """Table 4.22's PAM / FEMNIST columns: A.3.1's settings, the [U] choices the docstring names."""
  c = cfg('wima.py:pam')
  assert (c.dataset, c.model, c.model_kwargs.get('gn_groups', 2), c.rounds, c.clients_per_round) == \
      ('cifar100_pam', 'resnet18_gn', 2, 10000, 100)      # resnet18_gn's default: 2 groups
  assert (c.client.lr, c.client.weight_decay, c.client.batch_size, c.client.momentum, c.server.momentum) == \
      (0.05, 4e-4, 20, 0.0, 0.0)
  assert (c.wima.enabled, c.wima.window, c.augment, c.normalize) == (True, 100, 'none', 'cifar100')
  assert cfg('wima.py:pam,fedavgm').server.momentum == 0.9
  f = cfg('wima.py:femnist,scaffold')
  assert (f.dataset, f.model, f.rounds, f.clients_per_round, f.algorithm, f.data.fraction) == \
      ('femnist', 'mcmahan_cnn', 1500, 10, 'scaffold', 1.0)
  assert (f.client.lr, f.client.momentum, f.client.weight_decay, f.client.batch_size, f.client.local_epochs) == \
      (0.1, 0.0, 0.0, 10, 1)
  assert (f.wima.window, f.published.accuracy) == (100, 86.61)
  assert cfg('wima.py:femnist,feddyn').published.to_dict() == {}       # N/A in the table
  assert cfg('wima.py:pam,batch=10').published.to_dict() == {}         # not the table's batch
  with pytest.raises(ConfigError, match='pam'):
    cfg('wima.py:pam,alpha=0.05')


def test_man_zeta_convention_and_cifar10():
  assert 'rounds_to_target' not in cfg('man_cifar100.py:fedavg,dir0.6').published      # "500+"
  assert 'lambda_max' not in cfg('man_cifar100.py:fedsam,man,iid').published          # Table 2: no iid column
  paper, code = cfg('man_cifar100.py:feddc,man'), cfg('man_cifar100.py:feddc,man,zeta=code')
  assert (paper.man.zeta, paper.man.convention, code.man.zeta, code.man.convention) == \
      (0.15, 'paper', 0.15, 'code')
  c = cfg('man_cifar100.py:cifar10,fedavg,man')
  validate_config(c)
  assert (c.dataset, c.model, c.normalize, c.rounds, c.man.zeta) == ('cifar10', 'cifar_cnn', 'cifar10', 500, 0.15)
  assert c.published.to_dict() == {}          # supplementary Sec. 5.2: not in the seeds


def test_table_4_13_only_on_its_rows():
  assert 'lambda_local_1' not in cfg('baselines_cifar_cnn.py:dataset=cifar10,algo=fedprox,table=4.15').published
  assert 'lambda_local_1' not in cfg('baselines_cifar_cnn.py:dataset=cifar10,algo=fedsmoo,client=sam,alpha=0.05,'
                                     'table=4.15').published
  assert 'lambda_local_1' not in cfg('fedgloss_cifar.py:cifar10,sgd').published
  assert cfg('baselines_cifar_cnn.py:dataset=cifar10,algo=feddyn,client=sam,table=4.15').published.lambda_local_3 \
      == 200.2


def test_fedgloss_sota_settings():
  c = cfg('fedgloss_sota.py:cifar100,fedgloss,sam')
  assert (c.model, c.data.alpha, c.rounds, c.clients_per_round, c.client.lr, c.client.momentum) == \
      ('resnet18_gn', 0.5, 10000, 10, 0.01, 0.7)
  assert (c.client.weight_decay, c.client.optimizer, c.client.rho, c.client.rho_warmup_rounds) == \
      (1e-5, 'sam', 0.01, 0)
  assert (c.algo.rho_server, c.algo.rho_server_schedule, c.algo.dual_variant) == (0.01, 'constant', 'release')
  c = cfg('fedgloss_sota.py:landmarks,fedsmoo,sam')
  assert (c.model, c.rounds, c.clients_per_round, c.client.local_epochs, c.client.rho, c.algo.beta) == \
      ('mobilenet_v2_gn', 1300, 50, 5, 0.1, 50.0)
  assert cfg('fedgloss_sota.py:cifar10,fedavg,sam').client.optimizer == 'sam'
  assert cfg('fedgloss_sota.py:landmarks,fedspeed,sam').published.to_dict() == {}    # Table 4.19 only
  with pytest.raises(ConfigError, match='client=sgd'):
    cfg('fedgloss_sota.py:cifar10,fedgamma,sgd')


def test_diverged_and_unpublished_cells():
  pub = cfg('baselines_cifar_cnn.py:cifar100,feddyn,table=4.15').published
  assert 'diverged' in pub.source and 'accuracy' not in pub and 'Table 4.19: did not converge' in pub.source
  pub = cfg('fedgloss_sota.py:landmarks,scaffold').published
  assert 'diverged' in pub.source and 'accuracy' not in pub
  # A combination no table has builds, with nothing published.
  assert cfg('fedgloss_cifar.py:cifar10,naive_fedgloss,sgd').published.to_dict() == {}
  assert cfg('wima.py:cifar10,scaffold,window=10').published.to_dict() == {}


def test_cells_equal_the_replaced_files():
  """Key fields of the per-file configs this replaced (read from main:configs/<old>.py when written)."""
  c = cfg('fedsam_cifar.py:cifar100,fedasam,swa')             # was cifar100_cnn_fedasam_swa.py
  assert (c.dataset, c.model, c.data.alpha, c.data.num_clients, c.data.examples_per_client) == \
      ('cifar100', 'cifar_cnn', 0.0, 100, 500)
  assert (c.rounds, c.clients_per_round, c.client.lr, c.client.batch_size, c.client.weight_decay) == \
      (20000, 5, 0.01, 64, 4e-4)
  assert (c.client.optimizer, c.client.rho, c.client.asam_eta) == ('asam', 0.5, 0.2)
  assert (c.swa.enabled, c.swa.cycle, c.swa.lr1, c.swa.lr2, c.swa.start_fraction) == (True, 20, 1e-2, 1e-4, 0.75)
  assert (c.augment, c.normalize, c.eval_every, c.eval_every_last, c.summary_last_k) == \
      ('cifar', 'cifar100', 100, 100, 100)
  c = cfg('fedsam_cifar.py:cifar10,fedsam')                    # was cifar10_cnn_fedsam.py
  assert (c.rounds, c.client.optimizer, c.client.rho, c.swa.enabled, c.swa.cycle) == (10000, 'sam', 0.1, False, 10)
  c = cfg('fedgloss_cifar.py:cifar100')                        # was cifar100_cnn_fedgloss.py
  assert c.algorithm == 'fedgloss' and c.rounds == 20000
  assert {k: c.algo[k] for k in ('rho_server', 'beta', 'admm', 'dual_variant', 'population')} == \
      {'rho_server': 0.01, 'beta': 100.0, 'admm': True, 'dual_variant': 'release', 'population': 0}
  assert c.algo.rho_server_schedule == 'release'   # new: set explicitly (the published runs' schedule)
  assert (c.client.optimizer, c.client.rho, c.client.rho0, c.client.rho_warmup_rounds) == ('sam', 0.2, 0.001, 15000)
  c = cfg('fedgloss_cifar.py:cifar10,naive_fedgloss')          # was cifar10_cnn_naive_fedgloss.py
  assert (c.algorithm, c.algo.rho_server, c.algo.beta, c.client.rho, c.client.rho_warmup_rounds) == \
      ('naive_fedgloss', 0.15, 10.0, 0.15, 2000)
  c = cfg('wima.py:cifar10')                                   # was cifar10_resnet20_fedavg_wima.py
  assert (c.model, c.rounds, c.clients_per_round, c.client.lr, c.client.weight_decay, c.client.batch_size) == \
      ('resnet20_gn', 10000, 10, 0.1, 0.0, 100)
  assert (c.wima.enabled, c.wima.window, c.swa.enabled, c.algorithm) == (True, 100, False, 'fedavg')
  c = cfg('wima.py:landmarks')                                 # was landmarks_mobilenet_fedavg_wima.py
  assert (c.dataset, c.model, c.rounds, c.client.batch_size, c.client.lr, c.client.local_epochs) == \
      ('gld160k', 'mobilenet_v2_gn', 3000, 50, 0.1, 5)
  assert (c.wima.window, c.normalize, c.data.train_augment, c.eval_every) == (370, 'imagenet', True, 10)
  c = cfg('fedsam_pam.py:fedasam')                             # was pam_resnet18_fedasam.py
  assert (c.dataset, c.model, c.data.source, c.rounds, c.clients_per_round) == \
      ('cifar100_pam', 'resnet18_gn', 'sqlite', 10000, 10)
  assert (c.client.batch_size, c.client.momentum, c.client.optimizer, c.client.rho, c.client.asam_eta) == \
      (20, 0.9, 'asam', 0.5, 0.2)
  assert (c.augment, c.swa.enabled, c.swa.cycle, c.swa.start_fraction) == ('none', False, 5, 0.75)
  c = cfg('fedsam_landmarks.py:fedsam')                        # was landmarks_mobilenet_fedsam.py
  assert (c.rounds, c.client.weight_decay, c.client.optimizer, c.client.rho, c.swa.lr1, c.swa.cycle) == \
      (5000, 4e-5, 'sam', 0.05, 1e-1, 5)
  c = cfg('fedsoup_digits.py:fedbn')                           # was fedsoup_digits_fedbn.py
  assert (c.algorithm, c.model_kwargs.gn_groups, c.clients_per_round, c.personalized.finetune_epochs) == \
      ('fedbn', 4, 5, 15)
  c = cfg('fedsoup_digits.py:fedsoup')                         # was fedsoup_digits_fedsoup.py
  assert dict(c.algo) == {'start_fraction': 0.75, 'strict': False, 'val_source': 'val', 'persist_opt_state': False}
  assert (c.data.leave_out, c.data.global_fraction, c.client.lr, c.summary_last_k) == (-1, 0.1, 0.05, 1)
  c = cfg('baselines_cifar_cnn.py:dataset=cifar10,algo=fedspeed')
  assert c.algo.dual_mean == 'active'   # Algorithm 1, explicit (the registered default is now 'population')


def test_man_cells_follow_the_digest():
  c = cfg('man_cifar100.py:fedasam,man,iid')
  assert (c.dataset, c.model, c.rounds, c.clients_per_round, c.data.alpha) == ('cifar100', 'cifar_cnn', 500, 10, 1000.0)
  assert (c.client.lr, c.client.batch_size, c.client.local_epochs, c.client.weight_decay, c.client.grad_clip) == \
      (0.1, 50, 5, 1e-3, 10.0)
  assert (c.man.zeta, c.client.optimizer, c.client.rho, c.client.asam_eta) == (0.15, 'asam', 0.1, 0.2)
  assert cfg('man_cifar100.py:fedasam,dir0.3').client.rho == 0.5 and cfg('man_cifar100.py:fedasam').man.zeta == 0.0
  c = cfg('man_cifar100.py:feddyn,man,dir0.6')
  assert (c.algorithm, c.algo.alpha, c.data.alpha) == ('feddyn', 0.01, 0.6)
  c = cfg('man_cifar100.py:feddc,dir0.3')
  assert (c.algorithm, c.algo.alpha, c.algo.control_lr, c.man.zeta, c.client.optimizer) == \
      ('feddc', 0.01, 'initial', 0.0, 'sgd')
  c = cfg('man_cifar100.py:tiny_imagenet,fedsam,man,iid')
  assert (c.dataset, c.model, c.normalize, c.augment, c.data.examples_per_client, c.data.num_clients) == \
      ('tiny_imagenet', 'man_convnet', 'imagenet', 'none', 1000, 100)
  assert (c.man.zeta, c.client.rho) == (0.1, 0.01)
  assert cfg('man_cifar100.py:tiny_imagenet,fedsam,iid').client.rho == 0.03
  assert cfg('man_cifar100.py:tiny_imagenet,fedasam,iid').client.rho == 0.1
  assert cfg('man_cifar100.py:fedasam,iid').client.rho == 0.5               # CIFAR-100 without MAN
  c = cfg('man_cifar100.py:fedspeed')
  assert (c.client.optimizer, c.client.rho, c.algo.lam, c.algo.alpha, c.algo.dual_mean) == \
      ('sam', 0.01, 100.0, 1.0, 'population')


@pytest.mark.parametrize('spec,needle', [
    ('fedsam_cifar.py:cifar1000', "'cifar1000' is invalid: unknown token; allowed: dataset = cifar10 | cifar100"),
    ('fedsam_cifar.py:foo=1', "unknown key 'foo'; allowed: dataset = cifar10 | cifar100; method = fedavg"),
    ('fedsam_cifar.py:cifar10,alpha=0.5', 'no such cell for cifar10; allowed alpha: 0 | 0.05 | 100'),
    ('fedsam_cifar.py:clients=x', 'expected a int'),
    ('fedsam_cifar.py:swa=maybe', 'expected 0 or 1'),
    ('fedsam_cifar.py:fedsam,epochs=2', 'allowed epochs: 1'),
    ('wima.py:cifar10,cifar100', "dataset is already set by 'cifar10'"),
    ('fedgloss_cifar.py:fedgloss,sgd,adam', "'adam' is invalid: unknown token; allowed:"),
    ('man_cifar100.py:fedprox',
     "allowed: dataset = cifar100 | tiny_imagenet | cifar10; method = fedavg | fedsam | fedasam | feddyn | feddc | "
     "fedspeed"),
    ('fedsoup_digits.py:leave_out=7', 'allowed leave_out: -1 | 0 | 1 | 2 | 3 | 4'),
    ('baselines_digits.py:algo=fedfoo', 'algo must be one of fedavg | fedavgm'),
    ('baselines_cifar_cnn.py:algorithm=fedprox', "unknown key 'algorithm'"),
])
def test_bad_config_string_is_one_line_with_the_allowed_tokens(spec, needle):
  with pytest.raises(ConfigError) as e:
    cfg(spec)
  msg = str(e.value)
  assert needle in msg and '\n' not in msg
  assert msg.startswith(f"configs/{spec.split(':')[0]}:")


def test_published_is_ignored_by_the_resume_check():
  a = cfg('fedsam_cifar.py:cifar10,fedasam').to_dict()
  b = cfg('fedsam_cifar.py:cifar10,fedasam').to_dict()
  b['published'] = {'source': 'corrected transcription', 'accuracy': 1.0}
  assert checkpoint.config_diffs(a, b) == []
  b['client']['rho'] = 0.1
  assert [d[0] for d in checkpoint.config_diffs(a, b)] == ['client.rho']


def test_binary_bad_string_exits_2_with_one_line(tmp_path):
  res = subprocess.run([sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
                        '--config=configs/fedsam_cifar.py:cifar100,fedasm', f'--workdir={tmp_path / "w"}'],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
  assert res.returncode == 2, res.stderr[-2000:]
  lines = [line for line in res.stderr.splitlines() if line.strip()]
  assert lines == ["error: configs/fedsam_cifar.py:'fedasm' is invalid: unknown token; allowed: dataset = "
                   "cifar10 | cifar100; method = fedavg | fedsam | fedasam; swa (flag); alpha=<float>; "
                   "clients=<int>; epochs=<int>; aug = none | mixup | cutout; cycle=<int>; noavg (flag); "
                   "start=<int>; table = 4.3 | 4.1; cifarc (flag)"], res.stderr


@pytest.mark.slow
def test_binary_runs_a_cell_with_overrides(tmp_path):
  """The string reaches get_config through ml_collections, and --config.* / --config.algo.* still apply."""
  wd = tmp_path / 'w'
  res = subprocess.run([sys.executable, os.path.join(REPO, 'experiments', 'train.py'),
                        '--config=configs/baselines_digits.py:algo=fedprox', f'--workdir={wd}',
                        '--config.rounds=2', '--config.eval_every=1', '--config.algo.mu=0.3'],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
  assert res.returncode == 0, res.stderr[-2000:]
  saved = json.loads((wd / 'config.json').read_text())
  assert saved['algorithm'] == 'fedprox' and saved['algo']['mu'] == 0.3 and saved['rounds'] == 2


def test_paper_table_sweep_covers_a_family():
  from fedjax_flat.sweeps import grid as grid_lib
  path = os.path.join(CONFIGS, 'sweeps', 'paper_table.py')
  runs = grid_lib.expand(grid_lib.load_sweep_file(path + ':fedsam_landmarks'), 'D')
  assert len(runs) == len(load('fedsam_landmarks').CELLS) * 3
  assert {r.config for r in runs} == {f'configs/fedsam_landmarks.py:{c}' for c in load('fedsam_landmarks').CELLS}
  assert {r.cell for r in runs} == set(load('fedsam_landmarks').CELLS)      # rows and directories named by cell
  (one,) = [r for r in grid_lib.expand(grid_lib.load_sweep_file(path + ':fedsam_landmarks,only=fedsam+swa'), 'D')
             if r.seed == 0]
  assert one.cell == 'fedsam,swa' and one.workdir == os.path.join('D', 'fedsam,swa', 'seed=0')
  c10 = grid_lib.load_sweep_file(path + ':fedsam_cifar,only=cifar10')['grid']
  assert len(c10) == 252 and all(',' in g['config'] and 'cifar100' not in g['config'] for g in c10)
  t415 = grid_lib.load_sweep_file(path + ':baselines_cifar_cnn,only=4.15')['grid']
  assert len(t415) == 36
  with pytest.raises(ValueError, match='families: .*fedsam_cifar'):
    grid_lib.load_sweep_file(path + ':nope')


def test_paper_table_sweep_leaves_out_the_cells_another_binary_runs():
  from fedjax_flat.sweeps import grid as grid_lib
  path = os.path.join(CONFIGS, 'sweeps', 'paper_table.py')
  ladd = load('ladd')
  sweep = grid_lib.load_sweep_file(path + ':ladd')
  assert set(ladd.ENTRY_POINTS) == {c for c in ladd.CELLS if c.split(',')[1] in
                                    ('source_only', 'central_oracle', 'central_ftda')}
  # LADD's table is a pipeline: its source pre-training (the source_fda models and the source_only cells), then
  # the federated cells from their target's source_fda model; the centralized cells are named, not swept
  source, fed = sweep['stages']
  assert source['binary'] == 'experiments/pretrain_source.py' and 'binary' not in fed
  assert {g['config'] for g in source['grid']} == {f'configs/ladd.py:{t},{m}' for t in ('cityscapes', 'crosscity',
                                                                                         'mapillary')
                                                   for m in ('source_fda', 'source_only')}
  assert {g['config'] for g in fed['grid']} == {f'configs/ladd.py:{c}' for c in ladd.CELLS
                                                if c not in ladd.ENTRY_POINTS}
  for g in fed['grid']:
    target, method = g['config'].split(':')[1].split(',')
    assert g.get('init.pretrained') == ({'output_of': f'source/{target},source_fda', 'file': 'source_model.npz'}
                                        if method in ('ladd_cls', 'ladd_all', 'fedavg_st', 'ftda') else None)
  assert 'cityscapes,source_only' not in sweep['description']
  assert 'mapillary,central_oracle: experiments/centralized.py' in sweep['description']
  runs = grid_lib.expand(sweep, 'D')
  assert len(runs) == 3 * (6 + len(fed['grid']))
  grid_lib.run_configs(runs)        # every run validated, the federated ones before their source model exists
  with pytest.raises(ValueError, match='run by another binary'):
    grid_lib.load_sweep_file(path + ':ladd,only=central_oracle')


def test_fedsoup_release_switch_reads_the_release_files_and_validates():
  # the release's preprocessed Camelyon17 (its own dataset, no client_by) as a cell option, same published row
  c = cfg('fedsoup_table1.py:camelyon17_release,fedsoup,leave_out=0')
  validate_config(c)
  assert c.dataset == 'camelyon17_release' and c.data.dataset_dir == 'tiny_camelyon17' and 'client_by' not in c.data
  assert c.clients_per_round == 4 and c.published.model == 'personalized'


@pytest.mark.parametrize('algo', ['mime', 'mimelite'])
def test_mime_cells_carry_the_lr_that_trains(algo):
  # at the quickstart's lr 0.05 Mime / MimeLite's server momentum diverges (chance accuracy, README.baselines.md);
  # the family's own cell trains at the sweep's working lr
  assert cfg(f'baselines_digits.py:algo={algo}').client.lr == 0.005
  assert cfg('baselines_digits.py:algo=fedavg').client.lr == 0.05


def test_cells_reproducing_published_numbers_select_the_release_rules_their_runs_used():
  """Where the published run's code departs from its paper, the cell carries the release's rule (the switches'
  default stays the paper's): LADD (unsampled clusters, one teacher, SWA teacher of the global model), FedFomo in
  FedSoup's Table 1 (raw gains into the affinities, as FedSoup's clientfomo.py), MAN's Tiny-ImageNet ConvNet (block 3
  measured after its pool). No seed-table cell runs FedNova with a proximal term (tau_eff stays as registered)."""
  ladd = load('ladd')
  for c in ladd.CELLS:
    config = cfg(f'ladd.py:{c}')
    if config.algorithm == 'ladd':
      assert (config.algo.unsampled_clusters, config.algo.teacher_sharing, config.algo.swa_teacher_model) == \
          ('global', 'release', 'release'), c
  assert 'teacher_sharing' not in cfg('ladd.py:synthetic,ladd_cls').algo      # the stand-in: the thesis' rules
  for c in load('fedsoup_table1').CELLS:
    config = cfg(f'fedsoup_table1.py:{c}')
    assert (config.algo.get('affinity') == 'release') == (config.algorithm == 'fedfomo'), c
  for c in load('man_cifar100').CELLS:
    config = cfg(f'man_cifar100.py:{c}')
    want = 'release' if c.startswith('tiny_imagenet') and ',man,' in c else None
    assert config.model_kwargs.get('man_measure') == want, c
    if want:
      assert config.man.zeta > 0 and config.model == 'man_convnet'
  for family in [f[:-3] for f in os.listdir(CONFIGS) if f.endswith('.py')]:
    mod = load(family)
    for c in getattr(mod, 'CELLS', []):
      config = mod.get_config(c)
      assert not (config.algorithm == 'fednova' and float(config.algo.get('mu', 0)) > 0), (family, c)


def test_fedsoup_digits_cells_validate_against_their_data():
  """Every method's leave_out cell passes the data-level checks train.py runs (FedFomo's population N is the
  training clients: the held-out one never trains), on the embedded digits."""
  from fedjax_flat.algorithms import registry as alg_registry
  from fedjax_flat.data import registry as data_registry
  from fedjax_flat.config.validate import validate_against_data
  for leave_out in (-1, 0):
    data = None
    for m in load('fedsoup_digits').METHODS:
      c = cfg(f'fedsoup_digits.py:{m},leave_out={leave_out}')
      data = data or data_registry.get_dataset(c.dataset, **c.data.to_dict())
      validate_against_data(c, data)
      alg_registry.spec(c.algorithm).validate_data(c, data)
    assert data.num_clients == 5 - (leave_out >= 0)


def test_the_wima_tables_pack_by_algorithm():
  """Tables 4.22, 4.24 and 4.25 on CIFAR as few batched programs as their structures: the published number (each
  cell's own) is not part of the program, the window, subset and Dirichlet alpha are per-run values."""
  key = lambda cell: packing.pack_key(cfg(f'wima.py:{cell}'))
  t422_t424 = ['cifar10,fedavg,alpha=0', 'cifar10,fedavg,alpha=0.05'] + [
      f'cifar10,fedavg,alpha=0,window={w}' for w in (5, 10, 50, 200)]
  assert len({key(c) for c in t422_t424}) == 1
  t425 = [f'cifar10,fedavg,alpha={a},subset={s},batch=20' for a in (0, 0.05) for s in ('classifier', 'features', 'all')]
  assert len({key(c) for c in t425}) == 1
  assert key('cifar10,fedavg,nowima,alpha=0') != key('cifar10,fedavg,alpha=0')        # WiMA's state: a structure
  assert key('cifar10,scaffold,alpha=0') != key('cifar10,fedavg,alpha=0')
