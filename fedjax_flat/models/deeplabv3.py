"""DeepLabV3 with a MobileNetV2 backbone and BatchNorm: the LADD release's segmentation model.

The release (src/modules/deeplabv3.py) puts torchvision's `DeepLabHead` on the `features` of d-li14's ImageNet
MobileNetV2 (width 1.0, BatchNorm, ReLU6):

  backbone  MobileNetV2 features (Sandler et al. 2018, Table 2): stem conv3x3-32 stride 2, the 17 inverted
            residual blocks (t, c, n, s) = (1,16,1,1) (6,24,2,2) (6,32,3,2) (6,64,4,2) (6,96,3,1) (6,160,3,2)
            (6,320,1,1), head conv1x1-1280; output stride 32 (no dilation), BatchNorm after every conv
  head      ASPP(1280 -> 256, atrous rates 12, 24, 36): conv1x1, three dilated conv3x3 and an image-pooling branch
            (global mean -> conv1x1 -> upsample), each conv + BN + ReLU; concat (1280) -> conv1x1-256 + BN + ReLU
            -> Dropout(0.5); then conv3x3-256 + BN + ReLU; conv1x1 -> num_classes (with bias)
  output    logits bilinearly upsampled (half-pixel centres) to the input size

Convolutions have no bias except the last; BatchNorm epsilon 1e-5, momentum 0.1 in PyTorch's convention
(`bn_momentum` = 0.9 here, Flax's). Parameter names: the backbone's 'features_00' .. 'features_18' as
models/mobilenet_v2.py (with 'bn' norms), the head under 'classifier' (so `init.pretrained` re-initializes the whole
head when loading an ImageNet backbone, models/pretrained.find_classifier_key) with its final conv 'head'.
LADD's cluster layers: 'decoder' = every conv of 'classifier' (the release's), 'cls' = the final conv only.

Trainable parameters: backbone 2,223,872 (torchvision's MobileNetV2 without its classifier), head 10,423,808
+ 257 C (C classes; 7 BatchNorms): 12,652,563 for the 19 Cityscapes classes, 12,651,021 for CrossCity's 13.
ImageNet weights (d-li14/mobilenetv2.pytorch) are not shipped: convert them offline to a params file for
`init.pretrained`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_flat.models.base import from_flax
from fedjax_flat.models.layers import torch_bias_init, torch_kernel_init
from fedjax_flat.models.mobilenet_v2 import INVERTED_RESIDUAL_SETTING, InvertedResidualBase, make_divisible
from fedjax_flat.models.registry import register
from fedjax_flat.models.resnet import conv

BN_EPS = 1e-5
ASPP_RATES = (12, 24, 36)


class ConvBNAct(nn.Module):
  features: int
  kernel: int = 3
  strides: int = 1
  groups: int = 1
  dilation: int = 1
  act: Optional[str] = 'relu6'       # 'relu6' | 'relu' | None
  bn_momentum: float = 0.9
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, use_running_average: bool, mask=None):
    if self.dilation == 1:
      x = conv(x, self.features, self.kernel, strides=self.strides, groups=self.groups, conv_impl=self.conv_impl,
               name='conv')
    else:
      d = self.dilation
      x = nn.Conv(self.features, (self.kernel, self.kernel), kernel_dilation=(d, d), padding=[(d, d), (d, d)],
                  use_bias=False, kernel_init=torch_kernel_init(), name='conv')(x)
    x = nn.BatchNorm(momentum=self.bn_momentum, epsilon=BN_EPS, name='bn')(x, use_running_average=use_running_average,
                                                                          mask=mask)
    if self.act == 'relu6':
      x = jnp.clip(x, 0.0, 6.0)
    elif self.act == 'relu':
      x = nn.relu(x)
    if self.act is not None:
      self.sow('intermediates', 'act', x)
    return x


class InvertedResidualBN(InvertedResidualBase):
  """models/mobilenet_v2.py's block with BatchNorm units: ConvBNAct submodules 'expand', 'dw', 'project'."""
  bn_momentum: float = 0.9
  conv_impl: str = 'auto'

  def unit(self, y, features, kernel, strides, groups, act, name, use_running_average, mask=None):
    return ConvBNAct(features, kernel, strides=strides, groups=groups, act='relu6' if act else None,
                     bn_momentum=self.bn_momentum, conv_impl=self.conv_impl, name=name)(y, use_running_average, mask)


