"""Recurrent language models of the FedSeq chapter: the Shakespeare char-LSTM and the StackOverflow word-LSTM.

Inputs are token ids [B, T] (any integer or float dtype holding ids; cast here, so the engine's float
`sample_x` initializes them too); outputs are logits [B, T, V] (`readout='sequence'`, every position
predicts the next token) or [B, V] (`readout='last'`, the last position only: the LEAF / FedSeq-release
protocol, one next character per 80-character window).

Sequence masking: sentences are right-padded and the LSTM is causal, so padding positions never change the
outputs at real positions; the loss and metrics skip pad targets (text_tasks.NextToken). That is what
Keras's `mask_zero=True` achieves in TFF's models, without a per-step carry-over select.

LSTM: gates (i, f, g, o) = x W_ih + b_ih + h W_hh (+ b_hh), PyTorch's gate order and init
(uniform +-1/sqrt(hidden) for every weight and bias). `biases=2` is PyTorch's nn.LSTM (two bias vectors,
the FedSeq release's models), `biases=1` is Keras's / Flax's (one bias); the two compute the same family of
functions and differ only in the parameter count. A `lax.scan` over time computes x_t W_ih + h W_hh in each
step: measured on CPU (benchmarks/speed/lstm_step.py, interleaved), projecting every step's input up front in one
matmul took 1.3-1.4x the time of the char-LSTM layer's gradient and 0.9-1.0x the word-LSTM layer's; Flax's
nn.RNN(OptimizedLSTMCell) 1.05-1.1x both.

Parameter counts (tests/test_models_text.py recomputes them from the reference definitions):
  char_lstm  (vocab 90, embed 8, 2 x LSTM 100, biases=2, dense 90)            134,610 (FedSeq release, torch)
  word_lstm  (vocab 10,004, embed 96, LSTM 670, biases=1, dense 96, dense 10,004) 4,050,748 (Reddi et al. 2021)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import flax.linen as nn

from fedjax_flat.models.layers import Dense
from fedjax_flat.models.base import from_flax
from fedjax_flat.models.registry import register


def _uniform(scale):
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -scale, scale)


class LSTM(nn.Module):
  """One LSTM layer over a sequence: x [B, T, F] -> h [B, T, hidden] (zero initial state)."""
  hidden: int
  biases: int = 2

  @nn.compact
  def __call__(self, x):
    h4 = 4 * self.hidden
    init = _uniform(1.0 / self.hidden ** 0.5)
    w_ih = self.param('w_ih', init, (x.shape[-1], h4))
    w_hh = self.param('w_hh', init, (self.hidden, h4))
    b = self.param('b_ih', init, (h4,))
    if self.biases == 2:
      b = b + self.param('b_hh', init, (h4,))
    elif self.biases != 1:
      raise ValueError(f'biases={self.biases}; allowed: 1 (Keras/Flax) or 2 (PyTorch)')

    def step(carry, x_t):
      h, c = carry
      i, f, g, o = jnp.split(x_t @ w_ih + h @ w_hh + b, 4, axis=-1)
      c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      h = (jax.nn.sigmoid(o) * jnp.tanh(c)).astype(x.dtype)
      return (h, c), h

    # The cell state, a running sum over the sequence, is carried in at least float32 (bfloat16 compute:
    # models/base.py's mixed precision); h, the matmuls' input, in the compute dtype.
    h0 = jnp.zeros((x.shape[0], self.hidden), x.dtype)
    c0 = jnp.zeros((x.shape[0], self.hidden), jnp.promote_types(x.dtype, jnp.float32))
    _, hs = jax.lax.scan(step, (h0, c0), jnp.swapaxes(x, 0, 1))
    return jnp.swapaxes(hs, 0, 1)


def _ids(x):
  return x.astype(jnp.int32).reshape(x.shape[0], -1)


def _readout(h, readout: str):
  """'sequence': every position's output [B, T, H]; 'last': the last position's [B, H]."""
  if readout not in ('sequence', 'last'):
    raise ValueError(f"readout={readout!r}; allowed: 'sequence', 'last'")
  return h[:, -1] if readout == 'last' else h


class CharLSTM(nn.Module):
  """Embedding(vocab, 8) -> num_layers x LSTM(100) -> Dense(vocab): the FedSeq Shakespeare model."""
  vocab_size: int = 90
  embed: int = 8
  hidden: int = 100
  num_layers: int = 2
  biases: int = 2
  readout: str = 'sequence'

  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.Embed(self.vocab_size, self.embed, embedding_init=nn.initializers.normal(1.0))(_ids(x))
    for i in range(self.num_layers):
      h = LSTM(self.hidden, self.biases, name=f'lstm_{i}')(h)
    return Dense(self.vocab_size, torch_init=True)(_readout(h, self.readout))


class WordLSTM(nn.Module):
  """Embedding(vocab, 96) -> LSTM(670) -> Dense(96) -> Dense(vocab): Reddi et al.'s StackOverflow model."""
  vocab_size: int = 10004
  embed: int = 96
  hidden: int = 670
  biases: int = 1
  readout: str = 'sequence'

  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.Embed(self.vocab_size, self.embed, embedding_init=nn.initializers.normal(1.0))(_ids(x))
    h = LSTM(self.hidden, self.biases, name='lstm')(h)
    h = Dense(self.embed, torch_init=True)(_readout(h, self.readout))
    return Dense(self.vocab_size, torch_init=True)(h)


# --- Registered builders: config.model name -> Model (models/registry.py). ---

@register('char_lstm', token_ids=True)
def _char_lstm(num_classes, input_shape, conv_impl='auto', embed=8, hidden=100, num_layers=2, biases=2,
               readout='sequence'):
  del conv_impl   # num_classes = the extended vocabulary (inputs and outputs share it)
  return from_flax(CharLSTM(num_classes, embed=embed, hidden=hidden, num_layers=num_layers,
                                      biases=biases, readout=readout), 'char_lstm', num_classes, input_shape)


@register('word_lstm', token_ids=True)
def _word_lstm(num_classes, input_shape, conv_impl='auto', embed=96, hidden=670, biases=1, readout='sequence'):
  del conv_impl
  return from_flax(WordLSTM(num_classes, embed=embed, hidden=hidden, biases=biases, readout=readout),
                        'word_lstm', num_classes, input_shape)
