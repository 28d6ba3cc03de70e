"""FedSeq family (algorithms/fedseq.py, core/chains.py, training/chain_loop.py) against hand-written loops and
formulas on tiny problems: a chain is sequential SGD with a fresh optimizer per member, FedCyclic is SGD over
the concatenated clients, FedAsyncSeq merges by p, the growth functions are the reference code's, padding
and the lane layout change nothing, one compiled program, resume is bit-identical, communication matches
Table 5.2."""
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.fixtures.configs import small_config
from fedjax_flat.algorithms import fedseq as fedseq_lib
from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.core import chains as chains_lib
from fedjax_flat.data import batching
from fedjax_flat.data import sampling
from fedjax_flat.data.sources import builtin
from fedjax_flat.training import checkpoint as ckpt_lib
from fedjax_flat.training import chain_loop, trainers
from fedjax_flat.config.validate import validate_config
from fedjax_flat.errors import ConfigError

SIZES = [5, 9, 13, 4, 8, 11, 6, 7, 10, 3, 12, 9]
GROUPS = [np.array([0, 1, 2]), np.array([3, 4, 5, 6]), np.array([7, 8]), np.array([9, 10, 11])]


@pytest.fixture(scope='module')
def data():
  return builtin.synthetic(len(SIZES), SIZES, seed=0)


def cfg(alg='fedseq', **over):
  c = small_config(algorithm=alg, **over)
  c.client.weight_decay = 1e-3
  return c


def leaves(t):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(t)]


def assert_trees_close(a, b, **kw):
  for x, y in zip(leaves(a), leaves(b)):
    np.testing.assert_allclose(x, y, **{'rtol': 2e-5, 'atol': 2e-6, **kw})


@functools.lru_cache(maxsize=None)
def _sgd_step(model):
  """One jitted SGD(lr, momentum) + weight-decay step on the masked CE loss (compiled once per model)."""
  loss = local_lib.make_loss(model)

  @jax.jit
  def step(params, buf, batch, lr, mu, wd):
    g = jax.grad(lambda p: loss(p, batch)[0])(params)
    g = jax.tree_util.tree_map(lambda gi, p: gi + wd * p, g, params)
    buf = jax.tree_util.tree_map(lambda b, gi: mu * b + gi, buf, g)
    return jax.tree_util.tree_map(lambda p, b: p - lr * b, params, buf), buf
  return step


def hand_chain(trainer, params, order, r, *, reset=True):
  """The chain as a plain loop: each client in `order` runs its FedAvg batches of round r with
  SGD(lr, momentum) + weight decay; a fresh momentum buffer per client when `reset`."""
  c = trainer.config
  step = _sgd_step(trainer.model)
  hp = (c.client.lr, c.client.momentum, c.client.weight_decay)
  buf = jax.tree_util.tree_map(jnp.zeros_like, params)
  for k in order:
    rb = batching.make_round_batches(trainer.data, [int(k)], round_idx=r, seed=c.seed,
                                     batch_size=c.client.batch_size, num_steps=trainer.plan.num_steps,
                                     epochs=c.client.local_epochs, plan=trainer.plan.batch_plan)
    if reset:
      buf = jax.tree_util.tree_map(jnp.zeros_like, params)
    for s in range(trainer.plan.num_steps):
      if rb.mask[0, s].sum() == 0:
        continue
      params, buf = step(params, buf, {'x': rb.x[0, s], 'y': rb.y[0, s], 'mask': rb.mask[0, s]}, *hp)
  return params


@pytest.mark.parametrize('reset', [True, False])
def test_one_superclient_of_three_clients_is_a_sequential_loop(data, reset):
  c = cfg(rounds=2, **{'client.momentum': 0.5, 'algo.fraction': 1.0, 'algo.reset_opt_state': reset})
  t = trainers.make_trainer(c, data=data, superclients=[np.array([4, 0, 7])])
  assert isinstance(t, chain_loop.ChainTrainer)
  w = t.server_state['params']
  for r in range(2):
    order = t.plan.round_chains(r)[0].members[0]
    assert sorted(order.tolist()) == [0, 4, 7]
    w = hand_chain(t, w, order, r, reset=reset)
    t.train(num_rounds=1)
    assert_trees_close(t.server_state['params'], w)
  # The order is re-drawn every round from (seed, round, superclient), reproducibly.
  orders = [tuple(t.plan.round_chains(r)[0].members[0]) for r in range(12)]
  assert len(set(orders)) > 1 and orders == [tuple(t.plan.round_chains(r)[0].members[0]) for r in range(12)]


