"""DP in the outputs (training/evals/dp.py): dp_epsilon / dp_delta / dp_clip in every evaluation record and in
summary.json equal a direct accountant computation at the record's round; a DP run stopped and resumed is
bit-identical to the uninterrupted one (the run's DP key and the adaptive clip are in the checkpoint)."""
import json

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
  assert 'epsilon' in summary['facts']['dp']
  assert 'central DP' in (wd / 'summary.md').read_text()


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
