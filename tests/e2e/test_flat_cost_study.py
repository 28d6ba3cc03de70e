"""benchmarks/studies/flat_cost.py (issue 38's study): its compressibility measures against hand-computed values and
a Monte Carlo of QSGD's stochastic rounding, its cells and configs/flat_cost.py's uploads, and (slow) a tiny study
through the runs axis with its table, figures and the common-model measures."""
import json

import numpy as np
import pytest

from benchmarks.studies import flat_cost
from configs import flat_cost as fc_configs
from fedjax_flat.config import families


def test_compressibility_measures_by_hand():
  v = np.array([3.0, 4.0, 0.0, 0.0])          # ||v|| = 5
  assert flat_cost.topk_error(v, 0.25) == pytest.approx(3 / 5)           # keeps the 4
  assert flat_cost.topk_error(v, 0.5) == 0.0
  # s = 1: r = (0.6, 0.8, 0, 0) = p; E||Q - v||^2 = 5^2 (0.6 0.4 + 0.8 0.2) = 10
  assert flat_cost.qsgd_error(v, 1) == pytest.approx(np.sqrt(10) / 5)
  assert flat_cost.qsgd_error(np.zeros(3), 7) == 0.0
  assert flat_cost.l1_ratio(v) == pytest.approx(7 / (2 * 5))
  assert flat_cost.l1_ratio(np.ones(9)) == pytest.approx(1.0)


def test_qsgd_error_equals_the_stochastic_rounding_it_describes():
  rng = np.random.default_rng(0)
  v, s = rng.standard_normal(50), 3
  norm = np.linalg.norm(v)
  r = s * np.abs(v) / norm
  low = np.floor(r)
  draws = low + (rng.random((20000, v.size)) < (r - low))          # unbiased: E = r
  q = np.sign(v) * draws * norm / s
  np.testing.assert_allclose(q.mean(axis=0), v, atol=0.03)
  mc = np.sqrt(np.mean(np.sum((q - v) ** 2, axis=1))) / norm
  assert flat_cost.qsgd_error(v, s) == pytest.approx(mc, rel=0.02)


def test_cells_and_uploads():
  assert flat_cost.cells_for('fedavg,none;looksam,deadline', 'fp32,topk') == [
      'fedavg,none', 'fedavg,none,topk', 'looksam,deadline', 'looksam,deadline,topk']
  assert flat_cost._parts('fedsam,deadline') == ('fedsam', 'deadline', 'fp32')
  assert flat_cost._parts('fedsam,none,qsgd') == ('fedsam', 'none', 'qsgd')
  c = fc_configs.get_config('sam_every,deadline')
  assert (c.client.optimizer, c.client.sam_every, c.data.alpha, c.system.deadline_s) == ('sam_every', 2, 0.0, 8.0)
  u = fc_configs.get_config('fedsam,none,topk').upload
  assert (u.compress, u.fraction, u.error_feedback) == ('topk', 0.1, True)
  assert c.upload.compress == 'none' and fc_configs.get_config('looksam,qsgd').upload.bits == 4
  with pytest.raises(families.ConfigStringError):
    fc_configs.get_config('fedsam,zip')


@pytest.mark.slow    # 4 runs of 2 rounds in 3 runs programs, Hessians, the common-model measures (~4 min, busy cores)
def test_a_tiny_study_packs_its_runs_and_writes_its_table(tmp_path, capsys):
  out = str(tmp_path / 's.jsonl')
  flat_cost.run_study(out, flat_cost.cells_for('fedavg,none;fedavg,deadline;looksam,none', 'fp32') +
                      ['fedavg,none,topk'], '0', 2, str(tmp_path / 'w'), 4)
  recs = [json.loads(line) for line in open(out)]
  assert sorted(r['cell'] for r in recs) == ['fedavg,deadline', 'fedavg,none', 'fedavg,none,topk', 'looksam,none']
  lanes = {r['cell']: r['lanes'] for r in recs}
  assert lanes['fedavg,none'] == lanes['fedavg,deadline'] > 0, 'the two clock settings share one program'
  by_cell = {r['cell']: r for r in recs}
  top = by_cell.pop('fedavg,none,topk')       # 10 % of the values + a bitmap, on the clock too
  assert top['bytes_up'] < 0.2 * by_cell['fedavg,none']['bytes_up'] and 'topk_err@0.1' not in top
  recs = list(by_cell.values())
  for r in recs:
    assert 0 < r['topk_err@0.1'] < r['topk_err@0.01'] < 1 and r['lambda_max'] > 0
    assert r['curve'][-1][1] == pytest.approx(r['virtual_time_s'])
    assert r['curve'][-1][2] == pytest.approx(r['bytes_up'] + r['bytes_down'])
  text = flat_cost.table(out)
  assert text.count('\n| ') == 5      # the header and 4 rows
  written = flat_cost.figures(out, str(tmp_path / 'fig'))
  assert len(written) == 4
  flat_cost.run_study(out, ['fedavg,none'], '0', 2, str(tmp_path / 'w'), 4)     # done: skipped
  assert len(open(out).readlines()) == 4
  # every method's deltas from FedAvg's final model: FedAvg's own measurement is the study's, bit for bit
  common = str(tmp_path / 'c.jsonl')
  flat_cost.common_study(common, '0', str(tmp_path / 'w'))
  got = {r['cell']: r for r in map(json.loads, open(common))}
  assert sorted(got) == sorted(f'{m},{s}' for m in fc_configs.METHODS for s in fc_configs.SETTINGS)
  for cell in ('fedavg,none', 'fedavg,deadline'):
    assert {k: got[cell][k] for k in ('topk_err@0.1', 'qsgd_err@7', 'delta_norm')} == {
        k: by_cell[cell][k] for k in ('topk_err@0.1', 'qsgd_err@7', 'delta_norm')}
  assert got['fedsam,none']['delta_norm'] != got['fedavg,none']['delta_norm']
  assert flat_cost.common_table(common).count('\n| ') == 1 + len(fc_configs.METHODS) * len(fc_configs.SETTINGS)
