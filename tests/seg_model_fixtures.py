"""Small segmentation fixtures: a label-map FederatedDataset with 'seen' / 'unseen' test clients and a tiny
BatchNorm (or GroupNorm) segmentation model with an auxiliary head, registered as '_test_seg'."""
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.models import base as model_base
from fedjax_flat.models import registry as model_registry

IGNORE = 255


class TinySeg(nn.Module):
  """conv3x3(8) - norm - ReLU - conv1x1(C) (main); conv1x1(C) on the hidden features (aux, training only)."""
  num_classes: int = 3
  norm: str = 'bn'
  bn_momentum: float = 0.9

  @nn.compact
  def __call__(self, x, train: bool = False, *, use_running_average=None, mask=None):
    ura = (not train) if use_running_average is None else use_running_average
    h = nn.Conv(8, (3, 3), name='conv1')(x)
    if self.norm == 'bn':
      h = nn.BatchNorm(momentum=self.bn_momentum, epsilon=1e-5, name='norm1')(h, use_running_average=ura, mask=mask)
    else:
      h = nn.GroupNorm(num_groups=2, name='norm1')(h)
    h = nn.relu(h)
    self.sow('intermediates', 'act', h)
    main = nn.Conv(self.num_classes, (1, 1), name='head')(h)
    aux = nn.Conv(self.num_classes, (1, 1), name='aux')(h)
    if train or self.is_initializing():
      return main, aux
    return main


@model_registry.register('_test_seg')
def _tiny_seg(num_classes, input_shape, conv_impl='auto', norm='bn'):
  del conv_impl
  return model_base.from_flax(TinySeg(num_classes, norm=norm), '_test_seg', num_classes, input_shape,
                              batch_stats=norm == 'bn')


def seg_data(n_clients=4, sizes=(3, 5, 2, 4), hw=(16, 16), classes=3, seed=0, n_test=3, task='segmentation'):
  """Clients of unequal sizes; every image a square of one class on background 0, a void row (255) through it;
  the class shows in one channel. Test clients: 'seen' (same style) and 'unseen' (brighter)."""
  rng = np.random.default_rng(seed)
  ntr = int(sum(sizes))
  n = ntr + 2 * n_test
  h, w = hw
  y = np.zeros((n, h, w), np.int32)
  x = rng.normal(0, 0.1, (n, h, w, 3)).astype(np.float32)
  for i in range(n):
    c = int(rng.integers(1, classes))
    r0, c0 = rng.integers(0, h // 2, 2)
    y[i, r0:r0 + h // 2, c0:c0 + w // 2] = c
    x[i, ..., c % 3] += (y[i] == c)
    y[i, r0, :] = IGNORE
  x[ntr + n_test:] = 1.5 * x[ntr + n_test:] + 0.3
  offs = np.concatenate([[0], np.cumsum(sizes)])
  idx = [np.arange(offs[k], offs[k + 1]) for k in range(len(sizes))]
  return FederatedDataset.from_client_indices(
      x[:ntr], y[:ntr], idx, x[ntr:], y[ntr:], classes, name='seg_fixture', task=task,
      test_population_indices=[np.arange(n_test), np.arange(n_test, 2 * n_test)],
      test_client_names=['seen', 'unseen'])
