"""The retinal fundus set of FedSoup (digest A5): RIM-ONE, Drishti-GS and REFUGE as 4 institutions (clients),
normal vs glaucoma, 128 x 128, 1,264 images with equal client sizes (316 each).

Layout: the FedSoup release's preprocessed files (README: "Retina preprocessed dataset", a Google Drive
archive, https://drive.google.com/file/d/1Xq7Wx1ZGm4PNJSl0IYgBDuofaQETfMxm/view; no checksum published; the
release has no generation script for it), read by data/sources/pfl_npz.py:

  <data_dir>/<dataset_dir>/train/<k>.npz, test/<k>.npz     k = 0..3, dataset_dir default 'retina'

The 4-vs-3 question (which source gives two institutions) is not answered by the release; clients are named
by index. Validation, global test and leave-one-client-out: feature_shift.assemble_silos (leave_out here is
the same protocol as on Camelyon17; the paper runs it on Camelyon17 only).
"""
from __future__ import annotations

import os

from fedjax_flat.data.download import default_data_dir
from fedjax_flat.data.registry import register
from fedjax_flat.schema import DataValue
from fedjax_flat.data.sources.feature_shift import assemble_silos
from fedjax_flat.data.sources.pfl_npz import read_release

NUM_CLIENTS = 4
IMAGE_SIZE = 128
RELEASE_URL = 'https://drive.google.com/file/d/1Xq7Wx1ZGm4PNJSl0IYgBDuofaQETfMxm/view?usp=sharing'


def instructions(root: str) -> str:
  return (f'download the FedSoup release\'s retina archive by hand ({RELEASE_URL}) and extract it so that '
          f'{root}/train/0.npz ... exist')


def load_retina_fundus(data_dir=None, *, dataset_dir: str = 'retina', seed: int = 0, val_fraction: float = 0.0,
                       global_fraction=None, leave_out: int = -1):
  root = os.path.join(data_dir or default_data_dir(), dataset_dir)
  silos = read_release(root, NUM_CLIENTS, num_classes=2, image_size=IMAGE_SIZE, what='the retinal fundus set',
                       download_hint=instructions(root))
  lo = f', leave_out={leave_out}' if leave_out >= 0 else ''
  return assemble_silos(silos, name=f'retina_fundus({dataset_dir}{lo})', num_classes=2, seed=seed,
                        val_fraction=val_fraction, global_fraction=global_fraction, leave_out=leave_out,
                        silo_names=[f'institution{k}' for k in range(NUM_CLIENTS)])


@register('retina_fundus', limits={'num_clients': (NUM_CLIENTS, NUM_CLIENTS, 'the four institutions')},
          rules={'dataset_dir': DataValue(None, 'str', what='the folder of the release files under data_dir')})
def _retina_fundus(data_dir=None, num_clients=NUM_CLIENTS, dataset_dir='retina', seed=0, val_fraction=0.0,
                   global_fraction=0.0, leave_out=-1, **unused):
  """Registry builder (config.data)."""
  del unused, num_clients
  return load_retina_fundus(data_dir, dataset_dir=str(dataset_dir), seed=int(seed), val_fraction=float(val_fraction),
                            global_fraction=float(global_fraction) or None, leave_out=int(leave_out))
