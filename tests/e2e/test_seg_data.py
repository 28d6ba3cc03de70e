"""The segmentation data through the training loop: label maps batched, the on-device segmentation transform
(scale + crop, flip, LAB on half the batch) inside the round program, the dense task's loss with ignore 255;
host path (one round per call) and device path (rounds per call) give the same bits."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from fedjax_flat.data import registry as data_registry
from fedjax_flat.models import base, registry as model_registry
from fedjax_flat.training import trainers
from fedjax_flat.config.default_config import default_config, segmentation_data


class _TinyFCN(nn.Module):
  """A 2-layer fully convolutional net: per-pixel logits at any input size (test model)."""
  num_classes: int

  @nn.compact
  def __call__(self, x, train=False):
    return nn.Conv(self.num_classes, (3, 3))(nn.relu(nn.Conv(8, (3, 3))(x)))


if 'seg_test_fcn' not in model_registry.names():
  model_registry.register('seg_test_fcn')(
      lambda num_classes, input_shape, **kw: base.from_flax(_TinyFCN(num_classes), 'seg_test_fcn', num_classes,
                                                            input_shape))


def _config(device_data):
  c = default_config()
  c.dataset = 'seg_synthetic'
  c.data = segmentation_data('seg_synthetic', num_domains=3, unseen_domains=1, clients_per_domain=2,
                             examples_per_client=6, client_test_examples=2, unseen_test_per_domain=4,
                             image_size=(24, 32), crop=(16, 24), style='lab')
  c.augment, c.normalize = 'segmentation', 'feddrive'
  c.model, c.model_kwargs = 'seg_test_fcn', {}
  c.rounds, c.clients_per_round, c.eval_every = 3, 2, 3
  c.client.batch_size, c.client.lr = 4, 0.05
  c.engine.device_data = device_data
  c.engine.rounds_per_call = 3 if device_data else 1
  return c


def test_trains_on_label_maps():
  data = data_registry.get_dataset('seg_synthetic', **_config(True).data.to_dict())
  t = trainers.make_trainer(_config(True), data=data)
  assert t.plan.train_transform.style_bank.kind == 'lab' and t.task.ignore_index == 255
  t.train()
  rec = t.records[-1]
  assert rec['round'] == 3 and np.isfinite(rec['test_loss']) and 0 <= rec['test_accuracy'] <= 1
  assert np.isfinite(rec['train_loss'])


@pytest.mark.slow
def test_host_and_device_paths_agree():
  data = data_registry.get_dataset('seg_synthetic', **_config(False).data.to_dict())
  results = []
  for device_data in (False, True):
    t = trainers.make_trainer(_config(device_data), data=data)
    assert t.plan.train_transform.style_bank.kind == 'lab'
    t.train()
    results.append((t.records[-1], jax.tree_util.tree_map(np.asarray, t.server_state)))
  (r_host, s_host), (r_dev, s_dev) = results
  assert r_host['round'] == 3 and np.isfinite(r_host['test_loss']) and 0 <= r_host['test_accuracy'] <= 1
  assert np.isfinite(r_host['train_loss'])
  np.testing.assert_allclose(r_host['test_accuracy'], r_dev['test_accuracy'], rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(s_host), jax.tree_util.tree_leaves(s_dev)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
