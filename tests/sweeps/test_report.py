"""experiments/report.py: hand-written workdirs (config.json, summary.json, metrics.jsonl, hessian/) -> exact table."""
import csv
import json
import os
import subprocess
import sys

import pytest

from fedjax_flat.sweeps import report as report_lib
from tests.fixtures.paths import REPO as ROOT

REPORT = os.path.join(ROOT, 'experiments', 'report.py')


def _write(path, obj=None, lines=None):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    if lines is not None:
      f.write(''.join(json.dumps(l) + '\n' for l in lines))
    else:
      json.dump(obj, f)


def _run(d, seed, opt, *, summary=None, records=(), published=None, lam=None):
  cfg = {'seed': seed, 'rounds': 10, 'client': {'optimizer': opt}, 'published': published or {}}
  _write(os.path.join(d, 'config.json'), cfg)
  _write(os.path.join(d, 'metrics.jsonl'), lines=list(records))
  if summary is not None:
    _write(os.path.join(d, 'summary.json'), summary)
  if lam is not None:
    _write(os.path.join(d, 'hessian', 'hessian_global.json'), {'lambda_max': lam, 'eigenvalues': [lam]})


def _summary(lastk, final, model='global', wall=10.0):
  return {'rounds_completed': 10, 'rounds_planned': 10, 'reported_model': model, 'summary_last_k': 2,
          'mean_last_2_test_accuracy': lastk, 'final_test_accuracy': final, 'comm_total_bytes': 2e6,
          'wall_time_total_s': wall}


@pytest.fixture
def sweep_dir(tmp_path):
  """Cell A: 2 finished seeds (global model, published 80, lambda_max 4 and 6). Cell B: SWA reported, one
  finished seed and one killed (no summary.json), reference 55 +- 1."""
  d = str(tmp_path / 'syn')
  pub = {'source': 'paper Table 1', 'accuracy': 80.0}
  _run(f'{d}/A/seed=0', 0, 'sgd', summary=_summary(0.80, 0.82), published=pub, lam=4.0,
       records=[{'round': 5, 'test_accuracy': 0.70}, {'round': 10, 'test_accuracy': 0.82}])
  _run(f'{d}/A/seed=1', 1, 'sgd', summary=_summary(0.90, 0.88, wall=20.0), published=pub, lam=6.0,
       records=[{'round': 5, 'test_accuracy': 0.90}, {'round': 10, 'test_accuracy': 0.88}])
  # B: the global chain passes 0.8 but the reported (SWA) model never does.
  _run(f'{d}/B/seed=0', 0, 'sam', summary=_summary(0.60, 0.65, model='swa'),
       records=[{'round': 5, 'test_accuracy': 0.95, 'swa/test_accuracy': 0.55},
                {'round': 10, 'test_accuracy': 0.95, 'swa/test_accuracy': 0.65}])
  _run(f'{d}/B/seed=1', 1, 'sam', records=[{'round': 5, 'test_accuracy': 0.5}])
  ref = {'source': 'earlier table', 'accuracy': 55.0, 'accuracy_std': 1.0}
  runs = [dict(cell=c, seed=s, workdir=f'{c}/seed={s}', reference=ref if c == 'B' else None)
          for c in 'AB' for s in (0, 1)]
  _write(os.path.join(d, 'sweep.json'), {'name': 'syn', 'description': 'synthetic', 'runs': runs})
  return d


def test_aggregate_exact_values(sweep_dir):
  rows = report_lib.aggregate(report_lib.collect([sweep_dir]), ['cell'], target=0.8)
  a, b = rows
  assert (a['cell'], a['runs'], a['finished'], a['model']) == ('A', 2, 2, 'global')
  assert a['acc_lastk_mean'] == pytest.approx(85.0) and a['acc_lastk_std'] == pytest.approx(5.0)
  assert a['acc_final_mean'] == pytest.approx(85.0) and a['acc_final_std'] == pytest.approx(3.0)
  assert a['rounds_to_target_mean'] == 7.5 and a['reached_target'] == '2/2'      # rounds 10 and 5
  assert a['lambda_max_mean'] == 5.0 and a['lambda_max_std'] == 1.0 and a['lambda_max_runs'] == 2
  assert a['comm_mb_mean'] == 2.0 and a['wall_s_mean'] == 15.0
  assert a['published_acc'] == 80.0 and a['diff_published'] == pytest.approx(5.0) and a['reference_acc'] is None
  assert (b['runs'], b['finished'], b['model'], b['failed']) == (2, 1, 'swa', 'B/seed=1')
  assert b['acc_lastk_mean'] == pytest.approx(60.0) and b['acc_lastk_std'] == 0.0
  assert b['rounds_to_target_mean'] is None and b['reached_target'] == '0/1'     # SWA model, not the global one
  assert b['diff_reference'] == pytest.approx(5.0) and b['lambda_max_mean'] is None
  assert report_lib.rounds_to_target([{'round': 3, 'x': 0.5}, {'round': 6, 'x': 0.9}], 'x', 0.9) == 6


