"""FedWMSAM (Huang et al., NeurIPS 2025: weighted momentum and sharpness-aware minimization; release code
Huang-Yongzhi/NeurlPS_FedWMSAM, optimizer/WMSAM.py, client/fedwmsam.py, server/FedWMSAM.py). Stateful clients,
2x communication (w, m_k down; the update and c_k+ - c_k up); ONE forward+backward pass a local step (the ascent
is a momentum prediction, not a gradient).

  server state: w, the momentum M (a gradient estimate, init 0), SCAFFOLD's c (init 0), the weight a (init
                algo.alpha);  client state: c_k (init 0)
  server sends w and the client's personalized momentum m_k = M + (a / (1 - a)) (c - c_k)     (comm_down = 2)
  client k, w_{k,0} = w, target z_0 = w; each local step j on batch B (rho = client.rho):
        d   = z_j - w_k                              toward the momentum-predicted point
        e   = -rho d / (N(d) + 1e-7)                 N: global L2 norm (norm='global') or per-tensor sum ('layers')
        g   = a grad f_B(w_k + e) + (1 - a) m_k       the loss a f + (1 - a) <w, m_k> at w_k + e
        w_k <- w_k - lr (g + wd w_k)                 client chain (clip, wd) at the unperturbed w_k
        z_{j+1} = z_j + m_k
  c_k+ = c_k - c - (w_k - w) / (K_k lr)              SCAFFOLD option II, K_k the valid steps
  server: s = mean_S (cos(w_k - w, M) + 1)   (0 for a client when either vector is 0: the first round)
          a <- 0.99 a + 0.01 clip(s, 0.1, 0.9)       the cosine rule: a grows (towards SAM) as the clients'
                                                     updates agree with the momentum (opposite signs: +1 shifts)
          c <- c + (|S|/N) mean_S (c_k+ - c_k)
          M <- mean_S -(w_k - w) / (K_k lr)          the average per-step gradient of the round
          w <- ServerOpt(w, mean_S(w - w_k))         (plain means, as the release)

Where the release differs: its M is computed with one K for every client (epochs x N_0 / B, client 0's size) and
multiplied by args.lr_decay (0.998, the next round's lr ratio; here the lr schedule is the config's, so the factor is
not applied); its norm is the LESAM indexing slip (fedlesam.py: 'layers' is what it means); its SCAFFOLD K likewise
is the fixed one. algo.alpha = the release's --alpha default 0.1 (the initial a: 'momentum first, SAM later').
The paper's algorithm box was not available here: the rule above is the release's, matching the issue's
description (a momentum-predicted ascent point, a personalized momentum, a cosine-similarity switch).

Checked against the release (benchmarks/reference/flat2024_releases.py, torch 2.13 CPU, 3 rounds):
runs the release's FedWMSAM Server.train (client fedwmsam, WMSAM, clip 10 acting, the cosine rule for a) next to this
module with norm='layers': max relative error 6.1e-7 (client step), 3.2e-7 (round) with the per-tensor reading of
first_step; the literal flat-vector indexing differs by 0.31. Equal client sizes there, so the release's one K is
every client's. The suite's test stays the NumPy re-implementation (tests/algorithms/test_fedwmsam.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import global_norm, population, server_step_to, tmap
from fedjax_flat.algorithms.fedlesam import NORMS, perturbation, weights_only
from fedjax_flat.algorithms.hparams import Choice, Number, Population
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast, fedavg_server_init


def _dot(a, b):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return sum(jnp.sum(x.astype(jnp.float32) * y.astype(jnp.float32)) for x, y in zip(la, lb))


@register('fedwmsam', hparams={'alpha': Number(0.1, lo=0, hi=1, lo_open=True, hi_open=True),
                               'norm': Choice('global', NORMS, note=' (layers: the release)'),
                               'population': Population()},
          client_optimizers=('sgd',), needs=('population', 'client_state'))
def fedwmsam(ctx) -> FederatedAlgorithm:
  hp = ctx.hp
  norm, n_pop = hp['norm'], population(ctx, hp)
  loss_fn, server_tx, tx, hparams_fn = ctx.loss_fn, ctx.server_tx, ctx.client_tx, ctx.hparams_fn
  zeros = lambda t: tmap(jnp.zeros_like, t)  # noqa: E731

  server_init = fedavg_server_init(server_tx, extra=lambda params: {
      'M': zeros(params), 'c': zeros(params), 'a': jnp.asarray(hp['alpha'], jnp.float32)})
  broadcast = fedavg_broadcast(hparams_fn, shared=('M', 'c', 'a'))

  def client_init(bcast, ck, rng):
    del rng
    w, a = bcast['params'], bcast['a']
    m = weights_only(tmap(lambda mm, c, cc: mm + (a / (1.0 - a)) * (c - cc), bcast['M'], bcast['c'], ck))
    return local_lib.LocalState(w, tx.init(w), w, {'m': m, 'z': w, 'steps': jnp.zeros((), jnp.float32)})

  def client_step(bcast, local, batch, rng):
    ex, a = local.extra, bcast['a']
    d = tmap(lambda z, p: z - p, ex['z'], local.params)
    e = perturbation(d, bcast['hparams']['rho'], norm)

    def loss(p, b, r=None):   # a f_B at p + e (the <p, m> term enters as the correction (1 - a) m)
      val, aux = loss_fn(tmap(lambda x, y: x + y.astype(x.dtype), p, e), b, r)
      return a * val, aux

    corr = tmap(lambda m: (1.0 - a) * m, ex['m'])
    new, metrics = local_lib.local_step(local, batch, rng, loss_fn=loss, tx=tx, hparams=bcast['hparams'],
                                        correction=corr)
    z = tmap(lambda zz, m: zz + m, ex['z'], ex['m'])
    return new._replace(extra={**ex, 'z': z, 'steps': ex['steps'] + 1.0}), metrics

  def client_final(bcast, local, ck):
    upd = weights_only(tmap(lambda a, b: a - b, local.params, local.init_params))     # w_k - w
    k_lr = jnp.maximum(local.extra['steps'], 1.0) * bcast['hparams']['lr']
    c_new = tmap(lambda cc, c, u: cc - c - u / k_lr, ck, bcast['c'], upd)
    denom = global_norm(upd) * global_norm(bcast['M'])
    cos = jnp.where(denom > 0, _dot(upd, bcast['M']) / jnp.where(denom > 0, denom, 1.0) + 1.0, 0.0)
    out = {'delta': tmap(lambda a, b: a - b, local.init_params, local.params),
           'dc': tmap(lambda a, b: a - b, c_new, ck), 'grad': tmap(lambda u: -u / k_lr, upd), 'cos': cos}
    return {'weighted': {}, 'uniform': out}, c_new

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    u = agg['uniform']
    new = server_step_to(server_tx, state, tmap(lambda p, d: p - d, state['params'], u['delta']))
    frac = agg['num_clients'] / n_pop
    new['c'] = tmap(lambda c, dc: c + frac * dc, state['c'], u['dc'])
    new['M'] = u['grad']
    new['a'] = 0.99 * state['a'] + 0.01 * jnp.clip(u['cos'], 0.1, 0.9)
    return new

  return FederatedAlgorithm(ctx.name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, client_state_init=zeros, comm_down=2.0, comm_up=2.0,
                            extra_passes=0.0)   # one pass a step, the SGD client's own