def test_fedseq_weighted_average_of_chains(data):
  """Two sampled chains: the server's new model is the |D_S|-weighted mean of the two hand-run chains."""
  c = cfg(rounds=1, **{'algo.fraction': 1.0})
  groups = [np.array([0, 1, 2]), np.array([3, 4])]
  t = trainers.make_trainer(c, data=data, superclients=groups)
  w0 = t.server_state['params']
  finals, weights = [], []
  for ch in t.plan.round_chains(0):
    finals.append(hand_chain(t, w0, ch.members[0], 0))
    weights.append(sum(SIZES[k] for k in groups[ch.superclient]))
  t.train()
  expect = jax.tree_util.tree_map(lambda a, b: (weights[0] * a + weights[1] * b) / sum(weights), *finals)
  assert_trees_close(t.server_state['params'], expect)


def test_fedcyclic_is_sgd_over_the_concatenated_clients(data):
  c = cfg('fedcyclic', rounds=2, **{'algo.fraction': 0.5})
  t = trainers.make_trainer(c, data=data)
  w = t.server_state['params']
  for r in range(2):
    (ch,) = t.plan.round_chains(r)
    assert ch.members.shape == (1, 6)          # floor(0.5 * 12) clients, FedAvg's sample of that size
    np.testing.assert_array_equal(np.sort(ch.members[0]),
                                  np.sort(sampling.sample_clients(12, 6, seed=c.seed, round_idx=r)))
    w = hand_chain(t, w, ch.members[0], r)     # momentum 0: one SGD run over the concatenation
    t.train(num_rounds=1)
    assert_trees_close(t.server_state['params'], w, rtol=5e-5, atol=5e-6)


@pytest.mark.parametrize('over', [
    {'client.optimizer': 'sam', 'client.rho': 0.1},                                   # FedSeq + FedSAM
    {'server.momentum': 0.9, 'swa.enabled': True, 'swa.start_fraction': 0.5, 'swa.cycle': 1}])  # FedAvgM + SWA
def test_singleton_superclients_are_fedavg(data, over):
  """FedSeq with one client per superclient and C = 1 is FedAvg over every client (weights N_k), with any
  client optimizer and any server optimizer / wrapper: the chain reuses FedAvg's local step, batches and step
  keys, and the algorithm's server update."""
  over = {**over, 'clients_per_round': 12, 'rounds': 2}
  fa = trainers.make_trainer(cfg('fedavg', **over), data=data)
  fs = trainers.make_trainer(cfg('fedseq', **over, **{'algo.fraction': 1.0}), data=data,
                    superclients=[np.array([k]) for k in range(12)])
  fa.train()
  fs.train()
  assert jax.tree_util.tree_structure(fs.server_state) == jax.tree_util.tree_structure(fa.server_state)
  assert_trees_close(fs.server_state, fa.server_state, rtol=1e-4, atol=1e-5)


def _layout_runs(data, variants):
  runs = {}
  for name, over in variants.items():
    t = trainers.make_trainer(cfg(**{'algo.fraction': 0.75, 'rounds': 2, 'eval_every': 10}, **over), data=data,
                     superclients=GROUPS)
    t.train()
    runs[name] = (t, t.server_state['params'])
  for name, (_, p) in runs.items():
    assert_trees_close(p, runs['auto'][1]), name
  return runs


def test_padding_and_lanes_change_nothing(data):
  """More padded steps per lane and the chains packed into one lane: the same rounds."""
  runs = _layout_runs(data, {'auto': {}, 'padded_one_lane': {'algo.lane_steps': 40, 'algo.lanes': 1}})
  assert runs['auto'][0].plan.lane_shape.lanes == 3 and runs['padded_one_lane'][0].plan.lane_shape == (
      chains_lib.LaneShape(1, 40, 3))