def test_bits_to_target_from_cumulative_comm_bytes(tmp_path):
  """Table 4.19's column: bits (8 x cumulative comm_bytes) up to the first evaluation at or above --target."""
  recs0 = [{'round': 2, 'test_accuracy': 0.5, 'comm_bytes': 100.0}, {'round': 4, 'test_accuracy': 0.7,
                                                                       'comm_bytes': 200.0},
           {'round': 6, 'test_accuracy': 0.9, 'comm_bytes': 300.0}]
  recs1 = [{'round': 2, 'test_accuracy': 0.75, 'comm_bytes': 400.0}, {'round': 4, 'test_accuracy': 0.6,
                                                                        'comm_bytes': 800.0}]
  recs2 = [{'round': 2, 'test_accuracy': 0.1, 'comm_bytes': 10.0}]                  # never reaches 0.7
  for s, recs in enumerate((recs0, recs1, recs2)):
    _run(str(tmp_path / f'X/seed={s}'), s, 'sgd', summary=_summary(0.8, 0.8), records=recs)
  assert report_lib.bits_to_target(recs0, 'test_accuracy', 0.7) == 1600.0          # round 4: 200 bytes
  assert report_lib.bits_to_target(recs0, 'test_accuracy', 0.95) is None
  assert report_lib.bits_to_target([{'round': 1, 'test_accuracy': 0.9}], 'test_accuracy', 0.5) is None
  assert report_lib.bits_to_target([{'round': 1, 'test_accuracy': float('nan'), 'comm_bytes': 1.0}],
                                   'test_accuracy', 0.5) is None
  (row,) = report_lib.aggregate(report_lib.collect(workdirs=[str(tmp_path / 'X/seed=*')]), ['cell'], target=0.7)
  assert row['bits_to_target_mean'] == pytest.approx((1600.0 + 3200.0) / 2) and row['bits_to_target_runs'] == 2
  assert row['rounds_to_target_mean'] == 3.0 and row['reached_target'] == '2/3'
  md = '\n'.join(report_lib.markdown_table([row], ['cell'], 0.7))
  assert '| rounds to 0.7 | bits to 0.7 |' in md and '| 3.0 (2/3) | 2.4e+03 (2/3) |' in md


