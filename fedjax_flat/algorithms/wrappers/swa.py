"""Server-side SWA (FedSAM paper, thesis Algorithm 4 and Eq. 2.36-2.38): `with_swa(alg, config)`.

Wraps ANY algorithm: it only touches the server state, the broadcast hyperparameters, the server update and
the evaluated models. The clients keep training from the algorithm's own global model.

  T = config.rounds,  s = floor(start_fraction * T),  c = swa.cycle,  rounds i = 0, 1, ... (0-based)

  broadcast of round i >= s (swa.cyclic_lr):     client lr  gamma(i) = (1 - t) lr1 + t lr2,
                                                 t = ((i mod c) + 1) / c     (c = 1: lr1 at every round)
  server_update of round i = s:                  w_swa <- w^s      (copy of the model broadcast in round s)
  server_update of round i > s, (i - s) % c == 0 (after the algorithm's own update, swa.average):
                                                 w_swa <- (n w_swa + w^{i+1}) / (n + 1);  n <- n + 1

Timing (the FedSAM reference code's, which produced the published numbers; digest 1.4): n counts the
averages done so far (not the literal `t / c` of Algorithm 4) and starts at 0, so the FIRST average
overwrites the initial copy: w_swa = w^{s+c+1}, then the mean of w^{s+c+1}, w^{s+2c+1}, ... With s a
multiple of c the averaged models are the ones produced by the rounds whose lr is near lr1 (t = 1/c), one
round after the lr2 round: that off-by-one is the reference code's and is kept on purpose.

Evaluation: eval_models = the algorithm's models + 'swa': (w_swa, active), active from the end of round s
on (the reference code evaluates its SWA model once it exists, i.e. the stale copy w^s until the first
average). Ablations (thesis Table 4.11): swa.average=False keeps only the cyclic lr ("cyclic lr only", no
'swa' model); swa.cyclic_lr=False keeps the clients' lr ("averaging only").

Everything is a jnp.where on the traced round index: one compiled round program for all rounds.
The wrapped server state is the algorithm's state dict plus the key 'swa' = {'params', 'n', 'active'}.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from absl import logging

from fedjax_flat.algorithms import features
from fedjax_flat.algorithms.wrappers.server_entry import with_server_entry
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.optimizers.schedules import SWA_SECTION as SECTION  # noqa: F401  (config.swa, declared with its lr)
from fedjax_flat.optimizers.schedules import swa_cyclic_lr

KEY = 'swa'


def swa_start_round(config) -> int:
  """s = floor(start_fraction * T), the 0-based round from which the SWA lr and model apply."""
  return int(math.floor(config.swa.start_fraction * config.rounds + 1e-9))


def planned_averages(config) -> int:
  """How often w_swa is averaged within T rounds: at rounds s + c, s + 2c, ... <= T - 1 (0 = the SWA model
  stays the copy of w^s: a run too short for its start_fraction and cycle)."""
  return max(0, (config.rounds - 1 - swa_start_round(config)) // int(config.swa.cycle))


def with_swa(alg: FederatedAlgorithm, config) -> FederatedAlgorithm:
  scfg = config.swa
  start = swa_start_round(config)
  cycle = int(scfg.cycle)
  average = bool(scfg.average)
  # lr1 / lr2 stay as given: a batched program (core/runs.py) passes them as traced per-run values.
  lr_fn = swa_cyclic_lr(scfg.lr1, scfg.lr2, cycle) if scfg.cyclic_lr else None
  last_phase = alg.num_phases - 1

  def global_params(inner):
    return alg.eval_models(inner)['global'][0]

  def init(inner, params, rng):
    del params, rng
    if not average:
      return None
    w = global_params(inner)
    return {'params': jax.tree_util.tree_map(jnp.zeros_like, w), 'n': jnp.zeros((), jnp.int32),
            'active': jnp.zeros((), jnp.bool_)}

  def broadcast(inner, swa, round_idx, phase=0):
    del swa
    bcast = alg.broadcast(inner, round_idx, phase)
    if lr_fn is None:
      return bcast
    hp = dict(bcast['hparams'])
    base_lr = jnp.asarray(hp['lr'], jnp.float32)
    hp['lr'] = jnp.where(jnp.asarray(round_idx) >= start, lr_fn(round_idx), base_lr)
    return {**bcast, 'hparams': hp}

  def server_update(inner, swa, agg, round_idx, phase=0):
    if not average:
      return alg.server_update(inner, agg, round_idx, phase), None
    i = jnp.asarray(round_idx, jnp.int32)
    if phase == 0:            # w_swa <- w^s: the model the clients received at the start of round s
      init = i == start
      w_start = global_params(inner)
      swa = {**swa, 'params': jax.tree_util.tree_map(lambda ws, w: jnp.where(init, w, ws), swa['params'], w_start),
             'active': swa['active'] | (i >= start)}
    inner = alg.server_update(inner, agg, round_idx, phase)
    if phase == last_phase:   # end of a cycle (reference timing): running mean with the counter n
      do_avg = (i > start) & (jnp.mod(i - start, cycle) == 0)
      n = swa['n']
      nf = n.astype(jnp.float32)
      w_new = global_params(inner)
      avg = lambda ws, w: jnp.where(do_avg, (ws * nf.astype(ws.dtype) + w) / (nf + 1.0).astype(ws.dtype), ws)
      swa = {**swa, 'params': jax.tree_util.tree_map(avg, swa['params'], w_new), 'n': n + do_avg.astype(jnp.int32)}
    return inner, swa

  def eval_models(inner, swa):
    models = dict(alg.eval_models(inner))
    if average:
      models[KEY] = (swa['params'], swa['active'])
    return models

  return with_server_entry(alg, KEY, init=init, broadcast=broadcast, server_update=server_update,
                           eval_models=eval_models, wrappers=alg.wrappers + (KEY,),
                           reported_models=((KEY,) if average else ()) + alg.reported_models)


def _warn_too_few_rounds(config, population: int = 0) -> None:
  """swa x rounds: a run too short for its first average gets a warning (its SWA model is the last model)."""
  del population
  if config.swa.average and planned_averages(config) == 0:
    s = swa_start_round(config)
    logging.warning('swa: rounds=%d is too few for swa.start_fraction=%g and swa.cycle=%d: the first SWA average '
                    'would come in round %d, so the SWA model is never averaged (it stays the model after round '
                    '%d); lower swa.start_fraction or swa.cycle, or raise rounds', config.rounds,
                    config.swa.start_fraction, config.swa.cycle, s + config.swa.cycle + 1, s)


# After DP: it averages the server's models, whatever made them.
FEATURE = features.register(features.Feature(
    KEY, order=40, switch='swa.enabled', enabled=lambda config: bool(config.swa.enabled),
    wrap=lambda alg, config, ctx: with_swa(alg, config), check=_warn_too_few_rounds))
