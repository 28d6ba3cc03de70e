"""The FedSoup study's Fig. 2a fields and Fig. 2b plot (benchmarks/studies/fedsoup_compare.py)."""
import json

import numpy as np
import pytest

from benchmarks.studies import fedsoup_compare as study


def _rec(alg, seed, fold, curve):
  return {'algorithm': alg, 'seed': seed, 'fold': fold,
          'finetune': [{'epoch': e, 'local_acc_weighted': l, 'global_acc_client_mean': g} for e, l, g in curve]}


def test_finetune_points_average_the_seeds_at_iterations_1_7_15():
  curve0 = [(e, 0.5 + 0.01 * e, 0.6 - 0.01 * e) for e in range(1, 16)]
  curve1 = [(e, 0.7 + 0.01 * e, 0.4 - 0.01 * e) for e in range(1, 16)]
  recs = [_rec('fedavg', 0, -1, curve0), _rec('fedavg', 1, -1, curve1),
          _rec('fedsoup', 0, -1, curve0[:7]), _rec('fedavg', 0, 2, curve1)]   # fold 2: left out of Fig. 2b
  pts = study.finetune_points(recs)
  np.testing.assert_allclose(pts['fedavg'], [(1, 0.61, 0.49), (7, 0.67, 0.43), (15, 0.75, 0.35)])
  np.testing.assert_allclose(pts['fedsoup'], [(1, 0.51, 0.59), (7, 0.57, 0.53)])   # a 7-epoch run has no 15


def test_finetune_tradeoff_plot_is_written(tmp_path):
  recs = [_rec(a, 0, -1, [(e, 0.5 + 0.01 * e + d, 0.6 - 0.01 * e) for e in range(1, 16)])
          for a, d in (('fedavg', 0.0), ('fedprox', 0.02), ('fedsoup', 0.04))]
  path = study.finetune_tradeoff_plot(recs, str(tmp_path / 'fig2b.png'))
  with open(path, 'rb') as f:
    head = f.read(8)
  assert head == b'\x89PNG\r\n\x1a\n'
  assert (tmp_path / 'fig2b.png').stat().st_size > 1000
  assert study.finetune_tradeoff_plot([_rec('fedavg', 0, -1, [])], str(tmp_path / 'none.png')) is None
  assert not (tmp_path / 'none.png').exists()


def test_main_writes_the_plot_next_to_the_results(tmp_path, monkeypatch, capsys):
  out = tmp_path / 'res.jsonl'
  rec = _rec('fedavg', 0, -1, [(e, 0.5, 0.5) for e in (1, 7, 15)])
  rec.update({k: 0.5 for k in ('local_acc_weighted', 'local_auc_pooled', 'global_acc_client_mean',
                               'global_auc_client_mean', 'ood_other_clients_acc_client_mean', 'server_global_acc')})
  out.write_text(json.dumps(rec) + '\n')
  monkeypatch.setattr('sys.argv', ['fedsoup_compare', f'--out={out}', '--table'])
  study.main()
  assert (tmp_path / 'res_fig2b.png').exists()
  assert 'res_fig2b.png' in capsys.readouterr().out


def test_sharpness_fields_name_both_estimates():
  f = study.sharpness_fields([1.0, 3.0, 2.0], [4.0, 6.0, 5.0])
  assert f['lambda_max_median'] == 2.0 and f['lambda_max_median_batch_median'] == 5.0
  assert f['lambda_max_full_data_clients'] == f['lambda_max_clients'] == [1.0, 3.0, 2.0]
  assert f['lambda_max_batch_median_clients'] == [4.0, 6.0, 5.0]


@pytest.mark.slow
def test_run_one_records_both_sharpness_estimates_and_the_finetune_curve():
  rec = study.run_one('fedavg', 0, -1, rounds=1, hessian_iters=3)
  assert len(rec['lambda_max_full_data_clients']) == len(rec['lambda_max_batch_median_clients']) > 0
  assert np.all(np.isfinite(rec['lambda_max_full_data_clients'] + rec['lambda_max_batch_median_clients']))
  assert [f['epoch'] for f in rec['finetune']] == list(range(1, 16))
