"""Reloading a run (training/reload.py): the run's exact config for every dataset builder and every shipped
config, and a FEMNIST run (whose config.data has no num_clients) reloaded by the Hessian tool's loader, a
chosen round (--per_client) and `init.checkpoint`; every wrong run directory one BadInputError / DataFormatError.
"""
import importlib.util
import inspect
import json
import os
import shutil

import ml_collections
import numpy as np
import pytest

from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import data_section, default_config, segmentation_data
from fedjax_flat.data import registry as data_registry
from fedjax_flat.errors import BadInputError, DataFormatError
from fedjax_flat.training import reload
from fedjax_flat.training import run as run_lib
from fedjax_flat.training.loop import DEVICES_KEY
from tests.fixtures.data_files import make_femnist_leaf
from tests.fixtures.paths import REPO

CONFIGS = os.path.join(REPO, 'configs')


def _saved(config):
  """What training/loop.write_config writes to config.json (without the device record)."""
  return json.loads(config.to_json_best_effort())


def _builder_config(name):
  """A config as a config file for dataset `name` writes it: its config.data replaced whole (the builder's
  keyword arguments with their defaults, or the declared fields of a segmentation dataset)."""
  c = default_config()
  c.dataset = name
  declared = data_registry.declared_fields(name)
  if declared is not None:
    c.data = segmentation_data(name)
  else:
    params = inspect.signature(data_registry.DATASETS.get(name)).parameters.values()
    c.data = data_section(**{p.name: p.default for p in params if p.default is not inspect.Parameter.empty
                             and isinstance(p.default, (int, float, str, bool)) and p.name not in
                             data_registry.OPTIONAL_FIELDS})
  c.model_kwargs = ml_collections.ConfigDict({'hidden': 7})     # a model section replaced whole as well
  return c


@pytest.mark.parametrize('name', data_registry.names())
def test_every_dataset_builder_config_is_restored_exactly(name):
  c = _builder_config(name)
  saved = _saved(c)
  restored = reload.restore_config({**saved, DEVICES_KEY: {'count': 2}})
  assert _saved(restored) == saved
  if 'num_clients' not in saved['data']:
    assert 'num_clients' not in restored.data          # the digits' default of 20 is not filled in


def _config_files():
  for f in sorted(os.listdir(CONFIGS)):
    if not f.endswith('.py'):
      continue
    spec = importlib.util.spec_from_file_location('cfg_' + f[:-3], os.path.join(CONFIGS, f))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield f, getattr(mod, 'CELLS', None)


def _check_shipped_configs(cells_per_family):
  datasets, checked = set(), 0
  for f, cells in _config_files():
    for spec in [f] + [f'{f}:{cell}' for cell in list(cells or ())[:cells_per_family]]:
      c = config_strings.load_config(os.path.join(CONFIGS, spec))
      saved = _saved(c)
      assert _saved(reload.restore_config(saved)) == saved, spec
      datasets.add(c.dataset)
      checked += 1
  return datasets, checked


def test_every_shipped_config_file_is_restored_exactly():
  """Every config file's default and the first cell of every family: config.json -> the same config."""
  datasets, checked = _check_shipped_configs(1)
  assert checked > 20
  assert {'femnist', 'shakespeare', 'stackoverflow', 'cifar10', 'cifar100', 'idda'} <= datasets


@pytest.mark.slow
def test_every_cell_of_every_family_is_restored_exactly():
  datasets, _ = _check_shipped_configs(None)
  assert {'cityscapes', 'idda', 'cifar100_pam'} <= datasets


def test_a_field_added_since_the_run_keeps_its_default():
  saved = _saved(default_config())
  del saved['client']['lr']
  del saved['eval_every']
  c = reload.restore_config(saved)
  assert c.client.lr == default_config().client.lr and c.eval_every == default_config().eval_every


# ----------------------------------------------------------------------------------------------------------
# A FEMNIST run: reloaded for the Hessian tool, --per_client's chosen round and init.checkpoint.


def _femnist_config(root):
  c = config_strings.load_config(os.path.join(CONFIGS, 'quickstart_femnist.py'))
  c.data.data_dir = root
  c.data.fraction = 1.0
  c.model = 'mlp'
  c.model_kwargs = ml_collections.ConfigDict()      # the MLP takes none of the CNN's kwargs
  c.rounds, c.eval_every, c.summary_last_k, c.progress_every_s = 2, 1, 1, 1e9
  c.checkpoint_every = 1
  c.clients_per_round, c.client.batch_size = 2, 4
  return c


