"""Prepares the Landmarks (gld23k / gld160k) per-client shards from the split CSVs + GLDv2 JPEGs, and prints the
statistics of the MSLS federated splits (FedVPR, thesis Table 6.5).

  python experiments/prepare.py --dataset=gld23k --data_dir=/data/fedjax_flat \
      [--images_dir=/data/fedjax_flat/gldv2/train] [--short_side=256] [--num_workers=2]
  python experiments/prepare.py --dataset=msls --data_dir=/data/fedjax_flat   # Table 6.5 from the CSVs only

Writes <data_dir>/landmarks_shards/<dataset>_s<short_side>/ (or --out_dir): train/<k>.bin (the client's
resized JPEGs), index.npz, index.json. Restarting resumes (finished client shards are kept).

Exit status (fedjax_flat/training/cli.py), each error one `error:` line without a traceback: 0 prepared, 1 a
shard that cannot be written (disk full, permissions), 2 bad input (flags, missing or malformed split CSVs,
an undecodable image without --allow_missing).
"""
import json
import os
import time

from absl import flags, logging

from fedjax_flat.errors import BadInputError

from fedjax_flat.data.sources import landmarks, msls

DATASET = flags.DEFINE_enum('dataset', None, sorted(landmarks.SPLITS) + ['msls'],
                            'Landmarks split, or msls (print the statistics of its federated splits).')
DATA_DIR = flags.DEFINE_string('data_dir', None, 'Directory with the split CSVs (see download.py).')
IMAGES_DIR = flags.DEFINE_string('images_dir', None, 'GLDv2 train JPEGs (default <data_dir>/gldv2/train).')
OUT_DIR = flags.DEFINE_string('out_dir', None, 'Shards directory (default <data_dir>/landmarks_shards/...).')
SHORT_SIDE = flags.DEFINE_integer('short_side', landmarks.DEFAULT_SHORT_SIDE, 'Resize shorter side to this.')
QUALITY = flags.DEFINE_integer('quality', 90, 'JPEG quality of the re-encoded images.')
NUM_WORKERS = flags.DEFINE_integer('num_workers', 2, 'Decode/encode threads.')
ALLOW_MISSING = flags.DEFINE_bool('allow_missing', False, 'Skip images that are missing or unreadable.')
flags.mark_flags_as_required(['dataset', 'data_dir'])


def main(argv):
  if len(argv) > 1:
    raise BadInputError(f'unexpected arguments {argv[1:]}; give --dataset and --data_dir')
  for flag, lo in ((SHORT_SIDE, 1), (NUM_WORKERS, 1)):
    if flag.value < lo:
      raise BadInputError(f'--{flag.name}={flag.value} must be >= {lo}')
  if not 1 <= QUALITY.value <= 100:
    raise BadInputError(f'--quality={QUALITY.value} must be in [1, 100] (JPEG quality)')
  if DATASET.value == 'msls':
    print_msls_splits(DATA_DIR.value)
    return
  info = landmarks.split_info(DATASET.value, DATA_DIR.value)
  print('split CSVs:', json.dumps(info))
  t0 = time.time()
  out = landmarks.prepare(DATASET.value, DATA_DIR.value, images_dir=IMAGES_DIR.value, out_dir=OUT_DIR.value,
                          short_side=SHORT_SIDE.value, quality=QUALITY.value, num_workers=NUM_WORKERS.value,
                          allow_missing=ALLOW_MISSING.value, progress=True)
  with open(os.path.join(out, 'index.json')) as f:
    idx = json.load(f)
  logging.info('done in %.1f s', time.time() - t0)
  print(f'prepared {out}: {len(idx["client_ids"])} clients, {idx["num_train"]} train / {idx["num_test"]} test '
        f'images, {idx["missing_train"]} + {idx["missing_test"]} missing, {time.time() - t0:.1f} s')


def print_msls_splits(data_dir: str) -> None:
  """Table 6.5's columns (clients, sequences and images per client) of the proximity and random splits."""
  print('| split | radius (m) | sequences/client | images/client | # clients |')
  print('|---|---|---|---|---|')
  for r in msls.split_table(data_dir):
    (sm, ss), (im, istd) = r['sequences_per_client'], r['images_per_client']
    radius = '-' if r['radius'] is None else f"{r['radius']:.0f}"
    print(f"| {r['split']} | {radius} | {sm:.0f} +- {ss:.0f} | {im:.0f} +- {istd:.0f} | {r['clients']} |")


if __name__ == '__main__':
  from fedjax_flat.training import cli
  cli.run_main(main)   # every error one line and its exit status
