"""FedSeq, FedAsyncSeq, FedSeq2Par and FedCyclic (thesis ch. 5.2, Algorithm 6; Zaccone et al. ICPR 2022,
Silvi et al. IEEE Access 2024).

  S <- CREATE_SUPERCLIENTS(...); N_S <- |S|                          grouping (fedjax_flat.grouping)
  for t = 1..T:
    if f_gr(alpha, beta, t) > N_S: S <- CREATE_SUPERCLIENTS(f_gr(t))    FedSeq2Par only
    S^t <- max(1, floor(C N_S)) superclients sampled
    for S_i in S^t in parallel:                                       a chain (core/chains.py)
      shuffle the clients of S_i                                      every round, from (seed, t, i)
      w_{S_i} <- w^t (FedSeq, FedSeq2Par)  |  w[i] (FedAsyncSeq slot i)
      E_S times: each client in turn trains E_k epochs from the model the previous one passed on
      FedAsyncSeq: w[i] <- w_{S_i};  p_i <- p_i + |D_{S_i}|
    FedSeq / FedSeq2Par:  w^{t+1} <- sum_i |D_{S_i}| w_{S_i} / sum_i |D_{S_i}|    (any server optimizer
                          on the pseudo-gradient, like FedAvg: server lr 1 is this mean)
    FedAsyncSeq:          every R rounds (R = N_S by default): w^{t+1} <- sum_i p_i w[i] / sum_i p_i;
                          every slot restarts from it, p <- 0
  FedCyclic [425]: one chain of max(1, floor(C K)) sampled clients per round, no aggregation (the chain's
  final model is the next global model): FedSeq with N_S = 1 over the round's sampled clients.

Server side here, client side in core/chains.py (the chain is FedAvg's local training, so any client
optimizer works inside a chain: FedSeq + SAM is FedSeq with client.optimizer='sam'). The trainer
(training/chain_loop.py) builds the superclients, samples and orders the chains, and runs the rounds.

FedAsyncSeq as in the reference code (`fedseq_inter.py`): C N_S persistent slots; each round slot i trains
the i-th superclient of that round's random sample (so a model returned by one superclient goes on to
another random one); the evaluated model of every round is the p-weighted mean of the slots (the reference
aggregates it every round), and every R rounds the slots restart from that merge. The merge is applied
through the server optimizer on the pseudo-gradient w_merge - sum p_i w[i] / p (SGD lr 1: the mean itself).
Latency is not simulated (the algorithm is round-synchronous, as Algorithm 6 is written).

FedSeq2Par's growth functions (eq. 5.3-5.5), floored as in the reference code (`fedseq_parallel.py`), and
capped at the population K as there:
  linear  beta * floor(alpha (t - 1) + 1)    log  beta * floor(alpha ln t + 1)    exp  beta * floor((1 + alpha)^(t-1))
"""
from __future__ import annotations

import functools
import math
import sys

import jax
import jax.numpy as jnp
import optax

from fedjax_flat.algorithms.fedavg import fedavg
from fedjax_flat.algorithms.hparams import Choice, Flag, Integer, Number
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import ChainSpec, FederatedAlgorithm
from fedjax_flat.errors import ConfigError

GROWTH = ('linear', 'log', 'exp')

# Hyperparameters of every chain algorithm (config.algo.*). C = 0.2: the reference code's experiments
# (K = 500, C = 0.2 for every method); the thesis does not state C.
_FRACTION = {'fraction': Number(0.2, lo=0, lo_open=True, hi=1, finite=True,   # C: fraction of superclients
                                note=': the fraction C of superclients (FedCyclic: of clients) sampled per round')}
_PASSES = {'chain_passes': Integer(1, lo=1),      # E_S: passes over the chain per round (a ring when > 1)
           'lanes': Integer(0, lo=0),             # L: chains run in parallel per program (0 = auto; core/chains.py)
           'lane_steps': Integer(0, lo=0)}        # T: local steps per lane (0 = auto: the longest lane of the run)
_FLAGS = {'shuffle_chain': Flag(True),            # re-draw the chain order every round (reference: shuffle_sp_clients)
          # a fresh client optimizer state per chain member (the reference builds a new optimizer)
          'reset_opt_state': Flag(True)}


def check(cfg, hp, chain: ChainSpec = ChainSpec()) -> None:
  """What a chain cannot do (the chain trainer lays out the chains on the host, one round per call)."""
  del hp
  algo = cfg.algorithm
  if cfg.server.get('weighting', 'examples') != 'examples':
    raise ConfigError('server.weighting', cfg.server.weighting, f'{algo} weights each chain by its data '
                      "(|D_S|, algorithms/fedseq.py): use 'examples'")
  if chain.over == 'clients' and (cfg.server.optimizer != 'sgd' or cfg.server.lr != 1 or cfg.server.momentum):
    raise ConfigError('server.optimizer', cfg.server.optimizer, 'FedCyclic has no server step (the chain\'s '
                      'model is the next global model): use server.optimizer=sgd, lr=1, momentum=0')
  if cfg.engine.get('stream_batches', False):
    raise ConfigError('engine.stream_batches', True, f'{algo} lays out its chains on the host: use False')
  rpc = cfg.engine.get('rounds_per_call', 'auto')
  if rpc != 'auto' and rpc != 1:
    raise ConfigError('engine.rounds_per_call', rpc, f"{algo} runs one round per call: use 'auto' or 1")


