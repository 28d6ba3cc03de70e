"""Client-level differential privacy as a server-side wrapper of any algorithm whose upload is a model delta:
`with_dp(alg, config, population)` (DP-FedAvg, McMahan et al. 2018; adaptive clipping, Andrew et al. 2021;
the mechanisms and config.dp in privacy/mechanism.py).

The wrapped client_final clips the algorithm's upload {'weighted': {'delta'}} and sends it as a uniform
('uniform': every client counts once, so no client's weight exceeds 1 / m) together with its clipped-or-not bit;
the wrapped server_update turns the engine's mean back into the sum over the round's clients, adds the Gaussian
noise with a key derived from (run key, round), divides by the expected cohort m and hands the algorithm its
usual {'weighted': {'delta': noisy mean}}. With server.weighting='capped' (McMahan et al. 2018's bounded
weights w_k = min(N_k / w_hat, 1)) the clipped delta stays 'weighted', the engine weighs it by min(N_k, w_hat) =
w_hat w_k, and the estimate is the paper's fixed-denominator f_f = (sum_k w_k Delta_k + N(0, (z C m / M)^2)) /
(q W), q W = m w_bar with w_bar the mean capped weight over the population's clients (each w_k <= 1, so one
client still moves the sum by at most C). Local mode noises every upload inside client_final instead, with a key
derived from the client's own key (seed, round, client); distributed mode (DP-FedSAM's release mechanism) adds there
each client's share of the central noise, std z C sqrt(m) / M, so the sum carries what central mode adds and is
accounted like it (against a server that sees only the sum: secure aggregation). DP-FedSAM / DP-FedASAM are FedAvg
with SAM / ASAM clients under any mode (configs/dp.py); the release's per-tensor clipping is `dp.per_tensor`.

The wrapped server state is the algorithm's state dict plus 'dp' = {'key': the run's DP key (from server_init's
rng), 'clip': the current clip (adaptive clipping)}: checkpointed with it, so a resumed run draws the same noise
and continues from the same clip.

Which algorithms qualify: those that declare upload='delta' (core/contract.UPLOADS): their client_final emits
exactly {'weighted': {'delta': ...}, 'uniform': {}}, the model delta and nothing else (tests/algorithms/wrappers/
test_dp.py traces every registered algorithm to keep the declarations true; the refusal is
algorithms/features.py's). Control variates (SCAFFOLD), dual variables (FedDyn), normalized directions (FedNova) or
client slots are other uploads whose sensitivity the clip does not bound: refused in one line. So are the
asynchronous algorithms (FedBuff, FedAsync), whose server steps on arrivals are not the sampled rounds the
accountant counts.
"""
from __future__ import annotations

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms import features
from fedjax_flat.algorithms.wrappers.server_entry import with_server_entry
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.data import attacks
from fedjax_flat.errors import ConfigError
from fedjax_flat.models.base import num_param_arrays
from fedjax_flat.privacy import accounting
from fedjax_flat.privacy import mechanism as mech
from fedjax_flat.privacy.mechanism import SECTION  # noqa: F401  (config.dp, declared with its mechanisms)

KEY = 'dp'
_KEY_TAG = 0x4450      # folds the DP keys out of the run's and the clients' keys (independent of their other uses)

def enabled(config) -> bool:
  return config.get('dp') is not None and config.dp.mode != 'off'


def _attacked(config) -> bool:
  """A model-poisoning attack runs outside this wrapper (algorithms/wrappers/attack.py): the server then gets the
  round's stacked uploads, the attackers' rows rewritten, and clips every row itself."""
  return config.get('attack') is not None and config.attack.kind in attacks.MODEL_POISONING


