"""BiSeNetV2 (Yu et al. 2021) for federated semantic segmentation (FedDrive; thesis Table 4.10).

Architecture (NHWC; CBR = conv (no bias) + norm + ReLU, dw = depthwise conv, k3 = 3x3, s2 = stride 2):
  detail branch    S1: CBR 64 s2, CBR 64 | S2: CBR 64 s2, 2x CBR 64 | S3: CBR 128 s2, 2x CBR 128   (1/8)
  semantic branch  stem (1/4): CBR 16 s2 -> [CBR 8 k1 -> CBR 16 s2 | maxpool k3 s2] -> concat -> CBR 16
                   S3: GE-s2 16->32, GE 32 (1/8) | S4: GE-s2 32->64, GE 64 (1/16)
                   S5_4: GE-s2 64->128, 3x GE 128 (1/32) | S5_5: context embedding (GAP, norm, CBR k1, +x, CBR)
                   GE (stride 1, expansion 6): CBR k3, dw k3 (x6) + norm + ReLU, conv k1 + norm, + x, ReLU
                   GE-s2: CBR k3, dw k3 s2 (x6) + norm, dw k3 + norm + ReLU, conv k1 + norm,
                          + shortcut (dw k3 s2 + norm, conv k1 + norm), ReLU
  guided aggregation  detail: dw k3 + norm + conv k1 | conv k3 s2 + norm + avgpool k3 s2
                      semantic: conv k3 + norm, x4 up | dw k3 + norm + conv k1
                      (d1 * sigmoid(up(s1))) + up(d2 * sigmoid(s2)) -> CBR 128
  head             CBR 128->1024, dropout 0.1, then to full resolution (x8)
  booster (aux) heads on stem (x4), S3 (x8), S4 (x16), S5_4 (x32), mid 128; returned only with train=True
  (the reference's `output_aux`): logits = (main, aux2, aux3, aux4, aux5_4), each [B, H, W, classes].

Two published variants (`variant`):
  'feddrive' (default; Erosinho13/FedDrive src/modules/bisenetv2.py, the code of FedDrive and of the
     thesis' segmentation runs): heads = conv k1 to classes * r^2 (bias) + pixel shuffle (x r); the
     guided aggregation upsamples bilinearly with align_corners=True.
     Parameters, 19 classes: 8,196,416 with the booster heads (4,585,552 without); 16 classes: 7,473,296
     (4,388,752). Per part (19 classes): detail 519,232, semantic 1,159,504, aggregation 478,720,
     head 2,428,096, aux2 57,904, aux3 193,984, aux4 701,440, aux5_4 2,657,536.
  'coincheung' (CoinCheung/BiSeNet lib/models/bisenetv2.py, current): heads = [aux: nearest x2 + CBR
     to r^2 channels] + conv k1 to classes (bias) + bilinear upsampling (align_corners=False); nearest x4 in
     the aggregation. Parameters, 19 classes: 5,231,487 (3,358,627 without the booster heads).
  Counts measured by instantiating the two reference PyTorch modules (torch 2.x, `sum(p.numel() for p in
  model.parameters())`, running statistics excluded); tests/models/test_bisenetv2.py checks ours equal them.

Init as the reference: convolutions kaiming-normal (fan-out, gain sqrt 2), biases 0; norm scale 1 and bias 0,
except the last norm of every GE layer (scale 0: each GE block starts as its shortcut). ImageNet-pretrained
backbones are not shipped (the thesis does not say whether FedDrive's `--pretrained` was used).

`norm`: 'bn' (BatchNorm: eps 1e-5, momentum 0.9 = PyTorch's 0.1; running statistics in params['batch_stats'],
see models/base.py) or 'gn' (GroupNorm with `gn_groups` groups, eps 1e-5; stateless).
`remat=True` makes every ConvBNReLU, GE layer, the aggregation layer and every head its own `jax.checkpoint`
region (flax `nn.remat`): the backward pass keeps only the region boundaries and recomputes the inside, for
512x1024 crops (measured in benchmarks/studies/README.segmentation.md).
Input height and width must be multiples of 32.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_flat.models.layers import Conv
from fedjax_flat.models.base import from_flax
from fedjax_flat.models.registry import register

VARIANTS = ('feddrive', 'coincheung')
NORMS = ('bn', 'gn')
EPS = 1e-5
# kaiming_normal_(mode='fan_out') of the reference: N(0, 2 / (out_channels * kh * kw)).
_KAIMING = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')


@dataclasses.dataclass(frozen=True)
class Cfg:
  """What every block needs: normalization and convolution settings, and the run mode (static)."""
  norm: str = 'bn'
  gn_groups: int = 8
  bn_momentum: float = 0.9
  conv_impl: str = 'auto'
  use_running_average: bool = True
  train: bool = False
  remat: bool = False


def _pad(x, k: int):
  p = (k - 1) // 2
  return x if p == 0 else jnp.pad(x, [(0, 0), (p, p), (p, p), (0, 0)])


class Block(nn.Module):
  """Base of the blocks: conv and norm helpers bound to the shared Cfg."""
  cfg: Cfg

  def conv(self, x, features, k=3, stride=1, groups=1, bias=False, name=None):
    return Conv(features, (k, k), strides=stride, use_bias=bias, feature_group_count=groups,
                conv_impl=self.cfg.conv_impl, kernel_init=_KAIMING, name=name)(_pad(x, k))

  def norm(self, x, mask, name, zero_init=False):
    scale_init = nn.initializers.zeros_init() if zero_init else nn.initializers.ones_init()
    if self.cfg.norm == 'bn':
      return nn.BatchNorm(momentum=self.cfg.bn_momentum, epsilon=EPS, scale_init=scale_init, name=name)(
          x, use_running_average=self.cfg.use_running_average, mask=mask)
    return nn.GroupNorm(num_groups=self.cfg.gn_groups, epsilon=EPS, scale_init=scale_init, name=name)(x)

  def act(self, y):
    y = nn.relu(y)
    self.sow('intermediates', 'act', y)
    return y

  def cbr(self, x, mask, features, k=3, stride=1, name='cbr'):
    """ConvBNReLU: submodules '<name>_conv', '<name>_norm'. With remat, each one is its own jax.checkpoint
    region (the lifted function keeps the parameter names): its backward recomputes only its own conv (and
    im2col patches), so the high-resolution detail-branch activations are never all live at once."""
    def fn(mdl, x, mask):
      y = mdl.conv(x, features, k, stride, name=f'{name}_conv')
      return mdl.act(mdl.norm(y, mask, f'{name}_norm'))
    return (nn.remat(fn) if self.cfg.remat else fn)(self, x, mask)


class DetailBranch(Block):
  @nn.compact
  def __call__(self, x, mask):
    for stage, (c, n) in enumerate(((64, 2), (64, 3), (128, 3)), start=1):
      for i in range(n):
        x = self.cbr(x, mask, c, 3, 2 if i == 0 else 1, name=f'S{stage}_{i}')
    return x


class StemBlock(Block):
  @nn.compact
  def __call__(self, x, mask):
    x = self.cbr(x, mask, 16, 3, 2, name='conv')
    left = self.cbr(self.cbr(x, mask, 8, 1, 1, name='left_0'), mask, 16, 3, 2, name='left_1')
    right = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    return self.cbr(jnp.concatenate([left, right], axis=-1), mask, 16, 3, 1, name='fuse')


class CEBlock(Block):
  """Context embedding: global average pool, norm, CBR k1, broadcast add, CBR k3."""

  @nn.compact
  def __call__(self, x, mask):
    g = self.norm(jnp.mean(x, axis=(1, 2), keepdims=True), mask, 'norm')
    g = self.cbr(g, mask, 128, 1, 1, name='conv_gap')
    return self.cbr(x + g, mask, 128, 3, 1, name='conv_last')


class GELayer(Block):
  """Gather-and-expand layer, stride 1 (GELayerS1) or 2 (GELayerS2), expansion 6."""
  out: int = 32
  stride: int = 1
  expansion: int = 6

  @nn.compact
  def __call__(self, x, mask):
    cin = x.shape[-1]
    mid = cin * self.expansion
    y = self.cbr(x, mask, cin, 3, 1, name='conv1')
    if self.stride == 1:
      y = self.act(self.norm(self.conv(y, mid, 3, 1, groups=cin, name='dw_conv'), mask, 'dw_norm'))
      shortcut = x
    else:
      y = self.norm(self.conv(y, mid, 3, 2, groups=cin, name='dw1_conv'), mask, 'dw1_norm')
      y = self.act(self.norm(self.conv(y, mid, 3, 1, groups=mid, name='dw2_conv'), mask, 'dw2_norm'))
      s = self.norm(self.conv(x, cin, 3, 2, groups=cin, name='sc_dw_conv'), mask, 'sc_dw_norm')
      shortcut = self.norm(self.conv(s, self.out, 1, name='sc_conv'), mask, 'sc_norm')
    y = self.norm(self.conv(y, self.out, 1, name='conv2_conv'), mask, 'conv2_norm', zero_init=True)
    return self.act(y + shortcut)


def upsample_bilinear_align_corners(x, factor: int):
  """x [B, H, W, C] -> [B, H*f, W*f, C], bilinear with align_corners=True (torch nn.Upsample)."""
  def axis_interp(a, axis, n_out):
    n_in = a.shape[axis]
    if n_in == 1:
      return jnp.repeat(a, n_out, axis=axis)
    pos = jnp.arange(n_out, dtype=jnp.float32) * ((n_in - 1) / (n_out - 1))
    lo = jnp.clip(jnp.floor(pos).astype(jnp.int32), 0, n_in - 2)
    w = (pos - lo).astype(a.dtype)
    shape = [1] * a.ndim
    shape[axis] = n_out
    w = w.reshape(shape)
    return jnp.take(a, lo, axis=axis) * (1 - w) + jnp.take(a, lo + 1, axis=axis) * w
  x = axis_interp(x, 1, x.shape[1] * factor)
  return axis_interp(x, 2, x.shape[2] * factor)


def upsample_nearest(x, factor: int):
  return jnp.repeat(jnp.repeat(x, factor, axis=1), factor, axis=2)


def upsample_bilinear(x, factor: int):
  """Bilinear, align_corners=False (half-pixel centres, as torch's default and jax.image.resize)."""
  b, h, w, c = x.shape
  return jax.image.resize(x, (b, h * factor, w * factor, c), 'bilinear')


def pixel_shuffle(x, r: int):
  """torch.nn.PixelShuffle in NHWC: channel c * r^2 + i * r + j -> output pixel (h * r + i, w * r + j)."""
  b, h, w, cr = x.shape
  c = cr // (r * r)
  x = x.reshape(b, h, w, c, r, r).transpose(0, 1, 4, 2, 5, 3)
  return x.reshape(b, h * r, w * r, c)


class BGALayer(Block):
  """Bilateral guided aggregation of the detail (1/8) and semantic (1/32) features."""
  variant: str = 'feddrive'

  @nn.compact
  def __call__(self, xd, xs, mask):
    up = upsample_bilinear_align_corners if self.variant == 'feddrive' else upsample_nearest
    left1 = self.conv(self.norm(self.conv(xd, 128, 3, groups=128, name='left1_dw'), mask, 'left1_norm'),
                      128, 1, name='left1_conv')
    left2 = self.norm(self.conv(xd, 128, 3, 2, name='left2_conv'), mask, 'left2_norm')
    left2 = nn.avg_pool(left2, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), count_include_pad=True)
    right1 = self.norm(self.conv(xs, 128, 3, name='right1_conv'), mask, 'right1_norm')
    right2 = self.conv(self.norm(self.conv(xs, 128, 3, groups=128, name='right2_dw'), mask, 'right2_norm'),
                       128, 1, name='right2_conv')
    left = left1 * jax.nn.sigmoid(up(right1, 4))
    right = up(left2 * jax.nn.sigmoid(right2), 4)
    return self.cbr(left + right, mask, 128, 3, 1, name='conv')


