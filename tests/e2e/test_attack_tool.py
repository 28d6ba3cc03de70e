"""experiments/attack.py: bad flags refused in one line before any run is loaded, and the attacks on a
finished quickstart run (inversion PNG + PSNR / SSIM, membership AUC and epsilon bound beside a DP run's
accountant epsilon)."""
import json

import numpy as np
import pytest

from tests.fixtures.entry_cases import QS, QUICK, assert_one_line, run_binary


def test_bad_flag_one_line_before_loading(tmp_path):
  # the workdir does not exist: the flag is refused first, and nothing is created (one process start: the
  # other refusals are check_flags' own lines)
  res = run_binary('attack', f'--workdir={tmp_path / "nope"}', '--lira_shadows=3', timeout=120)
  assert_one_line(res, 2, '--lira_shadows=3 must be 0 (no LiRA) or an even number')
  assert not (tmp_path / 'nope').exists()
  res = run_binary('attack', f'--workdir={tmp_path / "nope"}', '--upload=local', '--num_images=2', '--local_batch=3',
                   timeout=120)
  assert_one_line(res, 2, '--local_batch=3 must divide --num_images=2')
  assert not (tmp_path / 'nope').exists()


@pytest.mark.slow    # two 2-round trainings, an inversion and LiRA: about a minute on 2 cores
def test_attacks_on_finished_runs(tmp_path):
  for name, extra in (('plain', []), ('dp', ['--config.dp.mode=central', '--config.dp.clip=0.5',
                                             '--config.dp.noise_multiplier=1.0', '--config.dp.delta=1e-5',
                                             '--config.server.weighting=uniform'])):
    wd = tmp_path / name
    res = run_binary('train', f'--config={QS}', f'--workdir={wd}', '--config.rounds=2', '--config.eval_every=2',
                     *QUICK, *extra, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    # the DP run's shadows: DP runs of its config, lanes of one runs program (training/shadows.py)
    lira = ['--lira_shadows=4', '--shadow_epochs=2'] if name == 'plain' else ['--lira_shadows=2',
                                                                             '--shadow_trainer=federated']
    res = run_binary('attack', f'--workdir={wd}', '--steps=150', '--num_examples=100', *lira, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    out = wd / 'privacy_attacks'
    inv = json.loads((out / 'inversion.json').read_text())
    assert inv['num_images'] == 2 and inv['cosine_end'] < inv['cosine_start']
    if name == 'plain':
      assert np.mean(inv['psnr']) > np.mean(inv['psnr_random'])
    else:     # by default a DP run's upload is inverted as the DP adversary sees it: little direction survives
      assert inv['dp_noise'] == 'release' and inv['observed_cosine_to_sent'] < 0.2
    assert (out / 'inversion.png').stat().st_size > 1000
    mem = json.loads((out / 'membership.json').read_text())
    loss = mem['loss_threshold']
    assert mem['num_members'] == 100 and 0 <= loss['auc'] <= 1 and loss['epsilon_lower_bound'] >= 0
    assert 'membership (loss_threshold): AUC' in res.stdout
    if name == 'plain':
      assert 'lira' in mem and mem['lira']['num_shadows'] == 4 and 'accountant_epsilon' not in mem
    else:
      assert mem['accountant_epsilon'] > 0 and mem['delta'] == 1e-5
      assert mem['lira']['shadow_trainer'] == 'federated' and mem['lira']['num_shadows'] == 2
      assert sorted(p.name for p in (out / 'shadows').iterdir()) == ['shadow_0', 'shadow_1']
      assert 'accountant epsilon' in res.stdout
    assert '| loss_threshold |' in (out / 'privacy_attacks.md').read_text()
    # the SAM/SGD client's real upload (2 local steps, one image each), and for the DP run as DP leaves it
    for view in (('release', 'upload') if name == 'dp' else ('release',)):
      o = wd / f'inv_{view}'
      res = run_binary('attack', f'--workdir={wd}', '--attack=inversion', '--upload=local', '--local_steps=2',
                       '--local_batch=1', '--steps=100', f'--dp_noise={view}', f'--out_dir={o}', timeout=300)
      assert res.returncode == 0, res.stderr[-3000:]
      inv = json.loads((o / 'inversion.json').read_text())
      assert inv['upload'] == 'local' and inv['local_steps'] == 2 and inv['local_batch'] == 1
      assert inv['cosine_end'] < inv['cosine_start'] and np.all(np.isfinite(inv['psnr']))
      if name == 'plain':
        assert inv['dp_noise'] == 'none' and inv['observed_cosine_to_sent'] > 0.999999
      elif view == 'release':    # central DP, m = M: the release's noise is z C on each coordinate
        assert inv['dp_noise_std'] == pytest.approx(1.0 * 0.5) and inv['observed_cosine_to_sent'] < 0.2
        assert 'DP release (noise std 0.5)' in res.stdout
      else:                      # central DP: the server receives the clipped upload, no noise
        assert inv['dp_noise_std'] == 0 and inv['observed_cosine_to_sent'] > 0.999999
