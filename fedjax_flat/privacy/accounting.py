"""Privacy accounting for DP federated rounds (dp-accounting's RDP and PLD accountants).

One round = one sampled Gaussian mechanism over clients: sampling rate q = clients_per_round / N, noise
multiplier z (noise std / clip C), composed over `rounds`. Pure functions: the same arguments give the same
epsilon, so a resumed run recomputes the same value from its round count. `classic_epsilon` is the basic RDP
conversion that Abadi et al. (2016) and TF Privacy published with: their numbers are reproduced in the tests.

Adjacency and sensitivity. Each sampling is analysed under one neighbouring relation (`ADJACENCY`): Poisson
sampling under add/remove-one (a client's clipped upload joins or leaves the sum: it moves by at most C), fixed-size
sampling without replacement (what the engine does) under replace-one (one client's data swapped for another's:
its clipped upload moves anywhere in the ball of radius C, so the sum moves by up to 2C), and 'none' (every round
counts the client: local DP's randomizer, defined over any two inputs) also under replace-one. dp_accounting's
`GaussianDpEvent(m)` is a mechanism whose noise std is m times the sensitivity, and its replace-one events do not
double the sensitivity themselves (google/differential-privacy#378), so the event carries z / `sensitivity(...)`:
z / 2 under replace-one. Passing z there under-reported epsilon 3x to 9x before. `_library_doubles()` asks the
installed dp_accounting whether it applies the factor itself (an open pull request, #464, would): then the factor
is not applied twice. `norm_bound` is a client upload's largest L2 norm in units of C (1 for flat and per-layer
clipping; sqrt(L) when each of L tensors is clipped to C, the DP-FedSAM release's rule).
"""
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import sys
import tempfile

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

SAMPLINGS = ('poisson', 'fixed', 'none')
ACCOUNTANTS = ('rdp', 'pld')
# The neighbouring relation each sampling is analysed under (module docstring).
ADJACENCY = {'poisson': 'add_or_remove_one', 'fixed': 'replace_one', 'none': 'replace_one'}


def sensitivity(sampling: str, norm_bound: float = 1.0) -> float:
  """The L2 sensitivity of a round's sum of clipped uploads, in units of the clip C: replace-one moves one upload
  across its ball (2 x its bound), add/remove-one adds or drops it (1 x)."""
  return (2.0 if ADJACENCY[sampling] == 'replace_one' else 1.0) * float(norm_bound)


_DOUBLES = []


def _library_doubles() -> bool:
  """Whether the installed dp_accounting doubles the Gaussian's sensitivity under replace-one by itself.

  Asked of the library, once: sampling all n of n without replacement is the plain Gaussian mechanism, whose
  replace-one epsilon is that of multiplier z / 2 under add/remove. A library that gives that for z has the factor
  built in; one that gives the add/remove epsilon of z does not (dp_accounting <= 0.6); anything else is a
  behaviour this module does not know, refused rather than guessed (an epsilon must never be too small)."""
  if not _DOUBLES:
    rel = dp_accounting.NeighboringRelation

    def eps(event, relation):
      acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
      acc.compose(event)
      return acc.get_epsilon(1e-5)

    g = dp_accounting.GaussianDpEvent
    got = eps(dp_accounting.SampledWithoutReplacementDpEvent(10, 10, g(1.0)), rel.REPLACE_ONE)
    plain, doubled = eps(g(1.0), rel.ADD_OR_REMOVE_ONE), eps(g(0.5), rel.ADD_OR_REMOVE_ONE)
    if math.isclose(got, plain, rel_tol=1e-6):
      _DOUBLES.append(False)
    elif math.isclose(got, doubled, rel_tol=1e-6):
      _DOUBLES.append(True)
    else:
      raise RuntimeError(f'the installed dp_accounting gives epsilon {got:.6g} for sampling 10 of 10 clients '
                         f'under replace-one (neither {plain:.6g} nor {doubled:.6g}): its replace-one accounting '
                         'changed; pin dp-accounting to 0.6.x or check privacy/accounting.py')
  return _DOUBLES[0]


def event_multiplier(z: float, sampling: str, norm_bound: float = 1.0) -> float:
  """The multiplier the dp_accounting Gaussian event carries: z over the sensitivity the library does not apply
  itself (module docstring)."""
  s = sensitivity(sampling, norm_bound)
  if sampling == 'fixed' and _library_doubles():
    s /= 2.0
  return z / s


def _event(q, z, rounds, sampling, num_clients, norm_bound=1.0):
  gaussian = dp_accounting.GaussianDpEvent(event_multiplier(z, sampling, norm_bound))
  if sampling == 'poisson':
    one = dp_accounting.PoissonSampledDpEvent(q, gaussian)
  elif sampling == 'none':
    # Every round releases the client's noised upload: no amplification; the replace-one factor is in the
    # multiplier (an unsampled Gaussian is the same mechanism under either relation once the sensitivity is set).
    one = gaussian
  else:
    # Fixed-size sampling without replacement (what this engine simulates) is defined over the population size.
    if not num_clients:
      raise ConfigError('dp.sampling', sampling, 'fixed-size sampling needs num_clients (the population size N)')
    cohort = int(round(q * num_clients))
    one = dp_accounting.SampledWithoutReplacementDpEvent(num_clients, cohort, gaussian)
  return dp_accounting.SelfComposedDpEvent(one, rounds)


def _accountant(accountant, sampling):
  if accountant == 'rdp':
    # Sampling without replacement is only analysed under replace-one adjacency (Wang et al. 2019); 'none' carries
    # its replace-one factor in the multiplier (_event), so either relation gives the same epsilon.
    relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if sampling == 'fixed'
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    return dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
  if sampling == 'fixed':
    raise ConfigError('dp.accountant', accountant, "the PLD accountant has no fixed-size sampling: use 'rdp'")
  return dp_accounting.pld.PLDAccountant()


