"""Camelyon17 patches in the WILDS layout (camelyon17_v1.0), as FedSoup uses them (digest A4-A5, A10.9).

Files (https://worksheets.codalab.org/rest/bundles/0xe45e15f39fb54e9d9e919556af67aabe/contents/blob/, WILDS'
camelyon17 v1.0 archive, about 10.7 GB; WILDS publishes no checksum):

  <data_dir>/camelyon17_v1.0/metadata.csv      one row per patch: patient, node, x_coord, y_coord, tumor, ...,
                                               center (the hospital, 0-4)
  <data_dir>/camelyon17_v1.0/patches/patient_<PPP>_node_<N>/patch_patient_<PPP>_node_<N>_x_<X>_y_<Y>.png

Clients (5): client_by='center' the five hospitals (the paper: "each hospital/source"); client_by='node'
groups by the metadata's `node` column instead, which is what the release's generate_camelyon17.py queries
(`node==k`: the lymph-node index of a patient, not the hospital).
Split, per client, patient-level (a patient is only in train or only in test): its patients shuffled by
`seed`, test_patient_fraction of them (the release: 0.5, 0.7 for node 3) are test patients. Then the
release's class-balanced "tiny" subset: train_per_class patches per class from the training patients and
test_per_class from the test patients (320 and 140: 640 + 280 per client, x 5 = 4,600 images, the paper's
count; 0 = every patch). Patches are 96 x 96 RGB (resized to image_size if they are not), stored uint8.
Validation, global test and leave-one-client-out: data/sources/feature_shift.assemble_silos.

`camelyon17_release` reads the release's own preprocessed tiny Camelyon17 instead (README: "Tiny Camelyon17
preprocessed dataset", https://drive.google.com/file/d/1vFMEkm_l6_8KiPOayndbPEDgrek-_eZS/view, no checksum):
<data_dir>/tiny_camelyon17/{train,test}/<k>.npz in PFLlib's layout (data/sources/pfl_npz.py), its split as
released.

Paths are built from integers parsed from metadata.csv (no path text from the file reaches the file
system); a malformed CSV or image is one DataFormatError naming the file.
"""
from __future__ import annotations

import csv
import os
from typing import Dict, List, Tuple

import numpy as np

from fedjax_flat import errors
from fedjax_flat.data.download import default_data_dir
from fedjax_flat.data.registry import register
from fedjax_flat.schema import DataValue
from fedjax_flat.data.sources.feature_shift import assemble_silos
from fedjax_flat.data.sources.pfl_npz import read_release

DIRNAME = 'camelyon17_v1.0'
CLIENT_BY = ('center', 'node')
NUM_CLIENTS = 5
COLUMNS = ('patient', 'node', 'x_coord', 'y_coord', 'tumor', 'center')


def download_command(data_dir: str) -> str:
  return f'python experiments/download.py --dataset=camelyon17 --data_dir={data_dir}'


def patch_path(root: str, patient: int, node: int, x: int, y: int) -> str:
  d = f'patient_{patient:03d}_node_{node}'
  return os.path.join(root, 'patches', d, f'patch_{d}_x_{x}_y_{y}.png')


def read_metadata(root: str) -> Dict[str, np.ndarray]:
  """metadata.csv -> int64 columns (COLUMNS); a missing column or a non-integer value is a DataFormatError."""
  path = os.path.join(root, 'metadata.csv')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'Camelyon17 not found: expected {path} (WILDS camelyon17_v1.0); get it with '
                            f'{download_command(os.path.dirname(root))}')
  cols: Dict[str, List[int]] = {c: [] for c in COLUMNS}
  with errors.reading(path, 'a WILDS Camelyon17 metadata.csv'):
    with open(path, newline='') as f:
      reader = csv.DictReader(f)
      missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
      if missing:
        raise errors.DataFormatError(f'{path}: no column(s) {missing}; a WILDS metadata.csv has {list(COLUMNS)}')
      for i, row in enumerate(reader):
        for c in COLUMNS:
          try:
            cols[c].append(int(float(row[c])) if c != 'patient' else int(row[c]))
          except (TypeError, ValueError):
            raise errors.DataFormatError(f'{path}: row {i + 2} column {c}={row[c]!r} is not an integer') from None
  out = {c: np.asarray(v, np.int64) for c, v in cols.items()}
  if np.any(out['tumor'] < 0) or np.any(out['tumor'] > 1):
    raise errors.DataFormatError(f'{path}: column tumor holds values other than 0/1')
  return out


def load_patch(path: str, image_size: int) -> np.ndarray:
  from PIL import Image
  with errors.reading(path, 'a PNG patch', images=True):
    with Image.open(path) as im:
      im = im.convert('RGB')
      if im.size != (image_size, image_size):
        im = im.resize((image_size, image_size), Image.BILINEAR)
      return np.asarray(im, np.uint8)


