"""The landscape-lab plug-in (training/evals/lab.py, analysis/lab.py) in a run: its record fields are the ones its
lab.jsonl details give (recomputed with NumPy), the run's parameters are bit-identical to a run without the lab,
bad values are refused in one line before anything compiles."""
import json

import jax
import numpy as np
import pytest

from fedjax_flat.config import validate
from fedjax_flat.errors import ConfigError
from fedjax_flat.training import run as run_lib
from fedjax_flat.training import trainers
from fedjax_flat.training.reload import load_run
from tests.fixtures.configs import small_config

# alignment (a Lanczos compile, ~10 s) runs in the slow test of tests/e2e/test_hessian_tool.py; its pure function
# is checked against NumPy in tests/analysis/test_alignment.py
LAB = {'lab.every': 2, 'lab.examples': 24, 'lab.measures': 'drift,sparsity,rank,profile,barrier', 'lab.bins': 3,
       'lab.barrier_points': 5, 'rounds': 2, 'seed': 1}


@pytest.fixture(scope='module')
def lab_run(tmp_path_factory):
  wd = tmp_path_factory.mktemp('lab')
  return wd, run_lib.run(small_config(**LAB), str(wd))


def test_records_are_the_details_and_the_run_is_unchanged(lab_run):
  wd, summary = lab_run
  rec = [json.loads(line) for line in (wd / 'metrics.jsonl').read_text().splitlines()][-1]
  det = json.loads((wd / 'lab.jsonl').read_text().splitlines()[0])
  assert det['round'] == rec['round'] == 2 and len(det['clients']) == 3
  norms, cos = np.array(det['drift_norms']), np.array(det['drift_cosines'])
  assert rec['drift_norm_mean'] == pytest.approx(norms.mean(), rel=1e-6)
  assert rec['drift_norm_max'] == pytest.approx(norms.max(), rel=1e-6)
  assert rec['drift_cos_mean'] == pytest.approx(cos.mean(), rel=1e-5)
  assert rec['update_sparsity_mean'] == pytest.approx(np.mean(det['update_sparsity']), rel=1e-6)
  assert not any(k.startswith('align_') for k in rec)       # not asked for
  assert 'feature_rank/act0' in rec and 1 <= rec['feature_rank/act0'] <= 24
  assert sum(b['count'] for b in det['profile_bins']) == 24 and len(det['profile_bins']) == 3
  assert -1 <= rec['profile_loss_gradnorm_corr'] <= 1
  assert summary['lab']['measures'] == ['drift', 'sparsity', 'rank', 'profile', 'barrier']
  assert rec['barrier_mean'] == pytest.approx(np.mean(det['barriers']), rel=1e-6)
  assert rec['barrier_max'] == pytest.approx(np.max(det['barriers']), rel=1e-6)
  assert summary['lab']['barrier_mean'] == rec['barrier_mean'] and len(det['barriers']) == 3
  assert summary['lab']['drift_norm_mean'] == rec['drift_norm_mean'] and summary['lab']['examples'] == 24
  # the lab reads the state only: the run's parameters are those of the same run without it, bit for bit
  _, params, step = load_run(str(wd))
  off = trainers.make_trainer(small_config(**{k: v for k, v in LAB.items() if not k.startswith('lab.')}), None,
                              write_files=False)
  off.train()
  assert step == 2
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(off.plan.algorithm.eval_models(
      off.server_state)['global'][0])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_drift_of_the_details_is_that_of_the_recomputed_local_models(lab_run):
  # the lab's clients are the next round's, trained from the checkpointed global model: recomputed here with
  # analysis/local_models.py and compared with NumPy norms
  from fedjax_flat.analysis.local_models import local_updates
  from jax.flatten_util import ravel_pytree
  wd, _ = lab_run
  trainer, _, step = load_run(str(wd))
  u = local_updates(trainer, step)
  w = np.asarray(ravel_pytree(u['start'])[0], np.float64)
  norms = [np.linalg.norm(np.asarray(ravel_pytree(p)[0], np.float64) - w) for p in u['params']]
  det = json.loads((wd / 'lab.jsonl').read_text().splitlines()[0])
  assert u['ids'] == det['clients']
  np.testing.assert_allclose(det['drift_norms'], norms, rtol=1e-4)


