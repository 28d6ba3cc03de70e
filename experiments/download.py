"""Downloads a real dataset into --data_dir (resumable; checksums verified before use).

  python experiments/download.py --dataset=cifar100 --data_dir=/data/fedjax_flat
  python experiments/download.py --dataset=cifar100_pam --data_dir=...   # TFF sqlite -> FedJAX sqlite
  python experiments/download.py --dataset=gld23k --data_dir=...         # split CSVs only
  python experiments/download.py --dataset=stackoverflow --data_dir=...  # TFF sqlite (decompressed) + word counts
  python experiments/download.py --dataset=femnist --data_dir=...        # prints how LEAF builds it (no file)
  python experiments/download.py --dataset=gldv2_images --shards=0-9 --data_dir=...  # GLDv2 JPEG shards
  python experiments/download.py --dataset=feddrive_splits --data_dir=...  # FedDrive's released split JSONs
  python experiments/download.py --dataset=cityscapes --data_dir=...  # login needed: prints URLs, extracts zips
  python experiments/download.py --dataset=idda --data_dir=...        # on request: prints where, checks layout

Without internet access the command fails with the URL, checksum and the path where the file can be put
by hand; re-running then verifies and uses it.
"""
import sys
import time

from absl import app, flags

from fedjax_flat.data import download as dl

from fedjax_flat.data.sources import catalogue

DATASET = flags.DEFINE_enum('dataset', None, list(catalogue.DATASETS), 'Dataset to download.')
DATA_DIR = flags.DEFINE_string('data_dir', None, 'Destination directory (the loaders\' data_dir).')
SHARDS = flags.DEFINE_string('shards', '0-499', 'gldv2_images only: shard range "a-b" or list "1,2,5".')
flags.mark_flags_as_required(['dataset', 'data_dir'])


def _parse_shards(s):
  out = []
  for part in s.split(','):
    if '-' in part:
      a, b = part.split('-')
      out.extend(range(int(a), int(b) + 1))
    elif part.strip():
      out.append(int(part))
  return out


def main(argv):
  del argv
  last = [0.0]

  def progress(done, total):
    now = time.time()
    if now - last[0] > 5:
      last[0] = now
      pct = f' ({100 * done / total:.1f}%)' if total else ''
      print(f'  {done / 1e6:.1f} MB{pct}', flush=True)

  try:
    paths = catalogue.download(DATASET.value, DATA_DIR.value, progress=progress,
                        shards=_parse_shards(SHARDS.value) if DATASET.value == 'gldv2_images' else ())
  except dl.DownloadError as e:
    print(f'ERROR: {e}', file=sys.stderr)
    return 1
  for p in paths:
    print(f'ready: {p}')
  return 0


if __name__ == '__main__':
  app.run(main)
