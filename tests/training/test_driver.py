"""The divergence error's hint (training/driver.py divergence_hint / check_divergence): the client's step by
default, the DP noise (numbers by hand) with dp.mode on, the compressor with compressed uploads; one line each."""
import math
import types

import numpy as np
import pytest

from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.privacy import mechanism
from fedjax_flat.training import driver as driver_lib
from fedjax_flat.training import trainers
from tests.fixtures.configs import small_config

D = 76522             # the digits CNN's params
DP = {'server.weighting': 'uniform'}


def hint(**over):
  h = driver_lib.divergence_hint(small_config(**over), D, 20)
  assert '\n' not in h
  return h


def _plan(**over):
  return types.SimpleNamespace(config=small_config(**over), num_params=D, data=types.SimpleNamespace(num_clients=20))


def test_without_dp_or_compression_the_step_is_named():
  assert hint() == driver_lib.STEP_HINT == 'Lower client.lr / rho, or enable client.grad_clip.'
  with pytest.raises(driver_lib.DivergenceError) as e:
    driver_lib.check_divergence(2, np.array([4, 7, -1]), np.array([True, False, False]), True, _plan())
  assert str(e.value) == ('divergence (NaN/inf) at round 3: clients [7] produced non-finite loss or updates; server '
                          'state finite=True. Lower client.lr / rho, or enable client.grad_clip.')
  driver_lib.check_divergence(0, np.array([4, -1]), np.array([True, False]), True, _plan())    # padding: no error


def test_local_dp_names_the_per_client_noise():
  h = hint(**DP, **{'dp.mode': 'local', 'dp.noise_multiplier': 2.0, 'dp.clip': 0.5})
  # each client's noise norm ~ z C sqrt(d) against an update of norm <= C
  assert h.startswith('Likely the DP noise, not client.lr / rho') and "dp.mode='local'" in h
  assert f'{2.0 * 0.5 * math.sqrt(D):.3g}' in h and f'{2.0 * math.sqrt(D):.3g} x the largest update' in h
  assert 'norm <= C = 0.5' in h and 'z = 2' in h and 'dp.noise_multiplier' in h and 'Lower client.lr' not in h


def test_central_dp_names_the_noise_on_the_mean():
  h = hint(**DP, **{'dp.mode': 'central', 'dp.noise_multiplier': 0.8, 'dp.noise_cohort': 4})
  assert h.startswith('Likely the DP noise') and "dp.mode='central'" in h
  assert f'{0.8 * 0.1 * math.sqrt(D) / 4:.3g}' in h and 'noise cohort M = 4' in h and 'dp.noise_cohort' in h
  # a target epsilon: the calibrated z, not dp.noise_multiplier's default
  h = hint(**DP, **{'dp.mode': 'central', 'dp.target_epsilon': 5.0})
  z = mechanism.noise_multiplier(small_config(**DP, **{'dp.mode': 'central', 'dp.target_epsilon': 5.0}), 20)
  assert z != 1.0 and f'z = {z:g}' in h


@pytest.mark.parametrize('over,words', [
    ({'upload.compress': 'randk', 'upload.fraction': 0.01},
     ["upload.compress='randk'", 'k = 765 of d = 76522', 'd / k = 100', 'error_feedback=False',
      'turn upload.error_feedback on']),
    ({'upload.compress': 'randk', 'upload.fraction': 0.01, 'upload.error_feedback': True},
     ["upload.compress='randk'", 'error_feedback=True', 'raise upload.fraction']),
    ({'upload.compress': 'topk', 'upload.fraction': 0.1}, ["upload.compress='topk'", 'k = 7652']),
    ({'upload.compress': 'qsgd', 'upload.bits': 2, 'upload.error_feedback': True},
     ["upload.compress='qsgd'", 'upload.bits=2 (3 levels)', f'{math.sqrt(512) / 3:.3g}', 'no contraction',
      'turn upload.error_feedback off']),
])
def test_compressed_uploads_name_the_compressor(over, words):
  h = hint(**over)
  assert h.startswith('Likely the compressed uploads') and "upload.compress='none' to confirm" in h
  for w in words:
    assert w in h, (w, h)


@pytest.mark.parametrize('over,cause', [(DP | {'dp.mode': 'local'}, "dp.mode='local'"),
                                        ({'upload.compress': 'randk', 'upload.fraction': 0.1}, 'upload.compress')])
def test_a_diverged_run_names_the_cause(over, cause):
  data = synthetic(8, [3, 17, 6, 9, 30, 1, 12, 5], input_shape=(4, 4, 1), num_classes=4, seed=3)
  t = trainers.make_trainer(small_config(**over, **{'client.lr': 1e30}), data=data)
  with pytest.raises(driver_lib.DivergenceError) as e:
    t.train()
  assert cause in str(e.value) and f'd = {t.plan.num_params}' in str(e.value) and '\n' not in str(e.value)
