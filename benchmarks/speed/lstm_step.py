"""The LSTM layer of models/rnn.py against two other lowerings: gradient time of one batch, interleaved.

  .venv/bin/python -m benchmarks.speed.lstm_step [--repeats=7]

Variants (same equations, PyTorch gate order): `library` (rnn.LSTM: x_t W_ih + h W_hh inside the scan),
`precompute` (every step's input projection in one matmul before the scan, time-major), `flax`
(nn.RNN(nn.OptimizedLSTMCell)). Settings: the Shakespeare char-LSTM layer (batch 100, 80 steps, 100 -> 100)
and the StackOverflow word-LSTM layer (batch 16, 20 steps, 96 -> 670). Prints each variant's median time
as a ratio to `library` (measured in one process, rows interleaved; absolute times on a shared machine are
noise). Results: benchmarks/speed/README.throughput.md, "LSTM layer".
"""
import os
import time

from absl import app, flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.models import rnn

_REPEATS = flags.DEFINE_integer('repeats', 7, 'Interleaved rounds; the median is reported.')


class _Precompute(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x):
    w_ih = self.param('w_ih', nn.initializers.lecun_normal(), (x.shape[-1], 4 * self.hidden))
    w_hh = self.param('w_hh', nn.initializers.lecun_normal(), (self.hidden, 4 * self.hidden))
    b = self.param('b', nn.initializers.zeros, (4 * self.hidden,))
    xw = jnp.einsum('btf,fg->tbg', x, w_ih) + b

    def step(carry, xw_t):
      h, c = carry
      i, f, g, o = jnp.split(xw_t + h @ w_hh, 4, axis=-1)
      c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      h = jax.nn.sigmoid(o) * jnp.tanh(c)
      return (h, c), h
    z = jnp.zeros((x.shape[0], self.hidden))
    return jnp.swapaxes(jax.lax.scan(step, (z, z), xw)[1], 0, 1)


class _Flax(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x):
    return nn.RNN(nn.OptimizedLSTMCell(self.hidden))(x)


def _grad_fn(module, x):
  params = module.init(jax.random.key(0), x)
  g = jax.jit(jax.grad(lambda p: jnp.sum(module.apply(p, x) ** 2)))
  jax.block_until_ready(g(params))                       # compile outside the timing
  return lambda: jax.block_until_ready(g(params))


def main(argv):
  del argv
  print(f'uptime: {os.getloadavg()}')
  for name, (b, t, i, h) in (('char-LSTM layer', (100, 80, 100, 100)), ('word-LSTM layer', (16, 20, 96, 670))):
    x = jax.random.normal(jax.random.key(1), (b, t, i))
    fns = {'library': _grad_fn(rnn.LSTM(h, biases=1), x), 'precompute': _grad_fn(_Precompute(h), x),
           'flax': _grad_fn(_Flax(h), x)}
    times = {k: [] for k in fns}
    for _ in range(_REPEATS.value):
      for k, f in fns.items():
        s = time.perf_counter()
        for _ in range(3):
          f()
        times[k].append((time.perf_counter() - s) / 3)
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(f'{name} (batch {b}, {t} steps, {i} -> {h}): library {med["library"] * 1e3:.1f} ms; ratios to library: '
          + ', '.join(f'{k} {v / med["library"]:.2f}' for k, v in med.items()))


if __name__ == '__main__':
  app.run(main)
