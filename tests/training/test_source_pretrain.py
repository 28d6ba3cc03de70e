"""Source pre-training (training/source_pretrain.py): it learns the source, is a function of the seed, restyles
with the bank when given one, and its checkpoint round-trips through the params file with shape checks; the
streamed path (GTA5 files) equals the in-memory one, the style bank is the target clients' mean FDA styles, a
killed run resumes bit-identically, and `run` writes the source model, its target evaluation and the results."""
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_flat.config import families as config_strings
from fedjax_flat.data.sources import ladd_data as L
from fedjax_flat.data.sources import seg_synthetic_da as D
from fedjax_flat.data.transforms import fda
from fedjax_flat.errors import ConfigError, DataFormatError
from fedjax_flat.models import pretrained
from fedjax_flat.models.base import fast_init
from fedjax_flat.models.registry import get_model
from fedjax_flat.training import init as init_lib
from fedjax_flat.training import source_pretrain as P
from tests.fixtures import seg_files
from tests.fixtures.paths import REPO

FAMILY = os.path.join(REPO, 'configs', 'ladd.py')


@pytest.fixture(scope='module')
def setup():
  ds = D.load(num_styles=2, clients_per_style=2, examples_per_client=4, source_examples=16, test_per_style=2,
              image_size=(16, 16))
  model = get_model('seg_cnn', num_classes=4, input_shape=(16, 16, 3), width=4)
  # fast_init: the threefry init of seg_cnn compiles for ~35 s on CPU (rbg: ~2 s); the tests need some init,
  # not that one.
  params0 = fast_init(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 3)))
  return ds, model, params0


def test_pretraining_learns_and_is_deterministic(setup):
  ds, model, params0 = setup
  a, losses = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=40, batch_size=8, lr=0.05, seed=3)
  b, _ = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=40, batch_size=8, lr=0.05, seed=3)
  assert losses.shape == (40,) and np.all(np.isfinite(losses))
  assert losses[-10:].mean() < 0.8 * losses[:5].mean()
  for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  # BatchNorm statistics moved away from their initial values (written after each step).
  assert not np.allclose(np.asarray(jax.tree_util.tree_leaves(a['batch_stats'])[0]),
                         np.asarray(jax.tree_util.tree_leaves(params0['batch_stats'])[0]))


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_style_bank_changes_the_training(setup):
  ds, model, params0 = setup
  styles = fda.client_styles(ds)
  plain, _ = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=3, batch_size=4, seed=0)
  styled, _ = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=3, batch_size=4, seed=0,
                                styles=styles)
  diff = [not np.allclose(np.asarray(u), np.asarray(v))
          for u, v in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(styled))]
  assert any(diff)
  with pytest.raises(ValueError, match='steps=0'):
    P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=0)


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_checkpoint_round_trip(setup, tmp_path):
  ds, model, params0 = setup
  trained, _ = P.pretrain_source(model, params0, ds.source_x, ds.source_y, steps=2, batch_size=4)
  path = str(tmp_path / 'source.npz')
  P.save_source_model(path, trained)
  back = P.load_source_model(model, params0, path)
  for u, v in zip(jax.tree_util.tree_leaves(trained), jax.tree_util.tree_leaves(back)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  other = get_model('seg_cnn', num_classes=4, input_shape=(16, 16, 3), width=8)
  with pytest.raises(ValueError):
    P.load_source_model(other, other.init(jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 3))), path)


# ------------------------------------------------------------------------------------------------ streamed path

@pytest.fixture(scope='module')
def trees(tmp_path_factory):
  """GTA5 (7 images of 16 x 24, one training image of another size) and a LADD-style Cityscapes split (3
  unlabelled clients, 3 labelled test images of 16 x 32), in their official layouts."""
  d = str(tmp_path_factory.mktemp('ladd'))
  gta = seg_files.make_gta5(os.path.join(d, 'gta5'), n=7, size=(16, 24), odd_size=(18, 26))
  split, written = seg_files.make_cityscapes_ladd(d)
  return d, split, gta, written


def _gta5(d):
  return L.gta5_source(d, root=os.path.join(d, 'gta5'), image_size=(16, 24), images_per_client=2, num_workers=1)


def _leaves(t):
  return [np.asarray(v) for v in jax.tree_util.tree_leaves(t)]


@pytest.fixture(scope='module')
def small(trees):
  """seg_cnn for GTA5's 16 x 24 images, and the settings both file tests share (one compiled step: the session's
  compilation cache serves every train() call after the first)."""
  model = get_model('seg_cnn', num_classes=19, input_shape=(16, 24, 3), width=4, aux=False)
  params0 = fast_init(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 16, 24, 3)))
  x, _ = _gta5(trees[0]).examples(range(3))
  styles = np.asarray(fda.extract_styles(fda.to_unit(x)))
  return model, params0, dict(steps=4, batch_size=3, lr=0.05, seed=1, styles=styles)


