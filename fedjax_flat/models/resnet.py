"""ResNets with GroupNorm: ResNet18-GN (FedSAM / FedGloSS CIFAR and CIFAR100-PAM), ResNet34-GN (FedWMSAM's
CIFAR100) and ResNet20-GN (WiMA); and ResNet18 with BatchNorm (`resnet18_bn`), the torchvision / "kuangliu" CIFAR
network the GN one replaces.

Digest section 2.8: BatchNorm is replaced by GroupNorm with 2 groups per GN layer (Hsieh et al.), so the model
has no mutable state and `params` is the whole trainable state. GN has the same affine parameters as BN
(scale and bias per channel), so parameter counts equal those of the BN models.

ResNet18-GN (`resnet18`), torchvision/"kuangliu" layout:
  stem 'cifar' (default; the thesis does not name the variant, [U]): conv3x3-64 stride 1, GN, ReLU,
  no maxpool.
  stem 'imagenet': conv7x7-64 stride 2, GN, ReLU, maxpool 3x3 stride 2 (padding 1).
  4 stages of 2 BasicBlocks, widths 64-128-256-512, strides 1-2-2-2; a block whose shape changes has a
  projection shortcut conv1x1 (stride s) + GN. Global average pool, dense classifier.
  Parameters: 11,173,962 for 10 classes and 11,220,132 for 100 (CIFAR stem; the ImageNet stem adds
  7*7*3*64 - 3*3*3*64 = 7,680).

ResNet34-GN (`resnet34`): the same stem, blocks, shortcuts and GN choices, BasicBlock stages 3-4-6-3 (He et al.
  2016, Table 1). Parameters: 21,328,292 for 100 classes with the CIFAR stem; 21,335,972 with the ImageNet stem,
  torchvision's resnet34 (21,797,672 for 1000 classes) with its head changed to 100 classes.

ResNet18-BN (`resnet18_bn`, `ResNetBN`): the same layout with BatchNorm (momentum 0.9 in flax's convention =
  PyTorch's 0.1, epsilon 1e-5) in place of every GroupNorm: the same 11,173,962 trainable parameters for 10
  classes (PyTorch's `parameters()`: BN's scale and bias equal GN's), plus 9,600 running statistics (mean and
  variance of the 4,800 BN channels: 64 + 4 x 64 + (4 x 128 + 128) + (4 x 256 + 256) + (4 x 512 + 512)) in
  params['batch_stats'] (models/base.py: the statistics travel with the params; local steps update them and
  the server averages them, core/batch_stats.py; only algorithms declaring the 'batch_stats' need run it).
  No thesis table uses it: the FedSAM / FedGloSS / PAM ResNet18 is the GN one (Appendix A.1: "replacing
  Batch Normalization layers with group normalization"); it is here for the BN-vs-GN comparison and for
  ported torchvision weights.

ResNet20-GN (`resnet20`), the CIFAR ResNet of He et al. 2016 (section 4.2): conv3x3-16, GN, ReLU, then 3
stages of 3 BasicBlocks, widths 16-32-64, strides 1-2-2, global average pool, dense classifier.
  shortcut 'A' (default, He et al.'s CIFAR choice): parameter-free, stride-2 subsampling plus zero channel
  padding. 'B': projection conv1x1 + GN where the shape changes.
  Parameters, 10 classes: 269,722 (shortcut 'A'; "0.27M" in He et al.) and 272,474 (shortcut 'B').
  The GN group count for ResNet20 is not given in the thesis ([U]); default 2, as ResNet18-GN.

Conventions shared with `mobilenet_v2.py`:
  * All convolutions go through `layers.Conv` (so `conv_impl='im2col'` keeps CPU loops fast), without bias,
    PyTorch default init (`torch_init=True`, as the PyTorch reference code that uses no custom init).
  * Padding is PyTorch's: symmetric (k-1)//2 zeros on each side, also for strided convolutions (TF 'SAME'
    would pad (0, 1) for even inputs and shift the sampling grid by one pixel; weights ported from PyTorch
    expect the symmetric one).
  * GroupNorm epsilon 1e-5 (PyTorch's), scale 1 and bias 0 at init.
  * Every ReLU output is sown (`'intermediates'/'act'`) for MAN. Submodule names sort in depth order
    ('layer1_0' < 'layer1_1' < 'layer2_0' ...), and `base.from_flax` flattens the sown values with sorted
    keys, so `with_activations=True` returns the activations stem first, last block last.
  * Parameter names: 'stem_conv', 'stem_gn', 'layer{stage}_{block}' / {'conv1','gn1','conv2','gn2',
    'shortcut_conv','shortcut_gn'}, 'classifier' (used by `pretrained.load_pretrained`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp

from fedjax_flat.models.layers import Conv, Dense
from fedjax_flat.models.base import from_flax
from fedjax_flat.models.registry import register

GN_EPSILON = 1e-5
BN_EPSILON = 1e-5


def _act(module: nn.Module, y):
  """ReLU whose output is sown for MAN."""
  y = nn.relu(y)
  module.sow('intermediates', 'act', y)
  return y


def torch_pad(x, k: int):
  """Symmetric zero padding of (k-1)//2 on H and W (PyTorch's `padding=k//2` for odd k)."""
  p = (k - 1) // 2
  if p == 0:
    return x
  return jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [(p, p), (p, p), (0, 0)])


