"""configs/ladd.py (thesis Tables 5.6-5.8, Table A.7): every cell builds and validates with its published mIoU
(shown in the docstring), the hyperparameters are Table A.7's (Mapillary: the release's), and the strings that
name no published setting are one line."""
import json
import os

import pytest

from fedjax_flat.config import families as config_strings
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError
from tests.fixtures.paths import REPO

FAMILY = os.path.join(REPO, 'configs', 'ladd.py')


def _mod():
  return config_strings.load_module(FAMILY)


def cfg(arg):
  return config_strings.load_config(f'{FAMILY}:{arg}')


def _source_model(tmp_path):
  """A stand-in for the source model experiments/pretrain_source.py writes (validation checks that it exists)."""
  path = tmp_path / 'source_model.npz'
  path.write_bytes(b'')
  return str(path)


def test_every_cell_builds_validates_and_carries_its_published_miou(tmp_path):
  mod = _mod()
  assert len(mod.CELLS) == len(set(mod.CELLS)) == 8 + 4 + 6
  assert 'configs/ladd.py' in mod.__doc__
  doc = mod.__doc__.replace('+-', ' ')
  seen = set()
  for cell in mod.CELLS:
    c = mod.get_config(cell)
    if c.algorithm == 'ladd':      # without a source model LADD stops (tests/algorithms/test_ladd.py)
      c.init.pretrained = _source_model(tmp_path)
    validate_config(c)
    pub = c.published.to_dict()
    assert pub.get('source') and 0 < pub['miou'] < 100 and f"{pub['miou']:.2f}" in doc, cell
    assert f"{pub['miou_std']:.2f}" in doc, cell
    key = json.dumps({k: v for k, v in c.to_dict().items() if k != 'published'}, sort_keys=True, default=str)
    seen.add((key, json.dumps(pub, sort_keys=True)))
  assert len(seen) == len(mod.CELLS)


@pytest.mark.parametrize('spec,rounds,clients,lr,lambda_kd,omega,t_start', [
    ('crosscity,ladd_cls', 1000, 4, 1e-2, 20.0, 1, 400),
    ('cityscapes,ladd_all', 300, 5, 5e-5, 10.0, 5, 200),
    ('mapillary,ladd_cls', 1500, 6, 1e-2, 10.0, 5, 50),        # the release's config (garbled thesis row)
])
def test_table_a7(spec, rounds, clients, lr, lambda_kd, omega, t_start):
  c = cfg(spec)
  assert (c.rounds, c.clients_per_round, c.client.lr) == (rounds, clients, lr)
  assert (c.algo.lambda_kd, c.algo.teacher_step, c.algo.swa_teacher_start) == (lambda_kd, omega, t_start)
  assert c.algorithm == 'ladd' and (c.algo.k_min, c.algo.k_max, c.algo.force_k) == (4, 19, 0)
  assert c.model == 'deeplabv3_mobilenetv2' and c.client.batch_size == 16 and c.client.momentum == 0.9
  assert tuple(c.data.crop) == (512, 1024) and not c.data.labelled_train


def test_methods():
  assert cfg('cityscapes,ladd_cls').algo.cluster_layers == 'decoder'      # the release's LADD(cls)
  assert cfg('cityscapes,ladd_all').algo.cluster_layers == 'all'
  st = cfg('crosscity,fedavg_st')
  assert st.algorithm == 'ladd' and st.algo.force_k == 1 and st.published.miou == 33.59
  for spec in ('cityscapes,fed_oracle', 'mapillary,central_oracle', 'cityscapes,ftda'):
    c = cfg(spec)
    assert c.algorithm == 'fedavg' and c.data.labelled_train and c.rounds == 1500, spec
  assert cfg('cityscapes,ftda').init.reinit_classifier == 'never'
  assert cfg('mapillary,central_oracle').centralized.epochs == 100
  assert cfg('mapillary,central_oracle').published.miou == 61.46