def test_binary_writes_markdown_csv_plots(sweep_dir, tmp_path):
  out = tmp_path / 'rep'
  p = subprocess.run([sys.executable, REPORT, f'--sweep_dir={sweep_dir}', f'--out_dir={out}', '--target=0.8',
                      '--title=Synthetic'], capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert p.returncode == 1 and '2 rows from 4 runs (1 unfinished, 0 non-finite, 0 torn metrics lines)' in p.stdout, \
      p.stdout + p.stderr
  md = (out / 'report.md').read_text()
  assert ('| cell | model | last-K acc (%) | final acc (%) | seeds | rounds to 0.8 | bits to 0.8 | lambda_max | '
          'comm (MB) | '
          'published (%) | diff | reference (%) | diff |') in md
  assert ('| A | global | 85.00 ± 5.00 | 85.00 ± 3.00 | 2/2 | 7.5 (2/2) |  | 5.00 ± 1.00 | 2 | 80.00 | +5.00 '
          '|  |  |') in md
  assert ('| B | swa | 60.00 ± 0.00 | 65.00 ± 0.00 | 1/2 | not reached (0/1) |  |  | 2 |  |  | 55.00 ± 1.00 '
          '| +5.00 |') in md
  assert 'Unfinished or failed runs (not averaged): B/seed=1' in md
  with open(out / 'report.csv') as f:
    rows = list(csv.DictReader(f))
  assert [r['cell'] for r in rows] == ['A', 'B']
  assert float(rows[0]['acc_lastk_mean']) == 85.0 and float(rows[0]['diff_published']) == 5.0
  assert rows[1]['failed'] == 'B/seed=1' and float(rows[1]['reference_acc']) == 55.0
  for name in ('report_syn_curves.png', 'report_syn_bars.png'):
    assert (out / name).stat().st_size > 5000


def test_workdirs_glob_grouped_by_config_key(sweep_dir, tmp_path):
  runs = report_lib.collect(workdirs=[f'{sweep_dir}/*/seed=*'])
  assert sorted(r['cell'] for r in runs) == ['A', 'A', 'B', 'B']
  rows = report_lib.aggregate(runs, ['client.optimizer'])
  assert [(r['client.optimizer'], r['finished'], round(r['acc_lastk_mean'], 6)) for r in rows] == \
      [('sgd', 2, 85.0), ('sam', 1, 60.0)]
  p = subprocess.run([sys.executable, REPORT, f'--workdirs={sweep_dir}/A/seed=*', f'--out_dir={tmp_path}/r2',
                      '--group_by=client.nope'], capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert p.returncode == 2 and 'client.nope' in p.stderr and len(p.stderr.strip().splitlines()) == 1
  p = subprocess.run([sys.executable, REPORT, f'--workdirs={tmp_path}/none*', f'--out_dir={tmp_path}/r2'],
                     capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert p.returncode == 2 and 'matches no run directory' in p.stderr


def test_runs_of_different_experiments_are_not_pooled_as_seeds(tmp_path):
  """Grouped by client.optimizer, FedAvg (server momentum 0) and FedAvgM (0.9) are two rows, not "2/2 seeds";
  the seed, the device record and the checkpoint cadence do not split; a run without config.json stays counted."""
  d = tmp_path / 'w'
  for name, seed, mom, extra in (('avg0', 0, 0.0, {}), ('avg1', 1, 0.0, {'host_devices': {'devices': 2},
                                                                        'checkpoint_every': 7}),
                                 ('avgm0', 0, 0.9, {})):
    _run(str(d / name), seed, 'sgd', summary=_summary(0.8 if mom else 0.6, 0.8))
    cfg = json.loads((d / name / 'config.json').read_text())
    cfg.update(server={'optimizer': 'sgd', 'momentum': mom}, **extra)
    _write(str(d / name / 'config.json'), cfg)
  rows = report_lib.aggregate(report_lib.collect(workdirs=[str(d / '*')]), ['client.optimizer'])
  assert [(r['differs'], r['finished'], r['runs'], round(r['acc_lastk_mean'], 6)) for r in rows] == \
      [('server.momentum=0.0', 2, 2, 60.0), ('server.momentum=0.9', 1, 1, 80.0)]
  # the key asked for as a grouping key names the rows instead of splitting them
  rows = report_lib.aggregate(report_lib.collect(workdirs=[str(d / '*')]), ['server.momentum'])
  assert [(r['server.momentum'], r['differs'], r['finished']) for r in rows] == [('0.0', '', 2), ('0.9', '', 1)]
  runs = report_lib.collect(workdirs=[str(d / '*')])
  runs.append(dict(runs[0], workdir='x', config=None, summary=None, finished=False))   # a run that never started
  for r in runs:
    r['cell'] = 'one cell'
  a, b = report_lib.aggregate(runs, ['cell'])
  assert (a['differs'], a['runs'], a['finished'], a['failed'], b['runs']) == \
      ('server.momentum=0.0', 3, 2, 'one cell/seed=0', 1)
  md = '\n'.join(report_lib.markdown_table(rows, ['server.momentum'], None))
  assert 'differs in' not in md
  p = subprocess.run([sys.executable, REPORT, f'--workdirs={d}/*', f'--out_dir={tmp_path}/rep',
                      '--group_by=client.optimizer'], capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert p.returncode == 0 and 'split' in p.stderr and 'server.momentum' in p.stderr, p.stdout + p.stderr
  md = (tmp_path / 'rep' / 'report.md').read_text()
  assert '| client.optimizer | differs in | model |' in md
  assert '| sgd | server.momentum=0.0 | global | 60.00 ± 0.00 |' in md and '| sgd | server.momentum=0.9 |' in md


def test_compute_dtype_splits_runs_other_engine_fields_do_not(tmp_path):
  """engine.compute_dtype changes the result: bfloat16 and float32 runs are two rows; a config.json without the
  field (written before it existed) ran float32; engine.strategy stays an execution detail."""
  d = tmp_path / 'w'
  for name, seed, engine in (('f0', 0, {'strategy': 'vmap'}), ('f1', 1, {'compute_dtype': 'float32'}),
                             ('b0', 0, {'compute_dtype': 'bfloat16'})):
    _run(str(d / name), seed, 'sgd', summary=_summary(0.7 if engine.get('compute_dtype') == 'bfloat16' else 0.6, 0.8))
    cfg = json.loads((d / name / 'config.json').read_text())
    cfg['engine'] = engine
    _write(str(d / name / 'config.json'), cfg)
  rows = report_lib.aggregate(report_lib.collect(workdirs=[str(d / '*')]), ['client.optimizer'])
  assert [(r['differs'], r['finished'], round(r['acc_lastk_mean'], 6)) for r in rows] == \
      [('engine.compute_dtype=bfloat16', 1, 70.0), ('engine.compute_dtype=float32', 2, 60.0)]


def test_rounds_to_centralized_averaged_over_seeds(tmp_path):
  runs = []
  for seed, (r70, r90) in enumerate(((4, 9), (6, None), (8, 12))):
    d = str(tmp_path / f'seed={seed}')
    _run(d, seed, 'sgd', summary={**_summary(0.8, 0.8), 'rounds_to_70pct_centralized': r70,
                                   'rounds_to_90pct_centralized': r90, 'centralized_accuracy': 0.85})
    runs.append(d)
  rows = report_lib.aggregate(report_lib.collect(workdirs=runs), [])
  assert rows[0]['rounds_to_70pct_centralized_mean'] == 6.0 and rows[0]['reached_70pct_centralized'] == '3/3'
  assert rows[0]['rounds_to_90pct_centralized_mean'] == 10.5 and rows[0]['reached_90pct_centralized'] == '2/3'


# ------------------------------------------------------------------------------------------------ hardening II

def test_torn_line_in_the_middle_keeps_the_later_records(tmp_path):
  d = str(tmp_path / 'c' / 'seed=0')
  _run(d, 0, 'sgd', summary=_summary(0.8, 0.8))
  recs = [{'round': r, 'test_accuracy': a} for r, a in ((2, 0.5), (4, 0.6), (6, 0.85), (8, 0.9))]
  lines = [json.dumps(r) for r in recs]
  lines[1] = lines[1][:12]                                    # torn: a damaged middle line
  with open(os.path.join(d, 'metrics.jsonl'), 'w') as f:
    f.write('\n'.join(lines[:2] + ['{"round": "x"}'] + lines[2:]) + '\n')
  runs = report_lib.collect(workdirs=[d])
  assert [r['round'] for r in runs[0]['records']] == [2, 6, 8] and runs[0]['torn_lines'] == [2, 3]
  row, = report_lib.aggregate(runs, ['cell'], target=0.8)
  assert row['rounds_to_target_mean'] == 6.0                   # the record after the torn line counts
  assert row['torn_lines'] == 2 and 'c/seed=0 metrics.jsonl line(s) 2, 3' in row['torn']


def test_non_finite_runs_are_shown_not_averaged(tmp_path):
  base = str(tmp_path / 'nf')
  _run(f'{base}/A/seed=0', 0, 'sgd', summary=_summary(0.80, 0.82),
       records=[{'round': 5, 'test_accuracy': float('inf')}, {'round': 10, 'test_accuracy': 0.82}])
  _run(f'{base}/A/seed=1', 1, 'sgd', summary=_summary(float('nan'), float('nan')),
       records=[{'round': 5, 'test_accuracy': float('nan')}])
  _run(f'{base}/A/seed=2', 2, 'sgd', summary=_summary(float('inf'), 0.9))
  runs = report_lib.collect(workdirs=[f'{base}/A/seed=*'])
  row, = report_lib.aggregate(runs, ['cell'], target=0.9)
  assert row['finished'] == 1 and row['runs'] == 3 and row['nonfinite'] == 2
  assert row['nonfinite_runs'] == 'A/seed=1 A/seed=2'
  assert row['acc_lastk_mean'] == pytest.approx(80.0) and row['acc_lastk_std'] == 0.0
  assert row['reached_target'] == '0/1' and row['rounds_to_target_mean'] is None   # inf reaches nothing
  assert report_lib.rounds_to_target([{'round': 1, 'x': float('inf')}, {'round': 2, 'x': float('nan')},
                                      {'round': 3, 'x': 0.95}], 'x', 0.9) == 3
  md = '\n'.join(report_lib.markdown_table([row], ['cell'], 0.9))
  assert '| 1/3 (2 non-finite, not averaged) |' in md and 'inf' not in md and 'nan' not in md


@pytest.mark.parametrize('manifest, needle', [
    ({}, '"runs" must be a list'),
    ([], 'no readable sweep.json'),
    ({'runs': 'abc'}, '"runs" must be a list'),
    ({'runs': [{'cell': 'A', 'seed': 0}]}, 'run 0 has no "workdir"'),
    ({'runs': [{'workdir': '../../etc', 'cell': 'A'}]}, 'inside the sweep directory'),
    ({'runs': [{'workdir': 'A/seed=0', 'cell': 3}]}, '"cell" must be a string'),
    ({'runs': [{'workdir': 'A/seed=0', 'cell': 'A', 'reference': 'x'}]}, '"reference" must be an object'),
])
def test_manifests_of_the_wrong_shape_are_report_errors(tmp_path, manifest, needle):
  _write(str(tmp_path / 'sweep.json'), manifest)
  with pytest.raises(report_lib.ReportError, match=needle):
    report_lib.collect([str(tmp_path)])


def test_wrong_typed_summary_values_are_not_a_crash(tmp_path):
  d = str(tmp_path / 'w' / 'seed=0')
  _run(d, 0, 'sgd', summary={**_summary(0.8, 'high'), 'rounds_completed': '10', 'comm_total_bytes': 'x'})
  row, = report_lib.aggregate(report_lib.collect(workdirs=[d]), ['cell'])
  assert row['finished'] == 0 and row['failed'] == 'w/seed=0'      # not a number of rounds: not finished
  _run(d, 0, 'sgd', summary={**_summary(0.8, 'high'), 'comm_total_bytes': 'x'})
  row, = report_lib.aggregate(report_lib.collect(workdirs=[d]), ['cell'])
  assert row['finished'] == 1 and row['acc_final_mean'] is None and row['comm_mb_mean'] is None


def test_binary_reports_torn_and_non_finite_in_one_run(tmp_path):
  base = str(tmp_path / 'b')
  _run(f'{base}/A/seed=0', 0, 'sgd', summary=_summary(0.8, 0.8))
  _run(f'{base}/A/seed=1', 1, 'sgd', summary=_summary(float('nan'), 0.8))
  with open(f'{base}/A/seed=0/metrics.jsonl', 'w') as f:
    f.write('{"round": 5, "test_acc\n{"round": 10, "test_accuracy": 0.8}\n')
  p = subprocess.run([sys.executable, REPORT, f'--workdirs={base}/A/seed=*', f'--out_dir={tmp_path}/r',
                      '--target=0.75', '--noplots'], capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert p.returncode == 1 and 'Traceback' not in p.stderr, p.stderr
  assert '1 unfinished' not in p.stdout and '1 non-finite, 1 torn metrics lines' in p.stdout
  assert 'unreadable line(s) skipped (line(s) 1)' in p.stderr and 'non-finite accuracy' in p.stderr
  md = (tmp_path / 'r' / 'report.md').read_text()
  assert '| 1/2 (1 non-finite, not averaged) | 10.0 (1/1) |' in md
  assert 'Runs with a non-finite (NaN / inf) accuracy (shown here, not averaged): A/seed=1' in md


def test_task_metrics_and_personalized_accuracy_beside_their_published_numbers(tmp_path):
  # Segmentation: mIoU (pooled, seen, unseen) from the reported model's summary beside published.miou*; the
  # accuracy columns say pixel accuracy. Personalized (FedSoup Table 1): published.model='personalized' compares
  # the published accuracy with the personal models' global-test accuracy, not the server model's.
  d = str(tmp_path)
  seg_model = {'final_test_accuracy': 0.9, 'final_test_miou': 0.4, 'mean_last_2_test_miou': 0.40,
               'mean_last_2_test_seen_miou': 0.5, 'mean_last_2_test_unseen_miou': 0.3}
  for seed, shift in ((0, 0.0), (1, 0.02)):
    m = {k: (v + shift if k.startswith('mean_last') else v) for k, v in seg_model.items()}
    _run(f'{d}/seg/seed={seed}', seed, 'sgd', summary={**_summary(0.9, 0.9), 'models': {'global': m}},
         published={'source': 'FedDrive Table 6.3', 'miou_seen': 45.0, 'miou_unseen': 35.0, 'miou_seen_std': 1.0})
  personal = {'local': {'acc_client_mean': 0.7, 'auc_client_mean': 0.8},
              'global': {'acc_client_mean': 0.6, 'auc_client_mean': 0.75}}
  _run(f'{d}/soup/seed=0', 0, 'sgd', summary={**_summary(0.83, 0.83), 'models': {'global': {}},
                                               'personalized': personal},
       published={'source': 'FedSoup Table 1', 'model': 'personalized', 'accuracy': 65.0, 'local_acc': 72.0,
                  'local_auc': 80.0, 'global_auc': 70.0})
  rows = report_lib.aggregate(report_lib.collect(workdirs=[f'{d}/seg/seed=*']), ['cell'])
  (seg,) = rows
  assert seg['miou_mean'] == pytest.approx(41.0) and seg['miou_std'] == pytest.approx(1.0)
  assert seg['miou_seen_mean'] == pytest.approx(51.0) and seg['diff_miou_seen'] == pytest.approx(6.0)
  assert seg['miou_unseen_mean'] == pytest.approx(31.0) and seg['diff_miou_unseen'] == pytest.approx(-4.0)
  assert seg['published_miou_seen_std'] == 1.0 and seg['published_miou'] is None
  md = '\n'.join(report_lib.markdown_table(rows, ['cell'], None))
  assert 'last-K pixel acc (%)' in md and 'last-K mIoU (%)' in md
  assert '| 41.00 ± 1.00 |' in md and '| 51.00 ± 1.00 | 45.00 ± 1.00 | +6.00 |' in md
  (soup,) = report_lib.aggregate(report_lib.collect(workdirs=[f'{d}/soup/seed=0']), ['cell'])
  assert soup['acc_lastk_mean'] == pytest.approx(83.0)          # the server model, shown as measured
  assert soup['acc_personal_mean'] == pytest.approx(60.0) and soup['diff_published'] == pytest.approx(-5.0)
  assert soup['local_acc_mean'] == pytest.approx(70.0) and soup['diff_local_acc'] == pytest.approx(-2.0)
  assert soup['local_auc_mean'] == pytest.approx(80.0) and soup['diff_local_auc'] == pytest.approx(0.0)
  assert soup['global_auc_mean'] == pytest.approx(75.0) and soup['diff_global_auc'] == pytest.approx(5.0)
  md = '\n'.join(report_lib.markdown_table([soup], ['cell'], None))
  assert 'personal models acc (%)' in md and 'published local AUC (%)' in md
  assert '| 60.00 ± 0.00 | 65.00 | -5.00 |' in md


def test_retrieval_accuracy_is_labelled_recall_at_1(tmp_path):
  m = {'final_test_accuracy': 0.5, 'final_test_recall@1': 0.5, 'mean_last_2_test_recall@5': 0.7,
       'mean_last_2_test_recall@10': 0.8}
  _run(str(tmp_path / 'vpr'), 0, 'sgd', summary={**_summary(0.5, 0.5), 'models': {'global': m}},
       published={'source': 'thesis Table 6.6', 'accuracy': 46.9})
  rows = report_lib.aggregate(report_lib.collect(workdirs=[str(tmp_path / 'vpr')]), ['cell'])
  md = '\n'.join(report_lib.markdown_table(rows, ['cell'], None))
  assert 'last-K R@1 (%)' in md and 'last-K R@5 (%)' in md and 'last-K R@10 (%)' in md
  assert rows[0]['recall@5_mean'] == pytest.approx(70.0) and rows[0]['diff_published'] == pytest.approx(3.1)


def test_plot_draws_accuracy_against_virtual_time_and_bytes_when_the_records_have_them(tmp_path):
  def run(shift, seed):
    return {'cell': 'a', 'seed': seed, 'acc_key': 'test_accuracy', 'records': [
        {'round': r, 'test_accuracy': 0.1 * r + shift, 'virtual_time_s': 3600.0 * r, 'bytes_down': 2.0**20 * r,
         'bytes_up': 0.0} for r in (1, 2, 3)]}
  rows = [{'cell': 'a', '_runs': [run(0.0, 0), run(0.02, 1)], 'acc_lastk_mean': 30.0, 'acc_lastk_std': 1.0}]
  notes = []
  out = report_lib.plot(rows, ['cell'], str(tmp_path / 'r'), notes=notes)
  assert [os.path.basename(p) for p in out] == ['r_curves.png', 'r_time.png', 'r_bytes.png', 'r_bars.png']
  assert all(os.path.getsize(p) > 0 for p in out) and notes == []
  for rec in rows[0]['_runs'][0]['records']:       # a run without the clock: left out of time / bytes, named
    del rec['virtual_time_s'], rec['bytes_down'], rec['bytes_up']
  out = report_lib.plot(rows, ['cell'], str(tmp_path / 's'), notes=notes)
  assert [os.path.basename(p) for p in out] == ['s_curves.png', 's_time.png', 's_bytes.png', 's_bars.png']
  assert notes == ['s_time.png leaves out the runs without a virtual clock (config.system): a/seed=0',
                   's_bytes.png leaves out the runs without a virtual clock (config.system): a/seed=0']
  for rec in rows[0]['_runs'][1]['records']:       # no run has a clock: no time / bytes plots, nothing to say
    del rec['virtual_time_s'], rec['bytes_down'], rec['bytes_up']
  notes.clear()
  out = report_lib.plot(rows, ['cell'], str(tmp_path / 'u'), notes=notes)
  assert [os.path.basename(p) for p in out] == ['u_curves.png', 'u_bars.png'] and notes == []


@pytest.fixture
def drawn(monkeypatch):
  """What report_lib.plot draws: y labels, the curves' y values, bar x positions, scatter points by label."""
  from matplotlib.axes import Axes
  got = {'ylabel': [], 'curves': [], 'bars': [], 'scatter': {}}
  monkeypatch.setattr(Axes, 'set_ylabel', lambda self, s, *a, **k: got['ylabel'].append(s))
  orig_plot, orig_bar, orig_scatter = Axes.plot, Axes.bar, Axes.scatter

  def plot(self, x, y, *a, **k):
    got['curves'].append([round(float(v), 6) for v in y])
    return orig_plot(self, x, y, *a, **k)

  def bar(self, x, h, *a, **k):
    got['bars'].append((float(x), float(h), k.get('label')))
    return orig_bar(self, x, h, *a, **k)

  def scatter(self, x, y, *a, **k):
    got['scatter'][k.get('label')] = list(zip(map(float, x), map(float, y)))
    return orig_scatter(self, x, y, *a, **k)
  monkeypatch.setattr(Axes, 'plot', plot)
  monkeypatch.setattr(Axes, 'bar', bar)
  monkeypatch.setattr(Axes, 'scatter', scatter)
  return got


def test_plots_show_each_tasks_headline_metric_under_its_own_name(tmp_path, drawn):
  # Segmentation: the curves and bars are the mIoU (the table's column), not pixel accuracy; retrieval: R@1.
  d = str(tmp_path)
  seg_names = {'accuracy': 'pixel accuracy', 'headline': 'test_miou', 'headline_label': 'mIoU'}
  m = {'final_test_accuracy': 0.9, 'final_test_miou': 0.4, 'mean_last_2_test_miou': 0.4}
  _run(f'{d}/seg', 0, 'sgd', summary={**_summary(0.9, 0.9), 'models': {'global': m}, 'metric_names': seg_names},
       records=[{'round': r, 'test_accuracy': 0.9, 'test_miou': 0.1 * r} for r in (1, 2)],
       published={'miou': 45.0})
  rows = report_lib.aggregate(report_lib.collect(workdirs=[f'{d}/seg']), ['cell'])
  report_lib.plot(rows, ['cell'], str(tmp_path / 'seg'))
  assert drawn['ylabel'] == ['test mIoU (%), reported model', 'last-K test mIoU (%)']
  assert drawn['curves'] == [[10.0, 20.0]] and [h for _, h, _ in drawn['bars']] == [pytest.approx(40.0)]
  assert drawn['scatter'] == {'published': [(0.0, 45.0)]}
  assert 'last-K pixel acc (%)' in '\n'.join(report_lib.markdown_table(rows, ['cell'], None))
  for v in drawn.values():
    v.clear()
  vpr_names = {'accuracy': 'R@1', 'headline': 'test_accuracy', 'headline_label': 'R@1'}
  _run(f'{d}/vpr', 0, 'sgd', summary={**_summary(0.5, 0.5), 'metric_names': vpr_names},
       records=[{'round': 1, 'test_accuracy': 0.5}])
  rows = report_lib.aggregate(report_lib.collect(workdirs=[f'{d}/vpr']), ['cell'])
  report_lib.plot(rows, ['cell'], str(tmp_path / 'vpr'))
  assert drawn['ylabel'] == ['test R@1 (%), reported model', 'last-K test R@1 (%)']


def test_fedsoups_published_mark_sits_over_the_personal_models_bar(tmp_path, drawn):
  personal = {'global': {'acc_client_mean': 0.6}}
  _run(str(tmp_path / 'soup'), 0, 'sgd', summary={**_summary(0.83, 0.83), 'personalized': personal},
       records=[{'round': 10, 'test_accuracy': 0.83}],
       published={'source': 'FedSoup Table 1', 'model': 'personalized', 'accuracy': 65.0})
  rows = report_lib.aggregate(report_lib.collect(workdirs=[str(tmp_path / 'soup')]), ['cell'])
  report_lib.plot(rows, ['cell'], str(tmp_path / 'soup'))
  (server_x, server_h, _), (personal_x, personal_h, personal_label) = drawn['bars']
  assert server_h == pytest.approx(83.0) and personal_h == pytest.approx(60.0)
  assert personal_label.startswith('personal models') and server_x < personal_x
  assert drawn['scatter'] == {'published': [(personal_x, 65.0)]}


def test_curvature_and_rounds_to_each_cells_published_target_beside_the_paper(tmp_path):
  # FedGloSS / MAN cells publish lambda_max, the Hessian trace and the rounds to their own target accuracy
  # (thesis Table 4.19: FedAvg's accuracy; MAN: 50 %): each in its own column beside the measured value.
  d = str(tmp_path)
  pub = {'source': 'MAN Table 2', 'accuracy': 40.9, 'lambda_max': 51.49, 'hessian_trace': 8744.0,
         'target_accuracy': 50.0, 'rounds_to_target': 300.0, 'bits_to_target_B': 0.2}
  recs = [{'round': 5, 'test_accuracy': 0.45, 'comm_bytes': 1.0e6}, {'round': 10, 'test_accuracy': 0.55,
                                                                       'comm_bytes': 2.0e6}]
  for seed, lam, tr in ((0, 50.0, 8000.0), (1, 52.0, 9000.0)):
    _run(f'{d}/man/seed={seed}', seed, 'sgd', summary={**_summary(0.5, 0.55), 'num_params': 1000}, published=pub,
         records=recs)
    cfg_path = os.path.join(d, 'man', f'seed={seed}', 'config.json')
    with open(cfg_path) as f:
      cfg = json.load(f)
    _write(cfg_path, {**cfg, 'clients_per_round': 5})
    _write(os.path.join(d, 'man', f'seed={seed}', 'hessian', 'hessian_global.json'),
           {'lambda_max': lam, 'eigenvalues': [lam], 'trace': tr})
  _run(f'{d}/other/seed=0', 0, 'sam', summary=_summary(0.3, 0.3), published={'accuracy': 30.0},
       records=[{'round': 10, 'test_accuracy': 0.3}])
  rows = report_lib.aggregate(report_lib.collect(workdirs=[f'{d}/man/seed=*', f'{d}/other/seed=0']), ['cell'])
  man, other = rows
  assert man['target'] == pytest.approx(0.5) and man['rounds_to_target_mean'] == 10.0
  assert man['published_rounds_to_target'] == 300.0
  assert man['lambda_max_mean'] == 51.0 and man['published_lambda_max'] == 51.49
  assert man['diff_lambda_max'] == pytest.approx(-0.49)
  assert man['hessian_trace_mean'] == 8500.0 and man['hessian_trace_std'] == 500.0
  assert man['diff_hessian_trace'] == pytest.approx(-244.0)
  assert 'target' not in other and other['published_lambda_max'] is None   # no published target: no rounds
  # bits to the target in Table 4.19's unit B: FedAvg's bits in T = 10 rounds of 5 clients x 2 x 1000 x 32 bits
  assert man['bits_to_target_B_mean'] == pytest.approx(16e6 / (64.0 * 10 * 5 * 1000))
  assert man['published_bits_to_target_B'] == 0.2
  md = '\n'.join(report_lib.markdown_table(rows, ['cell'], None))
  assert ('| target acc (%) | rounds to target | bits to target | published rounds to target | bits to target (B) | '
          'published bits (B) | lambda_max | published lambda_max | diff | Hessian trace | published Hessian trace | '
          'diff |') in md
  assert '| 50.00 | 10.0 (2/2) | 1.6e+07 (2/2) | 300 | 5 | 0.2 |' in md
  assert '| 51.00 ± 1.00 | 51.49 | -0.49 | 8500.00 ± 500.00 | 8744.00 |' in md
  # --target overrides every row's own target.
  (man2, _) = report_lib.aggregate(report_lib.collect(workdirs=[f'{d}/man/seed=*', f'{d}/other/seed=0']),
                                   ['cell'], target=0.4)
  assert man2['target'] == 0.4 and man2['rounds_to_target_mean'] == 5.0


def test_what_a_run_spent_privacy_and_the_clock_get_their_own_columns(tmp_path):
  d = str(tmp_path)
  _run(f'{d}/dp/seed=0', 0, 'sgd', summary={**_summary(0.5, 0.5), 'dp_epsilon': 7.9986, 'dp_delta': 1e-5})
  _run(f'{d}/dp/seed=1', 1, 'sgd', summary={**_summary(0.5, 0.5), 'dp_epsilon': 8.0014, 'dp_delta': 1e-5})
  _run(f'{d}/clock/seed=0', 0, 'sam', summary={**_summary(0.4, 0.4), 'virtual_time_s': 5400.0, 'bytes_up': 2.45e6})
  rows = report_lib.aggregate(report_lib.collect(workdirs=[f'{d}/dp/seed=*', f'{d}/clock/seed=0']), ['cell'])
  dp, clock = rows
  assert dp['dp_epsilon_mean'] == pytest.approx(8.0) and dp['dp_delta_mean'] == 1e-5 and 'virtual_h_mean' not in dp
  assert clock['virtual_h_mean'] == 1.5 and clock['mb_up_mean'] == pytest.approx(2.45)
  md = '\n'.join(report_lib.markdown_table(rows, ['cell'], None))
  assert '| DP epsilon | DP delta | virtual time (h) | MB up (clock) |' in md
  assert '| 8.000 ± 0.001 | 1e-05 |  |  |' in md and '|  |  | 1.500 ± 0.000 | 2.45 ± 0.00 |' in md


def test_the_labs_loss_barrier_gets_its_own_columns(tmp_path):
  """summary.json `lab` (training/evals/lab.py) -> barrier_mean / barrier_max columns, mean +- std over seeds;
  a row whose runs have no barrier leaves the cells empty, a report without any has no such column."""
  d = str(tmp_path)
  for s, (m, x) in enumerate(((0.25, 0.5), (0.75, 1.5))):
    _run(f'{d}/lab/seed={s}', s, 'sgd', summary={**_summary(0.5, 0.5), 'lab': {'barrier_mean': m, 'barrier_max': x,
                                                                                 'measures': ['barrier']}})
  _run(f'{d}/plain/seed=0', 0, 'sam', summary=_summary(0.4, 0.4))
  rows = report_lib.aggregate(report_lib.collect(workdirs=[f'{d}/lab/seed=*', f'{d}/plain/seed=0']), ['cell'])
  lab, plain = rows
  assert lab['barrier_mean_mean'] == 0.5 and lab['barrier_max_mean'] == 1.0 and 'barrier_mean_mean' not in plain
  md = '\n'.join(report_lib.markdown_table(rows, ['cell'], None))
  assert '| barrier_mean | barrier_max |' in md
  assert f"| {lab['barrier_mean_mean']:.4f} ± {lab['barrier_mean_std']:.4f} | 1.0000 ± " in md
  assert '| barrier_' not in '\n'.join(report_lib.markdown_table([plain], ['cell'], None))
  report_lib.write_csv(rows, ['cell'], str(tmp_path / 'r.csv'))
  assert 'barrier_mean_mean' in open(tmp_path / 'r.csv').read().splitlines()[0]
