"""The FedSAM paper's CIFAR CNN ("LeNet5-like", Hsu et al. 2020), MAN's Tiny-ImageNet ConvNet, the FEMNIST CNNs
(Reddi et al., McMahan et al.), the pfl-research CNN, and a small CNN for 8x8 digits."""
from __future__ import annotations

import flax.linen as nn

from fedjax_flat.models.layers import Conv, Dense, max_pool, relu_max_pool
from fedjax_flat.models.resnet import group_norm
from fedjax_flat.models.base import from_flax
from fedjax_flat.models.registry import register


def _act(module: nn.Module, y):
  """ReLU whose output is sown for MAN (hidden post-activation outputs)."""
  y = nn.relu(y)
  module.sow('intermediates', 'act', y)
  return y


def _act_pool(module: nn.Module, y, pool_impl: str, conv_impl: str):
  """max_pool(_act(y), 2x2); with the module's `fused_relu_pool` one fused ReLU + pool (same values and
  gradients), unless the ReLU output is being collected (MAN's 'intermediates')."""
  if module.is_mutable_collection('intermediates') or not module.fused_relu_pool:
    return max_pool(_act(module, y), (2, 2), pool_impl=pool_impl, conv_impl=conv_impl)
  return relu_max_pool(y, (2, 2), pool_impl=pool_impl, conv_impl=conv_impl)


class CifarCNN(nn.Module):
  """conv5x5-64 VALID, ReLU, maxpool2, conv5x5-64 VALID, ReLU, maxpool2, fc384, fc192, fc classes.

  797,962 parameters for 10 classes, 815,332 for 100 (digest section 2.8). PyTorch default init, as the
  reference code.
  """
  num_classes: int = 10
  conv_impl: str = 'auto'
  pool_impl: str = 'auto'   # layers.max_pool: 'reshape' (same numbers, cheap gradient on CPU) | 'lax'
  # ReLU + pool as one op (layers.relu_max_pool; same numbers). Off: measured 0.44x (SGD) / 0.50x (SAM) of the
  # two ops on the CPU step (benchmarks/README.cnn_step.md); kept selectable for other backends' measurements.
  fused_relu_pool: bool = False

  @nn.compact
  def __call__(self, x, train: bool = False):
    act_pool = lambda y: _act_pool(self, y, self.pool_impl, self.conv_impl)
    x = act_pool(Conv(64, (5, 5), conv_impl=self.conv_impl, torch_init=True)(x))
    x = act_pool(Conv(64, (5, 5), conv_impl=self.conv_impl, torch_init=True)(x))
    x = x.reshape(x.shape[:-3] + (-1,))
    x = _act(self, Dense(384, torch_init=True)(x))
    x = _act(self, Dense(192, torch_init=True)(x))
    return Dense(self.num_classes, torch_init=True)(x)


class DigitsCNN(nn.Module):
  """A small CNN for the 8x8x1 embedded digits: conv3x3-32, [GN], ReLU, conv3x3-32, [GN], ReLU, maxpool2, fc128, fc.

  gn_groups > 0 adds GroupNorm after each conv (normalization params for FedBN / local-norm experiments at
  quickstart size); 0 (default) is the plain network.
  """
  num_classes: int = 10
  conv_impl: str = 'auto'
  gn_groups: int = 0
  pool_impl: str = 'auto'
  fused_relu_pool: bool = False   # as CifarCNN's

  @nn.compact
  def __call__(self, x, train: bool = False):
    norm = (lambda y, i: group_norm(y, self.gn_groups, name=f'GroupNorm_{i}')) if self.gn_groups else (
        lambda y, i: y)
    x = _act(self, norm(Conv(32, (3, 3), padding='SAME', conv_impl=self.conv_impl)(x), 0))
    x = _act_pool(self, norm(Conv(32, (3, 3), padding='SAME', conv_impl=self.conv_impl)(x), 1), self.pool_impl,
                  self.conv_impl)
    x = x.reshape(x.shape[:-3] + (-1,))
    x = _act(self, Dense(128)(x))
    return Dense(self.num_classes)(x)


MAN_MEASURES = ('paper', 'release')     # model_kwargs.man_measure of man_convnet (validated in config/validate.py)


