"""MobileNetV2 with GroupNorm, the Landmarks-User-160k model of FedSAM (digest section 2.8).

Thesis: "MobileNetV2, width multiplier 1.0, GN with 8 groups, no bottleneck layer before the classifier",
ImageNet-pretrained, backbone from rwightman/efficientnet-jax.

Architecture (Sandler et al. 2018, Table 2), `width_mult=1.0`:
  stem conv3x3-32 stride 2, GN, ReLU6;
  inverted residual blocks (t, c, n, s) = (1,16,1,1) (6,24,2,2) (6,32,3,2) (6,64,4,2) (6,96,3,1)
  (6,160,3,2) (6,320,1,1); a block is [conv1x1 expand to t*cin, GN, ReLU6] (absent when t=1),
  depthwise conv3x3 stride s, GN, ReLU6, conv1x1 linear projection to c, GN; residual when s=1 and cin=c;
  head conv1x1-1280, GN, ReLU6; global average pool; dense classifier (optional dropout, default off).

"No bottleneck layer before the classifier", decision: the pooled 1280 features go straight into the
classifier, with no extra (bottleneck/projection/pre-logits) layer between pooling and the classifier. The
standard 1x1 conv to 1280 *before* pooling is kept: it is part of MobileNetV2 (and of the pretrained
backbone in efficientnet-jax, whose `Head` is conv_pw-1280 + norm + act + pool + classifier, without the
extra post-pool conv of its `EfficientHead` used by MobileNetV3), and it is an expansion, not a
bottleneck. Dropping it would break loading the ImageNet-pretrained backbone and would not be "MobileNetV2
with width multiplier 1.0". The phrase most likely rules out adding a reduced-width embedding layer for
the 2,028 Landmarks classes, as some transfer setups do.

Parameters (GN has the same affine parameters as BN, so counts equal torchvision's BN model):
  3,504,872 for 1000 classes (= torchvision `mobilenet_v2()`), 2,223,872 of them in the backbone;
  4,821,740 for the 2,028 Landmarks classes; 2,236,682 for 10 classes.

Conventions (see `resnet.py`): `layers.Conv` for every convolution (depthwise ones use
feature_group_count=channels, which `layers.Conv` runs as a lax conv), no conv bias, PyTorch padding and
init, GN epsilon 1e-5. ReLU6 outputs are sown for MAN. Parameter/module names follow torchvision's
`features.{i}` indexing: 'features_00' (stem), 'features_01'..'features_17' (blocks), 'features_18' (head
conv), 'classifier'; zero-padded so that sorted keys are in depth order for `with_activations`.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import flax.linen as nn
import jax.numpy as jnp

from fedjax_flat.models.layers import Dense
from fedjax_flat.models.resnet import conv, group_norm
from fedjax_flat.models.base import from_flax
from fedjax_flat.models.registry import register

# (expansion t, output channels c, repeats n, first stride s), Sandler et al. Table 2.
INVERTED_RESIDUAL_SETTING: Tuple[Tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
    (6, 320, 1, 1))


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
  """Channel rounding of the reference implementations (never rounds down by more than 10%)."""
  min_value = min_value or divisor
  new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
  if new_v < 0.9 * v:
    new_v += divisor
  return new_v


def _act6(module: nn.Module, y):
  """ReLU6 whose output is sown for MAN."""
  y = jnp.clip(y, 0.0, 6.0)
  module.sow('intermediates', 'act', y)
  return y


class ConvGNAct(nn.Module):
  features: int
  kernel: int = 3
  strides: int = 1
  groups: int = 1
  gn_groups: int = 8
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x):
    x = conv(x, self.features, self.kernel, strides=self.strides, groups=self.groups,
             conv_impl=self.conv_impl, name='conv')
    return _act6(self, group_norm(x, self.gn_groups, name='gn'))


class InvertedResidualBase(nn.Module):
  """The inverted residual block (Sandler et al. 2018): [conv1x1 expand to t * cin, norm, ReLU6] (absent when
  t = 1), depthwise conv3x3 stride s, norm, ReLU6, conv1x1 linear projection to c, norm; + x when s = 1 and
  cin = c. The structure only: a subclass's `unit(y, features, kernel, strides, groups, act, name, *norm_args)`
  is one convolution + normalization (+ ReLU6 when act) and names its parameters, so that each model keeps its
  own parameter tree (this module's GroupNorm block: flat 'expand_conv' / 'expand_gn' ...; models/deeplabv3.py's
  BatchNorm block: 'expand' / {'conv', 'bn'} ... as its ConvBNAct submodules). __call__(x, *norm_args) passes
  norm_args (BatchNorm: use_running_average, mask) to every unit."""
  features: int
  strides: int
  expand_ratio: int

  def unit(self, y, features: int, kernel: int, strides: int, groups: int, act: bool, name: str, *norm_args):
    raise NotImplementedError

  @nn.compact
  def __call__(self, x, *norm_args):
    cin = x.shape[-1]
    hidden = int(round(cin * self.expand_ratio))
    y = x
    if self.expand_ratio != 1:
      y = self.unit(y, hidden, 1, 1, 1, True, 'expand', *norm_args)
    y = self.unit(y, hidden, 3, self.strides, hidden, True, 'dw', *norm_args)
    y = self.unit(y, self.features, 1, 1, 1, False, 'project', *norm_args)
    return x + y if self.strides == 1 and cin == self.features else y


class InvertedResidual(InvertedResidualBase):
  """The GroupNorm block: parameters '<unit>_conv' and '<unit>_gn' of the block itself, ReLU6 outputs sown here."""
  gn_groups: int = 8
  conv_impl: str = 'auto'

  def unit(self, y, features, kernel, strides, groups, act, name):
    y = conv(y, features, kernel, strides=strides, groups=groups, conv_impl=self.conv_impl, name=f'{name}_conv')
    y = group_norm(y, self.gn_groups, name=f'{name}_gn')
    return _act6(self, y) if act else y


class MobileNetV2(nn.Module):
  """MobileNetV2-GN; see the module docstring."""
  num_classes: int = 1000
  width_mult: float = 1.0
  gn_groups: int = 8
  dropout_rate: float = 0.0
  setting: Sequence[Tuple[int, int, int, int]] = INVERTED_RESIDUAL_SETTING
  last_channel: int = 1280
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, train: bool = False):
    g = self.gn_groups
    x = ConvGNAct(make_divisible(32 * self.width_mult), 3, strides=2, gn_groups=g,
                  conv_impl=self.conv_impl, name='features_00')(x)
    idx = 1
    for t, c, n, s in self.setting:
      out = make_divisible(c * self.width_mult)
      for i in range(n):
        x = InvertedResidual(out, s if i == 0 else 1, t, gn_groups=g, conv_impl=self.conv_impl,
                             name=f'features_{idx:02d}')(x)
        idx += 1
    last = make_divisible(self.last_channel * max(1.0, self.width_mult))
    x = ConvGNAct(last, 1, gn_groups=g, conv_impl=self.conv_impl, name=f'features_{idx:02d}')(x)
    x = jnp.mean(x, axis=(-3, -2))
    if self.dropout_rate > 0:
      x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return Dense(self.num_classes, torch_init=True, name='classifier')(x)


# --- Registered builders: config.model name -> Model (models/registry.py). ---

@register('mobilenet_v2_gn', head=(('classifier',),))
def _mobilenet_v2_gn(num_classes, input_shape, conv_impl='auto', gn_groups=8, width_mult=1.0,
                     dropout_rate=0.0):
  module = MobileNetV2(num_classes, width_mult=width_mult, gn_groups=gn_groups,
                                     dropout_rate=dropout_rate, conv_impl=conv_impl)
  return from_flax(module, 'mobilenet_v2_gn', num_classes, input_shape)