def check(config, population: int = 0) -> None:
  """The rules of config.dp across sections, one ConfigError each, before anything is compiled. population: the
  dataset's number of clients once loaded (0: config.dp.population / config.data.num_clients if given)."""
  if not enabled(config):
    return
  d = config.dp
  if config.server.get('weighting', 'examples') not in ('uniform', 'capped'):
    raise ConfigError('server.weighting', config.server.get('weighting', 'examples'),
                      "example weighting has no bound on a client's weight under DP: set server.weighting='uniform' "
                      "or 'capped' (with server.weight_cap)")
  if config.get('fedvc') is not None and config.fedvc.virtual_size:
    raise ConfigError('fedvc.virtual_size', config.fedvc.virtual_size, 'virtual clients split one user into '
                      'several uploads, which client-level DP does not bound: 0 with dp.mode on')
  if d.accountant == 'pld' and d.mode in ('central', 'distributed'):
    raise ConfigError('dp.accountant', d.accountant, "the engine samples a fixed-size cohort, which PLD does not "
                      "account: use 'rdp'")
  if d.mode == 'distributed' and config.server.get('weighting', 'examples') != 'uniform':
    raise ConfigError('server.weighting', config.server.get('weighting', 'examples'),
                      "distributed DP's clients each add an equal share of the noise, which a weighted sum would "
                      "rescale: set server.weighting='uniform'")
  n = int(population) or int(config.data.get('num_clients') or 0)   # the clients of the data
  if n and float(d.delta) >= 1.0 / n:
    raise ConfigError('dp.delta', d.delta, f'must be below 1 / population = {1.0 / n:.3g} ({n} clients), else '
                      'releasing one client in the clear is (0, delta)-DP')
  p = mech.population(config, population)                            # the population the accountant samples
  if not p:
    return                                  # checked again once the data are loaded
  if d.mode in ('central', 'distributed') and mech.noise_cohort(config) > p:
    raise ConfigError('dp.noise_cohort', d.noise_cohort, f'must be <= the population of {p} clients')
  if not d.get('per_tensor', False):   # (per-tensor clipping's bound needs the model: checked at the build)
    noise_multiplier(config, p)             # an unreachable target epsilon is refused here


def noise_multiplier(config, population: int = 0, num_leaves: int = 0):
  """z the accountant sees: dp.noise_multiplier, or the one calibrated to dp.target_epsilon (privacy/mechanism.py).
  num_leaves: the model's parameter arrays (needed with dp.per_tensor)."""
  return mech.noise_multiplier(config, population, num_leaves)


def epsilon(config, rounds: int, population: int = 0, num_leaves: int = 0) -> float:
  """Epsilon at config.dp.delta after `rounds` rounds (a function of the round count only: a resumed run reports
  what the uninterrupted one did)."""
  a = mech.accounting(config, population, num_leaves)
  return accounting.epsilon(a['q'], float(noise_multiplier(config, population, num_leaves)), int(rounds),
                            float(config.dp.delta), a['sampling'], a['accountant'], a['num_clients'],
                            a['norm_bound'])


def _is_delta_upload(out) -> bool:
  return (isinstance(out, dict) and set(out) == {'weighted', 'uniform'} and not out['uniform'] and
          isinstance(out['weighted'], dict) and set(out['weighted']) == {'delta'})


def _raw(key):
  return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


def mean_capped_weight(client_sizes, cap: float) -> float:
  """w_bar = (1 / P) sum_k min(N_k / w_hat, 1) over the population's clients: q W / m in McMahan et al. 2018."""
  sizes = np.asarray(client_sizes, np.float64)
  if sizes.size == 0:
    raise ValueError('mean_capped_weight needs the population\'s client sizes')
  return float(np.mean(np.minimum(sizes / float(cap), 1.0)))


