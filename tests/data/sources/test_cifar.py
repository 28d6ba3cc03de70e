import gzip
import json
import os
import pickle

import numpy as np
import pytest

from fedjax_flat.data.sources import cifar, cifar_c

from fedjax_flat.data import registry, safe_pickle
from fedjax_flat.data import partition
from fedjax_flat.data.partition import dirichlet_split, split_statistics
from tests.fixtures.data_files import make_cifar10, make_cifar100, py2_pickle, to_rows


# ---------------------------------------------------------------------------------------------------
# Reading the official formats.

@pytest.mark.parametrize('as_tar', [True, False])
def test_cifar10_tarball_and_extracted_dir(tmp_path, as_tar):
  ref = make_cifar10(str(tmp_path), as_tar=as_tar)
  a = cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)
  assert a['x_train'].shape == (100, 32, 32, 3) and a['x_train'].dtype == np.uint8
  np.testing.assert_array_equal(a['x_train'], ref['x_train'])
  np.testing.assert_array_equal(a['y_train'], ref['y_train'])
  np.testing.assert_array_equal(a['x_test'], ref['x_test'])
  np.testing.assert_array_equal(a['y_test'], ref['y_test'])


def test_row_major_chw_conversion(tmp_path):
  ref = make_cifar10(str(tmp_path))
  a = cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)
  # official row: 1024 R values, then 1024 G, then 1024 B, each plane row-major 32x32
  row = to_rows(ref['x_train'][:1])[0]
  assert a['x_train'][0, 0, 1, 0] == row[1] and a['x_train'][0, 1, 0, 1] == row[1024 + 32]
  assert a['x_train'][0, 31, 31, 2] == row[3071]


def test_cifar100_and_tarball_path_as_data_dir(tmp_path):
  ref = make_cifar100(str(tmp_path))
  a = cifar.load_arrays('cifar100', str(tmp_path / 'cifar-100-python.tar.gz'), check_official_sizes=False)
  np.testing.assert_array_equal(a['x_train'], ref['x_train'])
  np.testing.assert_array_equal(a['y_train'], ref['y_train'])
  np.testing.assert_array_equal(a['coarse_train'], ref['coarse_train'])
  assert a['filenames_train'] == ref['filenames'] and a['num_classes'] == 100


def test_missing_files_name_path_and_command(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    cifar.load_arrays('cifar100', str(tmp_path))
  msg = str(e.value)
  assert str(tmp_path / 'cifar-100-python.tar.gz') in msg
  assert f'python experiments/download.py --dataset=cifar100 --data_dir={tmp_path}' in msg


def test_official_sizes_checked(tmp_path):
  make_cifar10(str(tmp_path))
  with pytest.raises(cifar.CifarFormatError, match='expected 50000'):
    cifar.load_arrays('cifar10', str(tmp_path))


def test_truncated_tarball(tmp_path):
  make_cifar10(str(tmp_path))
  p = tmp_path / 'cifar-10-python.tar.gz'
  data = p.read_bytes()
  p.write_bytes(data[:len(data) // 2])
  with pytest.raises(cifar.CifarFormatError, match='truncated or corrupted'):
    cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)


def test_corrupted_byte_in_tarball_is_detected(tmp_path):
  make_cifar10(str(tmp_path))
  p = tmp_path / 'cifar-10-python.tar.gz'
  # Store the tar uncompressed inside gzip (level 0) so a flipped byte lands in pixel data: only the
  # gzip CRC can catch it, and it must.
  raw = gzip.decompress(p.read_bytes())
  p.write_bytes(gzip.compress(raw, compresslevel=0))
  cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)  # still fine
  data = bytearray(p.read_bytes())
  pos = data.find(b'training batch 3') + 2000
  data[pos] ^= 0xFF
  p.write_bytes(bytes(data))
  with pytest.raises(cifar.CifarFormatError):
    cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)


