"""FedGF: federated learning for global flatness (Lee & Yoon, ICML 2024; release code hwan-sig/Official-FedGF,
fedlab/contrib/algorithm/fedgf.py). 2x down, 1x up; two forward+backward passes a local step (SAM's).

  server state: w, the perturbed model w~ (none before the first update), c, the last W divergence indicators
  server sends w, w~ and c                                                    (comm_down = 2)
  client k, w_{k,0} = w, each local step on batch B (rho = client.rho):
        g  = grad f_B(w_k);  w^ = w_k + rho g / (||g|| + eps)            the local SAM ascent point
        p  = c w~ + (1 - c) w^     (round 1, no w~ yet: p = w^)            interpolated with the global one
        w_k <- w_k - lr (grad f_B(p) + wd w_k)                           client chain at the unperturbed w_k
  server: D = (1/|S|) sum_S ||w - w_k||                                  divergence of the round (plain mean)
          window <- the last W values of 1[D > T_D];  c = mean(window)    used from the NEXT round on
          w+ = ServerOpt(w, sum_k (N_k/N)(w - w_k))                        FedAvg (example-weighted, as fedlab)
          w~ = w+ + rho_g (w - w+) / ||w - w+||                           the global SAM ascent along the
                                                                           pseudo-gradient
  The evaluated model is w+ (never w~).

c in [0, 1] moves the clients' ascent point from their own (c = 0: FedSAM) towards the global one (c = 1) when the
clients have drifted apart (D above T_D for most of the last W rounds). Hyperparameters (config.algo): rho_global
(rho_g; 0 = client.rho, the release's `g_rho = rho` when unset), threshold (T_D), window (W; the release's script:
30). The release's script passes no T_D (its `--c_o` values are not a parser argument) and the paper's values are
not in the code: threshold's default 1.0 is this library's, to be tuned per model (log the divergence: the
server state's 'divergence').

client.optimizer must be 'sam' (its rho is the local radius; the ascent is computed here and the rest of the chain
-- correction, clip, weight decay, momentum -- follows the interpolated gradient).

Checked against the release (benchmarks/reference/flat2024_releases.py, torch 2.13 CPU, 3 rounds):
runs fedlab's
StandalonePipeline with the release's FedGfServerHandler and FedGfSerialClientTrainer next to this module: max
relative error 1.3e-7 (client step), 1.3e-7 (round), 2.1e-7 (w~), c = 1, 0.5, 0 the same on both sides. The
suite's test stays the NumPy re-implementation (tests/algorithms/test_fedgf.py, `test_release_rule_matches_numpy`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import global_norm, tmap, without_sharpness
from fedjax_flat.algorithms.fedlesam import weights_only
from fedjax_flat.algorithms.fedspeed import apply_gradient, require_sam
from fedjax_flat.algorithms.hparams import Integer, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init
from fedjax_flat.optimizers.client import client_optimizer

SAM_EPS = 1e-16    # the release's SAM.ascent_step denominator epsilon


@register('fedgf', hparams={'rho_global': Number(0.0, lo=0, note=' (0: client.rho)'),
                            'threshold': Number(1.0, lo=0, note=' (T_D: no published default)'),
                            'window': Integer(30, lo=1)},
          client_optimizers=('sam',))
def fedgf(ctx) -> FederatedAlgorithm:
  require_sam(ctx)
  hp = ctx.hp
  threshold, width = float(hp['threshold']), int(hp['window'])
  rho_g_fixed = float(hp['rho_global'])
  loss_fn, server_tx, hparams_fn = ctx.loss_fn, ctx.server_tx, ctx.hparams_fn
  tx = client_optimizer(without_sharpness(ctx.client_cfg))   # the ascent is ours: the rest of the chain

  server_init = fedavg_server_init(server_tx, extra=lambda params: {
      'w_tilde': tmap(jnp.copy, params), 'has_prev': jnp.bool_(False), 'c': jnp.zeros((), jnp.float32),
      'window': jnp.zeros((width,), jnp.float32), 'count': jnp.zeros((), jnp.int32),
      'divergence': jnp.zeros((), jnp.float32)})
  broadcast = fedavg_broadcast(hparams_fn, shared=('w_tilde', 'has_prev', 'c'))

  def client_init(bcast, cs, rng):
    del cs, rng
    w = bcast['params']
    return local_lib.LocalState(w, tx.init(w), w)

  def client_step(bcast, local, batch, rng):
    grad = lambda p: jax.value_and_grad(lambda q: loss_fn(q, batch, rng), has_aux=True)(p)  # noqa: E731
    (_, aux), g = grad(local.params)
    scale = bcast['hparams']['rho'] / (global_norm(weights_only(g)) + SAM_EPS)
    w_hat = tmap(lambda p, a: p + (scale * a).astype(p.dtype), local.params, weights_only(g))
    c = jnp.where(bcast['has_prev'], bcast['c'], 0.0)
    point = tmap(lambda wt, wh: (c * wt + (1.0 - c) * wh).astype(wh.dtype), bcast['w_tilde'], w_hat)
    g2 = grad(point)[1]
    new, m = apply_gradient(local, g2, tx, bcast['hparams'], None, aux[0], aux[1])
    if len(aux) > 2:   # BatchNorm: the running statistics of the unperturbed forward pass (as local_step)
      new = new._replace(params={**new.params, 'batch_stats': aux[2]})
    return new, m

  def client_final(bcast, local, cs):
    delta = tmap(lambda a, b: a - b, local.init_params, local.params)
    return {'weighted': {'delta': delta}, 'uniform': {'div': global_norm(weights_only(delta))}}, cs

  def server_update(state, agg, round_idx, phase=0):
    del phase
    w = state['params']
    div = agg['uniform']['div']
    slot = state['count'] % width
    window = state['window'].at[slot].set((div > threshold).astype(jnp.float32))
    count = state['count'] + 1
    c = jnp.sum(window) / jnp.minimum(count, width).astype(jnp.float32)
    updates, opt_state = server_tx.update(agg['weighted']['delta'], state['opt_state'], w)
    new_w = optax.apply_updates(w, updates)
    pg = weights_only(tmap(lambda a, b: a - b, w, new_w))
    rho_g = rho_g_fixed if rho_g_fixed > 0 else hparams_fn(round_idx)['rho']
    n = global_norm(pg)   # the release divides by it bare; a zero update (lr 0) leaves w~ = w+ here, not NaN
    s = jnp.where(n > 0, rho_g / jnp.where(n > 0, n, 1.0), 0.0)
    w_tilde = tmap(lambda p, d: p + (s * d).astype(p.dtype), new_w, pg)
    return {**state, 'params': new_w, 'opt_state': opt_state, 'w_tilde': w_tilde, 'has_prev': jnp.bool_(True),
            'c': c, 'window': window, 'count': count, 'divergence': div}

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, comm_down=2.0, extra_passes=0.0)   # SAM's two passes, declared by
                                                                              # client.optimizer='sam'
