"""Client-level DP mechanisms as pure functions over pytrees, and the `dp` config section.

DP-FedAvg (McMahan et al. 2018), central mode, one round over an expected cohort of m clients:

    Delta_k <- Delta_k * min(1, C / ||Delta_k||)                 flat clipping (per_layer: each of the L leaves to
                                                                  C / sqrt(L), so the whole upload stays within C)
    mean    = (sum_k Delta_k + N(0, (z_v C m / M)^2)) / m         uniform weights, fixed denominator m; M = the
                                                                  noise cohort (pfl-research: the noise of a cohort
                                                                  of M clients, std z_v C / M on the mean; M = m)

Local mode: every client adds N(0, (z C)^2) to its own clipped upload; the server takes the plain mean over m.

Distributed mode (DP-FedSAM, Shi et al. 2023; distributed DP as with secure aggregation): every client adds
N(0, (z C sqrt(m) / M)^2) to its own clipped upload, so the sum over the m clients carries the central mode's noise
N(0, (z C m / M)^2) and is accounted as central DP: a guarantee against a server that sees only the sum (secure
aggregation); one upload alone carries noise multiplier z sqrt(m) / M (z / sqrt(m) at M = m).

Accounting (privacy/accounting.py): the engine samples a fixed-size cohort without replacement, analysed under
replace-one adjacency, where swapping one client's data moves the clipped sum by up to 2C; local DP's randomizer
likewise (any two inputs of a client). per_tensor clipping (the DP-FedSAM release: each of the L tensors to C)
bounds an upload by C sqrt(L), which the accountant is told (`norm_bound`).

Adaptive clipping (Andrew et al. 2021, geometric update; TFF's defaults): each client also reports
b_k = 1[||Delta_k|| <= C]; the server's noisy fraction b_bar = (sum_k b_k + N(0, (sigma_b m / M)^2)) / m moves
the clip C <- C exp(-eta (b_bar - gamma)), gamma the target quantile. The noise multiplier z the accountant sees
is shared between the two queries (their Theorem 1): z_v = (z^-2 - (2 sigma_b)^-2)^-1/2, with sigma_b the count
noise on a cohort of M (default M / 20, the paper's choice), so 2 sigma_b > z is required.

Numbers may be per-run traced values of a batched program (core/runs.py): only jnp arithmetic touches them.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from fedjax_flat.errors import ConfigError
from fedjax_flat.privacy import accounting as accounting_lib
from fedjax_flat.schema import RESULT, TRUTH, VALUE, Choice, Field, Flag, Int, Num, Section, refuse_inert

MODES = ('off', 'central', 'local', 'distributed')
Z_MAX = 1e6      # a noise multiplier above this is a typo, not a privacy setting (dp.noise_multiplier=1e300 diverged)
ACCOUNTANTS = ('rdp', 'pld')
# The engine samples a fixed-size cohort without replacement (data/sampling.py): the accountant's event.
SAMPLING = 'fixed'
COUNT_NOISE_PER_CLIENT = 1.0 / 20.0   # Andrew et al. 2021: sigma_b = expected clients / 20


def _on(cfg) -> bool:
  return cfg.get('dp') is not None and cfg.dp.mode != 'off'


def _check(cfg) -> None:
  """The dp section's own cross-field rules (the rules involving other sections: algorithms/wrappers/dp.py)."""
  d = cfg.dp
  if d.mode == 'off':
    # dp.clip, dp.noise_multiplier, ... away from their defaults while off would be silently ignored: refused
    # like a field whose `when` does not hold (schema.Field.needs)
    for f in SECTION.fields:
      if f.name != 'mode' and f.rule is not None and f.name in d:
        refuse_inert(SECTION.path(f), d[f.name], f.rule.default, "dp.mode='central', 'local' or 'distributed'")
    return
  z = d.noise_multiplier
  if isinstance(z, (int, float)) and not d.target_epsilon and float(z) > Z_MAX:
    raise ConfigError('dp.noise_multiplier', z, f'must be <= {Z_MAX:g}: noise of std z C per coordinate drowns '
                      'every update (and overflows float32 near 1e38); calibration (dp.target_epsilon) searches '
                      'up to 1e3')
  if d.adaptive and d.mode == 'local':
    raise ConfigError('dp.adaptive', True, "adaptive clipping needs the server's noisy count: dp.mode='central' "
                      'only')
  if d.noise_cohort and d.mode == 'local':
    raise ConfigError('dp.noise_cohort', d.noise_cohort, "sizes the central noise: 0 with dp.mode='local'")
  if d.adaptive and d.mode == 'distributed':
    raise ConfigError('dp.adaptive', True, "adaptive clipping needs the server's noisy count, which distributed "
                      "DP's clients do not noise: dp.mode='central' only")
  if d.per_layer and d.per_tensor:
    raise ConfigError('dp.per_tensor', True, 'and dp.per_layer are two clipping rules: set one (per_layer: each '
                      'of L tensors to C / sqrt(L); per_tensor: each to C, the DP-FedSAM release)')
  if d.adaptive and not d.target_epsilon and float(d.noise_multiplier) > 0:
    z, sb = float(d.noise_multiplier), count_noise(cfg)
    if 2 * sb <= z:
      raise ConfigError('dp.noise_multiplier', z, f'with adaptive clipping it must be below 2 x the count noise '
                        f'{sb:g} (dp.count_noise, default noise cohort / 20); raise dp.count_noise or lower z')