def test_truncated_and_inconsistent_batches(tmp_path):
  make_cifar10(str(tmp_path), as_tar=False)
  d = tmp_path / 'cifar-10-batches-py'
  b1 = (d / 'data_batch_1').read_bytes()
  (d / 'data_batch_1').write_bytes(b1[:len(b1) - 100])
  with pytest.raises(cifar.CifarFormatError, match='data_batch_1'):
    cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)
  # labels and images disagree in count
  (d / 'data_batch_1').write_bytes(py2_pickle({b'data': np.zeros((20, 3072), np.uint8), b'labels': [0] * 19}))
  with pytest.raises(cifar.CifarFormatError, match='20 images'):
    cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)
  # wrong row width
  (d / 'data_batch_1').write_bytes(py2_pickle({b'data': np.zeros((20, 3000), np.uint8), b'labels': [0] * 20}))
  with pytest.raises(cifar.CifarFormatError, match='3072'):
    cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)
  # float labels would be truncated to wrong classes (3.7 -> 3): refused, as a data format error
  for labels in ([i % 10 + 0.7 for i in range(20)], [float(i % 10) for i in range(20)], [True] * 20):
    (d / 'data_batch_1').write_bytes(py2_pickle({b'data': np.zeros((20, 3072), np.uint8), b'labels': labels}))
    with pytest.raises(cifar.CifarFormatError, match='must be integer class ids'):
      cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)


def test_malicious_batch_is_refused(tmp_path):
  make_cifar10(str(tmp_path), as_tar=False)
  marker = tmp_path / 'pwned'

  class Evil:
    def __reduce__(self):
      return os.system, (f'touch {marker}',)

  (tmp_path / 'cifar-10-batches-py' / 'test_batch').write_bytes(pickle.dumps({b'data': Evil()}, protocol=2))
  with pytest.raises(safe_pickle.UnsafePickleError):
    cifar.load_arrays('cifar10', str(tmp_path), check_official_sizes=False)
  assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# Federation: saved splits, LEAF JSON splits, registry.

def test_split_saved_and_reused(tmp_path, monkeypatch):
  make_cifar10(str(tmp_path))
  kw = dict(num_clients=5, alpha=0.5, examples_per_client=20, seed=3, check_official_sizes=False)
  ds1 = cifar.load_federated('cifar10', str(tmp_path), **kw)
  files = os.listdir(tmp_path / 'splits')
  assert files == ['cifar10_alpha0.5_clients5_epc20_seed3.npz']

  def boom(*a, **k):
    raise AssertionError('the saved split must be reused, not regenerated')

  monkeypatch.setattr(cifar, 'dirichlet_split', boom)
  ds2 = cifar.load_federated('cifar10', str(tmp_path), **kw)
  for k in range(5):
    np.testing.assert_array_equal(ds1.client_indices(k), ds2.client_indices(k))
  assert ds2.num_clients == 5 and list(ds2.client_sizes()) == [20] * 5
  assert ds2.x.dtype == np.uint8 and ds2.input_shape == (32, 32, 3)


def test_saved_split_from_older_procedure_is_reused_with_a_warning(tmp_path, monkeypatch):
  make_cifar10(str(tmp_path))
  kw = dict(num_clients=5, alpha=0.5, examples_per_client=20, seed=3, check_official_sizes=False)
  ds1 = cifar.load_federated('cifar10', str(tmp_path), **kw)
  path = str(tmp_path / 'splits' / 'cifar10_alpha0.5_clients5_epc20_seed3.npz')
  clients, meta = cifar.load_split(path)
  cifar.save_split(path, clients, ds1.y, dict(meta, procedure='partition.dirichlet_split'))
  warnings = []
  monkeypatch.setattr(cifar.logging, 'warning', lambda msg, *a: warnings.append(msg % a))
  ds2 = cifar.load_federated('cifar10', str(tmp_path), **kw)
  for k in range(5):
    np.testing.assert_array_equal(ds1.client_indices(k), ds2.client_indices(k))
  assert len(warnings) == 1 and partition.PROCEDURE in warnings[0] and 'Delete the file' in warnings[0]
  assert cifar.load_split(path)[1]['procedure'] == 'partition.dirichlet_split'   # not overwritten


