"""The trainer of the chain algorithms (FedSeq family: algorithms/fedseq.py): superclients, chains, lanes.

`training/trainers.make_trainer(config, ...)` returns a `ChainTrainer` when config.algorithm is a chain algorithm: the
run trainer (training/loop.py) with the chain plan and the chain driver in place of the client ones; its recorder
is the same, and the chain statistics reach the records and summary.json through the 'fedseq' evaluation plug-in
(training/evals/fedseq.py).

  ChainPlan     builds the superclients (grouping/superclients.build_superclients, or the lists / the function
                given as `superclients=`), plans FedSeq2Par's regroupings for the whole run (the growth schedule is
                known: each new N_S is built once, memoized by the N_S asked for), applies the label-flipping
                attack inside the superclients (data/attacks.py), fixes the lane shape for the run, builds the
                algorithm; `round_chains(r)`: round r's sampled superclients (FedCyclic: its clients), each chain
                ordered; a pure function of (seed, r)
  ChainDriver   lays round r's chains into lanes (core/chains.py; prefetched on a thread), runs the compiled
                chain round (one program for every round), checks divergence, counts messages

Communication per round (thesis Table 5.2, in messages of one model): S2C = C2S = the number of chains run
(1 for FedCyclic), C2C = sum over chains of (E_S K_S - 1) (a ring of E_S passes). In metrics.jsonl:
comm_s2c / comm_c2s / comm_c2c (cumulative messages); comm_down_params counts S2C, comm_up_params counts C2S
and C2C (so comm_bytes is the network total). summary.json's `fedseq` section has the totals, the mean number
of superclients N_S over the rounds (Table 5.4's N_S bar), the mean chains per round (parallelism), the
local steps per round (the fairness protocol: the same number of model updates per round across methods),
the groupings (also in WORKDIR/superclients.json) and the attack report.

Every per-round statistic is a deterministic function of (seed, round, groupings), so after a resume the
totals of the earlier rounds are recomputed instead of being checkpointed. FedAsyncSeq's slots and counters
are part of the server state, hence of every checkpoint.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
from typing import Callable, List, Optional, Sequence, Union

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_flat.algorithms import fedseq as fedseq_lib
from fedjax_flat.core import chains as chains_lib
from fedjax_flat.core import engine as engine_lib
from fedjax_flat.data import sampling
from fedjax_flat.data import attacks
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.grouping import superclients as superclients_lib
from fedjax_flat.training import driver as driver_lib
from fedjax_flat.training import loop
from fedjax_flat.training.plan import RunPlan, declaration
from fedjax_flat.config import validate
from fedjax_flat.core import sharding as sharding_lib

SAMPLE_STREAM = 0x5C5        # chain_rng stream of the superclient sampling (core/chains.chain_rng)

Groups = List[np.ndarray]


def is_chain_config(config) -> bool:
  """Whether the configured algorithm declares a chain layout (core/contract.ChainSpec: the FedSeq family)."""
  declared = declaration(config)
  return declared is not None and declared.chain is not None


@dataclasses.dataclass
class Grouping:
  start_round: int            # first (0-based) round that uses it
  requested: int              # the N_S asked of the grouper (0: its own choice under the constraints)
  groups: Groups              # client ids of each superclient


@dataclasses.dataclass
class ChainBatch:
  round_idx: int
  chains: List[chains_lib.Chain]
  inputs: dict                # the round program's lane arrays (numpy)


def check_groups(groups, num_clients: int) -> Groups:
  """Superclients as int64 arrays; each non-empty, in range, disjoint (a ValueError names the problem)."""
  out, seen = [], np.zeros(num_clients, bool)
  if not len(groups):
    raise ValueError('no superclients')
  for i, g in enumerate(groups):
    g = np.asarray(g, np.int64).reshape(-1)
    if not len(g):
      raise ValueError(f'superclient {i} is empty')
    if g.min() < 0 or g.max() >= num_clients:
      raise ValueError(f'superclient {i} has client ids outside [0, {num_clients})')
    if seen[g].any() or len(np.unique(g)) != len(g):
      raise ValueError(f'superclient {i} repeats a client that is already in a superclient')
    seen[g] = True
    out.append(g)
  return out


class ChainPlan(RunPlan):
  """The run plan of a chain algorithm. `superclients`: None (the grouping toolkit), a list of client-id arrays
  (FedSeq / FedAsyncSeq) or a function num_superclients (None = the grouper's choice) -> list (any chain
  algorithm, FedSeq2Par too). `grouping_context`: (config, data, model) -> GroupingContext with w_0 as the run
  starts (config.init) and the run loader of grouping.probe_checkpoint (training/init.grouping_context; run.py
  passes it); None = a fresh w_0 only."""

  def __init__(self, config, workdir: Optional[str] = None, *, data=None,
               superclients: Union[None, Sequence, Callable] = None, grouping_context: Optional[Callable] = None):
    self._superclients = superclients
    self._grouping_context = grouping_context
    self._ctx = None
    super().__init__(config, workdir, data=data)

  def build_algorithm(self):
    c = self.config
    declared = self.declared      # the static declarations: the chain layout and the hparams
    self.name, self.chain, self.hp = declared.name, declared.chain, dict(declared.hp)
    if c.engine.get('stream_batches', False):
      raise validate.ConfigError('engine.stream_batches', True, 'is not available for chain algorithms')
    self.sizes = np.asarray(self.data.client_sizes(), np.int64)
    self.steps = chains_lib.client_steps(self.sizes, batch_size=c.client.batch_size,
                                         epochs=c.client.local_epochs, local_steps=c.client.local_steps)
    self.passes = int(self.hp['chain_passes'])
    self.groupings = self._plan_groupings()
    if attacks.enabled(c):     # attackers inside the superclients of the first grouping (FedCyclic: clients)
      self.poison_data(None if self.chain.over == 'clients' else self.groupings[0].groups)
    self._write_groupings()
    self.lane_shape, self.one_per_lane = self._lane_shape()
    strategy = engine_lib.resolve_strategy(c.engine.strategy)
    if self.mesh_requested():     # lanes sharded over every device (core/sharding.py): D blocks of lanes
      self.num_lanes, self.lane_chunk = sharding_lib.plan_cohort(strategy, self.lane_shape.lanes,
                                                                 c.engine.clients_per_chunk, jax.device_count())
    else:
      self.lane_chunk = engine_lib.chunk_size(strategy, self.lane_shape.lanes, c.engine.clients_per_chunk)
      self.num_lanes = engine_lib.padded_cohort(strategy, self.lane_shape.lanes, c.engine.clients_per_chunk)
    plan = {'num_slots': self.num_lanes, 'merge_every': self._merge_every()}
    return self.build(population=self.data.num_clients, chain=plan)

  def place_clients(self, shard_clients):
    """Lanes, not a client cohort, are what the devices share: the placement is of the lanes."""
    super().place_clients(shard_clients)
    if self.mesh is not None:
      self.placement = sharding_lib.ClientPlacement(self.mesh, self.num_lanes)

  def mesh_requested(self) -> bool:
    return sharding_lib.resolve_shard_clients(self.config.engine.get('shard_clients', 'auto'))

  def device_rounds_blocker(self):
    return 'chain algorithms lay out each round on the host (training/chain_loop.py)'

  def _merge_every(self) -> int:
    """FedAsyncSeq's R: algo.merge_every, 0 = N_S (the thesis' choice)."""
    r = int(self.hp.get('merge_every', 0) or 0)
    return r or (len(self.groupings[0].groups) if self.groupings else 1)

  def grouping_context(self) -> superclients_lib.GroupingContext:
    """The grouping toolkit's context, built once (FedSeq2Par regroups with it)."""
    if self._ctx is None:
      make = self._grouping_context
      self._ctx = (make(self.config, self.data, self.model) if make is not None
                   else superclients_lib.GroupingContext(self.model, self.data, self.config))
    return self._ctx

  def _group(self, num_superclients: Optional[int]) -> Groups:
    src = self._superclients
    if src is None:                             # the grouping toolkit (config.grouping.*)
      groups = superclients_lib.build_superclients(self.config, self.grouping_context(), self.workdir,
                                                   num_superclients=num_superclients)
    elif callable(src):
      groups = src(num_superclients)
    else:
      if num_superclients is not None and num_superclients != len(src):
        raise ValueError(f'{self.name} asks for {num_superclients} superclients but a fixed list of '
                         f'{len(src)} was given: pass a function num_superclients -> superclients')
      groups = src
    return check_groups(groups, self.data.num_clients)

  def _plan_groupings(self) -> List[Grouping]:
    """FedSeq / FedAsyncSeq: one grouping; FedSeq2Par: every regrouping of the run (Algorithm 6, lines 6-8)."""
    if self.chain.over == 'clients':
      return []
    if not self.chain.regroup:
      return [Grouping(0, 0, self._group(None))]
    hp, K = self.hp, self.data.num_clients
    f = lambda t: fedseq_lib.growth(hp['growth'], hp['growth_alpha'], hp['growth_beta'], t, cap=K)
    memo = {}

    def build(n):
      if n not in memo:
        memo[n] = self._group(n)
      return memo[n]
    plan = [Grouping(0, f(1), build(f(1)))]
    for r in range(1, self.config.rounds):
      want = f(r + 1)
      if want > len(plan[-1].groups):
        groups = build(want)
        if groups is not plan[-1].groups:
          plan.append(Grouping(r, want, groups))
    logging.info('%s: %d groupings over %d rounds (N_S %s)', self.name, len(plan), self.config.rounds,
                 ' -> '.join(str(len(g.groups)) for g in plan[:6]) + (' ...' if len(plan) > 6 else ''))
    return plan

  def _write_groupings(self):
    if not (self.workdir and jax.process_index() == 0):
      return
    os.makedirs(self.workdir, exist_ok=True)
    doc = {'algorithm': self.name,
           'groupings': [{'from_round': g.start_round, 'requested': g.requested,
                          'num_superclients': len(g.groups),
                          'examples': [int(self.sizes[x].sum()) for x in g.groups],
                          'groups': [x.tolist() for x in g.groups]} for g in self.groupings]}
    tmp = os.path.join(self.workdir, 'superclients.json.tmp')
    with open(tmp, 'w') as f:
      json.dump(doc, f)
    os.replace(tmp, os.path.join(self.workdir, 'superclients.json'))

  def _lane_shape(self):
    """(LaneShape, one chain per lane) fixed for the run from every grouping's worst round."""
    hp = self.hp
    frac, E = float(hp['fraction']), self.passes
    want_lanes, want_steps = int(hp['lanes']), int(hp['lane_steps'])
    if self.chain.over == 'clients':
      m = fedseq_lib.num_sampled(frac, self.data.num_clients)
      lanes, need = max(want_lanes, 1), E * int(np.sort(self.steps)[::-1][:m].sum())
      one_per_lane, per_lane = False, 1
    else:
      ms = [fedseq_lib.num_sampled(frac, len(g.groups)) for g in self.groupings]
      auto = 1 if self.chain.auto_lanes == 'one' else max(ms)
      lanes = want_lanes or auto
      if self.chain.slots and lanes < max(ms):
        raise validate.ConfigError('algo.lanes', want_lanes, f'{self.name} runs one chain slot per lane: '
                                   f'needs >= {max(ms)} lanes (C N_S), or 0 (auto)')
      one_per_lane = self.chain.slots
      need, per_lane = 1, 1
      for g, m in zip(self.groupings, ms):
        totals = np.sort([E * int(self.steps[x].sum()) for x in g.groups])[::-1][:m]
        need = max(need, chains_lib.lane_capacity(totals, lanes, one_per_lane=one_per_lane or lanes >= m))
        per_lane = max(per_lane, 1 if (one_per_lane or lanes >= m) else m)
    if want_steps and want_steps < need:
      raise validate.ConfigError('algo.lane_steps', want_steps, f'the longest lane of this run needs {need} '
                                 f'local steps (with {lanes} lanes): use >= {need} or 0 (auto)')
    return chains_lib.LaneShape(lanes, max(want_steps or need, 1), per_lane), one_per_lane

  # Rounds (pure functions of (seed, r)).
  def grouping_at(self, r: int) -> Optional[Grouping]:
    g = None
    for cand in self.groupings:
      if cand.start_round <= r:
        g = cand
    return g

  def round_chains(self, r: int) -> List[chains_lib.Chain]:
    """Round r's chains: sampled superclients (random order = slot order), each in a fresh random order."""
    c, hp = self.config, self.hp
    shuffle = bool(hp['shuffle_chain'])
    if self.chain.over == 'clients':     # one chain of a fraction C of the clients (FedAvg's sample of that size)
      m = fedseq_lib.num_sampled(hp['fraction'], self.data.num_clients)
      ids = sampling.sample_clients(self.data.num_clients, m, seed=c.seed, round_idx=r,
                                    sampler=c.get('sampler', 'auto'))
      members = chains_lib.order_members(ids, seed=c.seed, round_idx=r, superclient=-1, passes=self.passes,
                                         shuffle=shuffle)
      return [chains_lib.Chain(-1, members, float(self.sizes[ids].sum()), slot=0)]
    groups = self.grouping_at(r).groups
    m = fedseq_lib.num_sampled(hp['fraction'], len(groups))
    picks = chains_lib.chain_rng(c.seed, r, SAMPLE_STREAM).permutation(len(groups))[:m]
    return [chains_lib.Chain(int(i), chains_lib.order_members(groups[i], seed=c.seed, round_idx=r,
                                                              superclient=int(i), passes=self.passes,
                                                              shuffle=shuffle),
                             float(self.sizes[groups[i]].sum()), slot=j)
            for j, i in enumerate(picks)]

  def chain_stats(self, r: int, chains=None) -> dict:
    """Round r's counts: chains (S2C = C2S), C2C messages, clients trained, local steps, N_S."""
    chains = self.round_chains(r) if chains is None else chains
    members = [ch.members for ch in chains]
    g = self.grouping_at(r)
    return {'rounds': 1, 'chains': len(chains), 'c2c': sum(mb.size - 1 for mb in members),
            'clients': sum(mb.shape[1] for mb in members),
            'local_steps': sum(int(self.steps[mb].sum()) for mb in members),
            'num_superclients': len(g.groups) if g is not None else 1}

  def summary_section(self, tot: dict, device_gather: bool) -> dict:
    """summary.json's `fedseq` section from the totals of the rounds run (ChainDriver.totals)."""
    n = max(tot['rounds'], 1)
    sec = {'variant': self.name, 'fraction': float(self.hp['fraction']), 'chain_passes': self.passes,
           'lanes': self.lane_shape.lanes, 'lane_steps': self.lane_shape.steps,
           'chains_per_lane': self.lane_shape.chains, 'lane_chunk': self.lane_chunk,
           'device_gather': device_gather,
           'num_superclients_initial': len(self.groupings[0].groups) if self.groupings else 1,
           'num_superclients_final': len(self.groupings[-1].groups) if self.groupings else 1,
           'regroupings': max(len(self.groupings) - 1, 0),
           'mean_num_superclients': tot['num_superclients'] / n,
           'mean_chains_per_round': tot['chains'] / n, 'mean_clients_per_round': tot['clients'] / n,
           'mean_local_steps_per_round': tot['local_steps'] / n,
           'comm_messages': {'s2c': tot['chains'], 'c2s': tot['chains'], 'c2c': tot['c2c'],
                             'total': 2 * tot['chains'] + tot['c2c']},
           'comm_messages_per_round': {'s2c': tot['chains'] / n, 'c2s': tot['chains'] / n,
                                       'c2c': tot['c2c'] / n}}
    if self.chain.slots:
      sec['merge_every'] = self._merge_every()
    return sec


