"""training/writers.py: the run's final result line names its task's headline metric."""
import pytest

from fedjax_flat.training import writers


def test_final_line_is_miou_for_segmentation_and_accuracy_otherwise():
  seg = {'rounds_completed': 5, 'reported_model': 'global', 'final_test_accuracy': 0.9123, 'final_test_miou': 0.4567}
  assert writers.final_line(seg) == ('done: 5 rounds, final test mIoU 45.67% (pixel accuracy 0.9123; '
                                     'global model)')
  cls = {'rounds_completed': 7, 'reported_model': 'swa', 'final_test_accuracy': 0.5}
  assert writers.final_line(cls) == 'done: 7 rounds, final test accuracy 0.5000 (swa model)'


def test_personalized_plot_from_the_summary_section(tmp_path):
  rows = lambda accs: [{'client': k, 'n': 10, 'acc': a, 'auc': 0.5} for k, a in enumerate(accs)]   # noqa: E731
  res = {'personal_model': 'fedsoup', 'local': {'acc_client_mean': 0.7, 'per_client': rows([0.6, 0.8, 0.7])},
         'global': {'acc_client_mean': 0.5, 'per_client': rows([0.5, 0.4, 0.6])},
         'server': {'local_acc_client_mean': 0.65, 'global_acc': 0.55},
         'finetune': [{'epoch': 0, 'local_acc_client_mean': 0.7, 'global_acc_client_mean': 0.5},
                      {'epoch': 1, 'local_acc_client_mean': 0.75, 'global_acc_client_mean': 0.45}]}
  path = tmp_path / 'personalized.png'
  assert writers.plot_personalized(res, str(path), title='t') and path.stat().st_size > 10000
  import matplotlib.image
  assert matplotlib.image.imread(str(path)).shape[1] > 1200          # two panels: bars and the fine-tuning curve
  del res['finetune']
  assert writers.plot_personalized(res, str(path)) and matplotlib.image.imread(str(path)).shape[1] < 1000
  # no per-client rows (personalized.per_client=False): nothing to draw, no file
  assert not writers.plot_personalized({'local': {'acc_client_mean': 0.7}}, str(tmp_path / 'none.png'))
  assert not (tmp_path / 'none.png').exists()