def test_streamed_from_files_equals_in_memory(trees, small):
  d, _, _, _ = trees
  model, params0, kw = small
  src = _gta5(d)
  assert src.num_examples == 6
  x, y = src.examples(range(src.num_examples))          # the same images, decoded once, held in memory
  mem, lm = P.pretrain_source(model, params0, x, y, **kw)
  streamed, ls, info = P.train(model, params0, src, prefetch=2, **kw)
  assert info['num_examples'] == 6 and info['batch_size'] == 3
  np.testing.assert_array_equal(lm, ls)
  for u, v in zip(_leaves(mem), _leaves(streamed)):
    np.testing.assert_array_equal(u, v)
  # the batch of step t is a function of (seed, t): the same indices on every call, B distinct images
  idx = P.batch_indices(1, 2, 6, 3)
  np.testing.assert_array_equal(idx, P.batch_indices(1, 2, 6, 3))
  assert len(set(idx.tolist())) == 3 and not np.array_equal(idx, P.batch_indices(1, 3, 6, 3))


@pytest.mark.parametrize('style_size', [None, (8, 12)])
def test_restyle_replaces_the_low_frequencies_at_the_styles_size(style_size):
  """A style taken from a constant 0.3 image has only its DC term: the restyled image's mean becomes 0.3 (exactly
  when the sizes agree; up to the bicubic round trip when the swap happens at the styles' size)."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.uniform(0.35, 0.65, (2, 16, 24, 3)), jnp.float32)
  size = (16, 24) if style_size is None else style_size
  bank = fda.extract_styles(jnp.full((1,) + size + (3,), 0.3, jnp.float32))
  out = np.asarray(P.restyle(jax.random.PRNGKey(0), x, bank, 1, style_size))
  assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
  np.testing.assert_allclose(out.mean(axis=(1, 2)), 0.3, atol=1e-4 if style_size is None else 0.01)
  if style_size is None:
    np.testing.assert_array_equal(out, np.asarray(fda.restyle_batch(jax.random.PRNGKey(0), x, bank, 1)))


def test_style_bank_is_the_mean_style_of_each_target_client(trees):
  d, split, _, written = trees
  target = L.target_source('cityscapes', d, split_dir=split, num_workers=1)
  bank = fda.client_styles(target)
  assert bank.shape == (3, 3, 3, 3)
  for k, c in enumerate(target.clients):
    imgs = np.stack([written[p][0] for p in c.images]).astype(np.float32) / 255.0
    np.testing.assert_allclose(bank[k], np.asarray(fda.extract_styles(imgs)).mean(0), rtol=1e-5, atol=1e-4)


def test_a_killed_run_resumes_bit_identically(tmp_path, trees, small):
  d, _, _, _ = trees
  model, params0, kw = small
  src = _gta5(d)
  full, lf, _ = P.train(model, params0, src, **kw)
  ck = str(tmp_path / 'ck.npz')

  class Killed(Exception):
    pass

  def kill(t, loss):
    if t == 3:          # after the checkpoint of step 2, before the next
      raise Killed
  with pytest.raises(Killed):
    P.train(model, params0, src, checkpoint=ck, checkpoint_every=2, on_step=kill, **kw)
  with np.load(ck) as z:
    assert int(z['step']) == 2
  again, la, info = P.train(model, params0, src, checkpoint=ck, checkpoint_every=2, **kw)
  assert info['resumed_from_step'] == 2
  np.testing.assert_array_equal(lf, la)
  for u, v in zip(_leaves(full), _leaves(again)):
    np.testing.assert_array_equal(u, v)
  with pytest.raises(P.PretrainCheckpointError, match='another pre-training run'):
    P.train(model, params0, src, checkpoint=ck, **{**kw, 'lr': 0.01})
  open(ck, 'wb').write(b'not an npz')
  with pytest.raises(DataFormatError, match='ck.npz'):
    P.train(model, params0, src, checkpoint=ck, **kw)


def _ladd(spec, d, split, wd=None):
  c = config_strings.load_config(f'{FAMILY}:{spec}')
  c.data.data_dir, c.data.split_dir, c.data.image_size, c.data.crop = d, split, (16, 32), (16, 32)
  c.data.num_workers = 1
  c.model = 'seg_cnn'
  c.model_kwargs = ml_collections.ConfigDict({'width': 4, 'norm': 'bn', 'aux': False})
  c.eval_batch_size = 2
  return c


@pytest.mark.slow   # ~20 s of CPU (four compiled programs); default suite: the tests above and below
def test_run_writes_the_source_model_and_its_target_evaluation(tmp_path, trees):
  d, split, _, _ = trees
  c = _ladd('cityscapes,source_fda', d, split)
  s = c.source_pretrain
  s.data.data_dir, s.data.root, s.data.image_size, s.data.crop = d, os.path.join(d, 'gta5'), (16, 24), (16, 24)
  s.data.num_workers, s.steps, s.batch_size, s.checkpoint_every, s.log_every, s.prefetch = 1, 3, 2, 2, 1, 2
  wd = str(tmp_path / 'wd')
  summary = P.run(c, wd)
  for name in ('config.json', 'source_model.npz', 'pretrain_checkpoint.npz', 'style_bank.npy', 'metrics.jsonl',
               'summary.json', 'summary.md'):
    assert os.path.exists(os.path.join(wd, name)), name
  assert summary['steps'] == 3 and summary['num_source_examples'] == 6 and summary['num_style_clients'] == 3
  assert 0 <= summary['final_test_miou'] <= 1 and len(summary['final_test_iou']) == 19
  assert 'published_miou' not in summary            # the thesis gives no number for the FDA pre-training alone
  on_disk = json.load(open(os.path.join(wd, 'summary.json')))
  assert on_disk['final_test_miou'] == summary['final_test_miou']
  records = [json.loads(line) for line in open(os.path.join(wd, 'metrics.jsonl'))]
  assert [r['step'] for r in records] == [1, 2, 3, 3] and 'test_miou' in records[-1]
  target = L.target_source('cityscapes', d, split_dir=split, image_size=(16, 32), num_workers=1)
  np.testing.assert_array_equal(np.load(os.path.join(wd, 'style_bank.npy')), fda.client_styles(target))
  # the LADD cells read it as their w_0 (config.init.pretrained), every leaf as written
  ladd = _ladd('cityscapes,fedavg_st', d, split)
  ladd.init.pretrained = summary['source_model']
  model = get_model('seg_cnn', num_classes=19, input_shape=(16, 32, 3), width=4, norm='bn', aux=False)
  fresh = jax.tree_util.tree_map(np.zeros_like, pretrained.read_params(summary['source_model']))   # a stand-in init
  loaded = init_lib.initial_params(ladd, model, fresh)
  written = P.load_source_model(model, fresh, summary['source_model'])
  for u, v in zip(_leaves(loaded), _leaves(written)):
    np.testing.assert_array_equal(u, v)
  # rerun: the finished checkpoint is found, nothing retrained, the same model, one final evaluation record
  before = open(summary['source_model'], 'rb').read()
  again = P.run(c, wd)
  assert again['resumed_from_step'] == 3 and open(summary['source_model'], 'rb').read() == before
  assert [json.loads(line)['step'] for line in open(os.path.join(wd, 'metrics.jsonl'))] == [1, 2, 3, 3]
  # another setting in the same workdir: refused before anything of the earlier run is overwritten
  config_json = open(os.path.join(wd, 'config.json')).read()
  s.lr = 0.5
  with pytest.raises(P.PretrainCheckpointError, match='another pre-training run'):
    P.run(c, wd)
  assert open(os.path.join(wd, 'config.json')).read() == config_json


def test_run_pieces_source_steps_and_records(trees, tmp_path):
  """What run() assembles, without training: the streamed source with the release's augmentation, the step count
  of the epochs, the class check, and a resumed run's metrics keep only the training records."""
  d, split, _, _ = trees
  c = _ladd('cityscapes,source_only', d, split)
  s = c.source_pretrain
  s.data.data_dir, s.data.root, s.data.image_size, s.data.num_workers = d, os.path.join(d, 'gta5'), (16, 24), 1
  s.data.crop = (8, 12)
  target = L.target_source('cityscapes', d, split_dir=split, image_size=(16, 32), num_workers=1)
  src, aug = P.build_source(c, target)
  assert src.num_examples == 6 and aug is not None and not aug.needs_client
  assert P.steps_of(c, src.num_examples) == 100 * 1      # 100 epochs of ceil(6 / 16) = 1 step
  s.steps = 7
  assert P.steps_of(c, 6) == 7
  out = aug(jax.random.PRNGKey(0), {'x': jnp.zeros((2, 16, 24, 3)), 'y': jnp.zeros((2, 16, 24), jnp.uint8),
                                    'mask': jnp.ones(2)})
  assert out['x'].shape == (2, 8, 12, 3) and out['y'].dtype == jnp.int32      # the source section's crop
  s.data.target = 'crosscity'                             # 13 GTA5 classes for a 19-class target
  with pytest.raises(ConfigError, match='source_pretrain.data.target'):
    P.build_source(c, target)
  with pytest.raises(ConfigError, match='carries no source images'):
    P.build_source(_no_source(c), target)
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"round": 1, "step": 1, "train_loss": 2.0}\n{"round": 2, "step": 2, "test_miou": 0.1}\n{"torn')
  P._drop_evaluations(str(path))
  assert path.read_text() == '{"round": 1, "step": 1, "train_loss": 2.0}\n'


def _no_source(c):
  c = c.copy_and_resolve_references()
  c.source_pretrain.dataset = ''
  return c


def test_published_source_only_number_is_compared():
  out = P._published(config_strings.load_config(f'{FAMILY}:cityscapes,source_only'), 0.25)
  assert out['published_miou'] == 24.05 and out['published_miou_std'] == 1.14
  assert out['miou_minus_published'] == pytest.approx(0.95)
  assert P._published(config_strings.load_config(f'{FAMILY}:cityscapes,source_fda'), 0.25) == {}


def test_run_refuses_a_config_without_the_section(tmp_path):
  with pytest.raises(ConfigError, match='no source pre-training section'):
    P.run(config_strings.load_config(f'{FAMILY}:cityscapes,ladd_cls'), str(tmp_path))
  assert not os.listdir(tmp_path)