class ChainDriver:
  """The chain round program, one round per call; round r+1's lanes are laid out on a thread while round r runs.
  It keeps the running chain statistics (`totals(n)`: rounds [0, n), recomputed once after a resume, since every
  per-round statistic is a function of (seed, round, groupings))."""

  def __init__(self, plan: ChainPlan):
    self.plan = plan
    c, data = plan.config, plan.data
    self.device_gather = False
    if (isinstance(data, FederatedDataset) and data.store is None
        and c.engine.get('device_data', 'auto') is not False):
      nbytes = data.x.nbytes + data.y.nbytes
      self.device_gather = nbytes <= c.engine.get('device_data_max_mb', 1024) * 2**20
    self.dev_arrays = ({'x': jnp.asarray(data.x), 'y': jnp.asarray(np.asarray(data.y, np.int32))}
                       if self.device_gather else None)
    if plan.placement is not None and self.dev_arrays is not None:
      self.dev_arrays = plan.placement.replicate(jax.device_get(self.dev_arrays))
    self.round_fn = chains_lib.make_chain_round_fn(
        plan.algorithm, chunk=plan.lane_chunk, reset_opt_state=bool(plan.hp['reset_opt_state']),
        per_lane_params=plan.chain.slots, augment_fn=plan.train_transform, mesh=plan.mesh)
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._next = None
    self._totals = None

  def begin(self, r: int):
    self._next = None
    self.totals(r)           # before the first round: counts of the rounds a resumed run already did

  def block_length(self, r: int, boundary: int) -> int:
    del r, boundary
    return 1

  def prepare_round(self, r: int) -> ChainBatch:
    p = self.plan
    chains = p.round_chains(r)
    shape = dataclasses.replace(p.lane_shape, lanes=p.num_lanes)
    lanes = chains_lib.build_lanes(chains, shape, steps=p.steps, sizes=p.sizes, plan=p.batch_plan,
                                   seed=p.config.seed, round_idx=r, one_per_lane=p.one_per_lane)
    if self.device_gather:
      inputs = chains_lib.program_inputs(lanes, index=chains_lib.flat_index(p.data, lanes))
    else:
      inputs = chains_lib.program_inputs(lanes, chains_lib.gather_host(p.data, lanes))
    return ChainBatch(r, chains, inputs)

  def run_round(self, state, r: int, rb: ChainBatch):
    """(new server state, round result) of round r's laid-out chains."""
    p = self.plan
    inputs, key, round_idx = rb.inputs, p.key, jnp.asarray(r, jnp.int32)
    if p.placement is not None:   # every host built the whole layout: each device takes its lanes
      inputs = p.placement.shard_rows(inputs)
      key, round_idx = p.placement.replicate(key), np.int32(r)
    state, m = self.round_fn(state, inputs, self.dev_arrays, key, round_idx)
    m = jax.device_get(m) if p.placement is None else p.placement.to_host(m)
    server_finite = bool(driver_lib.finite(state))
    bad = [ch for ch in rb.chains if ch.lane >= 0 and not m['finite'][ch.lane]]
    if bad or not server_finite:
      members = sorted({int(k) for ch in bad for k in np.unique(ch.members)})
      raise driver_lib.DivergenceError(
          f'divergence (NaN/inf) at round {r + 1}: the chains of superclients '
          f'{[ch.superclient for ch in bad] or "none"} (clients {members or "none"}) produced non-finite loss '
          f'or updates; server state finite={server_finite}. '
          f'{driver_lib.divergence_hint(p.config, p.num_params, p.data.num_clients)}')
    s = p.chain_stats(r, rb.chains)
    tot = self.totals(r)
    for k, v in s.items():
      tot[k] += v
    ids = np.unique(np.concatenate([ch.members.reshape(-1) for ch in rb.chains]))
    count = float(np.sum(m['count']))
    return state, {'train_loss': float(np.sum(m['loss_sum']) / max(count, 1.0)), 'clients': ids,
                   'messages': {'down_params': s['chains'] * p.num_params,                  # S2C
                                'up_params': (s['chains'] + s['c2c']) * p.num_params}}     # C2S + C2C

  def step(self, state, store, r: int, n: int, end: int):
    del store, n
    rb = self._next[1].result() if (self._next is not None and self._next[0] == r) else self.prepare_round(r)
    self._next = (r + 1, self._pool.submit(self.prepare_round, r + 1)) if r + 1 < end else None
    state, res = self.run_round(state, r, rb)
    return state, [res]

  def totals(self, n: int) -> dict:
    """Cumulative chain statistics of rounds [0, n)."""
    if self._totals is None or self._totals['rounds'] != n:
      tot = {'rounds': 0, 'chains': 0, 'c2c': 0, 'clients': 0, 'local_steps': 0, 'num_superclients': 0}
      for r in range(n):
        for k, v in self.plan.chain_stats(r).items():
          tot[k] += v
      self._totals = tot
    return self._totals


class ChainTrainer(loop.Trainer):
  """The run trainer with a ChainPlan and a ChainDriver (arguments: ChainPlan's)."""

  def __init__(self, config, workdir: Optional[str] = None, *, data=None, write_files: bool = True,
               superclients: Union[None, Sequence, Callable] = None, grouping_context: Optional[Callable] = None):
    plan = ChainPlan(config, workdir, data=data, superclients=superclients, grouping_context=grouping_context)
    super().__init__(config, workdir, write_files=write_files, plan=plan, driver=ChainDriver(plan))
