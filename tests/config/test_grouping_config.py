"""config.grouping validation (one ConfigError naming field, value and fix) and experiments/group.py."""
import json
import os
import subprocess
import sys

import pytest

from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config
from tests.fixtures.paths import REPO


CASES = [
    ({'method': 'spectral'}, 'grouping.method', 'allowed values'),
    ({'estimator': 'hist'}, 'grouping.estimator', 'allowed values'),
    ({'distance': 'wasserstein'}, 'grouping.distance', 'allowed values'),
    ({'method': 'kmeans', 'distance': 'cosine'}, 'grouping.distance', 'Euclidean'),
    ({'method': 'icg', 'distance': 'kl', 'estimator': 'conf'}, 'grouping.distance', 'Euclidean'),
    ({'method': 'greedy', 'distance': 'kl', 'estimator': 'clf'}, 'grouping.distance', "'conf'"),
    ({'method': 'greedy', 'distance': 'gini', 'estimator': 't2v'}, 'grouping.distance', 'probability'),
    ({'min_examples': 0}, 'grouping.min_examples', '>= 1'),
    ({'min_examples': 10.5}, 'grouping.min_examples', 'integer'),
    ({'max_clients': -1}, 'grouping.max_clients', '>= 0'),
    ({'pretrain_epochs': 0}, 'grouping.pretrain_epochs', '>= 1'),
    ({'pretrain_lr': float('nan')}, 'grouping.pretrain_lr', 'finite'),
    ({'pretrain_lr': float('inf')}, 'grouping.pretrain_lr', 'finite'),
    ({'pretrain_lr': -0.1}, 'grouping.pretrain_lr', '>= 0'),
    ({'probe_lr': 0.0}, 'grouping.probe_lr', '> 0'),
    ({'public_per_class': 0}, 'grouping.public_per_class', '>= 1'),
    ({'pca_variance': 1.5}, 'grouping.pca_variance', '<= 1'),
    ({'pca_variance': float('nan')}, 'grouping.pca_variance', 'finite'),
    ({'pca_standardize': 1}, 'grouping.pca_standardize', 'True or False'),
    ({'num_clusters': -2}, 'grouping.num_clusters', '>= 0'),
    ({'icg_iterations': 0}, 'grouping.icg_iterations', '>= 1'),
    ({'fisher': 'kfac'}, 'grouping.fisher', 'allowed values'),
    ({'seed': -2}, 'grouping.seed', '>= -1'),
    ({'probe_model': 'vit'}, 'grouping.probe_model', 'allowed values'),
    ({'probe_pretrained': '/nonexistent/probe.npz'}, 'grouping.probe_pretrained', 'no such file'),
    ({'probe_checkpoint': '/nonexistent/run'}, 'grouping.probe_checkpoint', 'run directory'),
]


@pytest.mark.parametrize('values,field,allowed', CASES)
def test_invalid_grouping_field_is_named(values, field, allowed):
  c = default_config()
  for k, v in values.items():
    with c.grouping.ignore_type():
      c.grouping[k] = v
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(c)
  assert e.value.field == field and allowed in str(e.value)


def test_valid_pairings_pass():
  for method, est, dist in (('random', 'clf', 'kl'), ('greedy', 'conf', 'kl'), ('greedy', 'conf', 'gini'),
                            ('greedy', 't2v', 'normalized_cosine'), ('kmeans', 't2v', 'auto'),
                            ('icg', 'clf', 'euclidean'), ('greedy', 'clf', 'auto')):
    c = default_config()
    c.grouping.method, c.grouping.estimator, c.grouping.distance = method, est, dist
    validate.validate_config(c)


def test_both_probe_sources_rejected(tmp_path):
  c = default_config()
  path = tmp_path / 'p.npz'
  path.write_bytes(b'')
  c.grouping.probe_pretrained = str(path)
  c.grouping.probe_checkpoint = str(tmp_path)
  with pytest.raises(validate.ConfigError, match='use one of the two'):
    validate.validate_config(c)


def _group(args, tmp_path):
  cmd = [sys.executable, os.path.join(REPO, 'experiments', 'group.py'), '--config=configs/quickstart.py',
         f'--workdir={tmp_path}', '--config.data.alpha=0', '--config.grouping.min_examples=200',
         '--config.grouping.max_clients=5'] + args
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_group_command_prints_and_saves_statistics(tmp_path):
  r = _group(['--config.grouping.method=random', '--compare=', '--num_superclients=4'], tmp_path)
  assert r.returncode == 0, r.stderr[-2000:]
  assert '| random | 4 |' in r.stdout and 'label entropy' in r.stdout
  rec = json.load(open(tmp_path / 'grouping' / 'report.json'))
  assert len(rec) == 1 and len(rec[0]['groups']) == 4 and rec[0]['summary']['each_client_once']
  assert os.path.exists(tmp_path / 'grouping' / 'report.md')


# slow: two group.py subprocesses; the default suite covers the binary's one-line exit 2 by
# tests/e2e/test_entry_point_errors.py[group: --compare=foo] and the distance check by
# test_invalid_grouping_field_is_named (in process)
@pytest.mark.slow
def test_group_command_bad_config_exits_2(tmp_path):
  r = _group(['--config.grouping.method=greedy', '--config.grouping.distance=gini'], tmp_path)
  assert r.returncode == 2
  assert 'config.grouping.distance' in r.stderr and 'Traceback' not in r.stderr
  r = _group(['--compare=spectral'], tmp_path)
  assert r.returncode == 2 and 'spectral' in r.stderr