def conv(x, features: int, k: int, *, strides: int = 1, groups: int = 1, conv_impl: str = 'auto',
         name: str | None = None):
  """A bias-free k x k convolution with PyTorch padding and init. Call inside a compact method."""
  return Conv(features, (k, k), strides=strides, padding='VALID', use_bias=False,
              feature_group_count=groups, conv_impl=conv_impl, torch_init=True, name=name)(torch_pad(x, k))


def group_norm(x, groups: int, name: str | None = None):
  if x.shape[-1] % groups:
    raise ValueError(f'GroupNorm: {x.shape[-1]} channels are not divisible by {groups} groups')
  # Statistics per example over (H, W, channels of the group); explicit axes keep that true for inputs
  # with several leading batch axes (flax's default would pool over every axis but the first).
  return nn.GroupNorm(num_groups=groups, epsilon=GN_EPSILON, reduction_axes=(-3, -2, -1), name=name)(x)


class BasicBlock(nn.Module):
  """conv3x3 (stride s), GN, ReLU, conv3x3, GN, + shortcut, ReLU."""
  features: int
  strides: int = 1
  gn_groups: int = 2
  shortcut: str = 'B'            # 'B': conv1x1 + GN projection; 'A': subsample + zero channel padding
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x):
    f, s, g = self.features, self.strides, self.gn_groups
    cin = x.shape[-1]
    y = conv(x, f, 3, strides=s, conv_impl=self.conv_impl, name='conv1')
    y = _act(self, group_norm(y, g, name='gn1'))
    y = conv(y, f, 3, conv_impl=self.conv_impl, name='conv2')
    y = group_norm(y, g, name='gn2')
    if s != 1 or cin != f:
      if self.shortcut == 'B':
        sc = conv(x, f, 1, strides=s, conv_impl=self.conv_impl, name='shortcut_conv')
        sc = group_norm(sc, g, name='shortcut_gn')
      elif self.shortcut == 'A':
        if f < cin:
          raise ValueError("shortcut 'A' cannot reduce channels")
        sc = x[..., ::s, ::s, :]
        lo = (f - cin) // 2
        sc = jnp.pad(sc, [(0, 0)] * (sc.ndim - 1) + [(lo, f - cin - lo)])
      else:
        raise ValueError(f"shortcut={self.shortcut!r}; allowed: 'A', 'B'")
    else:
      sc = x
    return _act(self, y + sc)


class BNBlock(nn.Module):
  """BasicBlock with BatchNorm: conv3x3 (stride s), BN, ReLU, conv3x3, BN, + projection shortcut, ReLU."""
  features: int
  strides: int = 1
  bn_momentum: float = 0.9
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, *, use_running_average: bool, mask=None):
    f, s = self.features, self.strides
    bn = lambda name: nn.BatchNorm(momentum=self.bn_momentum, epsilon=BN_EPSILON, name=name)  # noqa: E731
    y = conv(x, f, 3, strides=s, conv_impl=self.conv_impl, name='conv1')
    y = _act(self, bn('bn1')(y, use_running_average=use_running_average, mask=mask))
    y = conv(y, f, 3, conv_impl=self.conv_impl, name='conv2')
    y = bn('bn2')(y, use_running_average=use_running_average, mask=mask)
    if s != 1 or x.shape[-1] != f:
      x = conv(x, f, 1, strides=s, conv_impl=self.conv_impl, name='shortcut_conv')
      x = bn('shortcut_bn')(x, use_running_average=use_running_average, mask=mask)
    return _act(self, y + x)


class ResNetBN(nn.Module):
  """ResNet18 with BatchNorm (module docstring): running statistics in the 'batch_stats' collection; `mask`
  [B] keeps padded examples out of the batch statistics."""
  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  widths: Sequence[int] = (64, 128, 256, 512)
  num_classes: int = 10
  stem_width: int = 64
  stem: str = 'cifar'
  bn_momentum: float = 0.9
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, train: bool = False, *, use_running_average: Optional[bool] = None, mask=None):
    ura = (not train) if use_running_average is None else use_running_average
    if mask is not None:
      mask = jnp.reshape(mask, (-1, 1, 1, 1)) > 0
    k, s = {'cifar': (3, 1), 'imagenet': (7, 2)}.get(self.stem, (None, None))
    if k is None:
      raise ValueError(f"stem={self.stem!r}; allowed: 'cifar', 'imagenet'")
    x = conv(x, self.stem_width, k, strides=s, conv_impl=self.conv_impl, name='stem_conv')
    x = nn.BatchNorm(momentum=self.bn_momentum, epsilon=BN_EPSILON, name='stem_bn')(
        x, use_running_average=ura, mask=mask)
    x = _act(self, x)
    if self.stem == 'imagenet':
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for i, (n, w) in enumerate(zip(self.stage_sizes, self.widths)):
      for j in range(n):
        x = BNBlock(w, strides=2 if (i > 0 and j == 0) else 1, bn_momentum=self.bn_momentum,
                    conv_impl=self.conv_impl, name=f'layer{i + 1}_{j}')(x, use_running_average=ura, mask=mask)
    x = jnp.mean(x, axis=(-3, -2))
    return Dense(self.num_classes, torch_init=True, name='classifier')(x)


