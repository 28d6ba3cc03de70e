"""DP in the outputs (training/evals/dp.py): dp_epsilon / dp_delta / dp_clip in every evaluation record and in
summary.json equal a direct accountant computation at the record's round; a DP run stopped and resumed is
bit-identical to the uninterrupted one (the run's DP key and the adaptive clip are in the checkpoint)."""
import json
import logging

import dp_accounting
import numpy as np
import pytest

from fedjax_flat.privacy import accounting
from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import run as run_lib
from tests.fixtures.configs import small_config

N = 20


def dp_run_config(rounds):
  return small_config(**{'dp.mode': 'central', 'dp.adaptive': True, 'dp.noise_multiplier': 0.2, 'dp.delta': 1e-3,
                         'server.weighting': 'uniform', 'rounds': rounds, 'data.num_clients': N,
                         'checkpoint_every': 1})


def records(wd):
  return [json.loads(line) for line in (wd / 'metrics.jsonl').read_text().splitlines()]


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  wd = tmp_path_factory.mktemp('dp_ref')
  summary = run_lib.run(dp_run_config(4), str(wd))
  return wd, summary


def test_every_record_and_the_summary_carry_epsilon_of_the_fixed_size_sampled_gaussian(uninterrupted):
  wd, summary = uninterrupted
  recs = [r for r in records(wd) if 'dp_epsilon' in r]
  assert [r['round'] for r in recs] == [2, 4]
  for r in recs:
    want = accounting.epsilon(3 / N, 0.2, r['round'], 1e-3, sampling='fixed', accountant='rdp', num_clients=N)
    assert r['dp_epsilon'] == want
    assert r['dp_delta'] == 1e-3
  clips = [r['dp_clip'] for r in recs]
  assert clips[0] != 0.1 and len(set(clips)) == 2        # the adaptive clip moved from TFF's initial 0.1
  assert summary['dp_epsilon'] == recs[-1]['dp_epsilon'] and summary['dp_clip'] == clips[-1]
  assert summary['dp_sampling'] == 'fixed' and summary['dp_noise_multiplier'] == 0.2
  # the relation the epsilon is stated under, and dp_accounting's own computation of it: replace-one moves the
  # clipped sum by 2C, so the Gaussian event carries z / 2 (issue 48: it carried z, 3x-9x too small an epsilon)
  assert summary['dp_adjacency'] == 'replace_one' and summary['dp_sensitivity'] == 2.0
  assert all(r['dp_adjacency'] == 'replace_one' for r in recs)
  acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  acc.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(N, 3, dp_accounting.GaussianDpEvent(0.2 / 2)), 4))
  assert summary['dp_epsilon'] == pytest.approx(acc.get_epsilon(1e-3), rel=1e-12)
  assert 'epsilon' in summary['facts']['dp']
  assert 'central DP' in (wd / 'summary.md').read_text()
  assert 'replace-one adjacency, sensitivity 2C' in summary['facts']['dp']


def _as_written_by_the_old_version(wd, step):
  """The checkpoint and metrics.jsonl of `wd` as a version before the fix left them: no dp_adjacency, epsilon
  accounted with the multiplier z on a sensitivity of C (what it reported)."""
  def old(rec):
    rec.pop('dp_adjacency', None)
    if 'dp_epsilon' in rec:
      rec['dp_epsilon'] = accounting.epsilon(3 / N, 0.4, rec['round'], 1e-3, sampling='fixed', num_clients=N)
    return rec
  meta_file = wd / 'checkpoints' / str(step) / 'meta' / 'metadata'
  meta = json.loads(meta_file.read_text())
  meta['records'] = [old(r) for r in meta['records']]
  meta.pop('meta_sha256')
  meta['meta_sha256'] = ckpt_lib._json_sha256(meta)
  meta_file.write_text(json.dumps(meta))
  (wd / 'metrics.jsonl').write_text(''.join(json.dumps(old(r)) + '\n' for r in records(wd)))


def test_resuming_a_run_of_the_old_accounting_recomputes_and_warns(uninterrupted, tmp_path, caplog):
  ref_wd, _ = uninterrupted
  run_lib.run(dp_run_config(3), str(tmp_path))
  _as_written_by_the_old_version(tmp_path, 3)
  before = {r['round']: r['dp_epsilon'] for r in records(tmp_path) if 'dp_epsilon' in r}
  with caplog.at_level(logging.WARNING):
    summary = run_lib.run(dp_run_config(4), str(tmp_path))
  assert any('under-reported epsilon' in m and 'replace_one' in m for m in caplog.messages), caplog.messages
  got = {r['round']: r for r in records(tmp_path) if 'dp_epsilon' in r}
  ref = {r['round']: r for r in records(ref_wd) if 'dp_epsilon' in r}
  for t in (2, 3):                      # recomputed, the old figure kept beside it
    assert got[t]['dp_epsilon'] == accounting.epsilon(3 / N, 0.2, t, 1e-3, sampling='fixed', num_clients=N)
    assert got[t]['dp_epsilon_reported_before_fix'] == before[t] < got[t]['dp_epsilon']
    assert got[t]['dp_adjacency'] == 'replace_one'
  assert got[2]['dp_epsilon'] == ref[2]['dp_epsilon'] and got[4]['dp_epsilon'] == ref[4]['dp_epsilon']
  assert 'dp_epsilon_reported_before_fix' not in got[4]
  assert summary['dp_epsilon'] == ref[4]['dp_epsilon']


def test_a_dp_run_stopped_and_resumed_is_bit_identical(uninterrupted, tmp_path):
  ref_wd, ref_summary = uninterrupted
  run_lib.run(dp_run_config(3), str(tmp_path))           # stops after round 3 with its checkpoint
  summary = run_lib.run(dp_run_config(4), str(tmp_path))  # resumes for round 4
  got, ref = ckpt_lib.read_checkpoint(str(tmp_path / 'checkpoints')), ckpt_lib.read_checkpoint(
      str(ref_wd / 'checkpoints'))
  assert got['step'] == ref['step'] == 4
  for a, b in zip(got['server_leaves'], ref['server_leaves'], strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert summary['dp_epsilon'] == ref_summary['dp_epsilon'] and summary['dp_clip'] == ref_summary['dp_clip']
  ref_recs = {r['round']: r for r in records(ref_wd) if 'dp_epsilon' in r}
  got_recs = {r['round']: r for r in records(tmp_path) if 'dp_epsilon' in r}   # + round 3, the first run's end
  assert set(ref_recs) <= set(got_recs)
  for t, r in ref_recs.items():
    assert got_recs[t]['dp_epsilon'] == r['dp_epsilon'] and got_recs[t]['dp_clip'] == r['dp_clip']


def test_a_capped_weight_dp_run_trains_with_the_datas_client_sizes_and_the_same_accounting(tmp_path):
  """server.weighting='capped' under central DP end to end: the algorithm is built with the data's client sizes
  (the fixed denominator), trains, and its epsilon is the uniform run's (w_k <= 1 leaves the sensitivity at C)."""
  cfg = dp_run_config(2)
  cfg.server.weighting, cfg.server.weight_cap = 'capped', 10.0
  summary = run_lib.run(cfg, str(tmp_path))
  assert np.isfinite(summary['final_test_accuracy'])
  assert summary['dp_epsilon'] == accounting.epsilon(3 / N, 0.2, 2, 1e-3, sampling='fixed', accountant='rdp',
                                                     num_clients=N)
  assert json.loads((tmp_path / 'config.json').read_text())['server']['weighting'] == 'capped'
