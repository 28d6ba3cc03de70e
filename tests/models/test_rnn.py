"""The FedSeq chapter's models: parameter counts from the reference definitions, shapes, the LSTM against a
numpy PyTorch-equation reference, causality (right padding changes nothing before it), dropout keys."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.models import registry, rnn
from tests.fixtures import arrays


def _torch_lstm(i, h):      # nn.LSTM layer: weight_ih [4h, i], weight_hh [4h, h], bias_ih, bias_hh
  return 4 * h * (i + h) + 8 * h


def _keras_lstm(i, h):      # keras.layers.LSTM: kernel, recurrent_kernel, one bias
  return 4 * h * (i + h) + 4 * h


def _dense(i, o):
  return i * o + o


def _init(name, classes, shape, **kw):
  m = registry.get_model(name, classes, shape, **kw)
  return m, jax.jit(m.init)(jax.random.key(0), jnp.zeros((1,) + shape, jnp.float32))


def _shapes(name, classes, shape, x_dtype=jnp.float32, **kw):
  """(number of parameters, output shape) by abstract evaluation only (nothing compiled or run)."""
  m = registry.get_model(name, classes, shape, **kw)
  p = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1,) + shape, jnp.float32))
  out = jax.eval_shape(lambda p, x: m.apply(p, x), p, jax.ShapeDtypeStruct((3,) + shape, x_dtype))
  return sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(p)), out.shape


def test_femnist_cnn_count_and_shapes():
  # Reddi et al. EMNIST CNN: conv3x3 1->32, conv3x3 32->64 (28 -> 26 -> 24), pool -> 12x12x64, fc 128, fc 62.
  want = (9 * 1 * 32 + 32) + (9 * 32 * 64 + 64) + _dense(12 * 12 * 64, 128) + _dense(128, 62)
  for variant in ('reddi', 'fedseq_release'):
    assert _shapes('femnist_cnn', 62, (28, 28, 1), variant=variant) == (want, (3, 62))
  assert want == 1_206_590


def test_femnist_dropout_draws_from_the_step_key():
  m, p = _init('femnist_cnn', 62, (28, 28, 1))
  x = arrays.uniform(1, (4, 28, 28, 1))
  run = jax.jit(lambda p, x, k, train: m.apply(p, x, train=train, rng=k), static_argnums=3)
  a = run(p, x, jax.random.key(2), True)
  np.testing.assert_array_equal(a, run(p, x, jax.random.key(2), True))
  assert not np.allclose(a, run(p, x, jax.random.key(3), True))
  np.testing.assert_array_equal(run(p, x, jax.random.key(2), False), run(p, x, jax.random.key(3), False))


def test_char_lstm_count_matches_fedseq_release():
  # ShakespeareRnn: Embedding(90, 8), nn.LSTM(8, 100, num_layers=2), Linear(100, 90).
  want = 90 * 8 + _torch_lstm(8, 100) + _torch_lstm(100, 100) + _dense(100, 90)
  assert _shapes('char_lstm', 90, (80,), jnp.int16) == (want, (3, 80, 90))
  assert _shapes('char_lstm', 90, (80,), jnp.int16, readout='last') == (want, (3, 90))
  assert want == 134_610


def test_word_lstm_count_matches_reddi():
  # TFF/Reddi et al.: Embedding(10004, 96), LSTM(670), Dense(96), Dense(10004): 4,050,748 parameters.
  want = 10004 * 96 + _keras_lstm(96, 670) + _dense(670, 96) + _dense(96, 10004)
  assert _shapes('word_lstm', 10004, (20,), jnp.int32) == (want, (3, 20, 10004))
  assert want == 4_050_748


def _np_lstm(x, w_ih, w_hh, b):
  """PyTorch's equations, gate order (i, f, g, o), zero initial state."""
  sig = lambda z: 1 / (1 + np.exp(-z))   # noqa: E731
  h = np.zeros((x.shape[0], w_hh.shape[0]))
  c = np.zeros_like(h)
  out = []
  for t in range(x.shape[1]):
    i, f, g, o = np.split(x[:, t] @ w_ih + h @ w_hh + b, 4, axis=-1)
    c = sig(f) * c + sig(i) * np.tanh(g)
    h = sig(o) * np.tanh(c)
    out.append(h)
  return np.stack(out, 1)


@pytest.mark.parametrize('biases', [1, 2])
def test_lstm_layer_matches_numpy(biases):
  layer = rnn.LSTM(5, biases)
  x = arrays.normal(0, (3, 7, 4))
  v = jax.jit(layer.init)(jax.random.key(1), x)
  p = jax.tree.map(np.asarray, v['params'])
  b = p['b_ih'] + (p['b_hh'] if biases == 2 else 0)
  np.testing.assert_allclose(jax.jit(layer.apply)(v, x), _np_lstm(np.asarray(x, np.float64), p['w_ih'], p['w_hh'], b),
                             atol=1e-5)
  bound = 1 / np.sqrt(5)                      # PyTorch's init: U(-1/sqrt(hidden), 1/sqrt(hidden))
  assert all(np.abs(a).max() <= bound for a in p.values())


def test_right_padding_never_changes_earlier_positions():
  m, p = _init('word_lstm', 30, (6,), hidden=8, embed=4)
  x = jnp.array([[5, 6, 7, 0, 0, 0]])
  y = jnp.array([[5, 6, 7, 9, 9, 1]])
  run = jax.jit(m.apply)
  np.testing.assert_allclose(run(p, x)[:, :3], run(p, y)[:, :3], atol=1e-6)
