"""A small encoder-decoder segmentation network with BatchNorm (or GroupNorm): the quickstart-sized model.

BiSeNetV2 (models/bisenetv2.py, 8.2M parameters) is the FedDrive model; compiling and training it on two CPU
cores takes minutes per run even at 64 x 64. `SegCNN` keeps what the segmentation algorithms act on -- BatchNorm
layers with running statistics (FedAvg / SiloBN / FedBN policies, test-time policies), a dense per-pixel head,
an auxiliary (booster-style) head in training for the summed-heads loss -- in a U-Net-like network of
ConvBNReLU blocks at three scales:

  e1 = CBR(w)(x)                        H      (w = `width`, 16 by default)
  e2 = CBR(2w)(CBR(2w, stride 2)(e1))   H / 2
  e3 = CBR(4w)(CBR(4w, stride 2)(e2))   H / 4
  d2 = CBR(2w)(concat(up2(e3), e2))     H / 2
  d1 = CBR(w)(concat(up2(d2), e1))      H
  logits = Conv1x1(num_classes)(d1);  training also returns up4(Conv1x1(num_classes)(e3)) (auxiliary head)

CBR = 3x3 conv (no bias, kaiming-normal fan-out, as BiSeNetV2) -> norm -> ReLU (sown as 'act' for MAN); up2 =
bilinear x2 (half-pixel centres). Height and width must be divisible by 4. With 4 classes: 26,560 parameters
at width 8 (configs/quickstart_seg.py), 104,952 at width 16 (tests/e2e/test_seg_pipeline.py counts them).
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from fedjax_flat.models.bisenetv2 import EPS, _KAIMING, _pad, upsample_bilinear
from fedjax_flat.models.layers import Conv
from fedjax_flat.models.base import from_flax
from fedjax_flat.models.registry import register

NORMS = ('bn', 'gn')


class SegCNN(nn.Module):
  num_classes: int
  width: int = 16
  aux: bool = True
  norm: str = 'bn'
  gn_groups: int = 4
  bn_momentum: float = 0.9
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, train: bool = False, *, use_running_average: Optional[bool] = None, mask=None):
    if x.shape[1] % 4 or x.shape[2] % 4:
      raise ValueError(f'SegCNN needs height and width divisible by 4, got {x.shape[1:3]}')
    ura = (not train) if use_running_average is None else use_running_average

    def cbr(h, features, stride, name):
      h = Conv(features, (3, 3), strides=stride, use_bias=False, conv_impl=self.conv_impl, kernel_init=_KAIMING,
               name=f'{name}_conv')(_pad(h, 3))
      if self.norm == 'bn':
        h = nn.BatchNorm(momentum=self.bn_momentum, epsilon=EPS, name=f'{name}_norm')(
            h, use_running_average=ura, mask=mask)
      else:
        h = nn.GroupNorm(num_groups=self.gn_groups, epsilon=EPS, name=f'{name}_norm')(h)
      h = nn.relu(h)
      self.sow('intermediates', 'act', h)
      return h

    w = self.width
    e1 = cbr(x, w, 1, 'enc1')
    e2 = cbr(cbr(e1, 2 * w, 2, 'enc2a'), 2 * w, 1, 'enc2b')
    e3 = cbr(cbr(e2, 4 * w, 2, 'enc3a'), 4 * w, 1, 'enc3b')
    d2 = cbr(jnp.concatenate([upsample_bilinear(e3, 2), e2], -1), 2 * w, 1, 'dec2')
    d1 = cbr(jnp.concatenate([upsample_bilinear(d2, 2), e1], -1), w, 1, 'dec1')
    logits = Conv(self.num_classes, (1, 1), conv_impl=self.conv_impl, name='head')(d1)
    if not self.aux or (not train and not self.is_initializing()):
      return logits
    aux = Conv(self.num_classes, (1, 1), conv_impl=self.conv_impl, name='aux')(e3)
    return logits, upsample_bilinear(aux, 4)


# --- Registered builders: config.model name -> Model (models/registry.py). ---

@register('seg_cnn', batch_stats=lambda kw: kw.get('norm', 'bn') == 'bn')
def _seg_cnn_model(num_classes, input_shape, conv_impl='auto', norm='bn', gn_groups=4, bn_momentum=0.9,
                   width=16, aux=True):
  if norm not in NORMS:
    raise ValueError(f'model_kwargs.norm={norm!r}; allowed: {NORMS}')
  module = SegCNN(num_classes, width=int(width), aux=bool(aux), norm=norm, gn_groups=int(gn_groups),
                           bn_momentum=float(bn_momentum), conv_impl=conv_impl)
  return from_flax(module, 'seg_cnn', num_classes, input_shape, batch_stats=norm == 'bn')