@pytest.mark.slow
def test_lane_strategies_change_nothing(data):
  """vmap over lanes and chunks with an empty padding lane: the same rounds (the default CPU strategy runs
  lanes one at a time; test_padding_and_lanes_change_nothing covers the layout in the default suite)."""
  runs = _layout_runs(data, {'auto': {}, 'vmap': {'engine.strategy': 'vmap'},
                             'chunked': {'engine.strategy': 'chunked', 'engine.clients_per_chunk': 2}})
  assert runs['chunked'][0].plan.num_lanes == 4          # 3 lanes padded to chunks of 2: an empty lane


def test_one_compiled_program_across_rounds_and_regroupings(data):
  """FedSeq2Par regroups (chains change number and length, clients differ in size): one compilation."""
  c = cfg('fedseq2par', rounds=7, **{'algo.fraction': 0.5, 'algo.growth': 'linear', 'algo.growth_alpha': 0.5,
                                      'algo.growth_beta': 2})
  split = lambda n: np.array_split(np.random.default_rng(n).permutation(12), n)
  t = trainers.make_trainer(c, data=data, superclients=split)
  assert [len(g.groups) for g in t.plan.groupings] == [2, 4, 6, 8]
  assert [g.start_round for g in t.plan.groupings] == [0, 2, 4, 6]
  s = t.train()
  assert t.driver.round_fn._cache_size() == 1
  assert s['fedseq']['regroupings'] == 3
  # N_S per round 2 2 4 4 6 6 8; chains max(1, floor(0.5 N_S)).
  assert s['fedseq']['mean_num_superclients'] == pytest.approx((2 + 2 + 4 + 4 + 6 + 6 + 8) / 7)
  assert s['fedseq']['mean_chains_per_round'] == pytest.approx((1 + 1 + 2 + 2 + 3 + 3 + 4) / 7)


def test_growth_functions_match_the_reference_formulas():
  ref = {'linear': lambda a, b, t: b * math.floor(a * (t - 1) + 1),
         'log': lambda a, b, t: b * math.floor(a * math.log(t) + 1),
         'exp': lambda a, b, t: b * math.floor((1 + a) ** (t - 1))}
  for kind, f in ref.items():
    for a, b in ((4.6e-4, 5), (3e-3, 5), (1.8e-2, 10), (2.0, 8)):
      for t in (1, 2, 3, 10, 100, 1000, 9999, 10000):
        if kind == 'exp' and (t - 1) * math.log1p(a) > 700:
          assert fedseq_lib.growth(kind, a, b, t, cap=500) == 500      # the reference overflows here
          continue
        assert fedseq_lib.growth(kind, a, b, t) == f(a, b, t)
  # CIFAR (thesis): 5 (1 + 4.6e-4)^(t-1) reaches 5 * 99 = 495 of K = 500 at t = 10000; capped at K.
  assert fedseq_lib.growth('exp', 4.6e-4, 5, 1) == 5
  assert fedseq_lib.growth('exp', 4.6e-4, 5, 10000) == 495
  assert fedseq_lib.growth('exp', 4.6e-4, 5, 20000, cap=500) == 500
  assert fedseq_lib.growth('linear', 2, 8, 3) == 40
  assert fedseq_lib.num_sampled(0.2, 50) == 10 and fedseq_lib.num_sampled(0.29, 100) == 29
  assert fedseq_lib.num_sampled(0.01, 50) == 1


