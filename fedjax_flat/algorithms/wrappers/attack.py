"""Model-poisoning attacks as client roles (config.attack.kind in data/attacks.MODEL_POISONING): a fraction
attack.fraction of the population is malicious (data/attacks.malicious_clients, from the seed) and rewrites its
upload, a model delta, where the server sees the cohort.

Roles travel as client state: every client's row holds {'malicious': bool} (`initial_client_states`, the
algorithm's own client state beside it under 'inner'), and client_final adds the flag to the 'uniform' upload,
so the round's stacked uploads say which rows are malicious whatever the round path or device count. The
wrapper declares aggregate='stacked'; its server_update (outside the robust aggregator: the feature's order 35
is above robust's 20, and the outer wrapper's server_update runs first) rewrites the valid malicious rows of the
'weighted' upload u (s = attack.scale; mu, sigma = the coordinate-wise mean and standard deviation (ddof 0) of
the round's honest valid uploads, which colluding attackers see):

  sign_flip   u <- -s u                      (the sign-flipping Byzantine worker)
  scale       u <- s u
  backdoor    u <- s u                       (model replacement, Bagdasaryan et al. 2020: the attacker trained on
                                              triggered data, data/attacks.py; s = the boost gamma, n / eta)
  gaussian    u <- s N(0, I)                 (a key from (config.seed, round); rows and leaves folded in; the
                                              seed's key is the server state's 'attack' entry, so each lane
                                              of a batched program draws its own run's noise)
  alie        u <- mu - s sigma              (A Little Is Enough, Baruch et al. 2019; s = z)
  ipm         u <- -s mu                     (inner product manipulation, Xie et al. 2020; s = epsilon)

then hands the rows (flags removed) to the robust aggregator, or, with server.aggregator='mean', reduces them
to the weighted mean itself (the engine's weights). attack.kind='none' or 'label_flip' builds nothing: the run
is bit-identical. On the runs axis (core/runs.py) a grid over attack.scale (a traced per-run value) and
attack.fraction (a per-run input: each run's roles are its own store rows, drawn on the host as when it runs
alone) is one program. With central DP (dp.mode='central', dp.py, order 30 inside this wrapper) the rows go to
DP's server step stacked: the server clips every row it receives (the attackers' rewritten ones included), sums,
adds the noise: DP as a defence. Refused in one line: an algorithm whose upload is not a delta, local or
distributed DP (the attackers would skip their own noise), and a population unknown when the algorithm is built.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat import aggregators
from fedjax_flat.algorithms import features
from fedjax_flat.algorithms.wrappers import dp as dp_lib
from fedjax_flat.algorithms.wrappers.server_entry import with_server_entry
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.data import attacks
from fedjax_flat.errors import ConfigError

KEY = 'attack'
FLAG = 'malicious'     # the 'uniform' upload's entry: 1.0 for a malicious client's row


def enabled(config) -> bool:
  a = config.get('attack')
  return a is not None and a.kind in attacks.MODEL_POISONING


def check(config, population: int = 0) -> None:
  del population
  if dp_lib.enabled(config) and config.dp.mode != 'central':
    raise ConfigError('dp.mode', config.dp.mode, 'with a model-poisoning attack: its clients add their own noise, '
                      "which an attacker would leave out; DP as a defence is the server's: set dp.mode='central'")


def _bcast(v, x):
  return v.reshape(v.shape + (1,) * (x.ndim - 1))


def honest_stats(uploads, honest):
  """(mu, sigma): the coordinate-wise mean and standard deviation (ddof 0) of the rows in `honest` [C] (zero when
  there are none)."""
  n = jnp.maximum(jnp.sum(honest.astype(jnp.float32)), 1.0)

  def mean(x):
    return jnp.sum(jnp.where(_bcast(honest, x), x, 0).astype(jnp.float32), axis=0) / n
  mu = jax.tree_util.tree_map(mean, uploads)
  var = jax.tree_util.tree_map(
      lambda x, m: jnp.sum(jnp.where(_bcast(honest, x), jnp.square(x.astype(jnp.float32) - m[None]), 0), axis=0) / n,
      uploads, mu)
  return mu, jax.tree_util.tree_map(jnp.sqrt, var)


def poison(uploads, valid, malicious, kind: str, scale, key=None):
  """The stacked 'weighted' uploads [C, ...] with the valid malicious rows rewritten by `kind` (module docstring);
  honest and padding rows unchanged."""
  bad = valid & malicious
  honest = valid & ~malicious
  s = jnp.asarray(scale, jnp.float32)
  if kind in ('alie', 'ipm'):
    mu, sigma = honest_stats(uploads, honest)
  leaves, treedef = jax.tree_util.tree_flatten(uploads)

  def forged(i, x):
    if kind == 'sign_flip':
      return -s * x
    if kind in ('scale', 'backdoor'):
      return s * x
    if kind == 'gaussian':
      return s * jax.random.normal(jax.random.fold_in(key, i), x.shape, jnp.float32)
    m = jax.tree_util.tree_leaves(mu)[i][None]
    if kind == 'alie':
      return jnp.broadcast_to(m - s * jax.tree_util.tree_leaves(sigma)[i][None], x.shape)
    if kind == 'ipm':
      return jnp.broadcast_to(-s * m, x.shape)
    raise ValueError(f'attack.kind={kind!r}; allowed: {attacks.MODEL_POISONING}')
  out = [jnp.where(_bcast(bad, x), forged(i, x).astype(x.dtype), x) for i, x in enumerate(leaves)]
  return jax.tree_util.tree_unflatten(treedef, out)


def _population(ctx, config) -> int:
  if ctx.data is not None:
    return int(ctx.data.num_clients)
  try:
    n = int(ctx.population) or int(config.data.get('num_clients', 0) or 0)
  except TypeError:          # a batched program's traced population: the roles need the number itself
    n = 0
  if n <= 0:
    raise ConfigError('attack.kind', config.attack.kind, 'draws its malicious clients from the population, '
                      'unknown when this algorithm is built: load the data first (a single run)')
  return n


def with_attack(alg: FederatedAlgorithm, config, ctx) -> FederatedAlgorithm:
  """`alg` whose malicious clients (their client-state flag) rewrite their delta before the server reduces it."""
  a = config.attack
  if alg.num_phases != 1:
    raise ConfigError('attack.kind', a.kind, f'{alg.name} exchanges {alg.num_phases} messages a round; the '
                      'attackers rewrite one')
  # attack.scale may be a batched program's per-run traced value (core/runs.VALUE_FIELDS): used only in jnp
  # arithmetic. attack.fraction is a per-run input (INPUT_FIELDS): it only draws the roles, which the run's own
  # host-side initial_client_states writes into its store rows, so a lane's roles are its run's alone.
  kind, scale, stacked_inside = str(a.kind), a.scale, alg.aggregate == 'stacked'
  inner_state = alg.client_state_init is not None

  def client_state_init(params):
    st = {FLAG: jnp.zeros((), jnp.bool_)}
    return {**st, 'inner': alg.client_state_init(params)} if inner_state else st

  def initial_client_states(params):
    k = _population(ctx, config)
    flags = np.zeros(k, bool)
    flags[attacks.malicious_clients(k, a.fraction, config.seed)] = True
    rows = {FLAG: jnp.asarray(flags)}
    if not inner_state:
      return rows
    if alg.initial_client_states is not None:
      inner = alg.initial_client_states(params)
    else:                    # the inner template for every client: the store's rows need one shape
      inner = jax.tree_util.tree_map(lambda t: jnp.broadcast_to(t, (k,) + jnp.shape(t)),
                                     alg.client_state_init(params))
    return {**rows, 'inner': inner}

  def client_init(bcast, client_state, rng):
    return alg.client_init(bcast, client_state['inner'] if inner_state else None, rng)

  def client_final(bcast, local, client_state):
    out, new_inner = alg.client_final(bcast, local, client_state['inner'] if inner_state else None)
    flag = client_state[FLAG]
    out = {**out, 'uniform': {**out['uniform'], FLAG: flag.astype(jnp.float32)}}
    new = {FLAG: flag, 'inner': new_inner} if inner_state else {FLAG: flag}
    return out, new

  def init(inner, params, rng):
    """The gaussian attackers' key, from (config.seed, ATTACK_STREAM), kept in the server state: a batched
    program's lanes each read their own run's key (the traced config holds one run's seed). No entry for the
    other kinds: their server state is the algorithm's own."""
    del inner, params, rng
    if kind != 'gaussian':
      return None
    return {'key': jax.random.key_data(jax.random.fold_in(jax.random.key(int(config.seed)),
                                                          attacks.ATTACK_STREAM))}

  def server_update(inner, entry, agg, round_idx, phase=0):
    uploads, weights, valid = agg['uploads'], agg['weights'], agg['valid']
    malicious = uploads['uniform'][FLAG] > 0.5
    uniform = {n: v for n, v in uploads['uniform'].items() if n != FLAG}
    key = None
    if kind == 'gaussian':
      key = jax.random.fold_in(jax.random.wrap_key_data(entry['key']), jnp.asarray(round_idx, jnp.int32))
    weighted = poison(uploads['weighted'], valid, malicious, kind, scale, key)
    if 'delta' in uniform:   # DP's uniform upload (dp.py): the clipped delta travels there
      uniform = {**uniform, 'delta': poison(uniform['delta'], valid, malicious, kind, scale, key)}
    if stacked_inside:       # the robust aggregator (or DP's server clip) reduces the poisoned rows
      return alg.server_update(inner, {**agg, 'uploads': {'weighted': weighted, 'uniform': uniform}},
                               round_idx, phase), entry
    coef = valid.astype(jnp.float32)
    mean_agg = {'weighted': aggregators.mean(weighted, weights, valid),
                'uniform': aggregators.mean(uniform, coef, valid),
                'num_clients': agg['num_clients'], 'total_weight': agg['total_weight']}
    return alg.server_update(inner, mean_agg, round_idx, phase), entry

  return with_server_entry(alg, KEY, init=init, server_update=server_update,
                           client_state_init=client_state_init, initial_client_states=initial_client_states,
                           client_init=client_init, client_final=client_final, aggregate='stacked',
                           wrappers=alg.wrappers + (KEY,))


# Above the robust aggregator (20) and DP (30): the outer wrapper's server_update sees the stacked uploads first,
# so the attackers rewrite their rows before the aggregator reduces them or DP's server clips them and adds noise.
FEATURE = features.register(features.Feature(
    KEY, order=35, switch='attack.kind', enabled=enabled, wrap=with_attack, upload='delta', check=check))
