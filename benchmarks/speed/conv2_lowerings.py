"""The paper CNN's second convolution (5 x 5, 64 -> 64 channels on 14 x 14, B = 64) under four lowerings, forward
and backward inside a scan of 8 local steps, as the client rounds run it (issue 27 section 1's "conv2 patch
materialisation" lever):

  im2col  the default: one [B, 10, 10, 1600] patch matrix, one GEMM (models/layers.Conv)
  rows    only the 5 column shifts concatenated ([B, 14, 10, 320], 5x less patch memory), 5 GEMMs over row shifts
  shifts  no patch matrix: 25 GEMMs of K = 64, one per kernel offset, accumulated
  lax     lax.conv_general_dilated (XLA:CPU's convolution)

  python -m benchmarks.speed.conv2_lowerings [--repeats=7]

Prints the median and minimum ms per step of each (interleaving is not needed: each is one jitted program timed
back to back on a quiet machine); all four outputs are checked equal first.
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.speed import bench_util

B, H, W, C, O, K = 64, 14, 14, 64, 64, 5
OH = OW = H - K + 1


def im2col(x, w):
  p = jnp.concatenate([x[:, i:i + OH, j:j + OW, :] for i in range(K) for j in range(K)], -1)
  return p @ w.reshape(K * K * C, O)


def rows(x, w):
  r = jnp.concatenate([x[:, :, j:j + OW, :] for j in range(K)], -1)
  wr = w.reshape(K, K * C, O)
  return sum(r[:, i:i + OH] @ wr[i] for i in range(K))


def shifts(x, w):
  return sum(x[:, i:i + OH, j:j + OW, :] @ w[i, j] for i in range(K) for j in range(K))


def lax(x, w):
  return jax.lax.conv_general_dilated(x, w, (1, 1), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))


LOWERINGS = {'im2col': im2col, 'rows': rows, 'shifts': shifts, 'lax': lax}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--repeats', type=int, default=7)
  a = ap.parse_args()
  x = jnp.asarray(np.random.RandomState(0).randn(B, H, W, C).astype(np.float32))
  w = jnp.asarray(np.random.RandomState(1).randn(K, K, C, O).astype(np.float32) * 0.05)
  ref = np.asarray(im2col(x, w))
  print(bench_util.uptime(), flush=True)
  for name, f in LOWERINGS.items():
    np.testing.assert_allclose(np.asarray(f(x, w)), ref, rtol=1e-3, atol=1e-3)

    def loss(w, x, f=f):
      return jnp.sum(jnp.tanh(f(x, w)))

    @jax.jit
    def steps(w, x):
      def body(w, _):
        gw, gx = jax.grad(loss, argnums=(0, 1))(w, x)
        return w - 1e-4 * gw, jnp.sum(gx)
      return jax.lax.scan(body, w, None, length=8)

    jax.block_until_ready(steps(w, x))
    ts = []
    for _ in range(a.repeats):
      t = time.perf_counter()
      jax.block_until_ready(steps(w, x))
      ts.append(time.perf_counter() - t)
    print(f'{name:7s} ms/step median {1e3 * np.median(ts) / 8:.2f}  min {1e3 * min(ts) / 8:.2f}', flush=True)
  print(bench_util.uptime(), flush=True)


if __name__ == '__main__':
  main()