def test_fedasyncseq_merge_is_the_p_weighted_mean():
  """server_update with per-slot models: between merges the reported model is sum p_i w_i / p; at a merge
  round every slot restarts from it and p resets."""
  import optax
  from fedjax_flat.algorithms.common import client_parts
  from fedjax_flat.algorithms.fedavg import fedavg
  base = fedavg(None, None, *client_parts(small_config().client), optax.sgd(1.0))
  alg = fedseq_lib.fedasyncseq(base, optax.sgd(1.0), num_slots=3, merge_every=2)
  w0 = {'a': jnp.zeros((2,)), 'b': jnp.ones(())}
  s = alg.server_init(w0, None)
  rng = np.random.default_rng(0)
  models = [{'a': jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), 'b': jnp.asarray(rng.normal(size=3), jnp.float32)}
            for _ in range(2)]
  weights = [np.array([10., 20., 0.]), np.array([5., 0., 30.])]      # slot 2 idle in round 0, slot 1 in round 1
  agg = lambda i: {'lanes': {'params': models[i], 'weight': jnp.asarray(weights[i], jnp.float32),
                             'valid': jnp.asarray(weights[i] > 0)}}
  s = alg.server_update(s, agg(0), 0)
  np.testing.assert_allclose(s['p'], [10, 20, 0])
  expect_a = (10 * models[0]['a'][0] + 20 * models[0]['a'][1]) / 30
  np.testing.assert_allclose(s['params']['a'], expect_a, rtol=1e-6)
  np.testing.assert_allclose(s['slots']['a'][2], w0['a'])           # untouched slot keeps its model
  s = alg.server_update(s, agg(1), 1)                                  # round 1: (1 + 1) % 2 == 0 -> merge
  p = np.array([15., 20., 30.])
  slots_a = np.stack([models[1]['a'][0], models[0]['a'][1], models[1]['a'][2]])
  merged_a = (p[:, None] * slots_a).sum(0) / p.sum()
  np.testing.assert_allclose(s['params']['a'], merged_a, rtol=1e-6)
  np.testing.assert_allclose(s['merged']['a'], merged_a, rtol=1e-6)
  np.testing.assert_allclose(s['slots']['a'], np.broadcast_to(merged_a, (3, 2)), rtol=1e-6)
  np.testing.assert_array_equal(s['p'], 0)