def test_source_cells():
  """The release's source runs: fda_inv (configs/pretrain_<target>.txt) and the centralized source only
  (configs/cityscapes_centr_sourceonly.txt); GTA5 mapped onto the target's classes, no flip, mean = std = 0.5."""
  for target in ('cityscapes', 'crosscity', 'mapillary'):
    fda_cell, only = cfg(f'{target},source_fda'), cfg(f'{target},source_only')
    for c in (fda_cell, only):
      validate_config(c)
      s = c.source_pretrain
      assert s.dataset == 'gta5' and s.data.target == target and not s.data.flip
      assert (tuple(s.data.crop), tuple(s.data.scale), s.batch_size, s.power, s.momentum) == (
          (512, 1024), (0.7, 2.0), 16, 0.9, 0.9)
      assert c.model == 'deeplabv3_mobilenetv2' and c.segmentation.ohem == 'topk'
      assert c.dataset == f'{target}_ladd' and not c.data.labelled_train
    assert (fda_cell.source_pretrain.style, fda_cell.source_pretrain.epochs, fda_cell.source_pretrain.lr) == (
        'fda', 10, 5e-3) and fda_cell.source_pretrain.data.jitter == 0.5
    assert (only.source_pretrain.style, only.source_pretrain.epochs, only.source_pretrain.lr) == ('none', 100, 0.05)
    assert fda_cell.published.to_dict() == {}      # the thesis gives no number for the pre-training alone
  assert cfg('crosscity,source_only').published.miou == 26.49
  ftda = cfg('cityscapes,central_ftda')
  assert ftda.data.labelled_train and ftda.init.reinit_classifier == 'never' and ftda.published.miou == 65.74
  assert (ftda.centralized.epochs, ftda.centralized.lr, ftda.centralized.schedule) == (50, 5e-3, 'poly')


@pytest.mark.parametrize('field,value,match', [('style', 'cfsi', 'source_pretrain.style'),
                                               ('lr', float('nan'), 'source_pretrain.lr'),
                                               ('batch_size', 0, 'source_pretrain.batch_size')])
def test_source_section_is_validated(field, value, match):
  c = cfg('cityscapes,source_fda')
  c.source_pretrain[field] = value
  with pytest.raises(ConfigError, match=match):
    validate_config(c)
  c = cfg('cityscapes,source_fda')
  c.source_pretrain.data.target = 'idda'
  with pytest.raises(ConfigError, match=r'source_pretrain\.data\.target'):
    validate_config(c)


@pytest.mark.parametrize('spec,match', [('crosscity,fed_oracle', 'no target labels'),
                                        ('mapillary,ftda', 'Cityscapes only'),
                                        ('crosscity,central_ftda', 'no target labels'),
                                        ('mapillary,central_ftda', 'Cityscapes only'),
                                        ('gta5,ladd_cls', 'invalid'), ('cityscapes,mcd', 'invalid')])
def test_bad_strings(spec, match):
  with pytest.raises(ConfigError, match=match) as e:
    cfg(spec)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('method', ['ladd_cls', 'ladd_all', 'fedavg_st', 'fed_oracle', 'ftda', 'central_oracle',
                                    'source_only', 'source_fda', 'central_ftda'])
def test_synthetic_stand_in_validates_and_publishes_nothing(method, tmp_path):
  c = cfg(f'synthetic,{method}')
  if c.algorithm == 'ladd':
    with pytest.raises(ConfigError, match=r'init\.pretrained.*pretrain_source\.py'):
      validate_config(c)
    c.init.pretrained = _source_model(tmp_path)
  validate_config(c)
  assert c.dataset == 'seg_synthetic_da' and c.published.to_dict() == {}
  assert c.algorithm == ('ladd' if method in ('ladd_cls', 'ladd_all', 'fedavg_st') else 'fedavg')
  if method.startswith('source_'):     # the in-memory source of seg_synthetic_da, as the synthetic study
    assert c.source_pretrain.dataset == '' and c.source_pretrain.steps == 300
    assert c.source_pretrain.style == ('fda' if method == 'source_fda' else 'none')
