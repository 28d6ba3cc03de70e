"""The LADD pipeline through its binaries on generated official-format files: experiments/pretrain_source.py
(GTA5 streamed, restyled with the Cityscapes clients' styles) writes source_model.npz and its target evaluation,
then experiments/train.py runs a LADD cell from it (config.init.pretrained). Slow (two binaries); the default
suite runs the same steps in process (tests/training/test_source_pretrain.py)."""
import json
import os

import pytest

from tests.fixtures import seg_files
from tests.fixtures.entry_cases import run_binary
from tests.fixtures.paths import REPO

CONFIG = '''
import ml_collections
from fedjax_flat.config import families

_LADD = families.load_module({ladd!r})


def get_config(arg=''):
  c = _LADD.get_config(arg)
  c.data.data_dir, c.data.split_dir, c.data.image_size, c.data.crop = {d!r}, {split!r}, (16, 32), (16, 32)
  c.data.num_workers = 1
  c.model = 'seg_cnn'
  c.model_kwargs = ml_collections.ConfigDict({{'width': 4, 'norm': 'bn', 'aux': False}})
  c.eval_batch_size = 2
  if 'source_pretrain' in c:
    s = c.source_pretrain
    s.data.data_dir, s.data.root, s.data.image_size, s.data.crop = {d!r}, {gta5!r}, (16, 24), (16, 24)
    s.data.num_workers, s.steps, s.batch_size, s.checkpoint_every, s.log_every = 1, 4, 2, 2, 2
  else:
    c.rounds, c.clients_per_round, c.client.batch_size = 1, 2, 2
    c.eval_every, c.eval_every_last = 1, 1
  return c
'''


@pytest.mark.slow     # two binaries; in process: tests/training/test_source_pretrain.py
def test_pretrain_source_then_ladd_from_it(tmp_path):
  d = str(tmp_path / 'data')
  seg_files.make_gta5(os.path.join(d, 'gta5'), n=7, size=(16, 24), odd_size=(18, 26))
  split, _ = seg_files.make_cityscapes_ladd(d)
  cfg = tmp_path / 'ladd_tiny.py'
  cfg.write_text(CONFIG.format(ladd=os.path.join(REPO, 'configs', 'ladd.py'), d=d, split=split,
                               gta5=os.path.join(d, 'gta5')))
  pre = str(tmp_path / 'pre')
  res = run_binary('pretrain_source', f'--config={cfg}:cityscapes,source_fda', f'--workdir={pre}')
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'target test mIoU' in res.stdout and 'steps/s' in res.stderr
  summary = json.load(open(os.path.join(pre, 'summary.json')))
  assert summary['steps'] == 4 and 0 <= summary['final_test_miou'] <= 1
  model = os.path.join(pre, 'source_model.npz')
  assert os.path.exists(model) and summary['source_model'] == model
  ladd = str(tmp_path / 'ladd')
  res = run_binary('train', f'--config={cfg}:cityscapes,fedavg_st', f'--workdir={ladd}',
                   f'--config.init.pretrained={model}', '--config.progress_every_s=0')
  assert res.returncode == 0, res.stderr[-3000:]
  assert json.load(open(os.path.join(ladd, 'config.json')))['init']['pretrained'] == model
  assert 'final_test_miou' in json.load(open(os.path.join(ladd, 'summary.json')))
  # the source-only cell on the same files compares its result with the published number
  only = str(tmp_path / 'only')
  res = run_binary('pretrain_source', f'--config={cfg}:cityscapes,source_only', f'--workdir={only}')
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'published 24.05 +- 1.14' in res.stdout
  assert not os.path.exists(os.path.join(only, 'style_bank.npy'))
