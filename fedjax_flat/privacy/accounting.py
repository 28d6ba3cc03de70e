"""Privacy accounting for DP federated rounds (dp-accounting's RDP and PLD accountants).

One round = one sampled Gaussian mechanism over clients: sampling rate q = clients_per_round / N, noise
multiplier z (noise std / clip), composed over `rounds`. Pure functions: the same arguments give the same epsilon,
so a resumed run recomputes the same value from its round count. `classic_epsilon` is the basic RDP conversion
that Abadi et al. (2016) and TF Privacy published with: their numbers are reproduced in the tests.
"""
import importlib.util
import math
import sys

from fedjax_flat.errors import ConfigError


def _lazy(name: str):
  """`name` imported on its first attribute access (importlib's LazyLoader): dp-accounting brings scipy.stats and
  scipy.signal (about a second), which every run would pay at its start while only DP runs use them."""
  if name in sys.modules:
    return sys.modules[name]
  spec = importlib.util.find_spec(name)
  if spec is None:
    raise ImportError(f'{name} is not installed (pip install dp-accounting)')
  spec.loader = importlib.util.LazyLoader(spec.loader)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


dp_accounting = _lazy('dp_accounting')

SAMPLINGS = ('poisson', 'fixed')
ACCOUNTANTS = ('rdp', 'pld')


def _event(q, z, rounds, sampling, num_clients):
  gaussian = dp_accounting.GaussianDpEvent(z)
  if sampling == 'poisson':
    one = dp_accounting.PoissonSampledDpEvent(q, gaussian)
  else:
    # Fixed-size sampling without replacement (what this engine simulates) is defined over the population size.
    if not num_clients:
      raise ConfigError('dp.sampling', sampling, 'fixed-size sampling needs num_clients (the population size N)')
    cohort = int(round(q * num_clients))
    one = dp_accounting.SampledWithoutReplacementDpEvent(num_clients, cohort, gaussian)
  return dp_accounting.SelfComposedDpEvent(one, rounds)


def _accountant(accountant, sampling):
  if accountant == 'rdp':
    # Sampling without replacement is only analysed under replace-one adjacency (Wang et al. 2019).
    relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if sampling == 'fixed'
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    return dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
  if sampling == 'fixed':
    raise ConfigError('dp.accountant', accountant, "the PLD accountant has no fixed-size sampling: use 'rdp'")
  return dp_accounting.pld.PLDAccountant()


def _check(q, z, rounds, delta, sampling, accountant):
  if sampling not in SAMPLINGS:
    raise ConfigError('dp.sampling', sampling, f'one of {SAMPLINGS}')
  if accountant not in ACCOUNTANTS:
    raise ConfigError('dp.accountant', accountant, f'one of {ACCOUNTANTS}')
  if not 0 < q <= 1:
    raise ConfigError('dp.sampling_rate', q, 'clients_per_round / num_clients must lie in (0, 1]')
  if z < 0:
    raise ConfigError('dp.noise_multiplier', z, 'must be >= 0')
  if rounds < 0:
    raise ConfigError('num_rounds', rounds, 'must be >= 0')
  if not 0 < delta < 1:
    raise ConfigError('dp.delta', delta, 'must lie in (0, 1); usually below 1 / num_clients')


def epsilon(q, z, rounds, delta, sampling='poisson', accountant='rdp', num_clients=None):
  """Epsilon after `rounds` rounds of the sampled Gaussian mechanism at rate q, noise multiplier z.

  z = 0 (no noise) is infinite epsilon; zero rounds spend nothing.
  """
  _check(q, z, rounds, delta, sampling, accountant)
  if rounds == 0:
    return 0.0
  if z == 0:
    return math.inf
  acc = _accountant(accountant, sampling)
  acc.compose(_event(q, z, rounds, sampling, num_clients))
  return float(acc.get_epsilon(delta))


# The RDP orders of TF Privacy's compute_dp_sgd_privacy (the MNIST DP-SGD tutorial's table of epsilons).
CLASSIC_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def classic_epsilon(q, z, rounds, delta, orders=CLASSIC_ORDERS):
  """Epsilon of the Poisson-sampled Gaussian by the basic RDP conversion eps = min_a T rdp(a) + log(1/delta)/(a-1)
  (Mironov 2017, Prop. 3).

  Why a second conversion: it is the one of Abadi et al.'s moments accountant (2016) and of TF Privacy before
  2020, so the epsilons published in that period are reproduced exactly (tests/privacy/test_accounting.py);
  `epsilon` uses dp-accounting's tighter conversion (Balle et al. 2020), which is never larger.
  """
  _check(q, z, rounds, delta, 'poisson', 'rdp')
  if rounds == 0:
    return 0.0
  if z == 0:
    return math.inf
  acc = dp_accounting.rdp.RdpAccountant(orders=list(orders))
  acc.compose(_event(q, z, rounds, 'poisson', None))
  return float(min(r + math.log(1.0 / delta) / (a - 1) for a, r in zip(acc.orders, acc.rdp) if a > 1))


def calibrate(target_epsilon, q, rounds, delta, sampling='poisson', accountant='rdp', num_clients=None,
              z_max=1e3, tol=1e-4):
  """The smallest noise multiplier z (within relative tol) whose epsilon is <= target_epsilon, by bisection.

  Epsilon decreases monotonically in z, so bisection on [0, z_max] keeps epsilon(hi) <= target throughout.
  """
  if not target_epsilon > 0:
    raise ConfigError('dp.target_epsilon', target_epsilon, 'must be > 0 (0 means: use dp.noise_multiplier)')
  _check(q, 1.0, rounds, delta, sampling, accountant)

  def eps(z):
    return epsilon(q, z, rounds, delta, sampling, accountant, num_clients)

  hi = 1.0
  while eps(hi) > target_epsilon:
    hi *= 2
    if hi > z_max:
      raise ConfigError('dp.target_epsilon', target_epsilon,
                        f'unreachable: noise multiplier {z_max:g} still gives epsilon {eps(z_max):.4g} at delta '
                        f'{delta:g} over {rounds} rounds; raise the target, delta or the population, or run fewer '
                        'rounds')
  lo = 0.0
  while hi - lo > tol * hi:
    mid = 0.5 * (lo + hi)
    if eps(mid) <= target_epsilon:
      hi = mid
    else:
      lo = mid
  return hi