class ResNet(nn.Module):
  """A GroupNorm ResNet of BasicBlocks. See the module docstring for the two configurations."""
  stage_sizes: Sequence[int]
  widths: Sequence[int]
  num_classes: int = 10
  stem_width: int = 64
  stem: str = 'cifar'           # 'cifar' (conv3x3 stride 1, no maxpool) | 'imagenet' (conv7x7/2 + maxpool/2)
  gn_groups: int = 2
  shortcut: str = 'B'
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train  # no dropout, no batch statistics
    if self.stem == 'cifar':
      x = conv(x, self.stem_width, 3, conv_impl=self.conv_impl, name='stem_conv')
      x = _act(self, group_norm(x, self.gn_groups, name='stem_gn'))
    elif self.stem == 'imagenet':
      x = conv(x, self.stem_width, 7, strides=2, conv_impl=self.conv_impl, name='stem_conv')
      x = _act(self, group_norm(x, self.gn_groups, name='stem_gn'))
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    else:
      raise ValueError(f"stem={self.stem!r}; allowed: 'cifar', 'imagenet'")
    for i, (n, w) in enumerate(zip(self.stage_sizes, self.widths)):
      for j in range(n):
        strides = 2 if (i > 0 and j == 0) else 1
        x = BasicBlock(w, strides=strides, gn_groups=self.gn_groups, shortcut=self.shortcut,
                       conv_impl=self.conv_impl, name=f'layer{i + 1}_{j}')(x)
    x = jnp.mean(x, axis=(-3, -2))
    return Dense(self.num_classes, torch_init=True, name='classifier')(x)


def resnet18(num_classes: int = 10, *, stem: str = 'cifar', gn_groups: int = 2,
             conv_impl: str = 'auto') -> ResNet:
  """ResNet18-GN: BasicBlock [2,2,2,2], widths 64-128-256-512, projection shortcuts."""
  return ResNet(stage_sizes=(2, 2, 2, 2), widths=(64, 128, 256, 512), num_classes=num_classes,
                stem_width=64, stem=stem, gn_groups=gn_groups, shortcut='B', conv_impl=conv_impl)


def resnet34(num_classes: int = 10, *, stem: str = 'cifar', gn_groups: int = 2,
             conv_impl: str = 'auto') -> ResNet:
  """ResNet34-GN: BasicBlock [3,4,6,3], widths 64-128-256-512, projection shortcuts."""
  return ResNet(stage_sizes=(3, 4, 6, 3), widths=(64, 128, 256, 512), num_classes=num_classes,
                stem_width=64, stem=stem, gn_groups=gn_groups, shortcut='B', conv_impl=conv_impl)


def resnet20(num_classes: int = 10, *, gn_groups: int = 2, shortcut: str = 'A',
             conv_impl: str = 'auto') -> ResNet:
  """ResNet20-GN (He et al. CIFAR ResNet, n=3): 3 stages x 3 BasicBlocks, widths 16-32-64."""
  return ResNet(stage_sizes=(3, 3, 3), widths=(16, 32, 64), num_classes=num_classes, stem_width=16,
                stem='cifar', gn_groups=gn_groups, shortcut=shortcut, conv_impl=conv_impl)


# --- Registered builders: config.model name -> Model (models/registry.py). ---

@register('resnet18_gn', head=(('classifier',),))
def _resnet18_gn(num_classes, input_shape, conv_impl='auto', stem='cifar', gn_groups=2):
  module = resnet18(num_classes, stem=stem, gn_groups=gn_groups, conv_impl=conv_impl)
  return from_flax(module, 'resnet18_gn', num_classes, input_shape)


@register('resnet34_gn', head=(('classifier',),))
def _resnet34_gn(num_classes, input_shape, conv_impl='auto', stem='cifar', gn_groups=2):
  module = resnet34(num_classes, stem=stem, gn_groups=gn_groups, conv_impl=conv_impl)
  return from_flax(module, 'resnet34_gn', num_classes, input_shape)


@register('resnet20_gn', head=(('classifier',),))
def _resnet20_gn(num_classes, input_shape, conv_impl='auto', gn_groups=2, shortcut='A'):
  module = resnet20(num_classes, gn_groups=gn_groups, shortcut=shortcut, conv_impl=conv_impl)
  return from_flax(module, 'resnet20_gn', num_classes, input_shape)


@register('resnet18_bn', head=(('classifier',),), batch_stats=lambda kw: True)
def _resnet18_bn(num_classes, input_shape, conv_impl='auto', stem='cifar', bn_momentum=0.9):
  module = ResNetBN(num_classes=num_classes, stem=stem, bn_momentum=float(bn_momentum), conv_impl=conv_impl)
  return from_flax(module, 'resnet18_bn', num_classes, input_shape, batch_stats=True)
