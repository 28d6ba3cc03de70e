"""CIFAR-C as extra test sets at the end of training: a report per corruption and severity."""
import csv

import numpy as np
import pytest

from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.training import trainers
from fedjax_flat.config.default_config import default_config
from fedjax_flat.errors import ConfigError


def _write_cifar_c(root, n=6, corruptions=('fog', 'snow')):
  d = root / 'CIFAR-10-C'
  d.mkdir(parents=True)
  np.save(d / 'labels.npy', np.tile(np.arange(n) % 3, 5).astype(np.uint8))
  rng = np.random.default_rng(0)
  for c in corruptions:
    np.save(d / f'{c}.npy', rng.integers(0, 255, (5 * n, 32, 32, 3)).astype(np.uint8))


def test_report_per_corruption_and_severity(tmp_path, capsys):
  _write_cifar_c(tmp_path)
  c = default_config()
  c.dataset, c.model, c.rounds, c.clients_per_round, c.eval_every = 'synthetic', 'mlp', 2, 2, 2
  c.progress_every_s = 1e9
  c.corruption_eval.name = 'cifar10_c'
  c.corruption_eval.data_dir = str(tmp_path)
  c.corruption_eval.severities = (1, 5)
  c.corruption_eval.check_official_sizes = False
  data = synthetic(3, 4, input_shape=(32, 32, 3), num_classes=3, seed=0)
  wd = tmp_path / 'run'
  t = trainers.make_trainer(c, str(wd), data=data)
  s = t.train()
  rep = s['corruptions']
  assert set(rep) >= {'fog', 'snow', 'mean_by_severity', 'mean'} and rep['model'] == 'global'
  assert set(rep['fog']) == {'1', '5'} and all(0.0 <= a <= 1.0 for a in rep['fog'].values())
  np.testing.assert_allclose(rep['mean_by_severity']['1'], (rep['fog']['1'] + rep['snow']['1']) / 2)
  rows = list(csv.reader(open(wd / 'corruptions.csv')))
  assert rows[0] == ['corruption', 'severity', 'accuracy'] and len(rows) == 5
  err = [line for line in capsys.readouterr().err.splitlines() if line.startswith('[cifar10_c]')]
  assert len(err) == 4 and err[0].startswith('[cifar10_c] 1/4 fog s1: acc ') and ' img/s, ETA ' in err[0]
  assert err[-1].startswith('[cifar10_c] 4/4 snow s5: ') and err[-1].endswith('ETA 0s')


def test_progress_rate_and_eta():
  """Fake clock: 10000 images per set; 3 sets in 30 s -> 1000 img/s and 5 sets left x 10 s = 50 s."""
  import io
  from fedjax_flat.evaluation.corruption import Progress
  t = [100.0]
  out = io.StringIO()
  p = Progress('cifar100_c', 8, out, clock=lambda: t[0])
  for i, (c, s) in enumerate([('fog', 1), ('fog', 2), ('snow', 1)]):
    t[0] += 10.0
    line = p.update(c, s, 10000, 0.5 + i / 10)
  assert line == '[cifar100_c] 3/8 snow s1: acc 0.7000 | 30.0 s, 1000 img/s, ETA 50s'
  assert out.getvalue().splitlines()[-1] == line
  t[0] += 4000.0
  assert p.update('glass_blur', 5, 10000, 0.1).endswith('ETA 1h07m10s')   # 4030 s / 4 done x 4 left = 4030 s


def test_missing_corruption_files_are_bad_input_before_training(tmp_path):
  """The CIFAR-C files are read after training: a wrong data_dir is one ConfigError when the trainer is built."""
  c = default_config()
  c.dataset, c.model, c.rounds, c.clients_per_round, c.eval_every = 'synthetic', 'mlp', 2, 2, 2
  c.corruption_eval.name = 'cifar10_c'
  c.corruption_eval.data_dir = str(tmp_path / 'nowhere')
  data = synthetic(3, 4, input_shape=(32, 32, 3), num_classes=3, seed=0)
  with pytest.raises(ConfigError, match=r'corruption_eval.data_dir=.*CIFAR-10-C not found.*download.py '
                                        r'--dataset=cifar10_c'):
    trainers.make_trainer(c, str(tmp_path / 'run'), data=data)
