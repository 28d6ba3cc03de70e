import os
import sqlite3
import zlib

import msgpack
import numpy as np
import pytest

from fedjax_flat.data.sources import pam

from fedjax_flat.data import registry
from tests.fixtures.data_files import int64_feature, make_cifar100, pam_clients, tf_example, write_pam


def test_read_fedjax_sqlite(tmp_path):
  train, test = write_pam(str(tmp_path))
  ds = registry.get_dataset('cifar100_pam', data_dir=str(tmp_path), check_official_sizes=False)
  assert ds.num_clients == 6 and ds.num_classes == 100 and list(ds.client_names) == [c for c, _ in train]
  for k, (_, ex) in enumerate(train):
    x, y = ds.client_examples(k)
    np.testing.assert_array_equal(x, ex['image'])
    np.testing.assert_array_equal(y, ex['label'])
    np.testing.assert_array_equal(ds.coarse_y[ds.client_indices(k)], ex['coarse_label'])
  assert ds.x.dtype == np.uint8 and ds.x.shape == (30, 32, 32, 3)
  # global test = union of the test clients, who are a separate population (not the training clients'
  # own test splits: there are none, and personalized protocols must not pair train client k with test client k)
  tx, ty = ds.test_examples()
  np.testing.assert_array_equal(tx, np.concatenate([ex['image'] for _, ex in test]))
  assert ds.num_test_clients == 3 and ds.client_test_offsets is None
  for k, (_, ex) in enumerate(test):
    np.testing.assert_array_equal(ds.test_client_examples(k)[1], ex['label'])
  assert ds.test_client_names == ['0', '1', '2']
  with pytest.raises(ValueError, match='no per-client test splits'):
    ds.client_test_examples(0)
  with pytest.raises(IndexError, match='test client 3'):
    ds.test_client_examples(3)


def test_roundtrip_with_own_writer(tmp_path):
  train = pam_clients(3, 4, 2)
  p = str(tmp_path / 'x.sqlite')
  pam.write_fedjax_sqlite(p, train)
  got = list(pam.read_fedjax_sqlite(p))
  assert [c for c, _ in got] == ['0', '1', '2']
  for (_, a), (_, b) in zip(got, train):
    for key in b:
      np.testing.assert_array_equal(a[key], b[key])
      assert a[key].dtype == b[key].dtype