class ManConvNet(nn.Module):
  """MAN's Tiny-ImageNet "ConvNet" (seed 003, digest B5): three blocks of conv3x3-64 (pad 1), GroupNorm(4),
  ReLU, maxpool2, then fc 512, ReLU, fc 384, ReLU, fc classes. 2,447,688 parameters for 200 classes at
  64x64x3 (64 x 8 x 8 = 4096 features into the first fc). Every ReLU output is sown for MAN.

  man_measure: 'paper' (MAN's Eq. 17: block 3's activation measured after its ReLU, before pooling) | 'release'
  (the authors' code measures block 3 after its max-pool: a 21% larger regularizer on the digest's check; for
  reproducing numbers published with that code; model_kwargs.man_measure).
  """
  num_classes: int = 200
  conv_impl: str = 'auto'
  pool_impl: str = 'auto'
  gn_groups: int = 4
  fused_relu_pool: bool = False   # as CifarCNN's
  man_measure: str = 'paper'

  @nn.compact
  def __call__(self, x, train: bool = False):
    if self.man_measure not in MAN_MEASURES:
      raise ValueError(f'man_measure={self.man_measure!r}; allowed: {MAN_MEASURES}')
    for i in range(3):
      y = Conv(64, (3, 3), padding='SAME', conv_impl=self.conv_impl, torch_init=True)(x)
      y = group_norm(y, self.gn_groups, name=f'GroupNorm_{i}')
      if i == 2 and self.man_measure == 'release':    # the release: block 3 measured after its pooling
        x = max_pool(nn.relu(y), (2, 2), pool_impl=self.pool_impl, conv_impl=self.conv_impl)
        self.sow('intermediates', 'act', x)
        continue
      x = _act_pool(self, y, self.pool_impl, self.conv_impl)
    x = x.reshape(x.shape[:-3] + (-1,))
    x = _act(self, Dense(512, torch_init=True)(x))
    x = _act(self, Dense(384, torch_init=True)(x))
    return Dense(self.num_classes, torch_init=True)(x)


class MLP(nn.Module):
  """A plain MLP (tests, Hessian checks against dense `jax.hessian`)."""
  num_classes: int = 10
  hidden: tuple = (64,)

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = x.reshape(x.shape[:-3] + (-1,)) if x.ndim >= 3 else x
    for h in self.hidden:
      x = _act(self, nn.Dense(h)(x))
    return nn.Dense(self.num_classes)(x)


class FemnistCNN(nn.Module):
  """The EMNIST/FEMNIST CNN of Reddi et al. 2021 (used by FedSeq): conv3x3-32 VALID, ReLU, conv3x3-64 VALID,
  ReLU, maxpool2, dropout 0.25, fc128, ReLU, dropout 0.5, fc classes. 1,206,590 parameters for 62 classes.

  `variant='fedseq_release'` drops the ReLUs after the first conv and after fc128, as the FedSeq release's
  `emnistCNN.forward` does (same parameters, a different function). Dropout draws from the step's `rng`
  (the engine passes one key per client and step), PyTorch default init as that release.
  """
  num_classes: int = 62
  conv_impl: str = 'auto'
  pool_impl: str = 'auto'
  variant: str = 'reddi'

  @nn.compact
  def __call__(self, x, train: bool = False):
    if self.variant not in ('reddi', 'fedseq_release'):
      raise ValueError(f"variant={self.variant!r}; allowed: 'reddi', 'fedseq_release'")
    act = (lambda y: _act(self, y)) if self.variant == 'reddi' else (lambda y: y)
    x = act(Conv(32, (3, 3), conv_impl=self.conv_impl, torch_init=True)(x))
    x = _act(self, Conv(64, (3, 3), conv_impl=self.conv_impl, torch_init=True)(x))
    x = max_pool(x, (2, 2), pool_impl=self.pool_impl, conv_impl=self.conv_impl)
    x = nn.Dropout(0.25, deterministic=not train)(x)
    x = x.reshape(x.shape[:-3] + (-1,))
    x = act(Dense(128, torch_init=True)(x))
    x = nn.Dropout(0.5, deterministic=not train)(x)
    return Dense(self.num_classes, torch_init=True)(x)


class McMahanCNN(nn.Module):
  """The "2-layer CNN" of McMahan et al. 2017 (FedAvg paper) for 28x28 (F)EMNIST, used by the thesis' WiMA
  FEMNIST runs: conv5x5-32 SAME, ReLU, maxpool2, conv5x5-64 SAME, ReLU, maxpool2, fc512, ReLU, fc classes.

  28 -> 14 -> 7, so fc512 sees 7*7*64 = 3,136 features: 832 + 51,264 + 1,606,144 + 31,806 = 1,690,046
  parameters for 62 classes. Init [U: not stated]: PyTorch default, as the other thesis CNNs here.
  """
  num_classes: int = 62
  conv_impl: str = 'auto'
  pool_impl: str = 'auto'

  @nn.compact
  def __call__(self, x, train: bool = False):
    for feats in (32, 64):
      y = Conv(feats, (5, 5), padding='SAME', conv_impl=self.conv_impl, torch_init=True)(x)
      x = max_pool(_act(self, y), (2, 2), pool_impl=self.pool_impl, conv_impl=self.conv_impl)
    x = x.reshape(x.shape[:-3] + (-1,))
    x = _act(self, Dense(512, torch_init=True)(x))
    return Dense(self.num_classes, torch_init=True)(x)