SECTION = Section('dp', (
    Field('mode', Choice('off', MODES), "'off' | 'central' (noise on the sum, trusted server) | 'local' (each "
          "client noises its own upload) | 'distributed' (each client adds its share of the central noise, as "
          'with secure aggregation: DP-FedSAM)'),
    Field('clip', Num(0.1, lo=0, lo_open=True), "C: each client's model delta clipped to this L2 norm (adaptive: "
          'the initial clip)', {VALUE}),
    Field('per_layer', Flag(False), 'clip each of the L parameter arrays to C / sqrt(L) instead of the whole delta'),
    Field('per_tensor', Flag(False), 'clip each of the L parameter arrays to C (the DP-FedSAM release): an upload '
          'is then bounded by C sqrt(L), which the accountant charges'),
    Field('noise_multiplier', Num(1.0, lo=0), 'z: Gaussian noise std z C (the accountant\'s multiplier)', {VALUE}),
    Field('target_epsilon', Num(0.0, lo=0), '> 0: calibrate z before training so that epsilon after `rounds` is at '
          'most this (0: use dp.noise_multiplier)', {VALUE, TRUTH}),
    Field('delta', Num(1e-5, lo=0, hi=1, lo_open=True, hi_open=True), 'delta of the (epsilon, delta) reported; '
          'below 1 / population'),
    Field('accountant', Choice('rdp', ACCOUNTANTS), "'rdp' | 'pld' (PLD has no fixed-size sampling: refused)"),
    Field('population', Int(0, lo=0), 'the population the accountant samples from (0: the dataset\'s clients)'),
    Field('noise_cohort', Int(0, lo=0), 'M: noise sized for a cohort of M clients (std z C / M on the mean; 0: '
          'the simulated clients_per_round)'),
    Field('adaptive', Flag(False), 'adaptive clipping: C tracks a quantile of the update norms (Andrew et al.)'),
    Field('target_quantile', Num(0.5, lo=0, hi=1), 'gamma: the quantile of update norms the clip tracks'),
    Field('clip_lr', Num(0.2, lo=0), 'eta: geometric clip update C <- C exp(-eta (b_bar - gamma))'),
    Field('count_noise', Num(0.0, lo=0), 'sigma_b: noise std of the clipped-or-not count of a cohort of M (0: M '
          '/ 20)'),
), check=_check, tags={RESULT}, doc='client-level differential privacy (algorithms/wrappers/dp.py)')


# ---- resolved numbers (host side, plain floats)

def cohort(cfg) -> int:
  """m: the expected (fixed) number of clients a round."""
  return int(cfg.clients_per_round)


def noise_cohort(cfg) -> int:
  """M: the cohort the noise is sized for (dp.noise_cohort, else m)."""
  return int(cfg.dp.noise_cohort) or cohort(cfg)


def count_noise(cfg) -> float:
  """sigma_b: the count noise std of a cohort of M."""
  return float(cfg.dp.count_noise) or COUNT_NOISE_PER_CLIENT * noise_cohort(cfg)


def population(cfg, data_population: int = 0) -> int:
  """P: the population the accountant samples from."""
  return int(cfg.dp.population) or int(data_population) or int(cfg.data.get('num_clients') or 0)


def accounting(cfg, data_population: int = 0, num_leaves: int = 0) -> dict:
  """The accountant's arguments (accounting.epsilon): central and distributed modes sample M of P without
  replacement each round; local mode releases every upload itself, so a client's epsilon composes over rounds
  without amplification ('none': a bound for every client whatever its participation). num_leaves: the model's
  parameter arrays L (per_tensor clipping bounds an upload by C sqrt(L); needed only then)."""
  norm_bound = 1.0
  if cfg.dp.get('per_tensor', False):
    if not num_leaves:
      raise ValueError('per_tensor clipping is accounted with the number of parameter arrays: pass num_leaves')
    norm_bound = math.sqrt(num_leaves)
  p = population(cfg, data_population)
  if cfg.dp.mode == 'local':
    out = {'q': 1.0, 'sampling': 'none', 'num_clients': None}
  else:
    m = noise_cohort(cfg)
    out = {'q': m / p if p else 0.0, 'sampling': SAMPLING, 'num_clients': p}
  out.update(accountant=str(cfg.dp.accountant), norm_bound=norm_bound,
             adjacency=accounting_lib.ADJACENCY[out['sampling']],
             sensitivity=accounting_lib.sensitivity(out['sampling'], norm_bound))
  return out


