"""sources/tfds.py: config.dataset='tfds' on tfds.testing.mock_data (no TensorFlow: TFDS' data sources read
ArrayRecord files), and config.dataset='array_record' on ArrayRecord files written here, streamed and trained
through ff.train."""
import numpy as np
import pytest

import fedjax_flat as ff
from fedjax_flat.config import validate
from fedjax_flat.config.default_config import data_section
from fedjax_flat.data import registry
from fedjax_flat.data.federated import ClientDataSource, FederatedDataset
from fedjax_flat.errors import ConfigError
from tests.fixtures.configs import small_config

tfds = pytest.importorskip('tensorflow_datasets')    # the tfds extra (installed by .ci/setup.sh)


def test_tfds_mock_mnist_with_each_kind_of_partitioner():
  with tfds.testing.mock_data(num_examples=40):
    d = registry.get_dataset('tfds', name='mnist', num_clients=4, alpha=1.0, seed=0)
    assert isinstance(d, FederatedDataset) and d.num_classes == 10 and d.x.dtype == np.uint8
    assert d.input_shape == (28, 28, 1) and list(d.client_sizes()) == [10] * 4
    assert d.name == 'tfds:mnist(hsu_dirichlet)'
    s = registry.get_dataset('tfds', name='mnist', partitioner='shard', num_shards_per_partition=2, num_clients=4,
                             stream=True)
    assert isinstance(s, ClientDataSource) and s.client_sizes().sum() == 40
    x, y = s.client_examples(2)
    assert x.shape == (s.client_sizes()[2], 28, 28, 1) and y.dtype == np.int32
    with pytest.raises(ConfigError, match=r"data.label='digit' .*no column 'digit'; its columns: \['image', 'label'"):
      registry.get_dataset('tfds', name='mnist', label='digit', num_clients=2)
  with pytest.raises(ConfigError, match=r"data.name='no_such_set' is invalid: not a TFDS dataset"):
    registry.get_dataset('tfds', name='no_such_set', num_clients=2)


def _write(path, n, seed):
  from array_record.python import array_record_module
  from flax import serialization
  rng = np.random.default_rng(seed)
  w = array_record_module.ArrayRecordWriter(str(path), 'group_size:1')
  ys = []
  for _ in range(n):
    y = int(rng.integers(0, 3))
    w.write(serialization.msgpack_serialize({'x': (rng.normal(size=4) + y).astype(np.float32), 'label': y}))
    ys.append(y)
  w.close()
  return np.array(ys)


def test_array_record_files_stream_and_train_with_flower_dirichlet(tmp_path):
  _write(tmp_path / 'train-00000.ar', 60, 0)
  _write(tmp_path / 'train-00001.ar', 40, 1)
  _write(tmp_path / 'test.ar', 30, 2)
  c = small_config(rounds=2, eval_every=1)
  c.dataset = 'array_record'
  c.data = data_section(path=str(tmp_path / 'train-*.ar'), test_path=str(tmp_path / 'test.ar'), features='x',
                        partitioner='dirichlet', alpha=1.0, min_partition_size=3, num_clients=4, stream=True, seed=0)
  validate.validate_config(c)
  d = registry.get_dataset('array_record', **c.data.to_dict())
  assert isinstance(d, ClientDataSource) and d.client_sizes().sum() == 100 and d.input_shape == (4,)
  r = ff.train('fedavg', c)      # a streamed source: the host path reads each client when its batches are built
  assert r.summary['rounds_completed'] == 2 and np.isfinite(r.summary['final_test_accuracy'])
  with pytest.raises(ConfigError, match=r"data.test_path=.*missing.ar' is invalid: no such ArrayRecord file"):
    registry.get_dataset('array_record', path=str(tmp_path / 'test.ar'), test_path=str(tmp_path / 'missing.ar'),
                         features='x', num_clients=2)