def with_dp(alg: FederatedAlgorithm, config, population: int = 0, client_sizes=None,
            num_leaves: int = 0) -> FederatedAlgorithm:
  """client_sizes: every client's example count (needed by server.weighting='capped': the fixed denominator);
  num_leaves: the model's parameter arrays (needed by dp.per_tensor: the accountant's norm bound)."""
  d = config.dp
  mode = str(d.mode)
  adaptive = bool(d.adaptive)
  per_layer, per_tensor = bool(d.per_layer), bool(d.get('per_tensor', False))
  m = mech.cohort(config)
  big_m = mech.noise_cohort(config)
  z = noise_multiplier(config, population, num_leaves)
  if isinstance(z, float) and d.target_epsilon:   # (a batched program's runs were calibrated on the host)
    logging.info('dp: noise multiplier z=%.6g calibrated to epsilon %g at delta %g over %d rounds', z,
                 d.target_epsilon, d.delta, config.rounds)
  sigma_b = mech.count_noise(config)
  z_v = mech.value_multiplier(z, sigma_b, adaptive)
  clip0 = d.clip
  capped = config.server.get('weighting', 'examples') == 'capped'
  if capped:
    if client_sizes is None:
      raise ConfigError('server.weighting', 'capped', "under DP needs the clients' example counts (build the "
                        'algorithm with its data) for the fixed denominator q W')
    cap = float(config.server.weight_cap)
    w_bar = mean_capped_weight(client_sizes, cap)
    denominator = m * cap * w_bar     # the engine's weights are w_hat w_k: the sum is w_hat sum_k w_k Delta_k
  else:
    cap, denominator = 1.0, m
  if alg.num_phases != 1:
    raise ConfigError('dp.mode', mode, f'{alg.name} exchanges {alg.num_phases} messages a round; DP wraps one')

  def init(inner, params, rng):
    del inner, params
    s = {'key': _raw(jax.random.fold_in(rng, _KEY_TAG))}   # raw uint32 key data: checkpointed like any array
    if adaptive:
      s['clip'] = clip0 * jnp.ones((), jnp.float32)
    return s

  def current_clip(s):
    return s['clip'] if adaptive else clip0

  def broadcast(inner, s, round_idx, phase=0):
    bcast = alg.broadcast(inner, round_idx, phase)
    return {**bcast, KEY: {'clip': current_clip(s) * jnp.ones((), jnp.float32)}}

  def _inner_bcast(bcast):
    return {k: v for k, v in bcast.items() if k != KEY}

  client_noise = mode in ('local', 'distributed')   # the clients draw the noise (key from their own key)
  share = mech.client_noise_share(mode, m, big_m)   # z C: local; z C sqrt(m) / M: distributed (sums to central's)
  sum_share = mech.sum_noise_share(mode, m, big_m)  # central: std z_v C m / M on the sum

  def client_init(bcast, client_state, rng):
    local = alg.client_init(_inner_bcast(bcast), client_state, rng)
    if not client_noise:
      return local
    return {'inner': local, 'dp_key': jax.random.fold_in(rng, _KEY_TAG)}

  def client_step(bcast, local, batch, rng):
    if not client_noise:
      return alg.client_step(_inner_bcast(bcast), local, batch, rng)
    inner, metrics = alg.client_step(_inner_bcast(bcast), local['inner'], batch, rng)
    return {**local, 'inner': inner}, metrics

  def client_final(bcast, local, client_state):
    inner_local = local['inner'] if client_noise else local
    out, client_state = alg.client_final(_inner_bcast(bcast), inner_local, client_state)
    if not _is_delta_upload(out):
      raise ConfigError('dp.mode', mode, f'{alg.name} uploads {jax.tree_util.tree_structure(out)}, not a model '
                        'delta alone: DP cannot bound it')
    c = bcast[KEY]['clip']
    delta, norm = mech.clip(out['weighted']['delta'], c, per_layer, per_tensor)
    if client_noise:
      delta = jax.tree_util.tree_map(jnp.add, delta, mech.gaussian(local['dp_key'], delta, z * c * share))
    up = {} if capped else {'delta': delta}
    if adaptive:
      up['below'] = (norm <= c).astype(jnp.float32)
    return {'weighted': {'delta': delta} if capped else {}, 'uniform': up}, client_state

  def stacked_sums(agg, c):
    """(the sum of the round's uploads, each clipped to c by the server, and the count of clipped-or-not bits)
    from the stacked rows an attack wrapper outside hands over: a malicious row is whatever its client sent, so
    the server clips every row it receives (an honest row, clipped by its client already, keeps its norm <= c)."""
    ups, valid = agg['uploads'], agg['valid']
    rows = ups['weighted']['delta'] if capped else ups['uniform']['delta']
    rows = jax.vmap(lambda r: mech.clip(r, c, per_layer, per_tensor)[0])(rows)
    coef = jnp.where(valid, agg['weights'] if capped else 1.0, 0.0).astype(jnp.float32)
    total = jax.tree_util.tree_map(lambda x: jnp.tensordot(coef, x.astype(jnp.float32), axes=1).astype(x.dtype),
                                   rows)
    below = (jnp.sum(jnp.where(valid, ups['uniform']['below'], 0.0)) if adaptive else None)
    return total, below

  def server_update(inner, s, agg, round_idx, phase=0):
    n = agg['num_clients']
    below_count = None
    if stacked:
      total, below_count = stacked_sums(agg, current_clip(s))
    elif capped:    # back to the sum: sum_k w_hat w_k Delta_k = weighted mean x total weight
      tw = agg['total_weight']
      total = jax.tree_util.tree_map(lambda x: x * tw.astype(x.dtype), agg['weighted']['delta'])
    else:
      total = jax.tree_util.tree_map(lambda x: x * n.astype(x.dtype), agg['uniform']['delta'])
    if client_noise:
      mean = jax.tree_util.tree_map(lambda x: x / jnp.asarray(denominator, x.dtype), total)
    else:
      k_value, k_count = jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(s['key']), round_idx))
      c = current_clip(s)
      mean = mech.noisy_mean(k_value, total, z_v * c * cap * sum_share, denominator)
      if adaptive:
        if below_count is None:
          below_count = agg['uniform']['below'] * n
        new_clip, _ = mech.adaptive_clip(s['clip'], below_count, k_count, sigma_b * (m / big_m), m,
                                         d.target_quantile, d.clip_lr)
        s = {**s, 'clip': new_clip}
    if stacked:
      agg = {k: v for k, v in agg.items() if k not in ('uploads', 'weights', 'valid')}
    inner_agg = {**agg, 'weighted': {'delta': mean}, 'uniform': {}}
    return alg.server_update(inner, inner_agg, round_idx, phase), s

  # Under a model-poisoning attack the round's uploads reach this server step stacked (the attack wrapper sits
  # outside, order 35): the attackers rewrite their rows, then the server clips every row and adds the noise.
  stacked = _attacked(config)
  return with_server_entry(alg, KEY, init=init, broadcast=broadcast, server_update=server_update,
                           wrappers=alg.wrappers + (KEY,), client_init=client_init, client_step=client_step,
                           client_final=client_final, aggregate='stacked' if stacked else alg.aggregate)