class SegmentHead(Block):
  num_classes: int = 19
  mid: int = 128
  up: int = 8
  aux: bool = False
  variant: str = 'feddrive'

  @nn.compact
  def __call__(self, x, mask):
    y = self.cbr(x, mask, self.mid, 3, 1, name='conv')
    y = nn.Dropout(0.1, deterministic=not (self.cfg.train and self.has_rng('dropout')))(y)   # no rng: off
    if self.variant == 'feddrive':
      y = self.conv(y, self.num_classes * self.up ** 2, 1, bias=True, name='conv_out')
      return pixel_shuffle(y, self.up)
    up = self.up
    if self.aux:
      y = self.cbr(upsample_nearest(y, 2), mask, self.up ** 2, 3, 1, name='conv_up')
      up //= 2
    y = self.conv(y, self.num_classes, 1, bias=True, name='conv_out')
    return upsample_bilinear(y, up)


class BiSeNetV2(nn.Module):
  num_classes: int = 19
  aux: bool = True                 # booster heads (returned in training only)
  variant: str = 'feddrive'
  norm: str = 'bn'
  gn_groups: int = 8
  bn_momentum: float = 0.9
  conv_impl: str = 'auto'
  remat: bool = False

  @nn.compact
  def __call__(self, x, train: bool = False, *, use_running_average: Optional[bool] = None, mask=None):
    if x.shape[1] % 32 or x.shape[2] % 32:
      raise ValueError(f'BiSeNetV2 needs height and width divisible by 32, got {x.shape[1:3]}')
    ura = (not train) if use_running_average is None else use_running_average
    cfg = Cfg(norm=self.norm, gn_groups=self.gn_groups, bn_momentum=self.bn_momentum,
              conv_impl=self.conv_impl, use_running_average=ura, train=train, remat=self.remat)
    wrap = nn.remat if self.remat else (lambda c: c)
    feat_d = DetailBranch(cfg, name='detail')(x, mask)          # remat per ConvBNReLU (Block.cbr)
    feat2 = StemBlock(cfg, name='segment_S1S2')(x, mask)
    f = feat2
    stages = {}
    for stage, layers in (('S3', ((32, 2), (32, 1))), ('S4', ((64, 2), (64, 1))),
                          ('S5_4', ((128, 2), (128, 1), (128, 1), (128, 1)))):
      for i, (out, stride) in enumerate(layers):
        f = wrap(GELayer)(cfg, out=out, stride=stride, name=f'segment_{stage}_{i}')(f, mask)
      stages[stage] = f
    feat_s = CEBlock(cfg, name='segment_S5_5')(f, mask)
    feat_head = wrap(BGALayer)(cfg, variant=self.variant, name='bga')(feat_d, feat_s, mask)
    head = lambda name, mid, up, aux: wrap(SegmentHead)(  # noqa: E731
        cfg, num_classes=self.num_classes, mid=mid, up=up, aux=aux, variant=self.variant, name=name)
    logits = head('head', 1024, 8, False)(feat_head, mask)
    if not self.aux or (not train and not self.is_initializing()):   # init creates the booster heads too
      return logits
    aux_in = (('aux2', feat2, 4), ('aux3', stages['S3'], 8), ('aux4', stages['S4'], 16),
              ('aux5_4', stages['S5_4'], 32))
    return (logits,) + tuple(head(name, 128, up, True)(feat, mask) for name, feat, up in aux_in)