class DeepLabV3MobileNetV2(nn.Module):
  num_classes: int
  width_mult: float = 1.0
  atrous_rates: Sequence[int] = ASPP_RATES
  aspp_channels: int = 256
  dropout_rate: float = 0.5
  bn_momentum: float = 0.9
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, train: bool = False, *, use_running_average: Optional[bool] = None, mask=None):
    ura = (not train) if use_running_average is None else use_running_average
    kw = dict(bn_momentum=self.bn_momentum, conv_impl=self.conv_impl)
    h_in, w_in = x.shape[1], x.shape[2]
    y = ConvBNAct(make_divisible(32 * self.width_mult), 3, strides=2, name='features_00', **kw)(x, ura, mask)
    idx = 1
    for t, c, n, s in INVERTED_RESIDUAL_SETTING:
      out = make_divisible(c * self.width_mult)
      for i in range(n):
        y = InvertedResidualBN(out, s if i == 0 else 1, t, name=f'features_{idx:02d}', **kw)(y, ura, mask)
        idx += 1
    y = ConvBNAct(make_divisible(1280 * max(1.0, self.width_mult)), 1, name=f'features_{idx:02d}', **kw)(y, ura, mask)
    y = DeepLabHead(self.num_classes, tuple(self.atrous_rates), self.aspp_channels, self.dropout_rate,
                    name='classifier', **kw)(y, train, ura, mask)
    return jax.image.resize(y, (y.shape[0], h_in, w_in, y.shape[-1]), 'bilinear')


class DeepLabHead(nn.Module):
  num_classes: int
  atrous_rates: Sequence[int] = ASPP_RATES
  channels: int = 256
  dropout_rate: float = 0.5
  bn_momentum: float = 0.9
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, train: bool, ura: bool, mask=None):
    kw = dict(bn_momentum=self.bn_momentum, conv_impl=self.conv_impl, act='relu')
    c = self.channels
    branches = [ConvBNAct(c, 1, name='aspp_0', **kw)(x, ura, mask)]
    for i, r in enumerate(self.atrous_rates, 1):
      branches.append(ConvBNAct(c, 3, dilation=int(r), name=f'aspp_{i}', **kw)(x, ura, mask))
    pooled = ConvBNAct(c, 1, name='aspp_pool', **kw)(jnp.mean(x, axis=(1, 2), keepdims=True), ura, mask)
    branches.append(jnp.broadcast_to(pooled, x.shape[:3] + (c,)))
    y = ConvBNAct(c, 1, name='aspp_project', **kw)(jnp.concatenate(branches, -1), ura, mask)
    y = nn.Dropout(self.dropout_rate, deterministic=not train)(y)
    y = ConvBNAct(c, 3, name='conv', **kw)(y, ura, mask)
    return nn.Conv(self.num_classes, (1, 1), kernel_init=torch_kernel_init(), bias_init=torch_bias_init(c),
                   name='head')(y)


@register('deeplabv3_mobilenetv2', batch_stats=lambda kw: True)
def _deeplabv3_mobilenetv2(num_classes, input_shape, conv_impl='auto', width_mult=1.0, bn_momentum=0.9,
                           dropout_rate=0.5, atrous_rates=ASPP_RATES):
  module = DeepLabV3MobileNetV2(num_classes, width_mult=float(width_mult), atrous_rates=tuple(atrous_rates),
                                dropout_rate=float(dropout_rate), bn_momentum=float(bn_momentum), conv_impl=conv_impl)
  return from_flax(module, 'deeplabv3_mobilenetv2', num_classes, input_shape, batch_stats=True, rbg_init=True)
