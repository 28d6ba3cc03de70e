"""config.init (training/init.py): a run starts from another run's checkpoint or a params file, before round 0
and never on resume; classifier re-initialized when the class count differs; misfits are one clear error."""
import jax
import numpy as np
import pytest
from tests.fixtures.configs import small_config

from fedjax_flat.models import pretrained
from fedjax_flat.training import checkpoint, loop
from fedjax_flat.training import run as run_lib
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError


def _source(tmp_path, **over):
  wd = str(tmp_path / 'source')
  run_lib.run(small_config(**{'rounds': 2, **over}), wd)
  leaves = checkpoint.read_checkpoint(wd + '/checkpoints')['server_leaves']
  return wd, leaves


def _first_params(monkeypatch, config, workdir):
  """The global params the run would train from at its first round (Trainer.train patched out)."""
  seen = {}

  def fake_train(self, stop_requested=None):
    seen['params'] = jax.device_get(self.algorithm.eval_models(self.server_state)['global'][0])
    seen['round'] = self.round
    return {}
  monkeypatch.setattr(loop.Trainer, 'train', fake_train)
  run_lib.run(config, workdir)
  monkeypatch.undo()
  return seen


def _flat(p):
  return {k: np.asarray(v) for k, v in pretrained.flatten(p).items()}


def test_starts_from_the_checkpoint_exactly_and_not_on_resume(tmp_path, monkeypatch):
  src, leaves = _source(tmp_path)
  _, src_params, step = __import__('fedjax_flat.training.reload', fromlist=['x']).load_run(src)
  assert step == 2
  # FedAvg's server state is {'opt_state': (), 'params': ...}: its leaves are the params, in tree order.
  for a, b in zip(jax.tree_util.tree_leaves(src_params), leaves):
    np.testing.assert_array_equal(a, b)
  c = small_config(**{'rounds': 3, 'init.checkpoint': src + '/checkpoints', 'seed': 7})
  got = _first_params(monkeypatch, c, str(tmp_path / 'target'))
  assert got['round'] == 0
  for k, v in _flat(src_params).items():
    np.testing.assert_array_equal(_flat(got['params'])[k], v)          # same classes: classifier kept too
  # Train the target 3 rounds; a rerun resumes from its own checkpoint, not from the source.
  run_lib.run(c, str(tmp_path / 'target'))
  own = checkpoint.read_checkpoint(str(tmp_path / 'target' / 'checkpoints'))['server_leaves']
  got = _first_params(monkeypatch, c, str(tmp_path / 'target'))
  assert got['round'] == 3
  for a, b in zip(jax.tree_util.tree_leaves(got['params']), own):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(own[0], leaves[0])


def test_other_class_count_reinitializes_the_classifier(tmp_path, monkeypatch):
  src, _ = _source(tmp_path)                                   # synthetic data: 10 classes
  c = small_config(**{'init.checkpoint': src, 'data.num_classes': 4})
  got = _flat(_first_params(monkeypatch, c, str(tmp_path / 'a'))['params'])
  plain = _flat(_first_params(monkeypatch, small_config(**{'data.num_classes': 4}), str(tmp_path / 'b'))['params'])
  _, src_params, _ = __import__('fedjax_flat.training.reload', fromlist=['x']).load_run(src)
  src_flat = _flat(src_params)
  assert got['Dense_1/kernel'].shape == (64, 4)
  np.testing.assert_array_equal(got['Dense_1/kernel'], plain['Dense_1/kernel'])   # the fresh classifier
  np.testing.assert_array_equal(got['Dense_1/bias'], plain['Dense_1/bias'])
  np.testing.assert_array_equal(got['Dense_0/kernel'], src_flat['Dense_0/kernel'])  # the source backbone
  assert not np.array_equal(got['Dense_0/kernel'], plain['Dense_0/kernel'])
  # reinit_classifier='never' refuses the 10-class classifier.
  c.init.reinit_classifier = 'never'
  with pytest.raises(ValueError, match=r'shape mismatch Dense_1/kernel: file \(64, 10\) vs model \(64, 4\)'):
    run_lib.run(c, str(tmp_path / 'c'))


def test_shape_mismatch_is_a_clear_error(tmp_path):
  src, _ = _source(tmp_path)                                   # MLP hidden (64,)
  c = small_config(**{'init.checkpoint': src})
  c.model_kwargs.hidden = (32,)
  with pytest.raises(ValueError, match=r'shape mismatch Dense_0/kernel: file \(64, 64\) vs model \(64, 32\)'):
    run_lib.run(c, str(tmp_path / 'target'))


def test_pretrained_file(tmp_path, monkeypatch):
  src, _ = _source(tmp_path)
  _, src_params, _ = __import__('fedjax_flat.training.reload', fromlist=['x']).load_run(src)
  path = str(tmp_path / 'w.npz')
  pretrained.save_params(path, src_params)
  got = _flat(_first_params(monkeypatch, small_config(**{'init.pretrained': path}), str(tmp_path / 't'))['params'])
  for k, v in _flat(src_params).items():
    np.testing.assert_array_equal(got[k], v)


def test_validation(tmp_path):
  src, _ = _source(tmp_path)
  path = tmp_path / 'w.npz'
  path.write_bytes(b'')
  for over, field in [({'init.checkpoint': str(tmp_path)}, 'init.checkpoint'),
                      ({'init.pretrained': str(tmp_path / 'missing.npz')}, 'init.pretrained'),
                      ({'init.checkpoint': src, 'init.pretrained': str(path)}, 'init.pretrained'),
                      ({'init.model': 'best'}, 'init.model'),
                      ({'init.reinit_classifier': 'yes'}, 'init.reinit_classifier')]:
    with pytest.raises(ConfigError, match=field):
      validate_config(small_config(**over))
  validate_config(small_config(**{'init.checkpoint': src}))