def test_fedasyncseq_slots_train_from_their_own_models(data):
  """Each slot continues from its own model (not the global one) until the merge every R = N_S rounds."""
  c = cfg('fedasyncseq', rounds=4, **{'algo.fraction': 0.5})
  t = trainers.make_trainer(c, data=data, superclients=GROUPS)
  assert t.plan.num_lanes == 2 and t.plan._merge_every() == 4
  slots = [t.server_state['params']] * 2
  p = np.zeros(2)
  for r in range(4):
    chains = t.plan.round_chains(r)
    for ch in chains:
      slots[ch.slot] = hand_chain(t, slots[ch.slot], ch.members[0], r)
      p[ch.slot] += ch.weight
    t.train(num_rounds=1)
    expect = jax.tree_util.tree_map(lambda a, b: (p[0] * a + p[1] * b) / p.sum(), *slots)
    assert_trees_close(t.server_state['params'], expect, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(t.server_state['p'], 0)                # merged after round 4 = R


def test_fedasyncseq_resume_is_bit_identical(data, tmp_path):
  """A run stopped at round 3 (slots mid-period) and resumed from its checkpoint by a new trainer ends
  bit-identical to the same trainer going on uninterrupted (2 trainers: each compiles its program)."""
  c = cfg('fedasyncseq', rounds=6, eval_every=6, **{'algo.fraction': 0.5, 'algo.merge_every': 4})
  a = trainers.make_trainer(c, str(tmp_path), data=data, superclients=GROUPS, write_files=False)   # no metrics / plots
  a.recorder.checkpointer = ckpt_lib.Checkpointer(str(tmp_path / 'checkpoints'), keep=2, every=3, asynchronous=False)
  a.train(num_rounds=3)                      # checkpoint at round 3: slots mid-period (merge at 4)
  assert float(np.sum(a.server_state['p'])) > 0
  a.recorder.checkpointer.close()
  a.recorder.checkpointer = None
  b = trainers.make_trainer(c, str(tmp_path), data=data, superclients=GROUPS, write_files=False)
  b.recorder.checkpointer = ckpt = ckpt_lib.Checkpointer(str(tmp_path / 'checkpoints'), keep=2, every=3,
                                                asynchronous=False)
  assert ckpt.restore_latest(b) == 3
  s = b.train()
  ckpt.close()
  a.train()                                  # rounds 4-6 without the interruption
  for x, y in zip(leaves(a.server_state), leaves(b.server_state)):
    np.testing.assert_array_equal(x, y)
  sec = a.plan.summary_section(a.driver.totals(a.round), a.driver.device_gather)
  assert s['fedseq']['comm_messages'] == sec['comm_messages']


def test_communication_split_matches_table_5_2(data):
  c = cfg(rounds=3, **{'algo.fraction': 0.5, 'algo.chain_passes': 2})
  t = trainers.make_trainer(c, data=data, superclients=GROUPS)
  s = t.train()
  s2c = c2c = 0
  for r in range(3):
    chains = t.plan.round_chains(r)
    s2c += len(chains)
    c2c += sum(2 * len(GROUPS[ch.superclient]) - 1 for ch in chains)     # E_S K_S - 1 (a ring of 2 passes)
  msg = s['fedseq']['comm_messages']
  assert msg == {'s2c': s2c, 'c2s': s2c, 'c2c': c2c, 'total': 2 * s2c + c2c}
  p = t.plan.num_params
  assert s['comm_total_params'] == {'down_params': s2c * p, 'up_params': (s2c + c2c) * p}
  assert t.records[-1]['comm_c2c'] == c2c
  # E_S = 2: each member trains again in a re-drawn order; the steps double.
  assert s['fedseq']['mean_local_steps_per_round'] == pytest.approx(
      np.mean([2 * sum(t.plan.steps[g].sum() for g in [GROUPS[ch.superclient] for ch in t.plan.round_chains(r)])
               for r in range(3)]))


def test_lane_packing_and_capacity():
  assert chains_lib.pack_lanes([5, 3, 4], 3).tolist() == [0, 2, 1]
  lanes = chains_lib.pack_lanes([7, 5, 4, 3, 3], 2)
  load = np.bincount(lanes, weights=[7, 5, 4, 3, 3], minlength=2)
  assert load.max() <= chains_lib.lane_capacity([7, 5, 4, 3, 3], 2) and load.max() == 12    # LPT: {7, 3}, {5, 4, 3}
  assert chains_lib.lane_capacity([7, 5], 1) == 12 and chains_lib.lane_capacity([7, 5], 2) == 7
  with pytest.raises(ValueError):
    chains_lib.pack_lanes([1, 2, 3], 2, one_per_lane=True)


def test_layout_flags(data):
  c = cfg(**{'algo.fraction': 1.0, 'algo.lanes': 1})
  t = trainers.make_trainer(c, data=data, superclients=[np.array([0, 3]), np.array([9])])
  rb = t.driver.prepare_round(0)
  x = rb.inputs
  steps = {0: 2, 3: 1, 9: 1}                               # ceil(n / 4): 5 -> 2, 4 -> 1, 3 -> 1
  n = sum(steps.values())
  assert (x['client'][0, n:] == -1).all() and (x['mask'][0, n:] == 0).all()
  assert x['member_start'][0].sum() == 3 and x['num_chains'][0] == 2
  lens, offs = x['chain_len'][0].tolist(), x['chain_offset'][0].tolist()
  assert sorted(lens) == [1, 3] and offs[1] == offs[0] + lens[0]     # back to back in the one lane
  by_len = dict(zip(lens, x['chain_weight'][0].tolist()))
  assert by_len == {3: 9.0, 1: 3.0}                          # |D_S|: clients 0 + 3 (5 + 4), client 9 (3)


def test_per_position_labels_keep_their_shape_in_both_gathers(data):
  """Labels with a shape per example (next_token: one id per position) travel whole through the host gather
  and the device gather's index, masked entries 0."""
  from fedjax_flat.data.federated import FederatedDataset
  y = np.arange(data.x.shape[0] * 3, dtype=np.int32).reshape(-1, 3) % 7 + 1
  seq = FederatedDataset.from_client_indices(data.x, y, [data.client_indices(k) for k in range(len(SIZES))],
                                             data.test_x, np.ones((len(data.test_x), 3), np.int32), 8)
  t = trainers.make_trainer(cfg(**{'algo.fraction': 1.0}), data=seq, superclients=GROUPS)
  p = t.plan
  lanes = chains_lib.build_lanes(p.round_chains(0), p.lane_shape, steps=p.steps, sizes=p.sizes, plan=p.batch_plan,
                                 seed=0, round_idx=0)
  host = chains_lib.gather_host(seq, lanes)['y']
  valid = lanes['mask'] > 0
  assert host.shape == lanes['mask'].shape + (3,) and (host[~valid] == 0).all() and (host[valid] > 0).all()
  np.testing.assert_array_equal(host[valid], y[chains_lib.flat_index(seq, lanes)][valid])


def test_validation_errors():
  bad = [({'algorithm': 'fedseq', 'algo.fraction': float('nan')}, 'algo.fraction'),
         ({'algorithm': 'fedseq', 'algo.fraction': 0.0}, 'algo.fraction'),
         ({'algorithm': 'fedseq', 'algo.chain_passes': 0}, 'algo.chain_passes'),
         ({'algorithm': 'fedseq2par', 'algo.growth': 'cubic'}, 'algo.growth'),
         ({'algorithm': 'fedseq2par', 'algo.growth_alpha': float('inf')}, 'algo.growth_alpha'),
         ({'algorithm': 'fedseq', 'algo.shuffle_chain': 1}, 'algo.shuffle_chain'),
         ({'algorithm': 'fedcyclic', 'server.momentum': 0.9}, 'server.optimizer'),
         ({'algorithm': 'fedseq', 'engine.rounds_per_call': 8}, 'engine.rounds_per_call'),
         ({'attack.kind': 'label_flip', 'attack.classes': '0,1,2'}, 'attack.classes'),
         ({'attack.kind': 'label_flip', 'attack.attackers': float('nan')}, 'attack.attackers'),
         ({'attack.kind': 'label_flip', 'attack.swap': 'all'}, 'attack.swap'),
         ({'attack.kind': 'flip'}, 'attack.kind')]
  for over, field in bad:
    c = small_config(**over)
    with pytest.raises(ConfigError) as e:
      validate_config(c)
    assert e.value.field == field, (over, e.value)


def test_lane_steps_too_small_is_a_config_error(data):
  with pytest.raises(ConfigError, match='algo.lane_steps'):
    trainers.make_trainer(cfg(**{'algo.lane_steps': 3, 'algo.fraction': 1.0}), data=data, superclients=GROUPS)
  with pytest.raises(ConfigError, match='algo.lanes'):
    trainers.make_trainer(cfg('fedasyncseq', **{'algo.lanes': 1, 'algo.fraction': 1.0}), data=data, superclients=GROUPS)


def test_superclients_are_checked(data):
  with pytest.raises(ValueError, match='repeats'):
    trainers.make_trainer(cfg(), data=data, superclients=[np.array([0, 1]), np.array([1, 2])])
  with pytest.raises(ValueError, match='outside'):
    trainers.make_trainer(cfg(), data=data, superclients=[np.array([0, 12])])


def test_groupings_file(data, tmp_path):
  t = trainers.make_trainer(cfg(rounds=1), str(tmp_path), data=data, superclients=GROUPS)
  import json
  doc = json.load(open(os.path.join(tmp_path, 'superclients.json')))
  g = doc['groupings'][0]
  assert g['groups'] == [x.tolist() for x in GROUPS]
  assert g['examples'] == [sum(SIZES[k] for k in x) for x in GROUPS]
  del t


def test_grouping_toolkit_is_called_with_each_new_num_superclients(data, monkeypatch, tmp_path):
  """Without superclients=, the trainer asks grouping/superclients.build_superclients(config, ctx, workdir, N):
  FedSeq with N = None (the constraints decide), FedSeq2Par once per new N of its growth schedule."""
  from fedjax_flat.grouping import superclients
  calls = []

  def build_superclients(config, ctx, workdir, num_superclients=None):
    calls.append((config.algorithm, ctx.data.num_clients, workdir, num_superclients))
    return np.array_split(np.arange(12), num_superclients or 4)
  monkeypatch.setattr(superclients, 'build_superclients', build_superclients)
  trainers.make_trainer(cfg(rounds=3), str(tmp_path), data=data)
  assert calls == [('fedseq', 12, str(tmp_path), None)]
  calls.clear()
  t = trainers.make_trainer(cfg('fedseq2par', rounds=9, **{'algo.growth': 'linear', 'algo.growth_alpha': 0.5,
                                                   'algo.growth_beta': 3}), str(tmp_path), data=data)
  assert [n for *_, n in calls] == [3, 6, 9, 12]                # f = 3 floor(0.5 (t - 1) + 1), capped at K
  assert [g.start_round for g in t.plan.groupings] == [0, 2, 4, 6]
