"""The groups plug-in (training/evals/groups.py): a run on a dataset that declares groups carries the worst /
average / per-group test accuracies in every evaluation record, consistent with its test accuracy and the test
group counts; summary.json `groups` names the worst group; bad group labels are refused before compiling."""
import json
import types

import numpy as np
import pytest

from fedjax_flat.errors import DataFormatError
from fedjax_flat.tasks.base import Classification
from fedjax_flat.tasks.groups import GroupLabelled
from fedjax_flat.training import run as run_lib
from fedjax_flat.training.evals import groups
from tests.fixtures.configs import small_config


@pytest.mark.slow   # a whole run (about 10-30 s on 2 shared cores); test_final_* covers the summary fast
def test_records_and_summary_of_a_grouped_run(tmp_path):
  c = small_config(**{'dataset': 'spurious_digits', 'data.num_clients': 4, 'data.strength': 0.9,
                      'data.alpha': float('inf'), 'data.test_fraction': 0.1, 'rounds': 2, 'eval_every': 1})
  summary = run_lib.run(c, str(tmp_path))
  recs = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  recs = [r for r in recs if 'test_accuracy' in r]
  assert [r['round'] for r in recs] == [1, 2]
  counts = np.asarray(summary['groups']['test_counts'], np.float64)
  assert len(counts) == 20 and counts.min() > 0
  for r in recs:
    acc = np.asarray([r[f'test_group_acc/{g}'] for g in range(20)])
    assert r['test_worst_group_acc'] == pytest.approx(acc.min(), abs=1e-6)
    assert r['test_avg_group_acc'] == pytest.approx(acc.mean(), abs=1e-6)
    # the groups partition the test set: their count-weighted accuracies give the test accuracy
    assert r['test_accuracy'] == pytest.approx(float(acc @ counts / counts.sum()), abs=1e-5)
  g = summary['groups']
  assert g['model'] == 'global' and g['round'] == 2 and g['worst_group_acc'] == recs[-1]['test_worst_group_acc']
  assert g['worst_group'] == g['names'][int(np.argmin(g['accuracy']))]
  assert 'worst-group accuracy' in (tmp_path / 'summary.md').read_text()


def _plan(test_y, num_groups=3):
  data = types.SimpleNamespace(test_y=np.asarray(test_y), group_names=('a', 'b', 'c'))
  return types.SimpleNamespace(task=GroupLabelled(num_groups=num_groups), data=data, dataset_name='toy')


def test_check_refuses_groups_outside_the_declared_range_and_warns_on_empty(caplog):
  with pytest.raises(DataFormatError, match=r'test group 3 is outside \[0, 3\)'):
    groups._check(_plan([[0, 0], [1, 3]]))
  with pytest.raises(DataFormatError, match='labels \\[class, group\\]'):
    groups._check(_plan([0, 1]))
  groups._check(_plan([[0, 0], [1, 2]]))
  assert 'b' in caplog.text
  assert groups._applies(_plan([[0, 0]])) and not groups._applies(types.SimpleNamespace(task=Classification()))


def test_final_summarizes_the_reported_models_last_record():
  plan = _plan([[0, 0], [1, 1], [1, 1], [0, 2]])
  rec = {'round': 4, 'swa/test_accuracy': 0.5, 'swa/test_worst_group_acc': 0.0, 'swa/test_avg_group_acc': 0.5,
         'swa/test_group_acc/0': 1.0, 'swa/test_group_acc/1': 0.5, 'swa/test_group_acc/2': 0.0}
  trainer = types.SimpleNamespace(plan=plan, data=plan.data,
                                  recorder=types.SimpleNamespace(records=[{'round': 2}, rec, {'round': 5}]))
  summary = {}
  groups._final(trainer, summary, 'swa')
  assert summary['groups'] == {'model': 'swa', 'round': 4, 'names': ['a', 'b', 'c'], 'test_counts': [1, 2, 1],
                               'accuracy': [1.0, 0.5, 0.0], 'worst_group_acc': 0.0, 'avg_group_acc': 0.5,
                               'worst_group': 'c'}
  assert 'swa worst-group accuracy 0.000 (c)' in summary['facts']['groups']
