"""FedNova (Wang et al., NeurIPS 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization"): normalized averaging, so that clients taking more local steps do not pull the global model
towards their own objective.

  server sends w^t
  client k: tau_k local steps of the client optimizer (SGD with momentum rho = client.momentum; SAM / ASAM
            replace the gradient; optional proximal term mu (w - w^t), as FedProx) -> w_k
            ||a_k||_1: the sum of the weights the local updates give the gradients, in units of the lr:
                M_0 = A_0 = 0;  M_{s+1} = rho M_s + 1 - eta mu A_s;  A_{s+1} = A_s + M_{s+1};  ||a_k||_1 = A_tau_k
              = tau_k                                          (rho = 0, mu = 0: plain SGD)
              = [tau_k - rho (1 - rho^tau_k) / (1 - rho)] / (1 - rho)         (momentum; paper App. C)
              = [1 - (1 - eta mu)^tau_k] / (eta mu)           (proximal; the paper's FedProx vector)
            sends d_k = (w^t - w_k) / ||a_k||_1 and ||a_k||_1
  server:   tau_eff = sum_k p_k ||a_k||_1,  Delta = tau_eff sum_k p_k d_k,  p_k = N_k / N  (example-weighted
            over the round's clients);  w^{t+1} = ServerOpt(w^t, Delta)   (server SGD lr eta_g: w^t - eta_g Delta)

With equal tau_k, rho = 0 and mu = 0 this is FedAvg (Delta = sum_k p_k (w^t - w_k)). tau_k counts the steps that
ran (padding steps of smaller clients never reach the update), so clients of different sizes get their own
tau_k. Weight decay is part of the gradient (as in the authors' optimizer, JYWa/FedNova). With momentum and
mu > 0 together the recursion above is the exact weight sum of the momentum-prox update; the authors' code
adds the two corrections one after the other. The lr must be constant within a round (no
client.lr_schedule='poly_step'), the base optimizer SGD.

algo.tau_eff: 'paper' (default) tau_eff = sum_k p_k ||a_k||_1 as above; 'release' the authors' code (JYWa/FedNova),
which with a proximal term (mu > 0) uses tau_eff = sum_k p_k tau_k, the local step counts, while the d_k stay
normalized by ||a_k||_1 (without a proximal term the two are the same). For reproducing numbers published with
that code.
"""
from __future__ import annotations

import jax.numpy as jnp
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import check_sgd_one_lr, run_value, tmap, tree_sub
from fedjax_flat.algorithms.hparams import Choice, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm


def normalizer(tau, rho: float = 0.0, eta_mu: float = 0.0) -> float:
  """||a||_1 after tau local steps (Python floats; the round program runs the same recursion per step)."""
  m = a = 0.0
  for _ in range(int(tau)):
    m = rho * m + 1.0 - eta_mu * a
    a = a + m
  return a


def check(cfg, hp) -> None:
  """The normalization assumes SGD (with momentum) at a constant lr within the round."""
  del hp
  check_sgd_one_lr(cfg, 'fednova', 'normalizes SGD (momentum) steps')


TAU_EFF = ('paper', 'release')


@register('fednova', hparams={'mu': Number(0.0, lo=0), 'tau_eff': Choice('paper', TAU_EFF)}, check=check)
def fednova(ctx) -> FederatedAlgorithm:
  mu = float(ctx.hp['mu'])
  steps_eff = ctx.hp['tau_eff'] == 'release' and mu > 0      # the release's sum_k p_k tau_k (module docstring)
  loss_fn, server_tx, tx = ctx.loss_fn, ctx.server_tx, ctx.client_tx
  rho = run_value(ctx.client_cfg.momentum or 0.0)     # a batched run's momentum stays its own traced value
  f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731

  # server_init, broadcast: FedAvg's (the contract's defaults)

  def client_init(bcast, cs, rng):
    del cs, rng
    w0 = bcast['params']
    extra = {'m': f32(0.0), 'a': f32(0.0), **({'tau': f32(0.0)} if steps_eff else {})}
    return local_lib.LocalState(w0, tx.init(w0), w0, extra)

  def client_step(bcast, local, batch, rng):
    hp = bcast['hparams']
    prox = tmap(lambda w, w0: mu * (w - w0), local.params, local.init_params) if mu else None
    new, met = local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=hp, correction=prox)
    m = rho * local.extra['m'] + 1.0 - hp['lr'] * mu * local.extra['a']      # the weight recursion
    extra = {'m': m, 'a': local.extra['a'] + m}
    if steps_eff:                # a step that ran (all-padding steps never reach client_step)
      extra['tau'] = local.extra['tau'] + 1.0
    return new._replace(extra=extra), met

  def client_final(bcast, local, cs):
    del bcast
    a = local.extra['a']
    inv = jnp.where(a > 0, 1.0 / jnp.where(a > 0, a, 1.0), 0.0)            # no step taken: d_k = 0
    d = tmap(lambda x: (x * inv).astype(x.dtype), tree_sub(local.init_params, local.params))
    up = {'d': d, 'a': a, **({'tau': local.extra['tau']} if steps_eff else {})}
    return {'weighted': up, 'uniform': {}}, cs

  def server_update(state, agg, round_idx, phase=0):
    del round_idx, phase
    tau_eff = agg['weighted']['tau' if steps_eff else 'a']
    delta = tmap(lambda d: (tau_eff * d).astype(d.dtype), agg['weighted']['d'])
    updates, opt_state = server_tx.update(delta, state['opt_state'], state['params'])
    return {**state, 'params': optax.apply_updates(state['params'], updates), 'opt_state': opt_state}

  return FederatedAlgorithm(ctx.name, client_init=client_init, client_step=client_step, client_final=client_final,
                            server_update=server_update)
