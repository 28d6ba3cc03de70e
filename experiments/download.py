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

Exit status (fedjax_flat/training/cli.py), each error one `error:` line without a traceback: 0 ready, 1 the
download failed (network, HTTP, checksum, a manual step needed: the line says what to do), 2 bad input (flags,
--shards).
"""
import time

from absl import flags

from fedjax_flat.data.sources import catalogue
from fedjax_flat.errors import BadInputError

DATASET = flags.DEFINE_enum('dataset', None, list(catalogue.DATASETS), 'Dataset to download.')
DATA_DIR = flags.DEFINE_string('data_dir', None, 'Destination directory (the loaders\' data_dir).')
SHARDS = flags.DEFINE_string('shards', '0-499', 'gldv2_images only: shard range "a-b" or list "1,2,5".')
flags.mark_flags_as_required(['dataset', 'data_dir'])


def _parse_shards(s):
  out = []
  try:
    for part in s.split(','):
      if '-' in part:
        a, b = part.split('-')
        if int(a) > int(b) or int(a) < 0:
          raise ValueError(part)
        out.extend(range(int(a), int(b) + 1))
      elif part.strip():
        out.append(int(part))
  except ValueError:
    raise BadInputError(f'--shards={s!r} is not a shard range a-b (0 <= a <= b) or a list 1,2,5; '
                        'e.g. --shards=0-9') from None
  if not out or min(out) < 0:
    raise BadInputError(f'--shards={s!r} names no shard; e.g. --shards=0-9')
  return out


def main(argv):
  if len(argv) > 1:
    raise BadInputError(f'unexpected arguments {argv[1:]}; give --dataset and --data_dir')
  if not DATA_DIR.value.strip():
    raise BadInputError("--data_dir='' is empty: give the destination directory")
  shards = _parse_shards(SHARDS.value) if DATASET.value == 'gldv2_images' else ()
  last = [0.0]

  def progress(done, total):
    now = time.time()
    if now - last[0] > 5:
      last[0] = now
      pct = f' ({100 * done / total:.1f}%)' if total else ''
      print(f'  {done / 1e6:.1f} MB{pct}', flush=True)

  # a failed download (DownloadError: an OperationError) is one `error:` line and exit 1 (cli.run_main)
  paths = catalogue.download(DATASET.value, DATA_DIR.value, progress=progress, shards=shards)
  for p in paths:
    print(f'ready: {p}')


if __name__ == '__main__':
  from fedjax_flat.training import cli
  cli.run_main(main)   # every error one line and its exit status