def client_split(meta: Dict[str, np.ndarray], rows: np.ndarray, *, rng, test_patient_fraction: float,
                 train_per_class: int, test_per_class: int) -> Tuple[np.ndarray, np.ndarray]:
  """Row indices (train, test) of one client: patient-level split, then the class-balanced subset."""
  patients = np.unique(meta['patient'][rows])
  patients = patients[rng.permutation(len(patients))]
  n_test = int(len(patients) * test_patient_fraction)
  test_p = set(patients[:n_test].tolist())
  is_test = np.asarray([p in test_p for p in meta['patient'][rows]], bool)

  def balanced(r, per_class):
    if not per_class:
      return np.sort(r)
    parts = [rng.permutation(r[meta['tumor'][r] == c])[:per_class] for c in (1, 0)]
    return np.sort(np.concatenate(parts))
  return balanced(rows[~is_test], train_per_class), balanced(rows[is_test], test_per_class)


def load_camelyon17(data_dir=None, *, client_by: str = 'center', seed: int = 0, test_patient_fraction: float = 0.5,
                    train_per_class: int = 320, test_per_class: int = 140, image_size: int = 96,
                    val_fraction: float = 0.0, global_fraction=None, leave_out: int = -1):
  if client_by not in CLIENT_BY:
    raise errors.ConfigError('data.client_by', client_by, f'allowed: {list(CLIENT_BY)}')
  data_dir = data_dir or default_data_dir()
  root = os.path.join(data_dir, DIRNAME)
  meta = read_metadata(root)
  rng = np.random.default_rng([int(seed), 0xCA17])
  silos = []
  for k in range(NUM_CLIENTS):
    rows = np.flatnonzero(meta[client_by] == k)
    if len(rows) == 0:
      raise errors.DataFormatError(f'{root}/metadata.csv: no patch with {client_by}={k} (5 clients expected)')
    tr, te = client_split(meta, rows, rng=rng, test_patient_fraction=test_patient_fraction,
                          train_per_class=train_per_class, test_per_class=test_per_class)

    def images(r):
      paths = [patch_path(root, int(meta['patient'][i]), int(meta['node'][i]), int(meta['x_coord'][i]),
                          int(meta['y_coord'][i])) for i in r]
      x = np.stack([load_patch(p, image_size) for p in paths]) if len(paths) else \
          np.zeros((0, image_size, image_size, 3), np.uint8)
      return x, meta['tumor'][r].astype(np.int32)
    silos.append({'train': images(tr), 'test': images(te)})
  lo = f', leave_out={leave_out}' if leave_out >= 0 else ''
  return assemble_silos(silos, name=f'camelyon17({client_by}{lo})', num_classes=2, seed=seed,
                        val_fraction=val_fraction, global_fraction=global_fraction, leave_out=leave_out,
                        silo_names=[f'{client_by}{k}' for k in range(NUM_CLIENTS)])


@register('camelyon17', limits={'client_by': CLIENT_BY, 'num_clients': (5, 5, 'the five hospitals')},
          rules={'test_patient_fraction': DataValue(None, 'number', lo=0, lo_open=True, hi=1, hi_open=True,
                                                    what='test share of each client\'s patients'),
                 'train_per_class': DataValue(None, 'int', lo=0, what='training patches per class; 0 = all'),
                 'test_per_class': DataValue(None, 'int', lo=0, what='test patches per class; 0 = all')})
def _camelyon17(data_dir=None, num_clients=5, client_by='center', seed=0, test_patient_fraction=0.5,
                train_per_class=320, test_per_class=140, image_size=96, val_fraction=0.0, global_fraction=0.0,
                leave_out=-1, **unused):
  """Registry builder (config.data): the release's tiny subset by default (4,600 patches)."""
  del unused, num_clients
  return load_camelyon17(data_dir, client_by=client_by, seed=int(seed),
                         test_patient_fraction=float(test_patient_fraction), train_per_class=int(train_per_class),
                         test_per_class=int(test_per_class), image_size=int(image_size),
                         val_fraction=float(val_fraction), global_fraction=float(global_fraction) or None,
                         leave_out=int(leave_out))


RELEASE_URL = 'https://drive.google.com/file/d/1vFMEkm_l6_8KiPOayndbPEDgrek-_eZS/view?usp=sharing'


@register('camelyon17_release', limits={'num_clients': (5, 5, 'the five clients of the release')},
          rules={'dataset_dir': DataValue(None, 'str', what='the folder of the release files under data_dir')})
def _camelyon17_release(data_dir=None, num_clients=5, dataset_dir='tiny_camelyon17', seed=0, val_fraction=0.0,
                        global_fraction=0.0, leave_out=-1, **unused):
  """Registry builder (config.data): the release's preprocessed tiny Camelyon17 (its own split)."""
  del unused, num_clients
  root = os.path.join(data_dir or default_data_dir(), str(dataset_dir))
  silos = read_release(root, NUM_CLIENTS, num_classes=2, image_size=96, what='the tiny Camelyon17 release',
                       download_hint=f'download it by hand ({RELEASE_URL}) and extract it there')
  lo = f', leave_out={leave_out}' if int(leave_out) >= 0 else ''
  return assemble_silos(silos, name=f'camelyon17_release({dataset_dir}{lo})', num_classes=2, seed=int(seed),
                        val_fraction=float(val_fraction), global_fraction=float(global_fraction) or None,
                        leave_out=int(leave_out), silo_names=[f'node{k}' for k in range(NUM_CLIENTS)])
