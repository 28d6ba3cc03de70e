"""Robust (cohort-level) aggregation as a server-side wrapper of any algorithm whose upload is a model delta:
`with_aggregator(alg, config)` for config.server.aggregator other than 'mean'.

The wrapped algorithm declares `aggregate='stacked'` (core/contract.py): the engine keeps every client's upload,
stacked [C, ...] in the round's client order with the engine's client weights and the validity mask (padding and
non-reporting clients masked), gathered over devices and hosts (core/engine.reduce_across). The wrapped
server_update reduces the 'weighted' upload (the delta) with the configured aggregator (fedjax_flat/aggregators.py:
median, trimmed_mean, krum, multi_krum, geometric_median, bulyan, centered_clipping, norm_bounding; rebasin, which
merges the client models w^t - delta_k aligned to the global model w^t and hands back w^t - the merge), any 'uniform'
entries (the compression wrapper's error) with the plain mean over the valid clients, and hands the algorithm its
usual {'weighted', 'uniform', 'num_clients', 'total_weight'}, so the algorithm's own server step (server optimizer:
FedAvgM's momentum, FedAdam's moments) runs on the robust aggregate. 'mean' leaves the algorithm as it is: the
streaming mean, bit-identical. Centered clipping starts from the previous round's aggregate (Karimireddy et al.
2021: the server's momentum of the reduced deltas), kept in the server state under 'robust' ({'center'}: zero
before the first round; the shape of one 'weighted' upload, found abstractly from the client functions).

Which algorithms qualify: those that declare upload='delta', the model delta alone (FedAvg and its SAM / ASAM
clients, FedProx, MOON, FedBABU, FedBN, SiloBN, FedCG, a researcher's own); control variates, duals or normalized
directions are not deltas a median of is a step of: refused in one line, as is DP (its accountant bounds the clipped
mean's sensitivity, not a median's). The stacked uploads cost C x the model on every device (`stacked_bytes`); a run
whose stack exceeds engine.stacked_max_mb ('auto': half the free memory of one device) is refused before compiling
(`check_memory`, called by training/plan.py). docs/aggregation.md has the measurements.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from fedjax_flat import aggregators
from fedjax_flat.algorithms import features
from fedjax_flat.algorithms.wrappers import dp as dp_lib
from fedjax_flat.algorithms.wrappers.server_entry import with_server_entry
from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.errors import ConfigError

# The stacked uploads, plus the aggregators' working copies (the sorted copy of median / trimmed mean, Krum's
# flattened [C, P] rows, the all-gather's receive buffer): measured in docs/aggregation.md.
STACK_COPIES = 3


def enabled(config) -> bool:
  return config.server.get('aggregator', 'mean') != 'mean'


def check(config, population: int = 0) -> None:
  """config.server.aggregator across sections, one ConfigError each, before anything is compiled."""
  del population
  if not enabled(config):
    return
  a = config.server.aggregator
  if dp_lib.enabled(config):
    raise ConfigError('server.aggregator', a, "with dp.mode on: the accountant bounds the clipped mean's "
                      "sensitivity, not a robust aggregate's; set server.aggregator='mean' or dp.mode='off'")


def stacked_bytes(cohort: int, param_shapes) -> int:
  """Bytes of one round's stacked uploads: C x the model (the delta has the params' shapes and dtypes)."""
  per_client = sum(int(x.size) * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(param_shapes))
  return int(cohort) * per_client


def available_bytes() -> int:
  """Free memory of one device: the accelerator's allocator limit minus what it holds, else the host's available
  physical memory (CPU)."""
  try:
    stats = jax.local_devices()[0].memory_stats() or {}
  except Exception:   # noqa: BLE001  (a backend without memory statistics)
    stats = {}
  if stats.get('bytes_limit'):
    return int(stats['bytes_limit']) - int(stats.get('bytes_in_use', 0))
  try:
    return int(os.sysconf('SC_AVPHYS_PAGES')) * int(os.sysconf('SC_PAGE_SIZE'))
  except (ValueError, OSError, AttributeError):
    return 0


def budget_bytes(config) -> int:
  """engine.stacked_max_mb in bytes ('auto': half of `available_bytes()`; 0 when unknown: no check)."""
  v = config.engine.get('stacked_max_mb', 'auto')
  if v == 'auto':
    return available_bytes() // 2
  return int(float(v) * 2**20)


def check_memory(config, cohort: int, param_shapes, budget: int = None) -> int:
  """Refuses (one ConfigError) a stacked aggregation whose estimate, STACK_COPIES x C x the model, exceeds the
  budget. Returns the estimate in bytes (0 when the aggregation streams)."""
  if not enabled(config):
    return 0
  need = STACK_COPIES * stacked_bytes(cohort, param_shapes)
  budget = budget_bytes(config) if budget is None else int(budget)
  if budget and need > budget:
    raise ConfigError('server.aggregator', config.server.aggregator,
                      f'stacks the round\'s {cohort} uploads: about {need / 2**20:.0f} MB ({STACK_COPIES} x {cohort} '
                      f'clients x {stacked_bytes(1, param_shapes) / 2**20:.1f} MB model) on every device, over the '
                      f'budget of {budget / 2**20:.0f} MB (engine.stacked_max_mb): lower clients_per_round, use '
                      "server.aggregator='mean' (streaming), or raise engine.stacked_max_mb")
  return need


def _valid_mean(tree, valid):
  coef = valid.astype(jnp.float32)
  return aggregators.mean(tree, coef, valid)


KEY = 'robust'    # the server state's entry of a stateful aggregator (centered clipping's center)


def upload_shape(alg: FederatedAlgorithm, params, state):
  """The ShapeDtypeStruct tree of one client's 'weighted' upload, evaluated abstractly (nothing runs): an
  algorithm's delta may cover part of the params (FedCG: the shared network)."""
  def one(st):
    bcast = alg.broadcast(st, jnp.int32(0), 0)
    cs = alg.client_state_init(params) if alg.client_state_init is not None else None
    local = alg.client_init(bcast, cs, jax.random.PRNGKey(0))
    return alg.client_final(bcast, local, cs)[0]['weighted']
  return jax.eval_shape(one, state)


