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


def test_fixed_size_sampling_equals_direct_replace_one_computation_at_twice_the_sensitivity():
  # Replace-one moves the clipped sum by up to 2C: the mechanism's multiplier on that sensitivity is z / 2, which
  # dp_accounting's replace-one events do not apply themselves (google/differential-privacy#378).
  acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  acc.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.SampledWithoutReplacementDpEvent(1000, 10, dp_accounting.GaussianDpEvent(1.1 / 2)), 200))
  got = accounting.epsilon(0.01, 1.1, 200, 1e-5, sampling='fixed', num_clients=1000)
  assert got == acc.get_epsilon(1e-5)
  # Replace-one adjacency costs more than add/remove-one Poisson sampling at the same rate.
  assert got > accounting.epsilon(0.01, 1.1, 200, 1e-5)


# Pinned whatever dp_accounting version is installed (issue 48's audit, own dp_accounting calls): the quickstart's
# 20 clients, 5 a round, z = 1.1, 6 rounds, delta 1e-3. Before the fix the fixed-size value was 4.8928.
QUICKSTART = dict(q=5 / 20, z=1.1, rounds=6, delta=1e-3)
REPLACE_ONE_EPSILON = 14.4230        # fixed-size sampling without replacement, replace-one, sensitivity 2C
ADD_REMOVE_EPSILON = 3.1592          # Poisson sampling at q = 1/4, add/remove-one, sensitivity C


def _quickstart(sampling):
  return accounting.epsilon(sampling=sampling, num_clients=20, **QUICKSTART)


def test_pinned_epsilons_of_both_relations():
  assert _quickstart('fixed') == pytest.approx(REPLACE_ONE_EPSILON, abs=1e-4)
  assert _quickstart('poisson') == pytest.approx(ADD_REMOVE_EPSILON, abs=1e-4)
  assert accounting.ADJACENCY == {'poisson': 'add_or_remove_one', 'fixed': 'replace_one', 'none': 'replace_one'}
  assert accounting.sensitivity('fixed') == 2.0 and accounting.sensitivity('poisson') == 1.0
  assert accounting.sensitivity('fixed', norm_bound=3.0) == 6.0


class _DoublingLibrary:
  """dp_accounting as google/differential-privacy#464 would make it: replace-one sampling without replacement
  halves the Gaussian's multiplier itself."""

  def __init__(self, real):
    self._real = real

  def __getattr__(self, name):
    return getattr(self._real, name)

  def SampledWithoutReplacementDpEvent(self, n, m, event):   # noqa: N802 (dp_accounting's name)
    return self._real.SampledWithoutReplacementDpEvent(n, m, self._real.GaussianDpEvent(event.noise_multiplier / 2))


def test_a_library_that_doubles_the_sensitivity_itself_is_not_corrected_twice(monkeypatch):
  monkeypatch.setattr(accounting, 'dp_accounting', _DoublingLibrary(dp_accounting))
  monkeypatch.setattr(accounting, '_DOUBLES', [])
  assert accounting._library_doubles()
  assert accounting.event_multiplier(1.1, 'fixed') == 1.1
  assert _quickstart('fixed') == pytest.approx(REPLACE_ONE_EPSILON, abs=1e-4)
  assert _quickstart('poisson') == pytest.approx(ADD_REMOVE_EPSILON, abs=1e-4)


def test_the_installed_library_is_asked_and_an_unknown_behaviour_refused(monkeypatch):
  monkeypatch.setattr(accounting, '_DOUBLES', [])
  assert not accounting._library_doubles()          # dp_accounting 0.6: the factor is ours to apply
  assert accounting.event_multiplier(1.1, 'fixed') == 0.55

  class Strange(_DoublingLibrary):
    def SampledWithoutReplacementDpEvent(self, n, m, event):   # noqa: N802
      return self._real.SampledWithoutReplacementDpEvent(n, m, self._real.GaussianDpEvent(event.noise_multiplier * 3))

  monkeypatch.setattr(accounting, 'dp_accounting', Strange(dp_accounting))
  monkeypatch.setattr(accounting, '_DOUBLES', [])
  with pytest.raises(RuntimeError, match='replace-one accounting changed'):
    accounting.epsilon(sampling='fixed', num_clients=20, **QUICKSTART)


def test_unsampled_release_is_the_gaussian_at_twice_the_sensitivity():
  # Local DP's randomizer (any two inputs of a client): every round composes a Gaussian of multiplier z / 2.
  assert accounting.epsilon(1.0, 1.0, 10, 1e-5, sampling='none') == accounting.epsilon(1.0, 0.5, 10, 1e-5)
  # A per-tensor bound C sqrt(L) scales the sensitivity with it.
  assert (accounting.epsilon(1.0, 3.0, 10, 1e-5, sampling='none', norm_bound=3.0)
          == accounting.epsilon(1.0, 0.5, 10, 1e-5))


# slow: a bisection of ~20 fixed-size (replace-one) accountings; the default suite covers its two halves by
# test_pinned_epsilons_of_both_relations (epsilon at z = 1.1 under replace-one) and
# test_calibration_is_within_target_and_minimal (the bisection of calibrate)
@pytest.mark.slow
def test_calibration_under_replace_one_meets_the_pinned_relation():
  z = accounting.calibrate(REPLACE_ONE_EPSILON, 5 / 20, 6, 1e-3, sampling='fixed', num_clients=20)
  assert z == pytest.approx(1.1, rel=1e-3)


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
    # a target met with (almost) no noise: bisection would halve z without end (it hung before)
    (lambda: accounting.calibrate(1e300, 0.25, 6, 1e-3, sampling='fixed', num_clients=20), 'dp.target_epsilon'),
    (lambda: accounting.calibrate(math.inf, 0.25, 6, 1e-3), 'dp.target_epsilon'),
    (lambda: accounting.calibrate(math.nan, 0.25, 6, 1e-3), 'dp.target_epsilon'),
    (lambda: accounting.epsilon(0.1, 1.0, 10, 1e-5, norm_bound=0.5), 'dp.norm_bound'),
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


def test_a_calibration_is_kept_on_disk_and_read_back_bit_for_bit(tmp_path, monkeypatch):
  monkeypatch.setenv(accounting.CACHE_ENV, str(tmp_path / 'dp'))
  args = dict(q=0.1, rounds=20, delta=1e-5)
  z = accounting.calibrate(2.0, **args)
  files = list((tmp_path / 'dp').iterdir())
  assert len(files) == 1 and files[0].suffix == '.json'
  # A second process-worth of calls reads the file: the bisection is not run again, the number is the same.
  bisect = accounting._bisect
  monkeypatch.setattr(accounting, '_bisect', lambda *a: pytest.fail('calibrated again'))
  assert accounting.calibrate(2.0, **args) == z
  # Other arguments are another key; a torn file is calibrated again (and rewritten), never trusted.
  monkeypatch.setattr(accounting, '_bisect', bisect)
  z3 = accounting.calibrate(3.0, **args)
  assert z3 < z and len(list((tmp_path / 'dp').iterdir())) == 2
  files[0].write_text('{"z": "nonsense')
  assert accounting.calibrate(2.0, **args) == z
  assert accounting._cached(str(files[0])) == z
  # off: no directory is touched
  monkeypatch.setenv(accounting.CACHE_ENV, 'off')
  assert accounting.calibrate(2.0, **{**args, 'rounds': 21}) > 0 and len(list((tmp_path / 'dp').iterdir())) == 2