@pytest.fixture(scope='module')
def femnist_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('femnist')
  make_femnist_leaf(str(tmp / 'data'), ((6, 9, 5), (7, 8)))
  c = _femnist_config(str(tmp / 'data'))
  assert 'num_clients' not in c.data
  wd = str(tmp / 'run')
  run_lib.run(c, wd)
  return tmp, wd, c


def test_femnist_run_reloads_with_its_own_config(femnist_run):
  _, wd, c = femnist_run
  trainer, params, step = reload.load_run(wd)
  assert step == 2 and trainer.config.dataset == 'femnist' and 'num_clients' not in trainer.config.data
  saved = reload.read_saved_config(wd)
  assert _saved(trainer.config) == {k: v for k, v in saved.items() if k != DEVICES_KEY}
  assert all(np.all(np.isfinite(x)) for x in __import__('jax').tree_util.tree_leaves(params))
  _, _, step1 = reload.load_run(os.path.join(wd, 'checkpoints'), step=1)      # --per_client_round=1
  assert step1 == 1


def test_femnist_run_as_init_checkpoint(femnist_run, tmp_path):
  tmp, wd, _ = femnist_run
  c = _femnist_config(str(tmp / 'data'))
  c.rounds = 1
  c.init.checkpoint = wd
  s = run_lib.run(c, str(tmp_path / 'from_init'))
  assert s['rounds_completed'] == 1


def test_wrong_run_directories_are_bad_input(femnist_run, tmp_path):
  _, wd, _ = femnist_run
  with pytest.raises(BadInputError, match='is not a run directory: no config.json'):
    reload.load_run(str(tmp_path))
  with pytest.raises(BadInputError, match='is not a directory'):
    reload.load_run(str(tmp_path / 'absent'))
  with pytest.raises(BadInputError, match=r'round 7 was not kept .* rounds \[1, 2\]'):
    reload.load_run(wd, step=7)
  with pytest.raises(BadInputError, match="model 'wima'"):
    reload.load_run(wd, 'wima')
  # a truncated config.json
  broken = tmp_path / 'truncated'
  shutil.copytree(wd, broken)
  text = (broken / 'config.json').read_text()
  (broken / 'config.json').write_text(text[:len(text) // 2])
  with pytest.raises(DataFormatError, match='config.json is not valid JSON'):
    reload.load_run(str(broken))
  (broken / 'config.json').write_text('[1, 2]')
  with pytest.raises(DataFormatError, match="not a run's config"):
    reload.load_run(str(broken))
  # config.json of another model than the checkpoints: a run directory put together from two runs
  other = tmp_path / 'other'
  shutil.copytree(wd, other)
  cfg = json.loads((other / 'config.json').read_text())
  cfg['model_kwargs'] = {'hidden': [13]}
  (other / 'config.json').write_text(json.dumps(cfg))
  with pytest.raises((BadInputError, DataFormatError)) as e:
    reload.load_run(str(other))
  assert '--fresh' not in str(e.value) and 'hidden' in str(e.value)


# ----------------------------------------------------------------------------------------------------------
# Two runs mixed (hessian.py --interpolate_with): the same model and parameter shapes, else one bad-input line.


def _model_config(model):
  c = default_config()
  c.model = model
  return c


def _mlp_params(hidden=64, dtype=np.float32):
  return {'Dense_0': {'kernel': np.zeros((64, hidden), dtype), 'bias': np.zeros((hidden,), dtype)},
          'Dense_1': {'kernel': np.zeros((hidden, 10), dtype), 'bias': np.zeros((10,), dtype)}}


def test_same_model_and_shapes_are_compatible():
  reload.check_same_model('a', _model_config('mlp'), _mlp_params(), 'b', _model_config('mlp'), _mlp_params())


@pytest.mark.parametrize('other_model, other_params, needles', [
    ('cnn', _mlp_params(), ["its model is 'cnn'", "is 'mlp'"]),
    ('mlp', _mlp_params(hidden=13), ['3 difference(s)', 'Dense_0/bias: (64,) float32 vs (13,) float32']),
    ('mlp', {**_mlp_params(), 'extra': {'w': np.zeros(3)}}, ['extra/w: only in b']),
    ('mlp', {'Dense_0': _mlp_params()['Dense_0']}, ['Dense_1/bias: missing in b']),
    ('mlp', _mlp_params(dtype=np.float16), ['float32 vs (64,) float16']),
])
def test_another_model_or_other_shapes_are_one_bad_input_line(other_model, other_params, needles):
  with pytest.raises(BadInputError) as e:
    reload.check_same_model('a', _model_config('mlp'), _mlp_params(), 'b', _model_config(other_model), other_params)
  msg = str(e.value)
  assert '\n' not in msg and msg.startswith('--interpolate_with=b: ')
  for n in needles:
    assert n in msg, msg
