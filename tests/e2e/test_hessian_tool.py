"""The Hessian tool on a trained run, and the seeds' headline claim at small scale."""
import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from tests.fixtures.paths import REPO



def _run(args, timeout=400):
  res = subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=timeout, cwd=REPO)
  assert res.returncode == 0, res.stderr[-3000:]
  return res


def test_hessian_tool_writes_report_and_plots(tmp_path):
  wd = tmp_path / 'run'
  _run(['experiments/train.py', '--config=configs/quickstart.py', f'--workdir={wd}', '--config.rounds=3',
        '--config.eval_every=3', '--config.model=mlp'])  # the tool's plumbing; CNN HVPs: tests/analysis/test_hessian.py
  # --interpolate_with the run itself: a compatible run, loaded with its own config (the path a = 0 .. 1 is one point)
  _run(['experiments/hessian.py', f'--workdir={wd}', '--num_examples=120', '--top_k=3', '--lanczos_steps=30',
        '--trace_probes=3', '--density_probes=1', '--surface_points=3', f'--interpolate_with={wd}'])
  out = wd / 'hessian'
  rep = json.loads((out / 'hessian_global.json').read_text())
  curve = rep['interpolation']
  assert curve['with'] == str(wd) and len(curve['alphas']) == len(curve['loss']) == 31
  assert np.ptp(curve['loss']) < 1e-4 * max(1.0, abs(curve['loss'][0]))
  assert (out / 'interpolation.png').stat().st_size > 1000
  assert rep['round'] == 3 and rep['num_examples'] == 120
  assert len(rep['eigenvalues']) == 3 and rep['lambda_max'] == rep['eigenvalues'][0]
  assert rep['method'] == 'lanczos' and len(rep['residuals']) == len(rep['rayleigh_quotients']) == 3
  assert rep['all_converged'] == all(rep['converged'])
  assert rep['trace'] is not None
  for f in ('eigenvalues_global.png', 'density_global.png', 'surface_global.png'):
    assert (out / f).stat().st_size > 1000


@pytest.mark.slow       # a run with every lab measure in it (Lanczos compiles), then the tool on its checkpoint
def test_lab_in_a_run_and_on_its_checkpoint_agree(tmp_path):
  wd = tmp_path / 'run'
  _run(['experiments/train.py', '--config=configs/quickstart.py', f'--workdir={wd}', '--config.rounds=2',
        '--config.eval_every=2', '--config.model=mlp', '--config.lab.every=2', '--config.lab.examples=60',
        '--config.lab.top_k=3'])
  rec = json.loads((wd / 'metrics.jsonl').read_text().splitlines()[-1])
  det = json.loads((wd / 'lab.jsonl').read_text().splitlines()[-1])
  assert rec['align_topk_client_mean'] == pytest.approx(np.mean(det['align_topk_clients']), rel=1e-5)
  assert 0 <= rec['align_topk_global'] <= 1 and rec['align_lambda_max'] == pytest.approx(det['eigenvalues'][0])
  assert len(det['eigenvalues']) == 3 and det['random_expectation'] > 0
  _run(['experiments/hessian.py', f'--workdir={wd}', '--lab', '--top_k=3', '--lab_examples=60'])
  rep = json.loads((wd / 'hessian' / 'lab_global_round2.json').read_text())
  assert rep['round'] == 2 and rep['details']['clients'] == det['clients']
  for k in ('drift_norm_mean', 'drift_cos_mean', 'update_sparsity_mean', 'feature_rank/act0',
            'profile_loss_gradnorm_corr'):       # the same computation from the same checkpointed state
    assert rep['fields'][k] == pytest.approx(rec[k], rel=1e-3, abs=1e-5), k
  md = (wd / 'hessian' / 'lab_global_round2.md').read_text()
  assert '| drift_norm_mean |' in md and '| loss bin |' in md
  bad = subprocess.run([sys.executable, 'experiments/hessian.py', f'--workdir={wd}', '--lab',
                        '--lab_measures=drift,curvature'], capture_output=True, text=True, cwd=REPO)
  assert bad.returncode == 2 and "--lab_measures='drift,curvature'" in bad.stderr
  # The barrier measure with its own path resolution: 3 points of the global-to-client and client-pair paths.
  _run(['experiments/hessian.py', f'--workdir={wd}', '--lab', '--lab_measures=barrier', '--lab_barrier_points=3',
        f'--out_dir={wd / "lab3"}'])
  rep3 = json.loads((wd / 'lab3' / 'lab_global_round2.json').read_text())
  assert rep3['measures'] == ['barrier'] and rep3['fields']['barrier_max'] >= rep3['fields']['barrier_mean'] >= 0


