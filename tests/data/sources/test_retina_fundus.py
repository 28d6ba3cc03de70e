"""The FedSoup release's preprocessed layout (data/sources/pfl_npz.py) for the retinal fundus set and the
release's tiny Camelyon17, on files written exactly as the release writes them
(np.savez_compressed(f, data={'x': [...], 'y': ...}): a pickled dict inside the .npz)."""
import io
import os
import pickle
import zipfile

import numpy as np
import pytest

from fedjax_flat.data.registry import get_dataset
from fedjax_flat.errors import DataFormatError


def write_release(root, clients, *, size, n_train=6, n_test=8):
  """<root>/{train,test}/<k>.npz as the release's save_file writes them; image value encodes (client, i)."""
  for split, n in (('train', n_train), ('test', n_test)):
    os.makedirs(os.path.join(root, split), exist_ok=True)
    for k in range(clients):
      xs = [np.full((3, size, size), (10 * k + i) / 127.5 - 1.0, np.float32) for i in range(n)]
      data = {'x': xs, 'y': np.asarray([i % 2 for i in range(n)], np.int64)}
      with open(os.path.join(root, split, f'{k}.npz'), 'wb') as f:
        np.savez_compressed(f, data=data)


def test_retina_reads_the_release_layout(tmp_path):
  write_release(str(tmp_path / 'retina'), 4, size=128)
  data = get_dataset('retina_fundus', data_dir=str(tmp_path), val_fraction=0.34)
  assert data.num_clients == 4 and data.x.shape[1:] == (128, 128, 3) and data.x.dtype == np.uint8
  for k in range(4):
    x, y = data.client_examples(k)
    vx, vy = data.client_val_examples(k)
    assert len(y) + len(vy) == 6 and len(vy) == 2                    # stratified validation share
    vals = np.concatenate([x[:, 0, 0, 0], vx[:, 0, 0, 0]]).astype(int)
    assert sorted(vals - 10 * k) == list(range(6))                    # round((x + 1) * 127.5) undoes Normalize
    np.testing.assert_array_equal(np.concatenate([y, vy]), (vals - 10 * k) % 2)
  assert len(data.test_examples()[1]) == 4 * 2                       # 1/4 of each local test set, equal counts


def test_release_tiny_camelyon17_and_leave_one_out(tmp_path):
  write_release(str(tmp_path / 'tiny_camelyon17'), 5, size=96, n_train=4, n_test=4)
  data = get_dataset('camelyon17_release', data_dir=str(tmp_path), leave_out=0)
  assert data.num_clients == 4 and len(data.unseen_examples()[1]) == 8


def test_unsafe_or_malformed_release_files_are_refused(tmp_path):
  root = tmp_path / 'retina'
  write_release(str(root), 4, size=128, n_train=2, n_test=2)
  evil = root / 'train' / '1.npz'

  class Evil:
    def __reduce__(self):
      return (os.system, ('echo pwned',))
  buf = io.BytesIO()
  np.lib.format.write_array_header_1_0(buf, {'descr': '|O', 'fortran_order': False, 'shape': ()})
  with zipfile.ZipFile(evil, 'w') as z:
    z.writestr('data.npy', buf.getvalue() + pickle.dumps(Evil(), protocol=3))
  with pytest.raises(DataFormatError, match=r'1\.npz.*refused to load global'):
    get_dataset('retina_fundus', data_dir=str(tmp_path))
  write_release(str(root), 4, size=64, n_train=2, n_test=2)            # the wrong resolution
  with pytest.raises(DataFormatError, match=r'expected x \[n, 3, 128, 128\]'):
    get_dataset('retina_fundus', data_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match='by hand'):
    get_dataset('retina_fundus', data_dir=str(tmp_path / 'nowhere'))