def _merge_models(reduce, weighted, weights, valid, inner, config):
  """A model merge (rebasin) over the client models w_k = w - delta_k (the deltas are w^t - w_k,
  algorithms/fedavg.py), with the global model w as the reference; returns the delta w - merged."""
  glob = inner.get('params') if isinstance(inner, dict) else None
  delta = weighted.get('delta') if isinstance(weighted, dict) and len(weighted) == 1 else None
  if glob is None or delta is None or (jax.tree_util.tree_structure(delta) != jax.tree_util.tree_structure(glob)):
    raise ConfigError('server.aggregator', config.server.aggregator, "merges whole client models: it needs an "
                      "upload {'delta': the params' shape} and a server state with 'params' (FedAvg, FedProx, SAM "
                      'clients); use another server.aggregator')
  models = jax.tree_util.tree_map(lambda g, d: g[None].astype(d.dtype) - d, glob, delta)
  merged = reduce(models, weights, valid, glob)
  return {'delta': jax.tree_util.tree_map(lambda g, m: (g - m).astype(g.dtype), glob, merged)}


def with_aggregator(alg: FederatedAlgorithm, config) -> FederatedAlgorithm:
  """`alg` with its 'weighted' upload reduced by config.server.aggregator over the round's stacked uploads."""
  if alg.num_phases != 1:
    raise ConfigError('server.aggregator', config.server.aggregator, f'{alg.name} exchanges {alg.num_phases} '
                      'messages a round; a robust aggregator reduces one')
  reduce = aggregators.from_config(config.server)
  stateful = config.server.aggregator in aggregators.STATEFUL
  merges = config.server.aggregator in aggregators.MODEL_MERGES

  def init(inner, params, rng):
    del rng
    if not stateful:
      return None
    shape = upload_shape(alg, params, inner)
    return {'center': jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shape)}

  def server_update(inner, own, agg, round_idx, phase=0):
    uploads, weights, valid = agg['uploads'], agg['weights'], agg['valid']
    if stateful:
      reduced = reduce(uploads['weighted'], weights, valid, own['center'])
    elif merges:
      reduced = _merge_models(reduce, uploads['weighted'], weights, valid, inner, config)
    else:
      reduced = reduce(uploads['weighted'], weights, valid)
    mean_agg = {'weighted': reduced, 'uniform': _valid_mean(uploads['uniform'], valid),
                'num_clients': agg['num_clients'], 'total_weight': agg['total_weight']}
    inner = alg.server_update(inner, mean_agg, round_idx, phase)
    return inner, ({'center': reduced} if stateful else None)

  return with_server_entry(alg, KEY, init=init, server_update=server_update, aggregate='stacked')


# Second: it reduces what the clients sent (compressed or not), before DP or the server averages see the result.
FEATURE = features.register(features.Feature(
    'robust', order=20, switch='server.aggregator', enabled=enabled,
    wrap=lambda alg, config, ctx: with_aggregator(alg, config), upload='delta', check=check))