def test_saved_split_for_other_data_is_rejected(tmp_path):
  make_cifar10(str(tmp_path), seed=0)
  kw = dict(num_clients=5, alpha=0.5, examples_per_client=20, check_official_sizes=False)
  cifar.load_federated('cifar10', str(tmp_path), **kw)
  os.remove(tmp_path / 'cifar-10-python.tar.gz')
  make_cifar10(str(tmp_path), seed=1)  # different labels
  with pytest.raises(ValueError, match='different data'):
    cifar.load_federated('cifar10', str(tmp_path), **kw)


def test_registry_builders(tmp_path):
  make_cifar10(str(tmp_path))
  make_cifar100(str(tmp_path))
  assert {'cifar10', 'cifar100'} <= set(registry.names())
  ds = registry.get_dataset('cifar10', data_dir=str(tmp_path), num_clients=10, alpha=0.0,
                            examples_per_client=10, check_official_sizes=False, unrelated_key=1)
  assert ds.num_clients == 10 and ds.num_classes == 10
  assert all(len(np.unique(ds.client_labels(k))) == 1 for k in range(10))
  ds = registry.get_dataset('cifar100', data_dir=str(tmp_path), num_clients=8, alpha=1000.0,
                            examples_per_client=50, check_official_sizes=False)
  assert ds.num_classes == 100 and ds.coarse_y.shape == (400,)
  with pytest.raises(FileNotFoundError, match='--dataset=cifar10 '):
    registry.get_dataset('cifar10', data_dir=str(tmp_path / 'nothing'))


def _leaf(path, users):
  d = {'users': [int(u) for u in users], 'num_samples': [len(v[0]) for v in users.values()],
       'user_data': {u: {'x': x, 'y': y} for u, (x, y) in users.items()}}
  path.write_text(json.dumps(d))
  return str(path)


def test_leaf_json_split_cifar10(tmp_path):
  ref = make_cifar10(str(tmp_path))
  y = ref['y_train']
  users = {'7': ([f'img_{i}_label_{y[i]}.png' for i in (5, 0, 99)], [int(y[i]) for i in (5, 0, 99)]),
           '2': ([f'img_{i}_label_{y[i]}.png' for i in (10, 11)], [int(y[i]) for i in (10, 11)])}
  path = _leaf(tmp_path / 'federated_train_alpha_0.05.json', users)
  ds = registry.get_dataset('cifar10', data_dir=str(tmp_path), split_json=path, check_official_sizes=False)
  assert ds.num_clients == 2 and list(ds.client_names) == ['7', '2']
  np.testing.assert_array_equal(ds.client_indices(0), [5, 0, 99])
  np.testing.assert_array_equal(ds.client_examples(1)[0], ref['x_train'][[10, 11]])
  # a label that does not match the data is an error, not silently wrong data
  bad = {'1': ([f'img_5_label_{(y[5] + 1) % 10}.png'], [int((y[5] + 1) % 10)])}
  with pytest.raises(ValueError, match='does not match'):
    registry.get_dataset('cifar10', data_dir=str(tmp_path), split_json=_leaf(tmp_path / 'bad.json', bad),
                         check_official_sizes=False)


def test_leaf_json_split_cifar100_with_repeated_file_name(tmp_path):
  ref = make_cifar100(str(tmp_path))
  names, y = ref['filenames'], ref['y_train']
  i2, i35 = names.index('baby_s_000333.png'), len(names) - 1 - names[::-1].index('baby_s_000333.png')
  assert {int(y[i2]), int(y[i35])} == {2, 35}
  users = {'0': (['baby_s_000333.png', names[3]], [35, int(y[3])]),
           '1': (['baby_s_000333.png', names[4]], [2, int(y[4])])}
  ds = cifar.load_federated('cifar100', str(tmp_path), split_json=_leaf(tmp_path / 's.json', users),
                            check_official_sizes=False)
  assert int(ds.y[ds.client_indices(0)[0]]) == 35 and int(ds.y[ds.client_indices(1)[0]]) == 2
  np.testing.assert_array_equal(ds.client_indices(0)[1:], [3])