def test_model_selection_by_validation_and_its_files(tmp_path):
  """Retrieval runs with validation clients: the first round with the highest val_recall@5 (the benchmark's
  rule) is selected with that round's validation and test numbers (another metric on request); the val_*
  metrics reach metrics.csv and the per-model summary; summary.md says the selection; a run without val_* has
  no selection; another model's selection reads its prefixed keys."""
  import csv
  import json
  recs = [{'round': r, 'test_accuracy': t, 'test_loss': 0.5, 'test_recall@1': t, 'test_recall@5': t + 0.1,
           'val_accuracy': v1, 'val_recall@1': v1, 'val_recall@5': v5, 'val_loss': 0.3, 'swa/test_accuracy': 0.9,
           'swa/test_loss': 0.1, 'swa/val_recall@5': sv}
          for r, t, v1, v5, sv in ((5, 0.40, 0.50, 0.80, 0.1), (10, 0.45, 0.70, 0.85, 0.3), (15, 0.60, 0.75, 0.80, 0.2),
                                   (20, 0.55, 0.70, 0.85, 0.3))]
  sel = writers.select_by_validation(recs)
  assert sel['best_round'] == 10 and sel['selected_by'] == 'val_recall@5' and sel['model'] == 'global'
  assert sel['test_recall@1'] == 0.45 and sel['test_recall@5'] == 0.55 and sel['val_recall@1'] == 0.70
  assert writers.select_by_validation(recs, metric='val_recall@1')['best_round'] == 15
  assert writers.select_by_validation(recs, 'swa')['best_round'] == 10
  assert writers.select_by_validation([{'round': 1, 'test_accuracy': 0.3, 'test_loss': 1.0}]) == {}
  w = writers.MetricsWriter(str(tmp_path), tensorboard=False)
  for r in recs:
    w.write(r)
  with open(tmp_path / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  assert [float(r['val_recall@1']) for r in rows] == [0.5, 0.7, 0.75, 0.7]
  summary = writers.summarize(recs, 2, {'experiment': 'x', 'reported_model': 'global'})
  assert summary['models']['global']['final_val_recall@1'] == 0.70
  assert summary['models']['global']['mean_last_2_val_recall@1'] == pytest.approx(0.725)
  summary['validation'] = sel
  writers.write_summary(str(tmp_path), summary)
  assert json.load(open(tmp_path / 'summary.json'))['validation']['best_round'] == 10
  assert 'round 10, val_recall@5 0.8500, test R@1 0.4500' in open(tmp_path / 'summary.md').read()


def test_metrics_png_title_names_the_client_optimizer():
  from fedjax_flat.config.default_config import default_config
  from fedjax_flat.training.recorder import plot_title
  c = default_config()
  c.dataset, c.client.optimizer = 'digits', 'sam'
  assert plot_title('fedavg', c) == 'fedavg (sam clients) on digits'
  c.client.optimizer = 'sgd'
  assert plot_title('fedgloss', c) == 'fedgloss (sgd clients) on digits'


def test_retrieval_results_say_r_at_1_not_test_accuracy(tmp_path, monkeypatch):
  # The task declares what its accuracy is (tasks/base.metric_names): R@1 for retrieval, written into summary.json
  # `metric_names`; the console's last line, summary.md and metrics.png name it.
  from matplotlib.axes import Axes

  from fedjax_flat.tasks import base as tasks_base
  from fedjax_flat.tasks.retrieval import Retrieval
  from fedjax_flat.tasks.segmentation import Segmentation
  names = tasks_base.metric_names(Retrieval())
  assert names == {'accuracy': 'R@1', 'headline': 'test_accuracy', 'headline_label': 'R@1'}
  assert tasks_base.metric_names(Segmentation())['headline'] == 'test_miou'
  assert tasks_base.metric_names(tasks_base.Classification())['accuracy'] == 'accuracy'
  recs = [{'round': 1, 'test_accuracy': 0.4, 'test_loss': 1.0}, {'round': 2, 'test_accuracy': 0.5, 'test_loss': 0.9}]
  summary = writers.summarize(recs, 2, {'experiment': 'x', 'reported_model': 'global', 'rounds_completed': 2,
                                        'metric_names': names})
  assert writers.final_line(summary) == 'done: 2 rounds, final test R@1 0.5000 (global model)'
  writers.write_summary(str(tmp_path), summary)
  md = open(tmp_path / 'summary.md').read()
  assert '| model | final R@1 | mean last-K R@1 |' in md and 'acc' not in md
  labels = []
  monkeypatch.setattr(Axes, 'set_ylabel', lambda self, s, *a, **k: labels.append(s))
  writers.plot_metrics(recs, str(tmp_path / 'metrics.png'), accuracy_name=names['accuracy'])
  writers.plot_system([{**r, 'virtual_time_s': 1.0, 'bytes_down': 1.0, 'bytes_up': 1.0} for r in recs],
                      str(tmp_path / 'system.png'), accuracy_name=names['accuracy'])
  assert labels == ['test R@1', 'loss', 'test R@1', 'test R@1']


def test_metrics_and_summary_never_hold_non_finite_json(tmp_path):
  """Issue 48: system.speed_sigma=1000 wrote `Infinity` into metrics.jsonl (not JSON to most readers). Non-finite
  numbers are written as null, in records, nested values, the rewrite on resume and summary.json."""
  import json
  import math
  import numpy as np
  w = writers.MetricsWriter(str(tmp_path), tensorboard=False)
  w.write({'round': 1, 'virtual_time_s': float('inf'), 'x': np.float32('nan'), 'ok': 1.5, 'v': [1.0, np.inf],
           'nested': {'a': -math.inf, 'b': 2}})
  w.load_existing(1)          # the rewrite path
  text = (tmp_path / 'metrics.jsonl').read_text()
  assert 'Infinity' not in text and 'NaN' not in text
  rec = json.loads(text, parse_constant=lambda c: pytest.fail(c))
  assert rec == {'round': 1, 'virtual_time_s': None, 'x': None, 'ok': 1.5, 'v': [1.0, None],
                 'nested': {'a': None, 'b': 2}}
  writers.write_summary(str(tmp_path), {'rounds_completed': 1, 'comm_total_ratio': float('nan'),
                                        'facts': {'t': np.float64('inf')}, 'models': {}})
  s = json.loads((tmp_path / 'summary.json').read_text(), parse_constant=lambda c: pytest.fail(c))
  assert s['comm_total_ratio'] is None and s['facts']['t'] is None
