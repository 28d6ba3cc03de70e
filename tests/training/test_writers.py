"""training/writers.py: the run's final result line names its task's headline metric."""
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
