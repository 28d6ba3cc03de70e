"""FedBN-style local normalization as a wrapper of any algorithm (Li et al. 2021; SiloBN, Andreux et al. 2020).

Normalization params (GroupNorm / LayerNorm / BatchNorm 'scale', 'bias', and BatchNorm running statistics)
stay on the client and are never aggregated; the client's personal model is the inner algorithm's with its
own normalization leaves (its personalizer: algorithms/personalization.py).
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import jax
import jax.numpy as jnp

from fedjax_flat.algorithms.personalization import Personalizer, if_seen, personal_params
from fedjax_flat.models.partition import key_name as _key_name  # one definition (ladd.py imports it here)

tmap = jax.tree_util.tree_map


# stay on the client and are never aggregated.

def is_batch_stats_path(path) -> bool:
  """BatchNorm running statistics: the 'batch_stats' half of a BatchNorm model's params (models/base.py)."""
  return bool(path) and _key_name(path[0]) == 'batch_stats'


def is_norm_path(path) -> bool:
  """Normalization params (scale, bias) and BatchNorm running statistics: FedBN keeps all of them local."""
  if is_batch_stats_path(path):
    return True
  names = [_key_name(k) for k in path]
  if not names or names[-1] not in ('scale', 'bias'):
    return False
  return any(('norm' in n.lower()) or n.lower().startswith(('gn', 'bn', 'ln')) for n in names[:-1])


def norm_flags(params, select=is_norm_path) -> List[bool]:
  """Per-leaf flags (in tree_leaves order): True for the leaves `select(path)` picks (normalization params)."""
  return [select(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def norm_leaves(params, select=is_norm_path) -> list:
  flags = norm_flags(params, select)
  return [x for x, f in zip(jax.tree_util.tree_leaves(params), flags) if f]


def with_norm_leaves(params, leaves, select=is_norm_path):
  flags = norm_flags(params, select)
  flat, treedef = jax.tree_util.tree_flatten(params)
  it = iter(leaves)
  return jax.tree_util.tree_unflatten(treedef, [next(it) if f else x for x, f in zip(flat, flags)])


def zero_norm_leaves(params, select=is_norm_path):
  return with_norm_leaves(params, [jnp.zeros_like(x) for x in norm_leaves(params, select)], select)


def with_local_norm(alg, name: Optional[str] = None, select=is_norm_path):
  """Wraps an algorithm so the normalization params are local (FedBN, Li et al. 2021).

  `select(path)` says which leaves stay local: `is_norm_path` (FedBN: norm scale/bias, and BatchNorm running
  statistics when the model has them), `is_batch_stats_path` (SiloBN, Andreux et al. 2020: statistics
  local, affine params shared; algorithms/silobn.py) or the model's declared head,
  `models/partition.is_head_path(model.head)` (FedRep's local head: algorithms/fedrep.py).

  Client state: {'norm': the client's norm leaves, 'seen': 0/1, 'inner': the inner algorithm's state}.
  client_init starts local training from the global model with the client's own norm params (the global
  ones on its first visit); the norm leaves of every params-shaped upload ('weighted' outputs with the
  params' tree structure, e.g. FedAvg's delta) are zeroed, so the server never aggregates them (they stay at
  their initial values on the server); the client keeps the norm leaves of the model it uploads
  (init - delta when the upload is a 'delta', else its trained params).
  The inner client_step / client_final get the original broadcast and must take the start point from
  local.init_params (FedAvg, FedProx, FedSoup do).
  A model without normalization layers makes this a no-op (no leaves).
  """
  inner_has_state = alg.client_state_init is not None
  # `name`: the algorithm this makes (FedBN, SiloBN, FedRep); without one it is the inner algorithm wrapped
  wrappers = alg.wrappers if name else alg.wrappers + ('localnorm',)
  personal_name = name or f'{alg.label}+localnorm'

  def client_state_init(params):
    s = {'norm': [jnp.zeros_like(x) for x in norm_leaves(params, select)], 'seen': jnp.zeros((), jnp.float32)}
    if inner_has_state:
      s['inner'] = alg.client_state_init(params)
    return s

  initial_client_states = None
  if alg.initial_client_states is not None:   # the inner algorithm's per-client rows, under 'inner'
    def initial_client_states(params):
      inner = alg.initial_client_states(params)
      k = jax.tree_util.tree_leaves(inner)[0].shape[0]
      rows = tmap(lambda x: jnp.broadcast_to(x, (k,) + x.shape), client_state_init(params))
      return {**rows, 'inner': inner}

  def client_init(bcast, cs, rng, **kw):
    p = bcast['params']
    seen = cs['seen'] > 0
    leaves = [jnp.where(seen, a, b) for a, b in zip(cs['norm'], norm_leaves(p, select))]
    b2 = {**bcast, 'params': with_norm_leaves(p, leaves, select)}
    return alg.client_init(b2, cs.get('inner'), rng, **kw)

  def client_step(bcast, local, batch, rng, **kw):
    return alg.client_step(bcast, local, batch, rng, **kw)

  def client_final(bcast, local, cs, **kw):
    out, inner_cs = alg.client_final(bcast, local, cs.get('inner'), **kw)
    ptree = jax.tree_util.tree_structure(local.params)
    uploaded = local.params
    if isinstance(out.get('weighted'), dict) and 'delta' in out['weighted']:
      uploaded = tmap(lambda a, d: a - d, local.init_params, out['weighted']['delta'])

    def strip(t):
      return zero_norm_leaves(t, select) if jax.tree_util.tree_structure(t) == ptree else t
    weighted = out['weighted']
    if isinstance(weighted, dict):
      weighted = {k: strip(v) for k, v in weighted.items()}
    else:
      weighted = strip(weighted)
    new_cs = {'norm': norm_leaves(uploaded, select), 'seen': jnp.ones((), jnp.float32)}
    if inner_has_state:
      new_cs['inner'] = inner_cs
    return {**out, 'weighted': weighted}, new_cs

  inner_personalizer = alg.personalizer

  def personalizer(algorithm, server_state, cs):
    inner_cs = None if cs is None else cs.get('inner')
    base = personal_params(dataclasses.replace(algorithm, personalizer=inner_personalizer), server_state, inner_cs)
    if cs is None:
      return base
    return if_seen(cs['seen'], with_norm_leaves(base, [jnp.asarray(x) for x in cs['norm']], select), base)

  return alg.replace(name=name or alg.name, wrappers=wrappers, personalizer=Personalizer(personal_name, personalizer),
                     client_state_init=client_state_init, initial_client_states=initial_client_states,
                     client_init=client_init, client_step=client_step, client_final=client_final)