def _check(q, z, rounds, delta, sampling, accountant, norm_bound=1.0):
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
  if not norm_bound >= 1.0:
    raise ConfigError('dp.norm_bound', norm_bound, "must be >= 1: a client upload's largest norm in units of the "
                      'clip')


def epsilon(q, z, rounds, delta, sampling='poisson', accountant='rdp', num_clients=None, norm_bound=1.0):
  """Epsilon after `rounds` rounds of the sampled Gaussian mechanism at rate q, noise std z C on the sum of
  uploads clipped to C (each at most norm_bound C), under the sampling's adjacency (`ADJACENCY`).

  z = 0 (no noise) is infinite epsilon; zero rounds spend nothing.
  """
  _check(q, z, rounds, delta, sampling, accountant, norm_bound)
  if rounds == 0:
    return 0.0
  if z == 0:
    return math.inf
  acc = _accountant(accountant, sampling)
  acc.compose(_event(q, z, rounds, sampling, num_clients, norm_bound))
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


Z_MIN = 1e-3    # calibration's floor: a target needing less noise than this is no privacy worth the name


# Calibrations already done, one small JSON file each: the bisection costs seconds to minutes (sampling without
# replacement is analysed order by order in Python), and every process that validates a DP config (each run of a
# sweep, each binary, each test worker) would pay it again for the same arguments. The file holds the z the
# bisection returned, so a cached z is the same number bit for bit; the key includes dp-accounting's version.
# FEDJAX_FLAT_DP_CACHE=DIR|off (default $XDG_CACHE_HOME/fedjax_flat/dp, i.e. ~/.cache/fedjax_flat/dp).
CACHE_ENV = 'FEDJAX_FLAT_DP_CACHE'


def _cache_dir():
  d = os.environ.get(CACHE_ENV, '')
  if d == 'off':
    return None
  return d or os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'), 'fedjax_flat', 'dp')


@functools.lru_cache(maxsize=None)
def _code_hash() -> str:
  with open(__file__, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def _cache_file(args):
  d = _cache_dir()
  if d is None:
    return None
  # Any change to this module (the accounting, the bisection) or to dp-accounting makes new keys: a z calibrated
  # by other code is never read back.
  key = json.dumps({'calibrate': [a if a is None or isinstance(a, str) else repr(float(a)) for a in args],
                    'code': _code_hash(), 'dp_accounting': importlib.metadata.version('dp-accounting'),
                    'doubles': _library_doubles()})
  return os.path.join(d, hashlib.sha256(key.encode()).hexdigest()[:32] + '.json')


def _cached(path):
  try:
    with open(path) as f:
      z = float.fromhex(json.load(f)['z'])
  except (OSError, ValueError, KeyError, TypeError):   # absent, torn or not ours: calibrate again
    return None
  return z if math.isfinite(z) and z > 0 else None


def _store(path, z):
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix='.tmp')
    with os.fdopen(fd, 'w') as f:
      json.dump({'z': float(z).hex()}, f)
    os.replace(tmp, path)     # atomic: a concurrent reader sees the whole file or none
  except OSError:
    pass                      # an unwritable cache only costs the next process the bisection


def calibrate(target_epsilon, q, rounds, delta, sampling='poisson', accountant='rdp', num_clients=None,
              z_max=1e3, tol=1e-4, norm_bound=1.0):
  """The smallest noise multiplier z (within relative tol) whose epsilon is <= target_epsilon, by bisection.

  Epsilon decreases monotonically in z, so bisection on [Z_MIN, z_max] keeps epsilon(hi) <= target throughout;
  a target already met at Z_MIN is refused in one line (the search would otherwise halve z without end). A result
  is kept on disk (`CACHE_ENV`) and read back for the same arguments.
  """
  args = (target_epsilon, q, rounds, delta, sampling, accountant, num_clients, z_max, tol, norm_bound)
  valid = isinstance(target_epsilon, (int, float)) and 0 < target_epsilon < math.inf
  path = _cache_file(args) if valid else None
  z = None if path is None else _cached(path)
  if z is None:
    z = _bisect(*args)
    if path is not None:
      _store(path, z)
  return z


def _bisect(target_epsilon, q, rounds, delta, sampling, accountant, num_clients, z_max, tol, norm_bound):
  if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
    raise ConfigError('dp.target_epsilon', target_epsilon, 'must be a finite number > 0 (0 means: use '
                      'dp.noise_multiplier)')
  _check(q, 1.0, rounds, delta, sampling, accountant, norm_bound)

  def eps(z):
    return epsilon(q, z, rounds, delta, sampling, accountant, num_clients, norm_bound)

  if eps(Z_MIN) <= target_epsilon:
    raise ConfigError('dp.target_epsilon', target_epsilon,
                      f'is met with almost no noise (multiplier {Z_MIN:g} gives epsilon {eps(Z_MIN):.4g}): that is '
                      "no privacy; lower the target, or set dp.mode='off' to train without DP")
  hi = 1.0
  while eps(hi) > target_epsilon:
    hi *= 2
    if hi > z_max:
      raise ConfigError('dp.target_epsilon', target_epsilon,
                        f'unreachable: noise multiplier {z_max:g} still gives epsilon {eps(z_max):.4g} at delta '
                        f'{delta:g} over {rounds} rounds; raise the target, delta or the population, or run fewer '
                        'rounds')
  lo = Z_MIN
  while hi - lo > tol * hi:
    mid = 0.5 * (lo + hi)
    if eps(mid) <= target_epsilon:
      hi = mid
    else:
      lo = mid
  return hi