def test_the_barriers_are_connectivitys_on_the_recomputed_local_models(lab_run):
  # each client's barrier is analysis/connectivity.loss_barrier from the checkpointed global model to that client's
  # local model (recomputed with analysis/local_models.py) on the lab's examples, at lab.barrier_points points
  from fedjax_flat.analysis import connectivity
  from fedjax_flat.analysis.data import make_fixed_batches
  from fedjax_flat.analysis.hvp import make_eval_fn
  from fedjax_flat.analysis.local_models import global_train_subset, local_updates
  wd, _ = lab_run
  trainer, params, step = load_run(str(wd))
  u = local_updates(trainer, step)
  x, y = trainer.data.take(global_train_subset(trainer.data, 24, 1))
  eval_fn = make_eval_fn(trainer.model, make_fixed_batches(np.asarray(trainer.plan.eval_transform(np.asarray(x))),
                                                           np.asarray(y), 24), task=trainer.task)
  want = [connectivity.loss_barrier(eval_fn, params, p, 5) for p in u['params']]
  det = json.loads((wd / 'lab.jsonl').read_text().splitlines()[0])
  np.testing.assert_allclose(det['barriers'], [w['barrier'] for w in want], rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(det['barrier_t'], [w['t_barrier'] for w in want])
  np.testing.assert_allclose(det['barrier_max_loss'], [w['max_loss'] for w in want], rtol=1e-5)
  assert all(w['barrier'] >= 0 for w in want)
  assert det['barrier_pairs'] == [[0, 1], [0, 2], [1, 2]]
  pair = [connectivity.loss_barrier(eval_fn, u['params'][i], u['params'][j], 5)['barrier'] for i, j in
          det['barrier_pairs']]
  np.testing.assert_allclose(det['barrier_pair'], pair, rtol=1e-4, atol=1e-6)
  rec = [json.loads(line) for line in (wd / 'metrics.jsonl').read_text().splitlines()][-1]
  assert rec['barrier_pair_mean'] == pytest.approx(np.mean(pair), rel=1e-4, abs=1e-6)


def test_the_barrier_is_not_a_default_measure():
  from fedjax_flat.analysis import lab as lab_lib
  assert 'barrier' not in small_config().lab.measures.split(',') and 'barrier' in lab_lib.MEASURES


@pytest.mark.parametrize('over, field', [
    ({'lab.every': 3}, 'lab.every'),                                   # not a multiple of eval_every=2
    ({'lab.every': 2, 'lab.measures': 'drift,curvature'}, 'lab.measures'),
    ({'lab.every': 2, 'lab.examples': 1}, 'lab.examples'),
    ({'lab.top_k': 3}, 'lab.top_k'),                                   # set while the lab is off
])
def test_bad_values_are_refused_in_one_line(over, field):
  with pytest.raises(ConfigError) as e:
    validate.validate_config(small_config(**over))
  assert e.value.field == field and '\n' not in str(e.value)


def test_two_phase_and_chain_algorithms_are_refused_for_the_client_measures():
  from fedjax_flat.analysis import lab
  import types
  alg = types.SimpleNamespace(chain=None, num_phases=2, label='TwoPhase')
  with pytest.raises(ConfigError, match='2 phases per round'):
    lab.check(alg, ('drift', 'rank'))
  lab.check(alg, ('rank', 'profile'))        # the model-only measures need no client
  chain = types.SimpleNamespace(chain=object(), num_phases=1, label='Chain')
  with pytest.raises(ConfigError, match='trains its clients in chains'):
    lab.check(chain, ('alignment',))