def divergence(config, d: int, population: int = 0) -> str:
  """The likely cause of a divergence with DP on: its noise against the clipped update (d params)."""
  dp = config.dp
  z, c = float(mech.noise_multiplier(config, population)), float(dp.clip)
  clip = f'C = {c:g}' + (' initially, adaptive' if dp.adaptive else '')
  if dp.mode == 'local':
    # each client's noise N(0, (z C)^2 I_d) has norm about z C sqrt(d), its clipped update at most C
    return (f"Likely the DP noise, not client.lr / rho: with dp.mode='local' each client adds to its clipped update "
            f'(norm <= {clip}) Gaussian noise of norm about z C sqrt(d) = {z:g} x {c:g} x sqrt({d}) = '
            f'{z * c * d ** 0.5:.3g}, z sqrt(d) = {z * d ** 0.5:.3g} x the largest update (dp.noise_multiplier '
            f'z = {z:g}, d = {d} params); lower dp.noise_multiplier '
            "or server.lr, raise clients_per_round (the mean's noise falls as 1 / sqrt(m)), or use "
            "dp.mode='central'.")
  m = mech.noise_cohort(config)
  return (f"Likely the DP noise, not client.lr / rho: with dp.mode='central' the mean update (norm <= {clip}) "
          f'gets Gaussian noise of norm about z C sqrt(d) / M = {z:g} x {c:g} x sqrt({d}) / {m} = '
          f'{z * c * d ** 0.5 / m:.3g}, z sqrt(d) / M = {z * d ** 0.5 / m:.3g} x the largest mean '
          f'(dp.noise_multiplier z = {z:g}, d = {d} params, noise cohort M = {m}); '
          'lower dp.noise_multiplier or server.lr, or raise clients_per_round / dp.noise_cohort.')


def _wrap(alg, config, ctx):
  return with_dp(alg, config, ctx.population, client_sizes=None if ctx.data is None else ctx.data.client_sizes(),
                 num_leaves=num_param_arrays(ctx.model) if config.dp.get('per_tensor', False) else 0)


# Third: the wrappers above it (SWA, WiMA) see the noisy aggregate as the algorithm's own.
FEATURE = features.register(features.Feature(KEY, order=30, switch='dp.mode', enabled=enabled, wrap=_wrap,
                                             upload='delta', check=check, divergence=divergence))
