"""FedLESAM, FedLESAM-S, FedLESAM-D (Fan et al., ICML 2024: locally estimated global perturbations; release code
MediaBrain-SJTU/FedLESAM). One forward+backward pass a local step (SAM's second pass is replaced by an estimate).

The SAM ascent is not the local gradient but an estimate of the GLOBAL update, known before the round starts:

  dg   = w^t - w_k^old          the global model now minus the one client k last received      (direction='client',
                                 the paper; 0 for a client's first round: no estimate yet)        the default)
  dg   = w^t - w^{t-1}          the server's last global update, the same for every client     (direction='server',
                                 the release: comm_vecs['global_update'], None = 0 in round 1)
  e_k  = -rho dg / (N(dg) + 1e-7)   N = the global L2 norm (norm='global', the paper's ||.||)
                                    N = sum over leaves of each leaf's L2 norm (norm='layers', the release)
  client k, w_{k,0} = w^t, each local step on batch B (rho = client.rho, the round's value):
        g = grad f_B(w_k + e_k)                               ONE backward pass, at the estimated ascent point
        w_k <- w_k - lr (g + correction + wd w_k)            client chain (clip, wd, momentum) at the unperturbed w_k
  FedLESAM:    correction = 0;   server FedAvg: w^{t+1} = ServerOpt(w^t, sum_k (N_k/N)(w^t - w_k))
  FedLESAM-S:  correction = lamb (c - c_k), SCAFFOLD's control variates (option II; scaffold.py), server SCAFFOLD's
  FedLESAM-D:  correction = -g_k + alpha (w_k - w^t), FedDyn's dual (feddyn.py), server FedDyn's

The perturbation is fixed for the whole round (it is computed once in client_init): e_k never costs a pass.
BatchNorm running statistics are never perturbed (they are not weights; dg is zero on them).

Where the release differs (each a switch; the paper's rule the default):
  * direction='server': the release sends every client the server's last update eta_g * mean_S(w_k - w^t) (for
    FedLESAM-D: that plus the dual term, i.e. again w^{t+1} - w^t), instead of each client's own w^t - w_k^old.
  * norm='layers': LESAM.first_step sums `g_update[idx].norm()` over the parameter tensors. As released,
    g_update is the FLAT update vector, so g_update[idx] is its idx-th SCALAR and each tensor is shifted by one
    constant: an indexing slip of the code; 'layers' implements what the loop evidently means (per-tensor norms).
  * FedLESAM-S's release multiplies SCAFFOLD's correction by args.lamb (default 0.1) in the loss
    (cross_entropy + lamb <w, c - c_k>); the paper's SCAFFOLD correction is lamb = 1 (the default here).
  * FedLESAM-D's release is FedDyn with alpha = args.lamb (default 0.1, the default here) written as h_k = sum of
    the client's updates: g_k = -alpha h_k. Its alpha (w_k - w^t) term sits in torch's weight decay, after the clip;
    here it is in the correction, before client.grad_clip (as feddyn.py).
  * the release clips every local gradient at global norm 10 (client.grad_clip=10) and averages the round's
    clients plainly for FedLESAM (server.weighting='uniform'); SCAFFOLD's K is epochs * N_0 / B there, the valid
    steps a client took here.

Checked against the release (benchmarks/reference/flat2024_releases.py, torch 2.13 CPU, 3 rounds):
runs the
release's own FedLESAM / FedLESAM_S / FedLESAM_D Server.train (clients, LESAM* optimizers, clip 10) next to this
module with direction='server', norm='layers': max relative error, client step / round, 3.2e-7 / 3.7e-7 (FedLESAM),
5.1e-7 / 2.6e-7 (-S), 2.5e-7 / 3.2e-7 (-D, no clip acting) when first_step is handed g_update split per tensor;
the literal flat-vector indexing differs by 0.48 (the slip above). The suite's test stays the NumPy float64
re-implementation (tests/algorithms/test_fedlesam.py, `test_one_step_matches_release_rule`; no torch needed).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import population, server_step_to, tmap
from fedjax_flat.algorithms.hparams import Choice, Number, Population
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init

DIRECTIONS = ('client', 'server')
NORMS = ('global', 'layers')
EPS = 1e-7          # the release's denominator epsilon (a zero estimate gives e = 0, never NaN)

_COMMON = {'direction': Choice('client', DIRECTIONS,
                               note=" (client: w^t - the model this client last received, the paper; server: the "
                                    "server's last update, the release)"),
           'norm': Choice('global', NORMS, note=' (global: one L2 norm, the paper; layers: the sum of per-tensor '
                                                'norms, the release)')}


def _is_stats(path) -> bool:
  k = path[0] if path else None
  return k is not None and str(getattr(k, 'key', k)) == 'batch_stats'


def weights_only(tree):
  """The tree with BatchNorm running statistics zeroed: they are not perturbed (no gradient flows into them)."""
  return jax.tree_util.tree_map_with_path(lambda p, x: jnp.zeros_like(x) if _is_stats(p) else x, tree)


def perturbation(dg, rho, norm='global'):
  """e = -rho dg / (N(dg) + EPS): N the global L2 norm ('global') or the sum of per-leaf L2 norms ('layers')."""
  dg = weights_only(dg)
  leaves = [x.astype(jnp.float32) for x in jax.tree_util.tree_leaves(dg)]
  if norm == 'global':
    n = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in leaves))
  elif norm == 'layers':
    n = sum(jnp.sqrt(jnp.sum(jnp.square(x))) for x in leaves)
  else:
    raise ValueError(f'algo.norm={norm!r}; allowed: {NORMS}')
  scale = -rho / (n + EPS)
  return tmap(lambda d: (scale * d).astype(d.dtype), dg)


def shifted_loss(loss_fn, e):
  """loss at w + e: its gradient is the gradient at the ascent point, taken with respect to w."""
  return lambda p, batch, rng=None: loss_fn(tmap(lambda a, d: a + d.astype(a.dtype), p, e), batch, rng)


def lesam_algorithm(ctx, correction: str) -> FederatedAlgorithm:
  """correction: 'none' (FedLESAM), 'scaffold' (FedLESAM-S), 'dyn' (FedLESAM-D)."""
  hp = ctx.hp
  direction, norm = hp['direction'], hp['norm']
  if direction not in DIRECTIONS:
    raise ValueError(f'algo.direction={direction!r}; allowed: {DIRECTIONS}')
  per_client = direction == 'client'
  loss_fn, server_tx, tx, hparams_fn = ctx.loss_fn, ctx.server_tx, ctx.client_tx, ctx.hparams_fn
  lamb = float(hp['lamb']) if correction == 'scaffold' else 0.0
  alpha = float(hp['alpha']) if correction == 'dyn' else 0.0
  n_pop = population(ctx, hp) if correction != 'none' else 0
  zeros = lambda t: tmap(jnp.zeros_like, t)  # noqa: E731

  # FedAvg's server state plus: the last global update w^t - w^{t-1} ('dg', 0 before the first; release: None) when
  # the server's is the direction, SCAFFOLD's control variate 'c' (-S), FedDyn's h (-D); the clients get dg and c.
  own = (() if per_client else ('dg',)) + {'scaffold': ('c',), 'dyn': ('h',)}.get(correction, ())
  server_init = fedavg_server_init(server_tx, extra=lambda params: {k: zeros(params) for k in own})
  broadcast = fedavg_broadcast(hparams_fn, shared=tuple(k for k in own if k != 'h'))

  def client_state_init(params):
    cs = {}
    if per_client:
      cs.update(w_last=zeros(params), seen=jnp.zeros((), jnp.float32))
    if correction == 'scaffold':
      cs['c'] = zeros(params)
    if correction == 'dyn':
      cs['g'] = zeros(params)
    return cs

  def client_init(bcast, cs, rng):
    del rng
    w = bcast['params']
    rho = bcast['hparams']['rho']
    if per_client:   # the paper: this client's own estimate, none before its first round
      dg = tmap(lambda a, b: a - b, w, cs['w_last'])
      e = tmap(lambda x: x * cs['seen'].astype(x.dtype), perturbation(dg, rho, norm))
    else:
      e = perturbation(bcast['dg'], rho, norm)
    extra = {'e': e}
    if correction == 'scaffold':   # lamb (c - c_k), fixed during the round
      extra.update(corr=tmap(lambda c, ck: lamb * (c - ck), bcast['c'], cs['c']), steps=jnp.zeros((), jnp.float32))
    if correction == 'dyn':
      extra['g'] = cs['g']
    return local_lib.LocalState(w, tx.init(w), w, extra)

  def client_step(bcast, local, batch, rng):
    ex = local.extra
    corr = None
    if correction == 'scaffold':
      corr = ex['corr']
    elif correction == 'dyn':      # -g_k + alpha (w_k - w^t), at the unperturbed w_k
      corr = tmap(lambda w, w0, g: -g + alpha * (w - w0), local.params, local.init_params, ex['g'])
    new, m = local_lib.local_step(local, batch, rng, loss_fn=shifted_loss(loss_fn, ex['e']), tx=tx,
                                  hparams=bcast['hparams'], correction=corr)
    if correction == 'scaffold':
      new = new._replace(extra={**ex, 'steps': ex['steps'] + 1.0})
    return new, m

  def client_final(bcast, local, cs):
    x, y = local.init_params, local.params
    new_cs = {}
    if per_client:   # remember the model received this round: next time's estimate starts from it
      new_cs.update(w_last=x, seen=jnp.ones((), jnp.float32))
    if correction == 'none':
      return {'weighted': {'delta': tmap(lambda a, b: a - b, x, y)}, 'uniform': {}}, new_cs
    if correction == 'scaffold':   # option II, K = the valid steps taken
      k_lr = jnp.maximum(local.extra['steps'], 1.0) * bcast['hparams']['lr']
      c_new = tmap(lambda ck, c, a, b: ck - c + (a - b) / k_lr, cs['c'], bcast['c'], x, y)
      out = {'delta': tmap(lambda a, b: a - b, x, y), 'dc': tmap(lambda a, b: a - b, c_new, cs['c'])}
      return {'weighted': {}, 'uniform': out}, {**new_cs, 'c': c_new}
    drift = tmap(lambda a, b: a - b, y, x)                            # FedDyn: theta_k - theta^{t-1}
    g_new = tmap(lambda g, d: g - alpha * d, local.extra['g'], drift)
    return {'weighted': {}, 'uniform': {'drift': drift}}, {**new_cs, 'g': g_new}

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    w = state['params']
    if correction == 'none':
      updates, opt_state = server_tx.update(agg['weighted']['delta'], state['opt_state'], w)
      new = {**state, 'params': optax.apply_updates(w, updates), 'opt_state': opt_state}
    elif correction == 'scaffold':
      new = server_step_to(server_tx, state, tmap(lambda p, d: p - d, w, agg['uniform']['delta']))
      frac = agg['num_clients'] / n_pop
      new['c'] = tmap(lambda c, dc: c + frac * dc, state['c'], agg['uniform']['dc'])
    else:
      drift = agg['uniform']['drift']
      frac = agg['num_clients'] / n_pop
      h = tmap(lambda hh, d: hh - alpha * frac * d, state['h'], drift)
      new = {**server_step_to(server_tx, state, tmap(lambda p, d, hh: p + d - hh / alpha, w, drift, h)), 'h': h}
    if not per_client:   # the release's global_update: what the server moved this round
      new['dg'] = tmap(lambda a, b: a - b, new['params'], w)
    return new

  stateful = per_client or correction != 'none'
  return FederatedAlgorithm(
      ctx.name, server_init, broadcast, client_init, client_step, client_final, server_update,
      client_state_init=client_state_init if stateful else None,
      comm_down=2.0 if correction == 'scaffold' else 1.0, comm_up=2.0 if correction == 'scaffold' else 1.0,
      extra_passes=0.0)   # one pass a step, the SGD client's own: the ascent point costs nothing


@register('fedlesam', hparams=dict(_COMMON), client_optimizers=('sgd',), needs=('client_state',), upload='delta')
def fedlesam(ctx) -> FederatedAlgorithm:
  return lesam_algorithm(ctx, 'none')


@register('fedlesam_s', hparams={**_COMMON, 'lamb': Number(1.0, lo=0, lo_open=True, note=' (the release: 0.1)'),
                                 'population': Population()},
          client_optimizers=('sgd',), needs=('population', 'client_state'))
def fedlesam_s(ctx) -> FederatedAlgorithm:
  return lesam_algorithm(ctx, 'scaffold')


@register('fedlesam_d', hparams={**_COMMON, 'alpha': Number(0.1, lo=0, lo_open=True), 'population': Population()},
          client_optimizers=('sgd',), needs=('population', 'client_state'))
def fedlesam_d(ctx) -> FederatedAlgorithm:
  return lesam_algorithm(ctx, 'dyn')
