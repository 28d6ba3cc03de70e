"""Privacy accounting: equal to direct dp_accounting computations, the Gaussian mechanism's exact curve, calibration."""
import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp
from scipy.stats import norm

from fedjax_flat.errors import ConfigError
from fedjax_flat.privacy import accounting


@pytest.mark.parametrize('q,z,rounds,delta', [(0.01, 1.1, 1000, 1e-5), (0.1, 0.8, 50, 1e-6), (1.0, 2.0, 10, 1e-5)])
def test_poisson_rdp_equals_direct_computation(q, z, rounds, delta):
  acc = rdp.RdpAccountant()
  acc.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds))
  assert accounting.epsilon(q, z, rounds, delta) == acc.get_epsilon(delta)


def test_poisson_pld_equals_direct_computation():
  acc = pld.PLDAccountant()
  acc.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.0)), 100))
  assert accounting.epsilon(0.05, 1.0, 100, 1e-5, accountant='pld') == acc.get_epsilon(1e-5)


def test_fixed_size_sampling_equals_direct_replace_one_computation():
  acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  acc.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(1000, 10, dp_accounting.GaussianDpEvent(1.1)), 200))
  got = accounting.epsilon(0.01, 1.1, 200, 1e-5, sampling='fixed', num_clients=1000)
  assert got == acc.get_epsilon(1e-5)
  # Replace-one adjacency costs more than add/remove-one Poisson sampling at the same rate.
  assert got > accounting.epsilon(0.01, 1.1, 200, 1e-5)


@pytest.mark.parametrize('z', [1.0, 2.0])
def test_pld_matches_the_exact_gaussian_mechanism_curve(z):
  # One unsampled Gaussian mechanism (sensitivity 1, std z) has the exact curve (Balle & Wang 2018, Thm. 8)
  # delta(eps) = Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z). PLD's epsilon is a tight upper bound on it.
  delta = 1e-5
  eps = accounting.epsilon(1.0, z, 1, delta, accountant='pld')
  exact_delta = norm.cdf(0.5 / z - eps * z) - math.exp(eps) * norm.cdf(-0.5 / z - eps * z)
  assert exact_delta <= delta
  assert exact_delta > 0.8 * delta  # tight: epsilon is not far above the exact one


def test_edge_cases():
  assert accounting.epsilon(0.1, 1.0, 0, 1e-5) == 0.0
  assert accounting.epsilon(0.1, 0.0, 10, 1e-5) == math.inf
  more = accounting.epsilon(0.1, 1.0, 20, 1e-5)
  assert accounting.epsilon(0.1, 1.0, 10, 1e-5) < more < accounting.epsilon(0.1, 0.8, 20, 1e-5)


@pytest.mark.parametrize('target', [1.0, 4.0])
def test_calibration_is_within_target_and_minimal(target):
  q, rounds, delta = 0.02, 100, 1e-5
  z = accounting.calibrate(target, q, rounds, delta)
  assert accounting.epsilon(q, z, rounds, delta) <= target
  assert accounting.epsilon(q, z * (1 - 2e-4), rounds, delta) > target


@pytest.mark.parametrize('call,field', [
    (lambda: accounting.epsilon(0.1, -1.0, 10, 1e-5), 'dp.noise_multiplier'),
    (lambda: accounting.epsilon(0.1, 1.0, 10, 1.5), 'dp.delta'),
    (lambda: accounting.epsilon(0.1, 1.0, 10, 1e-5, accountant='moments'), 'dp.accountant'),
    (lambda: accounting.epsilon(0.1, 1.0, 10, 1e-5, sampling='fixed', accountant='pld', num_clients=100),
     'dp.accountant'),
    (lambda: accounting.calibrate(0.0, 0.1, 10, 1e-5), 'dp.target_epsilon'),
    (lambda: accounting.calibrate(1e-4, 1.0, 10000, 1e-5, z_max=50), 'dp.target_epsilon'),
])
def test_bad_input_is_one_line_naming_the_field(call, field):
  with pytest.raises(ConfigError) as e:
    call()
  assert e.value.field == field and '\n' not in str(e.value)


# Published epsilons (each source's own accountant: the Poisson-sampled Gaussian, the basic RDP conversion).
PUBLISHED = [
    # Abadi et al. 2016, section 3.1: q = 0.01, sigma = 4, delta = 1e-5, T = 10000 -> "epsilon ~ 1.26".
    ('abadi2016', 0.01, 4.0, 10000, 1e-5, 1.26),
    # TF Privacy's MNIST DP-SGD tutorial (N = 60000, batch 256, delta = 1e-5): its table's three private rows,
    # T = ceil(epochs N / batch).
    ('tfp_mnist_z1.1_60ep', 256 / 60000, 1.1, math.ceil(60 * 60000 / 256), 1e-5, 3.01),
    ('tfp_mnist_z1.3_15ep', 256 / 60000, 1.3, math.ceil(15 * 60000 / 256), 1e-5, 1.19),
    ('tfp_mnist_z0.7_45ep', 256 / 60000, 0.7, math.ceil(45 * 60000 / 256), 1e-5, 7.10),
]


@pytest.mark.parametrize('source,q,z,steps,delta,published', PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_epsilons_are_reproduced_and_the_default_conversion_is_tighter(source, q, z, steps, delta,
                                                                                 published):
  got = accounting.classic_epsilon(q, z, steps, delta)
  assert abs(got - published) <= 0.005, (source, got)      # the sources print two decimals
  tight = accounting.epsilon(q, z, steps, delta)
  assert tight <= got
  # the default (tighter) conversion reports less, never more: 1.04 for Abadi's example
  assert tight < published
