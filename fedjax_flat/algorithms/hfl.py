"""Hierarchical FL (H-FL; FedVPR, thesis 6.3, Table 6.6): clusters of clients as mid-tier servers.

Clients are grouped into G geographic clusters (city: 21, continent: 4). Each cluster g is a mid-tier server
with its own model w_g. One round t:
  sampling        `clients_per_cluster` clients of every cluster (5 in the thesis): `stratified_sample`
  client k in g   local training from w_g (FedAvg's client: the client optimizer, its local steps)
  cluster g       Delta_g = sum_{k in S_g} N_k (w_g - w_k) / sum_{k in S_g} N_k
                  w_g <- ServerOpt_g(w_g, Delta_g)         (each cluster its own server-optimizer state)
                  a cluster with no sampled client keeps w_g
  top server      every T_c rounds ((t + 1) % T_c == 0): w = sum_g s_g w_g / sum_g s_g (s_g: the cluster's
                  examples), sent back to every cluster: w_g <- w
Messages: the bottom tier exchanges 2 per sampled client and round (model down and up), the top tier 2 per
cluster at each synchronisation; both are counted in the server state ('messages_bottom', 'messages_top').
The evaluated model ('global') is the top server's average of the cluster models (= every w_g right after a
synchronisation). With one cluster and T_c = 1 every round is FedAvg's (tests/algorithms/test_hfl.py).

Client identity, as in algorithms/ladd.py: the client state is {'cluster': int32} (`initial_client_states`);
the G cluster models are stacked on a leading axis in the server state and the broadcast, each client takes
its slice inside the compiled round, and uploads its update one-hot over G so that the engine's
example-weighted mean gives every cluster's sum.

Registered as 'hfl' (`experiments/train.py`, need 'client_groups'): the trainer reads every client's cluster
from the dataset's per-client metadata, data.client_groups[algo.group_by] ('city' / 'continent': MSLS and
vpr_synthetic set them), puts it in the client's initial state, and samples algo.clients_per_group clients
of every cluster a round (data/sampling.stratified_ids, the host and the compiled multi-round block alike);
config.clients_per_round must be that total, sum_g min(clients_per_group, |g|). algo.sync_every = T_c.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.algorithms.common import tree_sub
from fedjax_flat.algorithms.hparams import Choice, Integer
from fedjax_flat.algorithms.registry import register
from fedjax_flat.core.contract import FederatedAlgorithm, fedavg_broadcast
from fedjax_flat.data import sampling
from fedjax_flat.errors import ConfigError

tmap = jax.tree_util.tree_map


def initial_client_states(cluster_of) -> dict:
  """The client-state store's contents: every client's cluster, {'cluster': int32 [K]}."""
  return {'cluster': jnp.asarray(np.asarray(cluster_of), jnp.int32)}


def stratified_sample(cluster_of, clients_per_cluster: int, *, seed: int, round_idx: int) -> np.ndarray:
  """`clients_per_cluster` client ids of every cluster (all of a smaller cluster): the trainer's stratified
  sampler (data/sampling.sample_clients_stratified)."""
  return sampling.sample_clients_stratified(cluster_of, clients_per_cluster, seed=seed, round_idx=round_idx)


def hfl(model, loss_fn, client_tx: optax.GradientTransformation, hparams_fn,
        server_tx: optax.GradientTransformation, *, num_clusters: int, cluster_sizes,
        sync_every: int) -> FederatedAlgorithm:
  """H-FL with G = num_clusters mid-tier servers; `cluster_sizes` [G] weights the top server's average;
  `sync_every` = T_c."""
  g = int(num_clusters)
  if g < 1 or int(sync_every) < 1:
    raise ValueError(f'num_clusters={num_clusters} and sync_every={sync_every} must be >= 1')
  sizes = np.asarray(cluster_sizes, np.float64).reshape(-1)
  if sizes.shape != (g,) or not np.all(np.isfinite(sizes)) or np.any(sizes < 0) or sizes.sum() <= 0:
    raise ValueError(f'cluster_sizes={sizes.tolist()} must be {g} finite non-negative numbers, not all 0')
  top_w = jnp.asarray(sizes / sizes.sum(), jnp.float32)
  tc = int(sync_every)
  tx = client_tx

  def top_average(stacked):
    return tmap(lambda x: jnp.tensordot(top_w, x.astype(jnp.float32), axes=1).astype(x.dtype), stacked)

  def server_init(params, rng):
    del rng
    stacked = tmap(lambda x: jnp.broadcast_to(x, (g,) + x.shape), params)
    return {'params': stacked, 'opt_state': jax.vmap(server_tx.init)(stacked),
            'messages_bottom': jnp.zeros((), jnp.float32), 'messages_top': jnp.zeros((), jnp.float32)}

  broadcast = fedavg_broadcast(hparams_fn)

  def client_init(bcast, client_state, rng):
    del rng
    p = tmap(lambda x: x[client_state['cluster']], bcast['params'])
    return local_lib.LocalState(p, tx.init(p), p)

  def client_step(bcast, local, batch, rng):
    return local_lib.local_step(local, batch, rng, loss_fn=loss_fn, tx=tx, hparams=bcast['hparams'])

  def client_final(bcast, local, client_state):
    del bcast
    onehot = jax.nn.one_hot(client_state['cluster'], g, dtype=jnp.float32)
    delta = tree_sub(local.init_params, local.params)
    up = tmap(lambda d: onehot.reshape((g,) + (1,) * d.ndim) * d.astype(jnp.float32), delta)
    return {'weighted': {'delta_sum': up, 'cluster_w': onehot}, 'uniform': {}}, client_state

  def server_update(state, agg, round_idx, phase=0):
    del phase
    w = agg['weighted']['cluster_w']                                    # [G] share of each cluster
    active = w > 0
    delta = tmap(lambda s, p: (s / jnp.maximum(w, 1e-30).reshape((g,) + (1,) * (s.ndim - 1))).astype(p.dtype),
                 agg['weighted']['delta_sum'], state['params'])
    updates, opt_state = jax.vmap(server_tx.update)(delta, state['opt_state'], state['params'])
    new = optax.apply_updates(state['params'], updates)
    keep = lambda n, o: jnp.where(active.reshape((g,) + (1,) * (n.ndim - 1)), n, o)  # noqa: E731
    params = tmap(keep, new, state['params'])
    opt_state = tmap(keep, opt_state, state['opt_state'])
    sync = (jnp.asarray(round_idx) + 1) % tc == 0
    top = top_average(params)
    params = tmap(lambda p, t: jnp.where(sync, jnp.broadcast_to(t, p.shape), p), params, top)
    return {'params': params, 'opt_state': opt_state,
            'messages_bottom': state['messages_bottom'] + 2.0 * agg['num_clients'],
            'messages_top': state['messages_top'] + jnp.where(sync, 2.0 * g, 0.0)}

  def eval_models(state):
    return {'global': (top_average(state['params']), jnp.bool_(True))}

  def counters(state):     # messages at both tiers (summary.json 'messages')
    return {k: state[k] for k in ('messages_bottom', 'messages_top')}

  return FederatedAlgorithm('', server_init, broadcast, client_init, client_step, client_final,
                            server_update, eval_models, client_state_init=lambda params: {'cluster': jnp.int32(0)},
                            counters=counters)


# ------------------------------------------------------------------------------------- registration

GROUP_BY = ('city', 'continent')
HPARAMS = {
    'group_by': Choice('city', allowed=GROUP_BY, note=" (the clusters: data.client_groups[group_by])"),
    'clients_per_group': Integer(5, lo=1, note=' (clients sampled from every cluster a round; the thesis: 5)'),
    'sync_every': Integer(1, lo=1, note=' (T_c: rounds between top-server averages)'),
}


def _groups_of(data, hp):
  groups = getattr(data, 'client_groups', None) or {}
  if hp['group_by'] not in groups:
    raise ConfigError('algo.group_by', hp['group_by'], f'the dataset {data.name!r} has client groups '
                      f'{sorted(groups) or "none"}: pick one of them, or a dataset with per-client cities '
                      '(msls, vpr_synthetic)')
  g = np.asarray(groups[hp['group_by']])
  if g.shape != (data.num_clients,) or not np.issubdtype(g.dtype, np.integer) or g.min() < 0:
    raise ConfigError('algo.group_by', hp['group_by'], f'data.client_groups[{hp["group_by"]!r}] must be '
                      f'{data.num_clients} non-negative int ids, one per client; got {g.dtype} {g.shape}')
  return g


def _check_data(cfg, hp, data):
  g = _groups_of(data, hp)
  total = sampling.stratified_total(g, hp['clients_per_group'])
  if cfg.clients_per_round != total:
    raise ConfigError('clients_per_round', cfg.clients_per_round,
                      f'must be {total}: algo.clients_per_group={hp["clients_per_group"]} from each of the '
                      f'{len(np.unique(g))} {hp["group_by"]} clusters (all of a smaller one)')


def client_groups(data, hp) -> dict:
  """What the trainer hands the builder (ctx.client_groups): {'labels': int [K] in 0..G-1, 'examples':
  [G] examples per cluster (the top server's weights), 'per_group': clients sampled per cluster}."""
  labels = np.unique(_groups_of(data, hp), return_inverse=True)[1].astype(np.int64)
  sizes = np.asarray(data.client_sizes(), np.float64)
  return {'labels': labels, 'examples': np.bincount(labels, weights=sizes), 'per_group': int(hp['clients_per_group'])}


@register('hfl', hparams=HPARAMS, needs=('client_state', 'client_groups'), check_data=_check_data,
          client_groups=client_groups)
def hfl_algorithm(ctx) -> FederatedAlgorithm:
  """H-FL from a config: the trainer's client groups (cities / continents), the client optimizer of
  config.client, the server optimizer of config.server at every mid-tier server."""
  hp = ctx.hp
  groups = ctx.client_groups
  if groups is None:
    raise ConfigError('algorithm', ctx.name, "needs the clients' geographic clusters, which the trainer reads from "
                      "the run's data (training/plan.py); a program shared by several runs is built without them")
  labels = np.asarray(groups['labels'], np.int32)
  alg = hfl(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx, num_clusters=int(labels.max()) + 1,
            cluster_sizes=groups['examples'], sync_every=int(hp['sync_every']))
  return alg.replace(initial_client_states=lambda params: initial_client_states(labels))
