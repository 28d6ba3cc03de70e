"""configs/feddrive.py (thesis Table 4.10, FedDrive Tables 6.2 / 6.3): every cell builds and validates with
its published mIoU (shown in the docstring), the settings follow the digests, and bad strings are one line."""
import importlib.util
import json
import os

import pytest

from fedjax_flat.config import families as config_strings, default_config
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError
from tests.fixtures.paths import REPO

FAMILY = os.path.join(REPO, 'configs', 'feddrive.py')
needs_data = pytest.mark.skipif(not hasattr(default_config, 'segmentation_data'),
                                reason='needs the segmentation datasets (issue 16 part A: cityscapes, idda)')


def _mod():
  spec = importlib.util.spec_from_file_location('family_feddrive', FAMILY)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def cfg(arg):
  return config_strings.load_config(f'{FAMILY}:{arg}')


def test_cells_cover_the_three_tables():
  mod = _mod()
  assert len(mod.CELLS) == len(set(mod.CELLS)) == 3 * 15 + 7 + 2 * 8
  assert 'configs/feddrive.py' in mod.__doc__


@needs_data
def test_every_cell_builds_validates_and_carries_its_published_miou():
  mod = _mod()
  doc = mod.__doc__.replace('+-', ' ')
  seen = set()
  for cell in mod.CELLS:
    c = mod.get_config(cell)
    validate_config(c)
    pub = c.published.to_dict()
    assert pub.get('source'), cell
    keys = [k for k in ('miou', 'miou_seen', 'miou_unseen') if k in pub]
    assert keys, cell
    for k in keys:
      assert 0 < pub[k] < 100 and f'{pub[k]:.2f}' in doc, (cell, k)
    key = json.dumps({k: v for k, v in c.to_dict().items() if k != 'published'}, sort_keys=True, default=str)
    seen.add((key, json.dumps(pub, sort_keys=True)))
  assert len(seen) == len(mod.CELLS)


@needs_data
@pytest.mark.parametrize('spec,fields', [
    ('idda_country,uniform,fedsam', {'miou_seen': 64.22, 'miou_unseen': 49.74}),
    ('idda_rainy,fedasam,swa', {'miou_seen': 42.09, 'miou_unseen': 45.40}),
    ('cityscapes,silobn_asam', {'miou': 49.75}),
    ('cityscapes,silobn,lab,feddrive', {'miou': 42.23, 'miou_std': 1.23}),
    ('idda_rainy,silobn,feddrive', {'miou_seen': 62.48, 'miou_unseen': 50.03, 'miou_unseen_std': 0.79}),
    ('idda_country,fedbn,feddrive', {'miou_seen': 54.39}),
])
def test_published_numbers(spec, fields):
  pub = cfg(spec).published.to_dict()
  for k, v in fields.items():
    assert pub[k] == v
  if 'fedbn' in spec:
    assert 'miou_unseen' not in pub        # FedBN has no unseen-client number


@needs_data
def test_settings_follow_the_digests():
  c = cfg('cityscapes,silobn_sam,swa')
  assert (c.dataset, c.model, c.model_kwargs.norm, c.model_kwargs.variant, c.algorithm) == \
      ('cityscapes', 'bisenetv2', 'bn', 'feddrive', 'silobn')
  assert (c.rounds, c.clients_per_round, c.client.batch_size, c.client.local_epochs, c.client.lr,
          c.client.momentum, c.client.weight_decay) == (1500, 5, 8, 2, 0.05, 0.9, 5e-4)
  assert (c.client.optimizer, c.client.rho, c.swa.enabled, c.swa.lr1, c.swa.lr2, c.swa.cycle) == \
      ('sam', 0.01, True, 5e-2, 5e-4, 5)
  assert (c.segmentation.ohem, c.segmentation.ohem_fraction, c.client.lr_schedule) == ('topk', 0.25, 'poly_step')
  c = cfg('idda_rainy,uniform,fedasam,feddrive')
  assert (c.data.setting, c.data.distribution, c.rounds, c.client.batch_size, c.client.lr, c.client.weight_decay) == \
      ('rainy', 'uniform', 1600, 16, 0.1, 0.0)
  assert (c.client.optimizer, c.client.rho, c.client.asam_eta, c.segmentation.eval_mode) == \
      ('asam', 0.5, 0.2, 'downscale')
  assert cfg('idda_country,silobn,cfsi,feddrive').data.style == 'cfsi'


@pytest.mark.parametrize('spec,needle', [
    ('cityscapes,idda_rainy', "dataset is already set by 'cityscapes'"),
    ('fedprox', "'fedprox' is invalid: unknown token; allowed: dataset = cityscapes"),
    ('paper=2022', 'paper must be one of thesis | feddrive'),
])
def test_bad_strings(spec, needle):
  with pytest.raises(ConfigError) as e:
    cfg(spec)
  assert needle in str(e.value) and '\n' not in str(e.value)
