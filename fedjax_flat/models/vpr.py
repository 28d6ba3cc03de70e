"""FedVPR's descriptor network (thesis 6.3): ResNet18 truncated after its third residual stage + GeM + L2.

  stem        conv7x7-64 stride 2, norm, ReLU, maxpool 3x3 stride 2 (torchvision's ImageNet stem)
  layer1..3   2 BasicBlocks each, widths 64-128-256 (x base_width / 64), strides 1-2-2: the "conv4" ResNet18
              of the deep-visual-geo-localization benchmark (layer4 and the classifier are dropped)
  GeM         g = (mean_{h,w} max(x, eps)^p)^(1/p) per channel, p a learned scalar initialised to 3, eps 1e-6
              (Radenovic et al.; the benchmark's `GeM`)
  L2          descriptor = g / max(||g||_2, 1e-12)           -> [..., 256]
The thesis does not say which normalisation the federated model uses ([U]): `norm='gn'` (default: GroupNorm,
`gn_groups` groups, the same blocks as models/resnet.py, no state across clients) or `norm='bn'` (BatchNorm
with running statistics in params['batch_stats'], as torchvision's ResNet18; the algorithms that declare the
'batch_stats' need).

Inputs may carry any leading axes: x [..., H, W, 3] -> descriptors [..., D]; a training tuple
[B, T, H, W, 3] (query, positives, negatives: tasks/retrieval.py) is one forward pass over B * T images.

ImageNet weights: parameter names are models/resnet.py's ('stem_conv', 'stem_gn', 'layer{s}_{b}/...'), so a
ResNet18 params file (e.g. torchvision's weights converted offline with the imagenet stem) fits after
`backbone_params` keeps its stem and first three stages; save that with `pretrained.save_params` and set
`config.init.pretrained=<file>`, `config.init.classifier_key='gem'`, `config.init.reinit_classifier='always'`
(GeM's p starts at 3, everything else from the file).
"""
from __future__ import annotations

from typing import Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from fedjax_flat.models.base import from_flax
from fedjax_flat.models.registry import register
from fedjax_flat.models.resnet import BN_EPSILON, BasicBlock, BNBlock, _act, conv, group_norm
from fedjax_flat.models import pretrained

GEM_EPS = 1e-6
NORMS = ('gn', 'bn')


def gem(x, p, eps: float = GEM_EPS):
  """Generalized-mean pooling over H, W of x [N, H, W, C]: (mean(max(x, eps)^p))^(1/p)."""
  return jnp.power(jnp.mean(jnp.power(jnp.maximum(x, eps), p), axis=(-3, -2)), 1.0 / p)


def l2_normalize(v, eps: float = 1e-12):
  return v / jnp.maximum(jnp.sqrt(jnp.sum(jnp.square(v), -1, keepdims=True)), eps)


class VprResNet(nn.Module):
  """ResNet18 up to its third stage, GeM, L2 normalisation (module docstring)."""
  base_width: int = 64
  stage_sizes: Sequence[int] = (2, 2, 2)
  norm: str = 'gn'
  gn_groups: int = 2
  bn_momentum: float = 0.9
  gem_p: float = 3.0
  conv_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, train: bool = False, *, use_running_average: Optional[bool] = None, mask=None):
    if self.norm not in NORMS:
      raise ValueError(f'norm={self.norm!r}; allowed: {NORMS}')
    lead = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:])
    ura = (not train) if use_running_average is None else use_running_average
    if mask is not None:     # one flag per example (first axis), shared by the images of its tuple
      m = jnp.reshape(mask, (-1,))
      mask = jnp.broadcast_to(m.reshape(m.shape[:1] + (1,) * (len(lead) - 1)), lead).reshape((-1, 1, 1, 1))
    w = self.base_width
    x = conv(x, w, 7, strides=2, conv_impl=self.conv_impl, name='stem_conv')
    if self.norm == 'gn':
      x = group_norm(x, self.gn_groups, name='stem_gn')
    else:
      x = nn.BatchNorm(momentum=self.bn_momentum, epsilon=BN_EPSILON, name='stem_bn')(
          x, use_running_average=ura, mask=mask)
    x = _act(self, x)
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for i, n in enumerate(self.stage_sizes):
      for j in range(n):
        strides = 2 if (i > 0 and j == 0) else 1
        name = f'layer{i + 1}_{j}'
        if self.norm == 'gn':
          x = BasicBlock(w * 2 ** i, strides=strides, gn_groups=self.gn_groups, shortcut='B',
                         conv_impl=self.conv_impl, name=name)(x)
        else:
          x = BNBlock(w * 2 ** i, strides=strides, bn_momentum=self.bn_momentum, conv_impl=self.conv_impl,
                      name=name)(x, use_running_average=ura, mask=mask)
    p = self.param('gem', lambda _: jnp.full((1,), self.gem_p, jnp.float32))
    d = l2_normalize(gem(x.astype(jnp.float32), p[0].astype(jnp.float32)))   # pooling, norm: float32
    return d.reshape(lead + d.shape[-1:])


def backbone_params(resnet18_params, stages: int = 3):
  """The stem and first `stages` stages of a ResNet18 params tree (models/resnet.py names): what
  `vpr_resnet18` loads as ImageNet weights (layer4 and the classifier dropped)."""
  flat = pretrained.flatten(resnet18_params)
  keep = ('stem_',) + tuple(f'layer{s}_' for s in range(1, stages + 1))
  return pretrained.unflatten({k: v for k, v in flat.items() if k.startswith(keep)})


def kwargs_for_params(params) -> dict:
  """The `vpr_resnet18` arguments a params tree fits: norm 'bn' when it holds BatchNorm layers ('stem_bn'), else
  'gn'; base_width = the stem convolution's output channels. (GroupNorm's group count is not in the params: the
  builder's default.) {} when the tree holds no stem convolution."""
  flat = pretrained.flatten(params)
  stem = [v for k, v in flat.items() if k.endswith('stem_conv/kernel')]
  if not stem:
    return {}
  norm = 'bn' if any('stem_bn' in k.split(pretrained.SEP) for k in flat) else 'gn'
  return {'norm': norm, 'base_width': int(np.shape(stem[0])[-1])}


# --- Registered builder: config.model name -> Model (models/registry.py). ---

def _uses_bn(kwargs) -> bool:
  return kwargs.get('norm', 'gn') == 'bn'


@register('vpr_resnet18', batch_stats=_uses_bn)
def _vpr_resnet18(num_classes, input_shape, norm='gn', gn_groups=2, base_width=64, bn_momentum=0.9,
                  gem_p=3.0, conv_impl='auto'):
  """num_classes is ignored: the output is a 4 * base_width descriptor (256 at full width)."""
  if norm not in NORMS:
    raise ValueError(f'model_kwargs.norm={norm!r}; allowed: {NORMS}')
  module = VprResNet(base_width=int(base_width), norm=norm, gn_groups=int(gn_groups),
                     bn_momentum=float(bn_momentum), gem_p=float(gem_p), conv_impl=conv_impl)
  return from_flax(module, 'vpr_resnet18', num_classes, input_shape, batch_stats=norm == 'bn', rbg_init=True)