# ---------------------------------------------------------------------------------------------------
# Dirichlet statistics on CIFAR-100's label shape (100 classes x 500).

def test_dirichlet_statistics_cifar100_shape():
  y = np.repeat(np.arange(100), 500)
  stats = {}
  for alpha in (0.0, 0.5, 1000.0):
    s = dirichlet_split(y, 100, alpha, examples_per_client=500, num_classes=100, seed=0)
    assert sorted(np.concatenate(s).tolist()) == list(range(50000))
    stats[alpha] = split_statistics(y, s)
  print('CIFAR-100 shape Dirichlet stats:', json.dumps(stats))
  assert stats[0.0]['classes_per_client_min'] == stats[0.0]['classes_per_client_max'] == 1
  assert stats[1000.0]['classes_per_client_mean'] > 90
  # the FedSAM reference split has 5.13 (2-13); 40 seeds of ours span 4.76-5.34 (benchmarks/speed/README.data.md)
  assert 4.5 <= stats[0.5]['classes_per_client_mean'] <= 5.8


# ---------------------------------------------------------------------------------------------------
# CIFAR-10-C / CIFAR-100-C.

def _make_cifar_c(root, n=4, corruptions=('fog', 'snow')):
  d = root / 'CIFAR-10-C'
  d.mkdir(parents=True)
  labels = np.tile(np.arange(n) % 10, 5).astype(np.uint8)
  np.save(d / 'labels.npy', labels)
  data = {}
  for j, c in enumerate(corruptions):
    x = np.zeros((5 * n, 32, 32, 3), np.uint8)
    for s in range(5):
      x[s * n:(s + 1) * n] = 10 * j + s + 1  # encodes corruption and severity
    np.save(d / f'{c}.npy', x)
    data[c] = x
  return labels, data


def test_cifar_c_load_and_iterate(tmp_path):
  labels, data = _make_cifar_c(tmp_path)
  assert len(cifar_c.CORRUPTIONS) == 19 and set(cifar_c.BENCHMARK_CORRUPTIONS) <= set(cifar_c.CORRUPTIONS)
  x, y = cifar_c.load_corruption(str(tmp_path), 'snow', 3, check_official_sizes=False)
  assert x.shape == (4, 32, 32, 3) and x.dtype == np.uint8 and np.all(x == 10 + 3)
  np.testing.assert_array_equal(y, labels[8:12])
  seen = [(c, s, int(x[0, 0, 0, 0])) for c, s, x, y in cifar_c.iterate(
      str(tmp_path), corruptions=('fog', 'snow'), check_official_sizes=False)]
  assert len(seen) == 10 and seen[0] == ('fog', 1, 1) and seen[-1] == ('snow', 5, 15)
  assert cifar_c.available(str(tmp_path)) == ('fog', 'snow')


def test_cifar_c_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='--dataset=cifar10_c'):
    cifar_c.load_corruption(str(tmp_path), 'fog', 1)
  _make_cifar_c(tmp_path)
  with pytest.raises(cifar_c.CifarCFormatError, match='50000'):
    cifar_c.load_corruption(str(tmp_path), 'fog', 1)  # official sizes required by default
  p = tmp_path / 'CIFAR-10-C' / 'fog.npy'
  p.write_bytes(p.read_bytes()[:-500])  # truncated download
  with pytest.raises(cifar_c.CifarCFormatError, match='truncated'):
    cifar_c.load_corruption(str(tmp_path), 'fog', 1, check_official_sizes=False)
  np.save(p, np.zeros((7, 32, 32, 3), np.uint8))  # wrong number of images
  with pytest.raises(cifar_c.CifarCFormatError, match='wrong or truncated'):
    cifar_c.load_corruption(str(tmp_path), 'fog', 1, check_official_sizes=False)
  with pytest.raises(ValueError, match='severity'):
    cifar_c.load_corruption(str(tmp_path), 'snow', 6, check_official_sizes=False)