def check_gn_groups(gn_groups: int) -> None:
  """Every normalized width (8 ... 1024) must be divisible by the GroupNorm group count."""
  widths = (8, 16, 32, 64, 96, 128, 192, 256, 384, 768, 1024)
  bad = [w for w in widths if w % gn_groups]
  if gn_groups < 1 or bad:
    raise ValueError(f'gn_groups={gn_groups} must divide every normalized width of BiSeNetV2 {widths}; '
                     f'{bad} are not divisible (use 1, 2, 4 or 8)')


# --- Registered builders: config.model name -> Model (models/registry.py). ---

@register('bisenetv2', batch_stats=lambda kw: kw.get('norm', 'bn') == 'bn')
def _bisenetv2_model(num_classes, input_shape, conv_impl='auto', norm='bn', gn_groups=8, bn_momentum=0.9,
                     aux=True, variant='feddrive', remat=False):
  if norm not in NORMS:
    raise ValueError(f'model_kwargs.norm={norm!r}; allowed: {NORMS}')
  if variant not in VARIANTS:
    raise ValueError(f'model_kwargs.variant={variant!r}; allowed: {VARIANTS}')
  if norm == 'gn':
    check_gn_groups(int(gn_groups))
  module = BiSeNetV2(num_classes, aux=bool(aux), variant=variant, norm=norm, gn_groups=int(gn_groups),
                                bn_momentum=float(bn_momentum), conv_impl=conv_impl, remat=bool(remat))
  return from_flax(module, 'bisenetv2', num_classes, input_shape, batch_stats=norm == 'bn', rbg_init=True)
