"""Model registry: config name -> `Model` (pure init/apply). New models register here."""
from __future__ import annotations

from typing import Callable, Dict

from fedjax_flat.models import base, cnn

_BUILDERS: Dict[str, Callable[..., base.Model]] = {}


def register(name: str):
  def deco(fn):
    _BUILDERS[name] = fn
    return fn
  return deco


def names():
  return sorted(_BUILDERS)


def get_model(name: str, num_classes: int, input_shape: tuple, **kwargs) -> base.Model:
  if name not in _BUILDERS:
    raise ValueError(f'model={name!r} is unknown; allowed: {names()}')
  return _BUILDERS[name](num_classes=num_classes, input_shape=tuple(input_shape), **kwargs)


@register('cifar_cnn')
def _cifar_cnn(num_classes, input_shape, conv_impl='auto', pool_impl='auto'):
  return base.from_flax(cnn.CifarCNN(num_classes, conv_impl=conv_impl, pool_impl=pool_impl), 'cifar_cnn', num_classes, input_shape)


@register('digits_cnn')
def _digits_cnn(num_classes, input_shape, conv_impl='auto', gn_groups=0, pool_impl='auto'):
  return base.from_flax(cnn.DigitsCNN(num_classes, conv_impl=conv_impl, gn_groups=int(gn_groups),
                                      pool_impl=pool_impl), 'digits_cnn',
                        num_classes, input_shape)


@register('mlp')
def _mlp(num_classes, input_shape, hidden=(64,), conv_impl='auto'):
  del conv_impl
  return base.from_flax(cnn.MLP(num_classes, hidden=tuple(hidden)), 'mlp', num_classes, input_shape)


# --- Larger models of the papers: ResNet18-GN, ResNet20-GN, MobileNetV2-GN. ---
from fedjax_flat.models import mobilenet_v2 as _mobilenet_v2  # noqa: E402
from fedjax_flat.models import resnet as _resnet  # noqa: E402


@register('resnet18_gn')
def _resnet18_gn(num_classes, input_shape, conv_impl='auto', stem='cifar', gn_groups=2):
  module = _resnet.resnet18(num_classes, stem=stem, gn_groups=gn_groups, conv_impl=conv_impl)
  return base.from_flax(module, 'resnet18_gn', num_classes, input_shape)


@register('resnet20_gn')
def _resnet20_gn(num_classes, input_shape, conv_impl='auto', gn_groups=2, shortcut='A'):
  module = _resnet.resnet20(num_classes, gn_groups=gn_groups, shortcut=shortcut, conv_impl=conv_impl)
  return base.from_flax(module, 'resnet20_gn', num_classes, input_shape)


@register('mobilenet_v2_gn')
def _mobilenet_v2_gn(num_classes, input_shape, conv_impl='auto', gn_groups=8, width_mult=1.0,
                     dropout_rate=0.0):
  module = _mobilenet_v2.MobileNetV2(num_classes, width_mult=width_mult, gn_groups=gn_groups,
                                     dropout_rate=dropout_rate, conv_impl=conv_impl)
  return base.from_flax(module, 'mobilenet_v2_gn', num_classes, input_shape)


# --- The FedSeq chapter's FEMNIST CNN and language models (models/rnn.py). ---
from fedjax_flat.models import rnn as _rnn  # noqa: E402


@register('femnist_cnn')
def _femnist_cnn(num_classes, input_shape, conv_impl='auto', pool_impl='auto', variant='reddi'):
  return base.from_flax(cnn.FemnistCNN(num_classes, conv_impl=conv_impl, pool_impl=pool_impl, variant=variant),
                        'femnist_cnn', num_classes, input_shape)


@register('pfl_cnn')
def _pfl_cnn(num_classes, input_shape, conv_impl='auto', pool_impl='auto', dropout=True):
  return base.from_flax(cnn.PflCNN(num_classes, conv_impl=conv_impl, pool_impl=pool_impl, dropout=bool(dropout)),
                        'pfl_cnn', num_classes, input_shape)


@register('char_lstm')
def _char_lstm(num_classes, input_shape, conv_impl='auto', embed=8, hidden=100, num_layers=2, biases=2,
               readout='sequence'):
  del conv_impl   # num_classes = the extended vocabulary (inputs and outputs share it)
  return base.from_flax(_rnn.CharLSTM(num_classes, embed=embed, hidden=hidden, num_layers=num_layers,
                                      biases=biases, readout=readout), 'char_lstm', num_classes, input_shape)


@register('word_lstm')
def _word_lstm(num_classes, input_shape, conv_impl='auto', embed=96, hidden=670, biases=1, readout='sequence'):
  del conv_impl
  return base.from_flax(_rnn.WordLSTM(num_classes, embed=embed, hidden=hidden, biases=biases, readout=readout),
                        'word_lstm', num_classes, input_shape)
# --- Semantic segmentation: BiSeNetV2 (FedDrive), BatchNorm or GroupNorm. ---
from fedjax_flat.models import bisenetv2 as _bisenetv2  # noqa: E402


@register('bisenetv2')
def _bisenetv2_model(num_classes, input_shape, conv_impl='auto', norm='bn', gn_groups=8, bn_momentum=0.9,
                     aux=True, variant='feddrive', remat=False):
  if norm not in _bisenetv2.NORMS:
    raise ValueError(f'model_kwargs.norm={norm!r}; allowed: {_bisenetv2.NORMS}')
  if variant not in _bisenetv2.VARIANTS:
    raise ValueError(f'model_kwargs.variant={variant!r}; allowed: {_bisenetv2.VARIANTS}')
  if norm == 'gn':
    _bisenetv2.check_gn_groups(int(gn_groups))
  module = _bisenetv2.BiSeNetV2(num_classes, aux=bool(aux), variant=variant, norm=norm, gn_groups=int(gn_groups),
                                bn_momentum=float(bn_momentum), conv_impl=conv_impl, remat=bool(remat))
  return base.from_flax(module, 'bisenetv2', num_classes, input_shape, batch_stats=norm == 'bn', rbg_init=True)


from fedjax_flat.models import seg_cnn as _seg_cnn  # noqa: E402


@register('seg_cnn')
def _seg_cnn_model(num_classes, input_shape, conv_impl='auto', norm='bn', gn_groups=4, bn_momentum=0.9,
                   width=16, aux=True):
  if norm not in _seg_cnn.NORMS:
    raise ValueError(f'model_kwargs.norm={norm!r}; allowed: {_seg_cnn.NORMS}')
  module = _seg_cnn.SegCNN(num_classes, width=int(width), aux=bool(aux), norm=norm, gn_groups=int(gn_groups),
                           bn_momentum=float(bn_momentum), conv_impl=conv_impl)
  return base.from_flax(module, 'seg_cnn', num_classes, input_shape, batch_stats=norm == 'bn')


def uses_batch_stats(name: str, kwargs) -> bool:
  """Whether the model carries BatchNorm running statistics in its params (known from the config alone)."""
  return name in ('bisenetv2', 'seg_cnn') and dict(kwargs or {}).get('norm', 'bn') == 'bn'
