"""The centralized upper bound (training/centralized.py) and summary.json's rounds to 70% / 90% of it."""
import json
import os

import pytest

from fedjax_flat.training import centralized

from fedjax_flat.config import validate
from fedjax_flat.training import run as run_lib
from fedjax_flat.config.default_config import default_config
from tests.fixtures.paths import REPO


def _config():
  c = default_config()
  c.data.num_clients, c.data.alpha = 10, 0.0
  c.client.lr, c.client.batch_size = 0.05, 32
  c.clients_per_round = 5
  c.eval_every = 1
  c.progress_every_s = 1e9
  c.summary_last_k = 1
  return c


def test_rounds_to_with_window():
  recs = [{'round': r, 'test_accuracy': a} for r, a in ((2, 0.5), (4, 0.8), (6, 0.7), (8, 0.95), (10, 0.9))]
  assert centralized.rounds_to(recs, 'test_accuracy', 0.7) == 4
  assert centralized.rounds_to(recs, 'test_accuracy', 0.75, window=2) == 6    # (0.8 + 0.7) / 2 = 0.75
  assert centralized.rounds_to(recs, 'test_accuracy', 0.9, window=3) is None   # best 3-mean: 0.85
  assert centralized.rounds_to(recs, 'swa/test_accuracy', 0.1) is None
  assert centralized.fraction_key(0.7) == 'rounds_to_70pct_centralized'


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_centralized_beats_one_federated_round_and_feeds_rounds_to(tmp_path):
  c = _config()
  c.centralized.epochs = 4
  res = centralized.train(c, str(tmp_path / 'central'))
  saved = json.loads((tmp_path / 'central' / 'centralized.json').read_text())
  assert saved['final_test_accuracy'] == res['final_test_accuracy']
  from fedjax_flat.data import registry
  data = registry.get_dataset(c.dataset, **c.data.to_dict())
  assert saved['num_train_examples'] == int(data.client_sizes().sum()) and len(saved['epochs']) == 4
  assert saved['hparams'] == {'epochs': 4, 'lr': 0.05, 'momentum': 0.9, 'weight_decay': 4e-4, 'batch_size': 32,
                              'schedule': 'cosine'}
  f = _config()
  f.rounds = 5
  f.centralized.path = str(tmp_path / 'central')        # the workdir (its centralized.json is read)
  f.centralized.fractions = (0.3, 0.7, 0.9)
  s = run_lib.run(f, str(tmp_path / 'fed'))
  assert s['centralized_accuracy'] == res['final_test_accuracy']
  assert s['centralized_source'] == str(tmp_path / 'central' / 'centralized.json')
  recs = [json.loads(line) for line in open(tmp_path / 'fed' / 'metrics.jsonl')]
  # round 1 of this run is a 1-round federated run (same seed: same clients and batches)
  assert recs[0]['round'] == 1 and res['final_test_accuracy'] > 0.9 > recs[0]['test_accuracy']
  for frac in (0.3, 0.7, 0.9):
    want = next((r['round'] for r in recs if r['test_accuracy'] >= frac * res['final_test_accuracy']), None)
    assert s[centralized.fraction_key(frac)] == want
  assert s['rounds_to_30pct_centralized'] is not None
  disk = json.loads((tmp_path / 'fed' / 'summary.json').read_text())
  assert disk['rounds_to_70pct_centralized'] == s['rounds_to_70pct_centralized']


@pytest.mark.parametrize('field,value,msg', [
    ('accuracy', 1.5, 'fraction'), ('accuracy', float('nan'), 'finite'), ('epochs', 0, '>= 1'),
    ('momentum', 1.0, '[0, 1)'), ('weight_decay', -0.5, '-1'), ('schedule', 'step', 'allowed'),
    ('window', 0, '>= 1'), ('fractions', (0.7, 1.2), 'in (0, 1]'), ('fractions', (), 'in (0, 1]'),
    ('lr', float('inf'), 'finite'), ('lr', -0.1, '>= 0'), ('path', '/nonexistent/centralized.json', 'cannot read')])
def test_validation(field, value, msg):
  c = default_config()
  with c.centralized.ignore_type():
    c.centralized[field] = value
  with pytest.raises(validate.ConfigError, match=f'centralized.{field}') as e:
    validate.validate_config(c)
  assert msg in str(e.value)


def test_path_must_hold_a_centralized_result(tmp_path):
  p = tmp_path / 'x.json'
  p.write_text(json.dumps({'final_test_accuracy': 87.5}))       # percent, not a fraction
  c = default_config()
  c.centralized.path = str(p)
  with pytest.raises(validate.ConfigError, match=r'\(0, 1\]'):
    validate.validate_config(c)
  p.write_text(json.dumps({'final_test_accuracy': 0.875}))
  validate.validate_config(c)
  c.centralized.accuracy = 0.8
  with pytest.raises(validate.ConfigError, match='one of the two'):
    validate.validate_config(c)


def test_binary_exits_2_on_a_bad_field(tmp_path):
  import subprocess
  import sys
  repo = REPO
  res = subprocess.run([sys.executable, os.path.join(repo, 'experiments', 'centralized.py'),
                        f'--config={os.path.join(repo, "configs", "quickstart.py")}', f'--workdir={tmp_path}',
                        '--config.centralized.momentum=1.5'], capture_output=True, text=True, timeout=120)
  assert res.returncode == 2 and 'error: config.centralized.momentum' in res.stderr and 'Traceback' not in res.stderr