def _register(name, chain, extra_counts=None, extra=None):
  """The chain algorithms' declarations: rules in the order they are checked, and the chain layout the chain
  trainer reads (core/contract.ChainSpec)."""
  return register(name, hparams={**_FRACTION, **_PASSES, **(extra_counts or {}), **_FLAGS, **(extra or {})},
                  needs=('chains',), check=functools.partial(check, chain=chain), chain=chain)


def growth(kind: str, alpha: float, beta: float, t: int, cap: int = 0) -> int:
  """f_gr(alpha, beta, t) for round t >= 1, floored as in the reference code; capped at `cap` if > 0."""
  if kind == 'linear':
    v = beta * math.floor(alpha * (t - 1) + 1)
  elif kind == 'log':
    v = beta * math.floor(alpha * math.log(t) + 1)
  elif kind == 'exp':
    if (t - 1) * math.log1p(alpha) > 700:       # past any population: the cap (float overflow otherwise)
      return int(cap) if cap else sys.maxsize
    v = beta * math.floor((1 + alpha) ** (t - 1))
  else:
    raise ValueError(f'growth={kind!r}; allowed: {GROWTH}')
  v = int(v)
  return min(v, int(cap)) if cap else v


def num_sampled(fraction: float, n: int) -> int:
  """max(1, floor(C n)) as the reference's max(int(C n), 1); 1e-9 keeps 0.29 * 100 at 29."""
  return max(1, int(math.floor(float(fraction) * int(n) + 1e-9)))


def _fedavg_of(ctx):
  return fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)


@_register('fedseq', ChainSpec())
def _fedseq(ctx):
  return _fedavg_of(ctx)


@_register('fedseq2par', ChainSpec(regroup=True, auto_lanes='one'), {'growth_beta': Integer(5, lo=1)},
           {'growth': Choice('exp', ('exp', 'linear', 'log')),
            'growth_alpha': Number(4.6e-4, lo=0, bound=True, finite=True)})
def _fedseq2par(ctx):
  return _fedavg_of(ctx)


@_register('fedcyclic', ChainSpec(over='clients'))     # one chain of sampled clients, no server step
def _fedcyclic(ctx):
  return _fedavg_of(ctx)


@_register('fedasyncseq', ChainSpec(slots=True), {'merge_every': Integer(0, lo=0)})
def _fedasyncseq(ctx):
  chain = getattr(ctx, 'chain', None)
  if not chain:
    raise ValueError(f'{ctx.name} needs its chain plan (number of slots, merge period): it is built by the '
                     'chain trainer (training/chain_loop.py), which knows the superclients')
  return fedasyncseq(_fedavg_of(ctx), ctx.server_tx, num_slots=chain['num_slots'],
                     merge_every=chain['merge_every'])


def _weighted_mean(stacked, weights):
  w = weights / jnp.maximum(jnp.sum(weights), 1e-12)
  return jax.tree_util.tree_map(lambda s: jnp.tensordot(w.astype(s.dtype), s, axes=1), stacked)


def fedasyncseq(base: FederatedAlgorithm, server_tx: optax.GradientTransformation, *, num_slots: int,
                merge_every: int) -> FederatedAlgorithm:
  """FedAsyncSeq's server around FedAvg's clients: `num_slots` persistent chain models + data counters p."""
  R = int(merge_every)

  def server_init(params, rng):
    del rng
    slots = jax.tree_util.tree_map(lambda p: jnp.broadcast_to(p, (num_slots,) + p.shape), params)
    return {'params': params, 'merged': params, 'opt_state': server_tx.init(params), 'slots': slots,
            'p': jnp.zeros((num_slots,), jnp.float32)}

  def broadcast(state, round_idx, phase=0):
    return {**base.broadcast(state, round_idx, phase), 'slots': state['slots']}

  def server_update(state, agg, round_idx, phase=0):
    del phase
    lanes = agg['lanes']
    valid = lanes['valid']
    slots = jax.tree_util.tree_map(lambda new, old: jnp.where(
        valid.reshape((-1,) + (1,) * (new.ndim - 1)), new, old), lanes['params'], state['slots'])
    p = state['p'] + jnp.where(valid, lanes['weight'], 0.0)
    mean = _weighted_mean(slots, p)                   # the model the reference evaluates every round
    merge = (round_idx + 1) % R == 0

    def do_merge(_):
      delta = jax.tree_util.tree_map(lambda a, b: a - b, state['merged'], mean)
      updates, opt_state = server_tx.update(delta, state['opt_state'], state['merged'])
      merged = optax.apply_updates(state['merged'], updates)
      fresh = jax.tree_util.tree_map(lambda m: jnp.broadcast_to(m, (num_slots,) + m.shape), merged)
      return {'params': merged, 'merged': merged, 'opt_state': opt_state, 'slots': fresh,
              'p': jnp.zeros_like(p)}

    def keep(_):
      return {'params': mean, 'merged': state['merged'], 'opt_state': state['opt_state'], 'slots': slots,
              'p': p}
    return {**state, **jax.lax.cond(merge, do_merge, keep, None)}

  return base.replace(server_init=server_init, broadcast=broadcast,
                      server_update=server_update)
