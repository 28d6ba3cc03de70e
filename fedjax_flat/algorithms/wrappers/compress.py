"""Compressed uploads as a wrapper of any algorithm whose upload is a model delta: `with_compression(alg, config)`
(the transforms, their bytes and config.upload: systems/compress.py).

The wrapped client_final flattens the algorithm's upload {'weighted': {'delta'}} to one vector, adds the client's
residual (upload.error_feedback; rand-k then unscaled, a contraction: systems/compress.py), compresses it with a key
derived from the client's key (seed, round, client), keeps the new residual as client state and sends the compressed
delta in the algorithm's place, together with its relative compression error ||C(p) - p|| / ||p|| (a 'uniform' entry
the wrapped server_update removes before the algorithm sees the aggregate). The server state gains 'compress' =
{'err': the round's mean relative error, 'err_sum': its sum over rounds, 'rounds'} (checkpointed with it;
training/evals/compress.py reports it).

With error feedback the client state is {'ef': a residual shaped like the algorithm's delta} (+ the algorithm's own
under 'inner'): the client-state store the stateful algorithms use keeps it and checkpoints it; a client that does not
report keeps its residual. Which algorithms qualify: those that declare upload='delta', as for DP: their upload is
the model delta alone; control variates, duals, normalized directions or slots are refused in one line.
Combined with DP it is refused too: a compressed (rand-k: scaled by d / k) delta is no longer within the clip.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_flat.algorithms import features
from fedjax_flat.algorithms.wrappers import dp as dp_lib
from fedjax_flat.algorithms.wrappers.server_entry import split, with_server_entry
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.errors import ConfigError
from fedjax_flat.systems import compress as comp

KEY = 'compress'
_KEY_TAG = 0xC0DE     # folds the compression keys out of the clients' keys (independent of their other uses)


def enabled(config) -> bool:
  return comp.enabled(config)


def check(config, population: int = 0) -> None:
  """config.upload across sections, one ConfigError each, before anything is compiled."""
  del population
  if not enabled(config):
    return
  u = config.upload
  if dp_lib.enabled(config):
    raise ConfigError('upload.compress', u.compress, 'with dp.mode on: a compressed delta is no longer within the '
                      "clip the accountant relies on; set upload.compress='none' or dp.mode='off'")


def _is_delta_upload(out) -> bool:
  return (isinstance(out, dict) and set(out) == {'weighted', 'uniform'} and not out['uniform'] and
          isinstance(out['weighted'], dict) and set(out['weighted']) == {'delta'})


def compress_upload(kind, delta, residual, key, fraction, bits):
  """(sent, new residual, relative error) of one client's delta tree (residual: a tree like it with error feedback
  (rand-k then unscaled: systems/compress.py), or None)."""
  v, unravel = ravel_pytree(delta)
  v = v.astype(jnp.float32)
  p = v if residual is None else v + ravel_pytree(residual)[0].astype(jnp.float32)
  c = comp.compress(kind, p, key, fraction=fraction, bits=bits, error_feedback=residual is not None)
  norm = jnp.sqrt(jnp.sum(jnp.square(p)))
  err = jnp.where(norm > 0, jnp.sqrt(jnp.sum(jnp.square(c - p))) / jnp.where(norm > 0, norm, 1.0), 0.0)
  new_residual = None if residual is None else unravel(p - c)
  return unravel(c), new_residual, err


def with_compression(alg: FederatedAlgorithm, config) -> FederatedAlgorithm:
  u = config.upload
  kind, fraction, bits, ef = str(u.compress), u.fraction, u.bits, bool(u.error_feedback)
  if alg.num_phases != 1:
    raise ConfigError('upload.compress', kind, f'{alg.name} exchanges {alg.num_phases} messages a round; '
                      'compression wraps one')
  inner_has_state = alg.client_state_init is not None

  def init(inner, params, rng):
    del inner, params, rng
    # three distinct buffers (the round program donates the state: one buffer twice is refused)
    return {k: jnp.zeros((), jnp.float32) for k in ('err', 'err_sum', 'rounds')}

  def _inner(state):
    return split(state, KEY)[0]

  client_state_init = alg.client_state_init
  initial_client_states = alg.initial_client_states
  def zero_residual(params):
    """Zeros shaped like the algorithm's delta (FedCG's is its network's alone), from its upload traced once
    abstractly (jax.eval_shape: nothing is computed)."""
    def upload(p):
      key = jax.random.PRNGKey(0)
      bcast = alg.broadcast(alg.server_init(p, key), 0)
      cs = alg.client_state_init(p) if inner_has_state else None
      return alg.client_final(bcast, alg.client_init(bcast, cs, key), cs)[0]['weighted']['delta']
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(upload, params))

  if ef:
    def client_state_init(params):
      s = {'ef': zero_residual(params)}
      if inner_has_state:
        s['inner'] = alg.client_state_init(params)
      return s

    if alg.initial_client_states is not None:
      def initial_client_states(params):
        inner = alg.initial_client_states(params)
        k = jax.tree_util.tree_leaves(inner)[0].shape[0]
        rows = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (k,) + x.shape), client_state_init(params))
        return {**rows, 'inner': inner}

  def _inner_cs(cs):
    return cs.get('inner') if ef else cs

  def client_init(bcast, client_state, rng):
    return {'inner': alg.client_init(bcast, _inner_cs(client_state), rng),
            'key': jax.random.fold_in(rng, _KEY_TAG)}

  def client_step(bcast, local, batch, rng):
    inner, metrics = alg.client_step(bcast, local['inner'], batch, rng)
    return {**local, 'inner': inner}, metrics

  def client_final(bcast, local, client_state):
    out, inner_cs = alg.client_final(bcast, local['inner'], _inner_cs(client_state))
    if not _is_delta_upload(out):
      raise ConfigError('upload.compress', kind, f'{alg.name} uploads {jax.tree_util.tree_structure(out)}, not a '
                        'model delta alone: it cannot be compressed')
    delta = out['weighted']['delta']
    residual = None
    if ef:
      residual = client_state['ef']
      if jax.tree_util.tree_structure(residual) != jax.tree_util.tree_structure(delta):
        raise ValueError(f'{alg.name}: the error-feedback residual {jax.tree_util.tree_structure(residual)} is '
                         f'not shaped like its delta {jax.tree_util.tree_structure(delta)}')
    sent, new_residual, err = compress_upload(kind, delta, residual, local['key'], fraction, bits)
    if ef:
      cs = {'ef': new_residual}
      if inner_has_state:
        cs['inner'] = inner_cs
    else:
      cs = inner_cs
    return {'weighted': {'delta': sent}, 'uniform': {'compress_err': err}}, cs

  def server_update(inner, s, agg, round_idx, phase=0):
    err = agg['uniform']['compress_err']
    s = {'err': err, 'err_sum': s['err_sum'] + err, 'rounds': s['rounds'] + 1.0}
    inner_agg = {**agg, 'uniform': {}}
    return alg.server_update(inner, inner_agg, round_idx, phase), s

  personalizer = alg.personalizer
  if personalizer is not None and ef:
    personalizer = personalizer.__class__(personalizer.name, lambda a, st, cs: alg.personalizer.fn(
        a, _inner(st), None if cs is None else cs.get('inner')))
  elif personalizer is not None:
    personalizer = personalizer.__class__(personalizer.name, lambda a, st, cs: alg.personalizer.fn(
        a, _inner(st), cs))
  return with_server_entry(alg, KEY, init=init, server_update=server_update, wrappers=alg.wrappers + (KEY,),
                           client_init=client_init, client_step=client_step, client_final=client_final,
                           client_state_init=client_state_init, initial_client_states=initial_client_states,
                           personalizer=personalizer)


def divergence(config, d: int, population: int = 0) -> str:
  """The likely cause of a divergence with compressed uploads: the compressor's error (d params)."""
  del population
  u = config.upload
  ef = bool(u.error_feedback)
  feedback = f"upload.error_feedback={ef}"
  if u.compress in ('topk', 'randk'):
    k = comp.num_kept(float(u.fraction), d)
    what = f'upload.compress={u.compress!r}, fraction {float(u.fraction):g}: k = {k} of d = {d}, {feedback}'
    if u.compress == 'randk' and not ef:
      # unbiased, E ||C(v) - v||^2 = (d / k - 1) ||v||^2: noise (d / k - 1) times the update's own size
      why = f'each kept value x d / k = {d / k:.3g}, an error of (d / k - 1) = {d / k - 1:.3g} x ||delta||^2'
    else:
      why = 'the residual carries what was not sent' if ef else 'the dropped coordinates are lost'
    fix = 'raise upload.fraction' + ('' if ef else ' or turn upload.error_feedback on')
  else:   # qsgd: per bucket E ||C(v) - v||^2 <= min(n / s^2, sqrt(n) / s) ||v||^2 (Alistarh et al. 2017)
    s_, n = comp.levels(int(u.bits)), min(comp.QSGD_BUCKET, d)
    bound = min(n / s_ ** 2, n ** 0.5 / s_)
    what = f"upload.compress='qsgd', upload.bits={int(u.bits)} ({s_} levels), {feedback}"
    why = f'its variance bound {bound:.3g} x ||delta||^2' + (' (above 1: no contraction, error feedback can grow '
                                                             'the residual)' if ef and bound >= 1 else '')
    fix = 'raise upload.bits' + (' or turn upload.error_feedback off' if ef and bound >= 1 else '')
  return (f'Likely the compressed uploads ({what}; {why}): {fix}, or set upload.compress=\'none\' to confirm; '
          'then lower client.lr / rho.')


# First: the client's upload compressed before any server-side wrapper sees it.
FEATURE = features.register(features.Feature(
    KEY, order=10, switch='upload.compress', enabled=enabled, wrap=lambda alg, config, ctx: with_compression(
        alg, config), upload='delta', check=check, divergence=divergence))