@functools.lru_cache(maxsize=64)
def _calibrate(target, q, rounds, delta, sampling, accountant, num_clients, norm_bound):
  return accounting_lib.calibrate(target, q, rounds, delta, sampling, accountant, num_clients,
                                  norm_bound=norm_bound)


def noise_multiplier(cfg, data_population: int = 0, num_leaves: int = 0):
  """z the accountant sees: dp.noise_multiplier, or the one calibrated to dp.target_epsilon over cfg.rounds (once
  per distinct setting). In a batched program (core/runs.py) a per-run target is a traced value: the run's z was
  calibrated on the host (core/runs.run_values) and travels as its dp.noise_multiplier."""
  d = cfg.dp
  target = d.target_epsilon
  if not isinstance(target, (int, float)) or not target:
    return d.noise_multiplier
  a = accounting(cfg, data_population, num_leaves)
  return _calibrate(float(target), a['q'], int(cfg.rounds), float(d.delta), a['sampling'], a['accountant'],
                    a['num_clients'], a['norm_bound'])


def client_noise_share(mode: str, m: int, big_m: int) -> float:
  """f in the noise N(0, (z C f)^2) a client adds to its own clipped upload: 1 in local mode; sqrt(m) / M in
  distributed mode (m such shares sum to the central noise, z C m / M); 0 in central mode (the server adds it)."""
  return {'local': 1.0, 'distributed': math.sqrt(m) / big_m}.get(mode, 0.0)


def sum_noise_share(mode: str, m: int, big_m: int) -> float:
  """f in the noise N(0, (z C f)^2) on the sum of a cohort's m uploads: m / M in central and distributed mode
  (the release one client's upload hides in); sqrt(m) in local mode (m independent draws of std z C)."""
  return math.sqrt(m) if mode == 'local' else m / big_m


def value_multiplier(z, sigma_b, adaptive: bool):
  """z_v: the noise multiplier of the model query (z itself without adaptive clipping); z may be traced."""
  if not adaptive:
    return z
  return z * (1.0 - (z / (2.0 * sigma_b)) ** 2) ** -0.5    # = (z^-2 - (2 sigma_b)^-2)^-1/2, and 0 at z = 0


# ---- the mechanisms (traced)

def clip(tree, c, per_layer: bool = False, per_tensor: bool = False):
  """(clipped tree, its norm before clipping ||Delta||): flat clipping to C, each leaf to C / sqrt(L) (per_layer),
  or each leaf to C (per_tensor)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  sq = [jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves]
  norm = jnp.sqrt(sum(sq))
  c = jnp.asarray(c, jnp.float32)
  if per_layer or per_tensor:
    c_leaf = c / math.sqrt(len(leaves)) if per_layer else c
    scales = [jnp.minimum(1.0, c_leaf / jnp.maximum(jnp.sqrt(s), 1e-30)) for s in sq]
  else:
    scales = [jnp.minimum(1.0, c / jnp.maximum(norm, 1e-30))] * len(leaves)
  return jax.tree_util.tree_unflatten(treedef, [x * s.astype(x.dtype) for x, s in zip(leaves, scales)]), norm


def gaussian(key, tree, std):
  """N(0, std^2) noise shaped like `tree`, one key per leaf (split from `key`)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  keys = jax.random.split(key, len(leaves))
  std = jnp.asarray(std, jnp.float32)
  return jax.tree_util.tree_unflatten(treedef, [
      (std * jax.random.normal(k, x.shape, jnp.float32)).astype(x.dtype) for k, x in zip(keys, leaves)])


def noisy_mean(key, total, std_sum, m):
  """(sum + N(0, std_sum^2)) / m, leafwise: the fixed-denominator DP estimate of the mean."""
  noise = gaussian(key, total, std_sum)
  return jax.tree_util.tree_map(lambda s, n: (s + n) / jnp.asarray(m, s.dtype), total, noise)


def adaptive_clip(c, below_sum, key, count_std_sum, m, quantile, lr):
  """Andrew et al.'s geometric update: C exp(-lr (b_bar - quantile)), b_bar = (sum_k b_k + noise) / m."""
  b_bar = (below_sum + jnp.asarray(count_std_sum, jnp.float32) * jax.random.normal(key, (), jnp.float32)) / m
  return c * jnp.exp(-jnp.asarray(lr, jnp.float32) * (b_bar - jnp.asarray(quantile, jnp.float32))), b_bar
