"""ff.register_dataset: a user's arrays, generator or per-client function as a registered dataset (data/user.py)."""
import numpy as np
import pytest

import fedjax_flat as ff
from fedjax_flat.config import validate
from fedjax_flat.data import registry as data_registry
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.errors import BadInputError, ConfigError
from fedjax_flat.registry import DuplicateName
from tests.fixtures.configs import small_config


@pytest.fixture(autouse=True)
def _clean_registry():
  before = set(data_registry.names())
  yield
  for name in set(data_registry.names()) - before:
    data_registry.DATASETS._entries.pop(name)


def _pairs(num_clients, n=6, shape=(3,), classes=3, seed=0):
  rng = np.random.default_rng(seed)
  return [(rng.normal(size=(n + k,) + shape), rng.integers(0, classes, n + k)) for k in range(num_clients)]


def blobs(num_clients=4, seed=0):
  """A user's dataset: a generator of clients (float64 features: stored float32)."""
  return {'clients': (xy for xy in _pairs(num_clients, seed=seed)), 'test': _pairs(1, n=10, seed=99)[0]}


def test_a_generator_of_clients_is_a_federated_dataset_with_the_declared_spec():
  ff.register_dataset('blobs', blobs)
  d = data_registry.get_dataset('blobs', num_clients=3, seed=1, alpha=0.0)     # alpha: not fn's, not passed
  assert isinstance(d, FederatedDataset) and d.name == 'blobs'
  assert d.num_clients == 3 and list(d.client_sizes()) == [6, 7, 8]
  assert d.input_shape == (3,) and d.input_dtype == np.float32 and d.label_shape == () and d.num_classes == 3
  x1, y1 = d.client_examples(1)
  want = _pairs(3, seed=1)[1]
  np.testing.assert_array_equal(x1, want[0].astype(np.float32))
  np.testing.assert_array_equal(y1, want[1])
  assert data_registry.builder_args('blobs') == ['num_clients', 'seed']      # fn's own signature


def test_config_dataset_trains_and_validation_refuses_a_field_fn_does_not_take():
  ff.register_dataset('blobs', blobs)
  c = small_config(dataset='blobs', clients_per_round=2, rounds=2)
  c.data.num_clients = 4
  validate.validate_config(c)
  r = ff.train('fedavg', c)
  assert r.data.num_clients == 4 and r.summary['dataset'] == 'blobs' and 0 <= r.summary['final_test_accuracy'] <= 1
  c.data.examples_per_client = 5
  with pytest.raises(ConfigError, match=r"data.examples_per_client.*not a field of dataset 'blobs'"):
    validate.validate_config(c)


def test_a_per_client_function_is_a_streamed_source_checked_when_read():
  pairs = _pairs(3)
  ff.register_dataset('streamed', lambda: {'clients': lambda k: pairs[k] if k != 2 else (pairs[2][0][:2],
                                                                                          pairs[2][1][:2]),
                                           'sizes': [len(y) for _, y in pairs], 'test': pairs[0],
                                           'num_classes': 3})
  src = data_registry.get_dataset('streamed')
  assert not isinstance(src, FederatedDataset) and src.num_clients == 3 and list(src.client_sizes()) == [6, 7, 8]
  np.testing.assert_array_equal(src.rows(1, np.array([0, 2]))[1], pairs[1][1][[0, 2]])
  with pytest.raises(BadInputError, match=r"dataset 'streamed': client 2 returned 2 examples but 'sizes'\[2\] = 8"):
    src.client_examples(2)


def test_a_dataset_returned_whole_is_used_as_is():
  d = FederatedDataset.from_client_indices(np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1]),
                                           [np.array([0, 1]), np.array([2, 3])], np.zeros((2, 2), np.float32),
                                           np.array([0, 1]), 2)
  ff.register_dataset('whole', lambda num_clients=2: d)
  assert data_registry.get_dataset('whole', num_clients=2) is d


@pytest.mark.parametrize('out, message', [
    ([1, 2], "fn returned list: return {'clients'"),
    ({'clients': []}, "missing ['test']"),
    ({'clients': [], 'test': ([[0.0]], [0]), 'extra': 1}, "unknown ['extra']"),
    ({'clients': [], 'test': ([[0.0]], [0])}, "'clients' is empty"),
    ({'clients': [([[0.0]], [0, 1])], 'test': ([[0.0]], [0])}, 'client 0: x has 1 examples but y has 2'),
    ({'clients': [([[0.0]], [0]), ([[0.0, 1.0]], [0])], 'test': ([[0.0]], [0])},
     'client 1 has x of shape [n, 2] float32 and y [n] but client 0 has x [n, 1] float32'),
    ({'clients': [([[0.0]], [0.5])], 'test': ([[0.0]], [0])}, 'labels y must be integers'),
    ({'clients': [([[0.0]], [5])], 'test': ([[0.0]], [0]), 'num_classes': 3},
     'client 0 holds labels in [5, 5], outside [0, num_classes=3)'),
    ({'clients': [([[0.0]], [0])], 'test': ([[0.0]], [-1])}, "'test' holds labels in [-1, -1]"),
    ({'clients': lambda k: ([[0.0]], [0]), 'test': ([[0.0]], [0])}, "give 'sizes'"),
    ({'clients': lambda k: ([[0.0]], [0]), 'sizes': [1], 'test': ([[0.0]], [0])}, "give 'num_classes'"),
    ({'clients': [([[0.0]], [0])], 'test': [[0.0]]}, "'test' must be a pair (x, y)"),
])
def test_bad_fn_output_is_one_line_naming_what_is_wrong(out, message):
  ff.register_dataset('bad', lambda: out)
  c = small_config(dataset='bad')
  c.data.num_clients = None
  with pytest.raises(BadInputError) as e:
    ff.train('fedavg', c)
  text = str(e.value)
  assert text.startswith("dataset 'bad': ") and message in text and '\n' not in text, text


def test_a_taken_name_is_refused_and_a_rerun_definition_replaces():
  with pytest.raises(DuplicateName, match="'digits' is already registered"):
    ff.register_dataset('digits', blobs)
  ff.register_dataset('blobs', blobs)
  ff.register_dataset('blobs', blobs)          # the same definition again (a notebook cell re-run): quiet
  with pytest.raises(DuplicateName):
    ff.register_dataset('blobs', lambda: None)
  with pytest.raises(BadInputError, match='fn is a function of the config.data fields'):
    ff.register_dataset('x', [1, 2])
