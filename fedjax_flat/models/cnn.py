"""The FedSAM paper's CIFAR CNN ("LeNet5-like", Hsu et al. 2020) and a small CNN for 8x8 digits."""
from __future__ import annotations

import flax.linen as nn

from fedjax_flat.models.layers import Conv, Dense, max_pool
from fedjax_flat.models.resnet import group_norm
from fedjax_flat.models.base import from_flax
from fedjax_flat.models.registry import register


def _act(module: nn.Module, y):
  """ReLU whose output is sown for MAN (hidden post-activation outputs)."""
  y = nn.relu(y)
  module.sow('intermediates', 'act', y)
  return y


class CifarCNN(nn.Module):
  """conv5x5-64 VALID, ReLU, maxpool2, conv5x5-64 VALID, ReLU, maxpool2, fc384, fc192, fc classes.

  797,962 parameters for 10 classes, 815,332 for 100 (digest section 2.8). PyTorch default init, as the
  reference code.
  """
  num_classes: int = 10
  conv_impl: str = 'auto'
  pool_impl: str = 'auto'   # layers.max_pool: 'reshape' (same numbers, cheap gradient on CPU) | 'lax'

  @nn.compact
  def __call__(self, x, train: bool = False):
    pool = lambda y: max_pool(y, (2, 2), pool_impl=self.pool_impl, conv_impl=self.conv_impl)
    x = Conv(64, (5, 5), conv_impl=self.conv_impl, torch_init=True)(x)
    x = pool(_act(self, x))
    x = Conv(64, (5, 5), conv_impl=self.conv_impl, torch_init=True)(x)
    x = pool(_act(self, x))
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

  @nn.compact
  def __call__(self, x, train: bool = False):
    norm = (lambda y, i: group_norm(y, self.gn_groups, name=f'GroupNorm_{i}')) if self.gn_groups else (
        lambda y, i: y)
    x = _act(self, norm(Conv(32, (3, 3), padding='SAME', conv_impl=self.conv_impl)(x), 0))
    x = _act(self, norm(Conv(32, (3, 3), padding='SAME', conv_impl=self.conv_impl)(x), 1))
    x = max_pool(x, (2, 2), pool_impl=self.pool_impl, conv_impl=self.conv_impl)
    x = x.reshape(x.shape[:-3] + (-1,))
    x = _act(self, Dense(128)(x))
    return Dense(self.num_classes)(x)


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


# --- Registered builders: config.model name -> Model (models/registry.py). ---

@register('cifar_cnn')
def _cifar_cnn(num_classes, input_shape, conv_impl='auto', pool_impl='auto'):
  return from_flax(CifarCNN(num_classes, conv_impl=conv_impl, pool_impl=pool_impl), 'cifar_cnn', num_classes,
                   input_shape)


@register('digits_cnn')
def _digits_cnn(num_classes, input_shape, conv_impl='auto', gn_groups=0, pool_impl='auto'):
  return from_flax(DigitsCNN(num_classes, conv_impl=conv_impl, gn_groups=int(gn_groups),
                                      pool_impl=pool_impl), 'digits_cnn',
                        num_classes, input_shape)


@register('mlp')
def _mlp(num_classes, input_shape, hidden=(64,), conv_impl='auto'):
  del conv_impl
  return from_flax(MLP(num_classes, hidden=tuple(hidden)), 'mlp', num_classes, input_shape)


@register('femnist_cnn')
def _femnist_cnn(num_classes, input_shape, conv_impl='auto', pool_impl='auto', variant='reddi'):
  return from_flax(FemnistCNN(num_classes, conv_impl=conv_impl, pool_impl=pool_impl, variant=variant),
                        'femnist_cnn', num_classes, input_shape)
