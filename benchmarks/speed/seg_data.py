"""Segmentation data pipeline costs at Cityscapes size (1024 x 2048), interleaved in one process.

Host: decoding a client of Cityscapes-sized PNG pairs sequentially (`client_examples`) vs ahead on the
thread pool (`prefetch_clients`, 2 workers). Device: one training transform of a batch (make_seg_augment:
scale 0.5-1.5 + 512 x 1024 crop + jitter + normalize; + LAB / + CFSI on half the batch) against the eval
transform (normalize only) of the same batch. Images are synthetic (smooth gradients + noise, so the PNGs
compress like photos, about 4 MB each) in the official Cityscapes layout.

  .venv/bin/python -m benchmarks.speed.seg_data [--clients=4 --per_client=3 --batch=4 --repeats=3]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax
import numpy as np
from PIL import Image

from fedjax_flat.data.transforms import augment as A, style_transfer as S

from fedjax_flat.data.sources import cityscapes


def write_files(root, clients, per_client, h=1024, w=2048, seed=0):
  rng = np.random.default_rng(seed)
  yy, xx = np.mgrid[0:h, 0:w]
  base = np.stack([xx / w, yy / h, (xx + yy) / (h + w)], -1) * 200
  for split, cities in (('train', {f'city{c}': per_client for c in range(clients)}), ('val', {'valcity': 1})):
    for city, n in cities.items():
      for d in ('leftImg8bit', 'gtFine'):
        os.makedirs(os.path.join(root, d, split, city), exist_ok=True)
      for i in range(n):
        img = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        lab = np.kron(rng.integers(0, 34, (h // 64, w // 64)), np.ones((64, 64), np.int64)).astype(np.uint8)
        stem = f'{city}_{i:06d}_000019'
        Image.fromarray(img).save(os.path.join(root, 'leftImg8bit', split, city, f'{stem}_leftImg8bit.png'))
        Image.fromarray(lab, mode='L').save(os.path.join(root, 'gtFine', split, city, f'{stem}_gtFine_labelIds.png'))


def timed(fn):
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--clients', type=int, default=4)
  ap.add_argument('--per_client', type=int, default=3)
  ap.add_argument('--batch', type=int, default=4)
  ap.add_argument('--repeats', type=int, default=3)
  args = ap.parse_args()
  print('uptime:', os.popen('uptime').read().strip())
  with tempfile.TemporaryDirectory() as d:
    write_files(os.path.join(d, 'cityscapes'), args.clients, args.per_client)
    src = cityscapes.load(d, distribution='heterogeneous', clients_per_city=1, double=False, num_workers=2)
    ids = list(range(src.num_clients))
    n_img = int(src.client_sizes().sum())
    seq, pre = [], []
    for _ in range(args.repeats):              # interleaved
      seq.append(timed(lambda: [src.client_examples(k) for k in ids]))
      pre.append(timed(lambda: list(src.prefetch_clients(ids))))
    s, p = np.median(seq), np.median(pre)
    print(f'host decode, {n_img} image+label pairs of 1024x2048: sequential {s:.2f} s ({n_img / s:.2f} pairs/s), '
          f'prefetch (2 workers) {p:.2f} s ({n_img / p:.2f} pairs/s): {s / p:.2f}x')

    x, y = src.client_examples(0)
    reps = int(np.ceil(args.batch / len(x)))
    batch = {'x': np.concatenate([x] * reps)[:args.batch], 'y': np.concatenate([y] * reps)[:args.batch],
             'mask': np.ones(args.batch, np.float32)}
    pre_fn = jax.jit(A.make_seg_preprocess())
    variants = {'eval: normalize only (baseline)': lambda k, b: pre_fn(b['x'])}
    train = A.make_seg_augment(crop=(512, 1024), scale=(0.5, 1.5), jitter=0.4)
    variants['train: scale+crop+flip+jitter+normalize'] = jax.jit(train)
    for kind in ('lab', 'cfsi'):
      bank = S.build_style_bank(kind, src, batch_size=2, progress_every=0)
      variants[f'train + {kind.upper()} on half ({bank.nbytes / 1e6:.2f} MB bank)'] = jax.jit(
          A.make_seg_augment(crop=(512, 1024), scale=(0.5, 1.5), jitter=0.4, style=bank))
    times = {k: [] for k in variants}
    for name, fn in variants.items():        # compile
      jax.block_until_ready(fn(jax.random.PRNGKey(0), batch))
    for r in range(args.repeats):
      for name, fn in variants.items():
        times[name].append(timed(lambda: jax.block_until_ready(fn(jax.random.PRNGKey(r + 1), batch))))
    base = np.median(times['eval: normalize only (baseline)'])
    print(f'device transform of a batch of {args.batch} (1024x2048 in, 512x1024 out), backend {jax.default_backend()}:')
    for name, ts in times.items():
      print(f'  {name:52s} {np.median(ts) * 1e3:8.1f} ms  {np.median(ts) / base:6.2f}x')
    src.close()
  print('uptime:', os.popen('uptime').read().strip())


if __name__ == '__main__':
  main()
