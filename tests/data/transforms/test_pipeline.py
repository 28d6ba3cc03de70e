"""Train/eval transforms from config, incl. mixup restricted to valid examples, inside the engine."""
import jax
import numpy as np

from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.training import trainers
from fedjax_flat.data.transforms import pipeline as transforms
from fedjax_flat.data.transforms.transform import Transform
from fedjax_flat.config.default_config import default_config


def _cfg(augment, normalize):
  c = default_config()
  c.augment, c.normalize = augment, normalize
  return c


def test_none_is_identity_on_float_and_scales_uint8():
  train, ev = transforms.make_transforms(_cfg('none', 'none'), 10)
  x = np.random.default_rng(0).random((2, 4, 4, 1)).astype(np.float32)
  np.testing.assert_allclose(ev(x), x)
  np.testing.assert_allclose(train(jax.random.key(0), {'x': x, 'y': np.zeros(2, np.int32), 'mask': np.ones(2)})['x'], x)
  u = np.full((1, 2, 2, 3), 255, np.uint8)
  np.testing.assert_allclose(ev(u), 1.0)


def test_cifar_eval_normalizes_with_dataset_stats():
  _, ev = transforms.make_transforms(_cfg('cifar', 'cifar100'), 100)
  x = np.zeros((1, 32, 32, 3), np.uint8)
  np.testing.assert_allclose(ev(x)[0, 0, 0], -np.array([0.5071, 0.4867, 0.4408]) / [0.2675, 0.2565, 0.2761],
                             rtol=1e-5)


def test_mixup_mixes_only_valid_examples():
  train, _ = transforms.make_transforms(_cfg('cifar_mixup', 'cifar10'), 10)
  assert isinstance(train, Transform) and not train.needs_client   # changes the labels too: a batch transform
  rng = np.random.default_rng(0)
  batch = {'x': rng.integers(0, 255, (6, 32, 32, 3)).astype(np.uint8), 'y': np.arange(6, dtype=np.int32),
           'mask': np.array([1, 1, 1, 1, 0, 0], np.float32)}
  out = jax.jit(train)(jax.random.key(3), batch)
  y = np.asarray(out['y'])
  np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-5)
  # Valid rows only put mass on the classes of valid examples (0..3).
  assert np.all(y[:4, 4:] == 0)
  # Each valid label keeps weight lambda, and all valid rows share one lambda.
  lam = y[np.arange(4), np.arange(4)]
  np.testing.assert_allclose(lam, lam[0], rtol=1e-5)


def test_cifar_augmentation_runs_in_training():
  c = default_config()
  c.dataset, c.model, c.rounds, c.clients_per_round = 'synthetic', 'mlp', 2, 2
  c.augment, c.normalize = 'cifar_mixup', 'cifar10'
  c.client.batch_size = 4
  c.progress_every_s = 1e9
  data = synthetic(3, 6, input_shape=(32, 32, 3), num_classes=4, seed=0)
  t = trainers.make_trainer(c, data=data)
  s = t.train()
  assert np.isfinite(s['final_test_accuracy'])
