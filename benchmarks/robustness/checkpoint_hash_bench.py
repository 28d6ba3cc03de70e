"""Cost of the checkpoint content hashes (training/checkpoint.py, SHA-256 per leaf) next to what a save
already pays: the host copy of the same leaves, measured interleaved in one process.

States: the CIFAR CNN server state with momentum (2 x 797,962 float32), and a SCAFFOLD-like client-state
store of 100 clients x the CIFAR CNN (319 MB). Per repeat: host copy (`_host_leaves`, what save() does first),
then `_digests` (save: hash; restore: verify), then the copy again; the medians are reported with their ratio.

  .venv/bin/python -m benchmarks.robustness.checkpoint_hash_bench [--repeats=5]
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.models.registry import get_model
from fedjax_flat.training import checkpoint as ckpt_lib


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--repeats', type=int, default=5)
  args = ap.parse_args()
  model = get_model('cifar_cnn', 10, (32, 32, 3))
  params = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  server = {'params': params, 'momentum': jax.tree_util.tree_map(jnp.ones_like, params)}
  store = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (100,) + a.shape) + 0.0, params)
  print(f'{"state":28s} {"MB":>7s} {"copy ms":>8s} {"sha256 ms":>10s} {"hash/copy":>9s}')
  for name, tree in (('CIFAR CNN server + momentum', server), ('100-client store (CIFAR CNN)', store)):
    jax.block_until_ready(tree)
    copy, hashing = [], []
    for _ in range(args.repeats):
      t = time.perf_counter()
      leaves = ckpt_lib._host_leaves(tree)              # pylint: disable=protected-access
      copy.append(time.perf_counter() - t)
      t = time.perf_counter()
      ckpt_lib._digests(leaves)                         # pylint: disable=protected-access
      hashing.append(time.perf_counter() - t)
    mb = sum(a.nbytes for a in leaves) / 2**20
    c, h = float(np.median(copy)), float(np.median(hashing))
    print(f'{name:28s} {mb:7.1f} {1e3 * c:8.1f} {1e3 * h:10.1f} {h / c:9.2f}')


if __name__ == '__main__':
  main()
