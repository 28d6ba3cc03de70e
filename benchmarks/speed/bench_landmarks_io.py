"""Landmarks input throughput on generated JPEGs (no real GLDv2 here): prepare, decode, decode+RRC.

  python -m benchmarks.speed.bench_landmarks_io [--num_images=256] [--workers=1,2]

Generates photo-like JPEGs at 640x480 (a typical GLDv2 size), runs `landmarks.prepare` (resize to shorter
side 256, re-encode q90), then measures images/s for: JPEG decode only; decode + random-resized-crop +
flip to 224x224 (the train transform); the eval center crop; and `prefetch_clients` with N threads.
"""
import argparse
import os
import tempfile
import time

import numpy as np

from fedjax_flat.data.sources import landmarks
from tests.fixtures.data_files import make_landmarks


def rate(n, fn, repeat=3):
  best = float('inf')
  for _ in range(repeat):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return n / best


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--num_images', type=int, default=256)
  ap.add_argument('--workers', default='1,2')
  args = ap.parse_args()
  per_user = 32
  users = args.num_images // per_user
  with tempfile.TemporaryDirectory() as d:
    make_landmarks(d, 'gld23k', num_users=users, per_user=(per_user,), num_test=16, size=(640, 480))
    n = users * per_user
    res = {}
    for w in [int(x) for x in args.workers.split(',')]:
      out = os.path.join(d, f'shards{w}')
      t = time.perf_counter()
      landmarks.prepare('gld23k', d, out_dir=out, num_workers=w)
      res[f'prepare 640x480 -> short side 256 ({w} threads)'] = (n + 16) / (time.perf_counter() - t)
    src = landmarks.LandmarksSource(out, image_size=224, seed=0, num_workers=1)
    blobs = [b for k in range(users) for b in src.read_client_blobs(k)]
    print(f'{n} images, mean shard JPEG {np.mean([len(b) for b in blobs]) / 1e3:.1f} kB')
    from PIL import Image
    import io

    def decode():
      for b in blobs:
        with Image.open(io.BytesIO(b)) as im:
          np.asarray(im.convert('RGB'))

    rng = np.random.default_rng(0)
    res['decode only (1 thread)'] = rate(n, decode)
    res['decode + RRC 224 + flip (1 thread)'] = rate(
        n, lambda: [landmarks.decode_transform(b, 224, rng) for b in blobs])
    res['decode + center crop 224 (1 thread)'] = rate(
        n, lambda: [landmarks.decode_transform(b, 224, None) for b in blobs])
    for w in [int(x) for x in args.workers.split(',')]:
      s = landmarks.LandmarksSource(out, image_size=224, seed=0, num_workers=w)
      res[f'prefetch_clients, decode + RRC ({w} threads)'] = rate(
          n, lambda: [None for _ in s.prefetch_clients(range(users))])
      s.close()
    src.close()
  for k, v in res.items():
    print(f'{k:55s} {v:8.0f} images/s')


if __name__ == '__main__':
  main()