class PflCNN(nn.Module):
  """pfl-research's CIFAR10 benchmark CNN (`simple_cnn`, apple/pfl-research benchmarks/model/{tf2,pytorch}/cnn.py):
  conv3x3-32 VALID, ReLU, conv3x3-64 VALID, ReLU, maxpool2, dropout 0.25, fc128, ReLU, dropout 0.5, fc classes.

  VALID convolutions as the reference (Keras' default; torch's padding 0): 32 -> 30 -> 28 -> pool 14, so fc128
  sees 14*14*64 = 12,544 features; 1,626,442 parameters for 10 classes. Init as the TF2 reference (Keras
  defaults): Glorot-uniform kernels, zero biases (its PyTorch port applies xavier_uniform_ to the weights and
  keeps torch's default biases). Flattened in HWC order (the TF2 reference; the PyTorch port flattens CHW: the
  same function class, fc128's rows permuted). Dropout draws from the step's `rng` (the engine passes one key
  per client and step); `dropout=False` removes both dropout layers (exact comparisons against references).
  """
  num_classes: int = 10
  conv_impl: str = 'auto'
  pool_impl: str = 'auto'
  dropout: bool = True

  @nn.compact
  def __call__(self, x, train: bool = False):
    glorot = nn.initializers.xavier_uniform()
    drop = lambda rate, y: nn.Dropout(rate, deterministic=not train)(y) if self.dropout else y  # noqa: E731
    x = _act(self, Conv(32, (3, 3), conv_impl=self.conv_impl, kernel_init=glorot)(x))
    x = _act(self, Conv(64, (3, 3), conv_impl=self.conv_impl, kernel_init=glorot)(x))
    x = max_pool(x, (2, 2), pool_impl=self.pool_impl, conv_impl=self.conv_impl)
    x = drop(0.25, x)
    x = x.reshape(x.shape[:-3] + (-1,))
    x = _act(self, Dense(128, kernel_init=glorot)(x))
    x = drop(0.5, x)
    return Dense(self.num_classes, kernel_init=glorot)(x)


# --- Registered builders: config.model name -> Model (models/registry.py). ---

@register('cifar_cnn', head=(('Dense_2',),))
def _cifar_cnn(num_classes, input_shape, conv_impl='auto', pool_impl='auto', fused_relu_pool=False):
  return from_flax(CifarCNN(num_classes, conv_impl=conv_impl, pool_impl=pool_impl,
                            fused_relu_pool=bool(fused_relu_pool)), 'cifar_cnn', num_classes, input_shape)


@register('digits_cnn', head=(('Dense_1',),))
def _digits_cnn(num_classes, input_shape, conv_impl='auto', gn_groups=0, pool_impl='auto', fused_relu_pool=False):
  return from_flax(DigitsCNN(num_classes, conv_impl=conv_impl, gn_groups=int(gn_groups),
                             pool_impl=pool_impl, fused_relu_pool=bool(fused_relu_pool)), 'digits_cnn',
                   num_classes, input_shape)


@register('man_convnet', head=(('Dense_2',),))
def _man_convnet(num_classes, input_shape, conv_impl='auto', pool_impl='auto', gn_groups=4, man_measure='paper'):
  return from_flax(ManConvNet(num_classes, conv_impl=conv_impl, pool_impl=pool_impl, gn_groups=int(gn_groups),
                              man_measure=str(man_measure)),
                   'man_convnet', num_classes, input_shape)


@register('mlp', head=lambda kw: ((f"Dense_{len(tuple(kw.get('hidden', (64,))))}",),))
def _mlp(num_classes, input_shape, hidden=(64,), conv_impl='auto'):
  del conv_impl
  return from_flax(MLP(num_classes, hidden=tuple(hidden)), 'mlp', num_classes, input_shape)


@register('femnist_cnn', head=(('Dense_1',),))
def _femnist_cnn(num_classes, input_shape, conv_impl='auto', pool_impl='auto', variant='reddi'):
  return from_flax(FemnistCNN(num_classes, conv_impl=conv_impl, pool_impl=pool_impl, variant=variant),
                        'femnist_cnn', num_classes, input_shape)


@register('pfl_cnn', head=(('Dense_1',),))
def _pfl_cnn(num_classes, input_shape, conv_impl='auto', pool_impl='auto', dropout=True):
  return from_flax(PflCNN(num_classes, conv_impl=conv_impl, pool_impl=pool_impl, dropout=bool(dropout)),
                   'pfl_cnn', num_classes, input_shape)


@register('mcmahan_cnn', head=(('Dense_1',),))
def _mcmahan_cnn(num_classes, input_shape, conv_impl='auto', pool_impl='auto'):
  return from_flax(McMahanCNN(num_classes, conv_impl=conv_impl, pool_impl=pool_impl), 'mcmahan_cnn', num_classes,
                   input_shape)