@pytest.mark.parametrize('flags,named', [
    (['--lab', '--lab_barrier_points=1'], '--lab_barrier_points=1'),
    (['--lab_barrier_points=5'], 'apply to --lab only'),
])
def test_lab_barrier_points_is_checked_before_anything_loads(tmp_path, flags, named):
  res = subprocess.run([sys.executable, 'experiments/hessian.py', f'--workdir={tmp_path / "no_run"}', *flags],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
  assert res.returncode == 2 and named in res.stderr and 'Traceback' not in res.stderr, res.stderr[-2000:]


@pytest.mark.slow       # 2 x 60 rounds of the digits CNN + Lanczos: an experiment, not a unit test
def test_fedasam_flatter_than_fedavg_on_digits_alpha0():
  """Claim 2 of the digest: client ASAM lowers the global model's lambda_max versus FedAvg (same budget)."""
  from configs import quickstart
  from fedjax_flat import analysis
  from fedjax_flat.training import trainers
  lam = {}
  for name, over in [('fedavg', {}), ('fedasam', {'optimizer': 'asam', 'rho': 0.7, 'asam_eta': 0.2})]:
    c = quickstart.get_config()
    c.data.alpha = 0.0
    c.rounds = 60
    c.eval_every = 60
    c.progress_every_s = 1e9
    for k, v in over.items():
      c.client[k] = v
    t = trainers.make_trainer(c)
    t.train()
    x, y = t.data.test_examples()
    rep = analysis.analyze(t.model, t.server_state['params'], x[:300], y[:300], batch_size=100, top_k=1,
                           lanczos_steps=30, rng=jax.random.key(0))
    lam[name] = rep['lambda_max']
  print('lambda_max', lam)
  assert np.isfinite(lam['fedavg']) and lam['fedasam'] < lam['fedavg']


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_per_client_local_vs_global_sharpness(tmp_path):
  """--per_client on a quickstart-sized run; the recomputed local models are the ones the next round trains:
  their example-weighted mean is the server's FedAvg update (server SGD lr 1)."""
  wd = tmp_path / 'run'
  _run(['experiments/train.py', '--config=configs/quickstart.py', f'--workdir={wd}', '--config.rounds=3',
        '--config.eval_every=3', '--config.checkpoint_every=2', '--config.model=mlp'])   # checkpoints 2 and 3
  res = _run(['experiments/hessian.py', f'--workdir={wd}', '--per_client', '--num_examples=60', '--num_iters=8'])
  rep = json.loads((wd / 'hessian' / 'per_client_global_round3.json').read_text())
  assert rep['round'] == 3 and len(rep['clients']) == 5 and 'mean lambda_max local/own' in res.stdout
  for r in rep['clients']:
    assert all(np.isfinite(r[k]) and r[k] > 0 for k in ('lambda_local_own', 'lambda_global_own',
                                                         'lambda_local_global'))
    assert all(r[f'residual_{n}'] >= 0 and isinstance(r[f'converged_{n}'], bool)
               for n in ('local_own', 'global_own', 'local_global'))
  assert rep['all_converged'] == all(r[f'converged_{n}'] for r in rep['clients']
                                     for n in ('local_own', 'global_own', 'local_global'))
  res2 = _run(['experiments/hessian.py', f'--workdir={wd}', '--per_client', '--per_client_round=2',
               '--num_examples=60', '--num_iters=8', '--batch_size=20', '--per_client_estimate=both',
               '--per_client_global=both'])
  rep2 = json.loads((wd / 'hessian' / 'per_client_global_round2.json').read_text())
  assert rep2['round'] == 2 and len(rep2['clients']) == 5 and rep2['estimate'] == 'both'
  assert 'local/own batch median' in res2.stdout and 'local/train' in res2.stdout and rep2['global_set'] == 'both'
  for r in rep2['clients']:     # FedSoup Fig. 2a's batch median beside each full-data estimate
    assert all(np.isfinite(r[f'lambda_{n}_batch_median']) for n in ('local_own', 'global_own', 'local_global',
                                                                    'local_train'))
  assert rep2['mean_lambda_local_own_batch_median'] == np.mean([r['lambda_local_own_batch_median']
                                                                for r in rep2['clients']])
  # The local models: one more FedAvg round from the checkpoint equals the weighted mean of them.
  from fedjax_flat.analysis.local_models import local_models
  from fedjax_flat.training.reload import load_run
  trainer, params, step = load_run(str(wd))
  ids, locs = local_models(trainer, step)
  sizes = np.asarray([len(trainer.data.client_examples(k)[1]) for k in ids], np.float64)
  mean = jax.tree_util.tree_map(lambda *p: sum(w * np.asarray(a, np.float64) for w, a in zip(sizes, p)) / sizes.sum(),
                                *locs)
  trainer.server_state, _ = trainer.driver.step(trainer.server_state, trainer.store, step, 1, step + 1)   # round step
  after = jax.device_get(trainer.algorithm.eval_models(trainer.server_state)['global'][0])
  for a, b in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(mean)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow   # three runs and two Hessian tool runs as subprocesses (the check: tests/training/test_reload.py)
def test_interpolate_with_loads_the_other_run_and_refuses_another_model(tmp_path):
  """--interpolate_with: another run of the same model is loaded with its own config and the path written after
  the eigenvalues; a run of another model is one bad-input line before any eigenvalue work, nothing written."""
  from tests.fixtures.entry_cases import assert_one_line
  runs = {}
  for name, flags in (('a', ['--config.model=mlp']), ('b', ['--config.model=mlp', '--config.seed=1']),
                      ('cnn', [])):
    runs[name] = tmp_path / name
    _run(['experiments/train.py', '--config=configs/quickstart.py', f'--workdir={runs[name]}', '--config.rounds=1',
          '--config.progress_every_s=0', *flags])
  hess = ['experiments/hessian.py', f'--workdir={runs["a"]}', '--num_examples=40', '--batch_size=20', '--top_k=1',
          '--lanczos_steps=8']
  _run(hess + [f'--interpolate_with={runs["b"]}', f'--out_dir={tmp_path / "ok"}'])
  rep = json.loads((tmp_path / 'ok' / 'hessian_global.json').read_text())
  assert rep['lambda_max'] == rep['eigenvalues'][0] and rep['interpolation']['with'] == str(runs['b'])
  loss = rep['interpolation']['loss']
  assert len(loss) == 31 and all(np.isfinite(loss)) and np.ptp(loss) > 0     # two different models
  res = subprocess.run([sys.executable] + hess + [f'--interpolate_with={runs["cnn"]}', f'--out_dir={tmp_path / "no"}'],
                       capture_output=True, text=True, timeout=400, cwd=REPO)
  assert_one_line(res, 2, f'--interpolate_with={runs["cnn"]}', "its model is 'digits_cnn'", "is 'mlp'")
  assert 'lambda_max' not in res.stderr and not (tmp_path / 'no').exists()


def test_unconverged_power_iteration_is_said_once_naming_num_iters(tmp_path):
  # Issue 48: the warning named --lanczos_steps (power iteration's steps are --num_iters) and came twice (the
  # library's log line and the binary's own).
  wd = tmp_path / 'run'
  _run(['experiments/train.py', '--config=configs/quickstart.py', f'--workdir={wd}', '--config.rounds=1',
        '--config.model=mlp', '--config.progress_every_s=0'])
  res = _run(['experiments/hessian.py', f'--workdir={wd}', '--num_examples=40', '--batch_size=20', '--top_k=2',
              '--method=power', '--num_iters=1', f'--out_dir={tmp_path / "h"}'])
  said = [line for line in res.stderr.splitlines() if 'did not converge' in line]
  assert len(said) == 1 and '--num_iters' in said[0] and '--lanczos_steps' not in said[0], res.stderr[-2000:]
  assert not all(json.loads((tmp_path / 'h' / 'hessian_global.json').read_text())['converged'])