def test_sqlite_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='--dataset=cifar100_pam'):
    registry.get_dataset('cifar100_pam', data_dir=str(tmp_path))
  write_pam(str(tmp_path))
  with pytest.raises(pam.PamFormatError, match='expected 500/50000'):
    registry.get_dataset('cifar100_pam', data_dir=str(tmp_path))  # official sizes by default
  # corrupted client blob
  con = sqlite3.connect(tmp_path / pam.TRAIN_FILE)
  blob = con.execute("SELECT data FROM federated_data WHERE client_id = ?", (b'2',)).fetchone()[0]
  con.execute("UPDATE federated_data SET data = ? WHERE client_id = ?", (blob[:len(blob) // 2], b'2'))
  con.commit()
  con.close()
  with pytest.raises(pam.PamFormatError, match="client '2'"):
    pam.load_sqlite(str(tmp_path), check_official_sizes=False)
  # array payload whose byte count does not match its shape
  bad = msgpack.ExtType(1, msgpack.packb(((2, 32, 32, 3), 'uint8', b'\0' * 100), use_bin_type=True))
  blob = zlib.compress(msgpack.packb({'image': bad, 'label': bad, 'coarse_label': bad}))
  with pytest.raises(pam.PamFormatError, match='bytes for shape'):
    pam.decode_client_blob(blob)
  # not a database
  (tmp_path / pam.TRAIN_FILE).write_bytes(b'garbage' * 100)
  with pytest.raises(pam.PamFormatError):
    pam.load_sqlite(str(tmp_path), check_official_sizes=False)


# ---------------------------------------------------------------------------------------------------
# TFF cifar100.sqlite (tf.train.Example per row) -> FedJAX files, without TensorFlow.

def test_convert_tff_sqlite(tmp_path):
  rng = np.random.default_rng(0)
  tff = tmp_path / 'cifar100.sqlite'
  con = sqlite3.connect(tff)
  con.execute('CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
              'serialized_example_proto BLOB NOT NULL);')
  con.execute('CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL, '
              'num_examples INTEGER NOT NULL);')
  expect = {}
  for split, n in (('train', 11), ('test', 2)):
    for k in range(n):
      cid = str(k)
      imgs = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
      labels = rng.integers(0, 100, 3)
      for i in range(3):
        proto = tf_example({'coarse_label': int64_feature([labels[i] // 5], False),
                             'image': int64_feature(imgs[i].ravel(), packed=(i != 1)),
                             'label': int64_feature([labels[i]], True)})
        con.execute('INSERT INTO examples VALUES (?, ?, ?)', (split, cid, proto))
      con.execute('INSERT INTO client_metadata VALUES (?, ?, ?)', (cid, split, 3))
      expect[(split, cid)] = (imgs, labels)
  con.commit()
  con.close()
  out = pam.convert_tff_sqlite(str(tff), str(tmp_path))
  assert [os.path.basename(p) for p in out] == [pam.TRAIN_FILE, pam.TEST_FILE]
  ds = pam.load_sqlite(str(tmp_path), check_official_sizes=False)
  # FedJAX orders clients by client_id text: '0', '1', '10', '2', ...
  assert list(ds.client_names) == sorted(str(k) for k in range(11))
  for k, cid in enumerate(ds.client_names):
    x, y = ds.client_examples(k)
    np.testing.assert_array_equal(x, expect[('train', cid)][0])
    np.testing.assert_array_equal(y, expect[('train', cid)][1])
  np.testing.assert_array_equal(ds.test_coarse_y[:3], expect[('test', '0')][1] // 5)


# ---------------------------------------------------------------------------------------------------
# Pachinko Allocation split.

def test_pachinko_split_properties():
  fine = np.repeat(np.arange(100), 30)
  coarse = fine // 5
  s = pam.pachinko_split(fine, coarse, 30, 100, alpha=0.1, beta=10.0, seed=0)  # uses the whole pool
  allidx = np.concatenate(s)
  assert len(s) == 30 and all(len(c) == 100 for c in s)
  assert len(np.unique(allidx)) == 3000  # disjoint, exhausted labels handled
  assert s[0].tolist() == pam.pachinko_split(fine, coarse, 30, 100, seed=0)[0].tolist()
  # alpha=0.1 concentrates clients on few coarse labels; large alpha spreads them
  few = np.mean([len(np.unique(coarse[c])) for c in s[:10]])
  s_wide = pam.pachinko_split(fine, coarse, 10, 100, alpha=100.0, beta=10.0, seed=0)
  wide = np.mean([len(np.unique(coarse[c])) for c in s_wide])
  assert few < 8 < wide
  with pytest.raises(ValueError, match='belongs to coarse'):
    pam.pachinko_split(np.array([0, 0]), np.array([0, 1]), 1, 1)


def test_generate_source(tmp_path):
  make_cifar100(str(tmp_path), per_class=4, n_test=40)
  kw = dict(data_dir=str(tmp_path), source='generate', num_clients=8, examples_per_client=50,
            num_test_clients=4, check_official_sizes=False)
  ds = registry.get_dataset('cifar100_pam', **kw)
  assert ds.num_clients == 8 and list(ds.client_sizes()) == [50] * 8
  assert ds.num_test_clients == 4 and ds.client_test_offsets is None
  assert sorted(os.listdir(tmp_path / 'splits')) == [
      'cifar100_pam_beta10_test_alpha0.1_clients4_epc10_seed1.npz',
      'cifar100_pam_beta10_train_alpha0.1_clients8_epc50_seed0.npz']
  ds2 = registry.get_dataset('cifar100_pam', **kw)  # reused from the saved split
  np.testing.assert_array_equal(ds.client_index, ds2.client_index)
  with pytest.raises(ValueError, match='source='):
    registry.get_dataset('cifar100_pam', data_dir=str(tmp_path), source='nope')
