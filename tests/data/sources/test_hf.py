"""sources/hf.py: config.dataset='hf' on datasets built offline from local arrays and files (save_to_disk, a
CSV file, an Image column, a text column with a tokenizers JSON), trained end to end through ff.train."""
import numpy as np
import pytest

import fedjax_flat as ff
from fedjax_flat.config import validate
from fedjax_flat.config.default_config import data_section
from fedjax_flat.data import registry
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.errors import ConfigError
from tests.fixtures.configs import small_config

datasets = pytest.importorskip('datasets')   # the hf extra (installed by .ci/setup.sh)


def _save(tmp_path, n=240, classes=4):
  rng = np.random.default_rng(0)
  y = rng.integers(0, classes, n)
  x = (rng.normal(size=(n, 6)) + y[:, None]).astype(np.float32)      # learnable: the class shifts the mean
  feats = datasets.Features({'x': datasets.List(datasets.Value('float32'), length=6),
                             'label': datasets.ClassLabel(num_classes=classes)})
  dd = datasets.DatasetDict({'train': datasets.Dataset.from_dict({'x': x[:200], 'label': y[:200]}, features=feats),
                             'test': datasets.Dataset.from_dict({'x': x[200:], 'label': y[200:]}, features=feats)})
  path = str(tmp_path / 'saved')
  dd.save_to_disk(path)
  return path, x, y


def _config(path, **data):
  c = small_config(rounds=2, eval_every=1)
  c.dataset, c.data = 'hf', data_section(**{'path': path, 'features': 'x', 'seed': 0, **data})
  return c


def test_save_to_disk_flower_dirichlet_trains_two_rounds_through_ff_train(tmp_path):
  path, _, _ = _save(tmp_path)
  c = _config(path, partitioner='dirichlet', alpha=0.5, num_clients=5, min_partition_size=5)
  validate.validate_config(c)
  r = ff.train('fedavg', c)
  assert r.summary['rounds_completed'] == 2 and np.isfinite(r.summary['final_test_accuracy'])
  d = registry.get_dataset('hf', **c.data.to_dict())
  assert isinstance(d, FederatedDataset) and d.num_classes == 4 and d.num_clients == 5 and d.x.shape[1:] == (6,)
  assert d.client_sizes().sum() == 200 and d.client_sizes().min() >= 5 and d.name == 'hf:saved(dirichlet)'


def test_default_partitioner_is_the_projects_split_and_files_load_too(tmp_path):
  path, x, y = _save(tmp_path)
  d = registry.get_dataset('hf', path=path, features='x', num_clients=4, alpha=0.0, seed=2)
  from fedjax_flat.data.partition import dirichlet_split
  want = dirichlet_split(y[:200].astype(np.int32), 4, 0.0, num_classes=4, seed=2)
  for k in range(4):
    np.testing.assert_array_equal(d.client_examples(k)[1], y[:200][want[k]])
    np.testing.assert_array_equal(d.client_examples(k)[0], x[:200][want[k]])
  csv = tmp_path / 'table.csv'      # one local file: its only split is 'train'
  csv.write_text('a,b,label\n' + ''.join(f'{i * 0.5},{-i},{i % 3}\n' for i in range(30)))
  d = registry.get_dataset('hf', path=str(csv), features=['a', 'b'], test_split='train', partitioner='iid',
                           num_clients=3)
  assert d.input_shape == (2,) and d.num_classes == 3 and list(d.client_sizes()) == [10, 10, 10]


def test_images_are_decoded_once_and_text_is_tokenized(tmp_path):
  rng = np.random.default_rng(1)
  imgs = rng.integers(0, 255, (12, 5, 5), dtype=np.uint8)      # grayscale: stored with a channel axis
  feats = datasets.Features({'img': datasets.Image(), 'label': datasets.Value('int64')})
  ds = datasets.Dataset.from_dict({'img': list(imgs), 'label': np.arange(12) % 2}, features=feats)
  datasets.DatasetDict({'train': ds, 'test': ds}).save_to_disk(str(tmp_path / 'img'))
  d = registry.get_dataset('hf', path=str(tmp_path / 'img'), features='img', partitioner='iid', num_clients=3)
  assert d.x.dtype == np.uint8 and d.input_shape == (5, 5, 1)
  k0 = d.client_examples(0)
  np.testing.assert_array_equal(np.sort(k0[0].reshape(len(k0[0]), -1), 0),
                                np.sort(imgs[np.isin(np.arange(12), d.client_indices(0))].reshape(-1, 25), 0))

  tokenizers = pytest.importorskip('tokenizers')
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({'[PAD]': 0, '[UNK]': 1, 'good': 2, 'bad': 3},
                                                         unk_token='[UNK]'))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.save(str(tmp_path / 'tok.json'))
  text = datasets.Dataset.from_dict({'text': ['good good', 'bad', 'good bad odd'] * 4, 'label': [1, 0, 1] * 4})
  datasets.DatasetDict({'train': text, 'test': text}).save_to_disk(str(tmp_path / 'text'))
  d = registry.get_dataset('hf', path=str(tmp_path / 'text'), features='text', tokenizer=str(tmp_path / 'tok.json'),
                           seq_len=4, partitioner='iid', num_clients=2)
  np.testing.assert_array_equal(d.test_x[:3], [[2, 2, 0, 0], [3, 0, 0, 0], [2, 3, 1, 0]])


@pytest.mark.parametrize('data,match', [
    ({'split': 'validation'}, r"data.split='validation' is invalid: .* has the splits \['train', 'test'\]"),
    ({'features': 'pixels'}, r"data.features='pixels' .*no column 'pixels'; its columns: \['label', 'x'\]"),
    ({'partitioner': 'pathological', 'num_classes_per_partition': 9},
     r"data.partitioner='pathological' .*PathologicalPartitioner cannot split 200 examples"),
])
def test_bad_inputs_are_one_line_exit_2_before_training(tmp_path, data, match):
  path, _, _ = _save(tmp_path)
  c = _config(path, num_clients=4, **data)
  validate.validate_config(c)          # the fields are well formed: the data decide, when they are loaded
  with pytest.raises(ConfigError, match=match):
    ff.train('fedavg', c)


def test_validation_refuses_a_field_before_loading(tmp_path):
  c = _config(str(tmp_path / 'nowhere'), num_clients=4, partitioner='iid', alpha=0.5)
  with pytest.raises(ConfigError, match=r"data.alpha=0.5 .*'iid' does not read it"):
    validate.validate_config(c)
  c = _config(str(tmp_path / 'nowhere'), num_clients=4, partitioner='flower')
  with pytest.raises(ConfigError, match=r"data.partitioner='flower'"):
    validate.validate_config(c)
  with pytest.raises(ConfigError, match=r"data.path=.*nowhere.*not a save_to_disk directory"):
    registry.get_dataset('hf', path=str(tmp_path / 'nowhere'), num_clients=2)
