"""The round engine against a plain Python loop of per-client optax updates (FedAvg, unequal clients)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.local import make_loss
from fedjax_flat.core import engine
from fedjax_flat.data import batching
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.models.registry import get_model
from fedjax_flat.config.default_config import default_config

SIZES = [5, 13, 8, 21, 3]


def _setup(strategy='vmap', chunk=0, momentum=0.0, wd=1e-3, server_lr=1.0, adam=False):
  cfg = default_config()
  cfg.model = 'mlp'
  cfg.client.lr = 0.01 if adam else 0.1
  cfg.client.base_optimizer = 'adam' if adam else 'sgd'
  cfg.client.momentum = momentum
  cfg.client.weight_decay = wd
  cfg.client.batch_size = 4
  cfg.client.local_epochs = 2
  cfg.server.lr = server_lr
  cfg.engine.strategy = strategy
  cfg.engine.clients_per_chunk = chunk
  data = synthetic(len(SIZES), SIZES, input_shape=(3, 2, 1), num_classes=3, seed=1)
  model = get_model('mlp', 3, (3, 2, 1), hidden=(5,))
  alg = registry.build_algorithm(cfg, model)
  params = model.init(jax.random.key(0), jnp.zeros((1, 3, 2, 1)))
  return cfg, data, model, alg, params


def _engine_rounds(strategy, chunk=0, rounds=3, **kw):
  cfg, data, model, alg, params = _setup(strategy, chunk, **kw)
  ids = np.arange(len(SIZES))
  n_steps = batching.padded_num_steps(data.client_sizes(), 4, epochs=2)
  c = engine.padded_cohort(strategy, len(ids), chunk)
  ch = engine.chunk_size(strategy, c, chunk)
  round_fn = engine.make_round_fn(alg, chunk=ch, donate=False)
  state = alg.server_init(params, jax.random.key(1))
  for r in range(rounds):
    rb = batching.make_round_batches(data, ids, round_idx=r, seed=0, batch_size=4, num_steps=n_steps, epochs=2,
                                     pad_clients_to=c)
    rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(c))
    state, _, m = round_fn(state, rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, r)
  return state['params'], round_fn, data, model, params


def _reference_rounds(rounds=3, momentum=0.0, wd=1e-3, server_lr=1.0, adam=False):
  """FedAvg written as a plain loop: per client, per batch, one optax step on the exact masked mean."""
  cfg, data, model, alg, params = _setup(momentum=momentum, wd=wd, server_lr=server_lr, adam=adam)
  loss = make_loss(model)
  base = optax.adam(0.01) if adam else optax.sgd(0.1, momentum=momentum or None)
  tx = optax.chain(optax.add_decayed_weights(wd), base)
  server = optax.sgd(server_lr)
  sstate = server.init(params)
  n_steps = batching.padded_num_steps(data.client_sizes(), 4, epochs=2)

  # One optax step, jitted: op-by-op dispatch of the grad and update took most of the suite's slowest engine
  # test; the loop around it (which steps, which examples, the masked mean) stays plain Python.
  @jax.jit
  def step(w, ost, batch):
    g = jax.grad(lambda p: loss(p, batch)[0])(w)
    u, ost = tx.update(g, ost, w)
    return optax.apply_updates(w, u), ost

  for r in range(rounds):
    deltas, weights = [], []
    for k in range(len(SIZES)):
      idx = data.client_indices(k)
      plan = batching.batch_plan(data.client_sizes(), batch_size=4, num_steps=n_steps, epochs=2)
      pos, mask = (a[0] for a in batching.host_round_positions(plan, 0, r, [k], [len(idx)]))
      w = params
      ost = tx.init(w)
      for s in range(n_steps):
        if mask[s].sum() == 0:
          continue
        n_valid = int(mask[s].sum())
        sel = idx[pos[s, :n_valid]]
        batch = {'x': data.x[sel], 'y': data.y[sel], 'mask': np.ones(n_valid, np.float32)}
        w, ost = step(w, ost, batch)
      deltas.append(jax.tree_util.tree_map(lambda a, b: a - b, params, w))
      weights.append(len(idx))
    wts = np.array(weights, np.float32) / sum(weights)
    delta = jax.tree_util.tree_map(lambda *d: sum(wi * di for wi, di in zip(wts, d)), *deltas)
    u, sstate = server.update(delta, sstate, params)
    params = optax.apply_updates(params, u)
  return params


@pytest.mark.parametrize('momentum,server_lr,adam', [
    (0.9, 0.5, False), pytest.param(0.0, 1.0, False, marks=pytest.mark.slow),
    pytest.param(0.0, 1.0, True, marks=pytest.mark.slow)])   # adam clients: also tests/optimizers, FedOpt tests
def test_vmap_engine_equals_python_loop(momentum, server_lr, adam):
  got, *_ = _engine_rounds('vmap', momentum=momentum, server_lr=server_lr, adam=adam)
  want = _reference_rounds(momentum=momentum, server_lr=server_lr, adam=adam)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), got, want)


def test_strategies_agree():
  full, *_ = _engine_rounds('vmap')
  for strategy, chunk in [('chunked', 2), ('chunked', 3), ('sequential', 0)]:
    got, *_ = _engine_rounds(strategy, chunk)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), got, full)


def test_padded_steps_and_clients_change_nothing():
  """Extra all-padding steps and padding clients (weight 0) leave the result unchanged."""
  cfg, data, model, alg, params = _setup()
  ids = np.arange(len(SIZES))
  s = batching.padded_num_steps(data.client_sizes(), 4, epochs=2)
  rngs = lambda c: jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(c))
  outs = []
  for extra_steps, pad_to in [(0, 5), (3, 8)]:
    fn = engine.make_round_fn(alg, chunk=pad_to, donate=False)
    rb = batching.make_round_batches(data, ids, round_idx=0, seed=0, batch_size=4, num_steps=s + extra_steps,
                                     epochs=2, pad_clients_to=pad_to)
    st, _, m = fn(alg.server_init(params, None), rb.as_dict(), None, rngs(pad_to), rb.num_examples,
                  rb.client_ids >= 0, 0)
    outs.append(st['params'])
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), *outs)


def test_partial_batch_loss_is_mean_over_valid_examples():
  model = get_model('mlp', 3, (3, 2, 1), hidden=(5,))
  params = model.init(jax.random.key(0), jnp.zeros((1, 3, 2, 1)))
  loss = make_loss(model)
  x = np.random.default_rng(0).normal(size=(4, 3, 2, 1)).astype(np.float32)
  y = np.array([0, 1, 2, 0], np.int32)
  full = loss(params, {'x': x[:2], 'y': y[:2], 'mask': np.ones(2, np.float32)})[0]
  padded = loss(params, {'x': x, 'y': y, 'mask': np.array([1, 1, 0, 0], np.float32)})[0]
  np.testing.assert_allclose(full, padded, rtol=1e-6)


@pytest.mark.parametrize('strategy,chunk', [('sequential', 0), ('chunked', 2)])
def test_padded_steps_are_skipped_one_client_at_a_time(strategy, chunk):
  """Sequential: an all-padding step is not computed (lax.cond); under vmap it is computed and masked. Both
  give the same result as without the extra padding steps (bit-identical for sequential)."""
  cfg, data, model, alg, params = _setup(strategy, chunk)
  calls = []
  step = alg.client_step

  def counted_step(*a, **k):
    jax.debug.callback(lambda: calls.append(1))
    return step(*a, **k)
  alg = alg.replace(client_step=counted_step)
  ids = np.arange(len(SIZES))
  s = batching.padded_num_steps(data.client_sizes(), 4, epochs=2)
  c = engine.padded_cohort(strategy, len(ids), chunk)
  fn = engine.make_round_fn(alg, chunk=engine.chunk_size(strategy, c, chunk), donate=False)
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(c))
  outs, n_calls = [], []
  for extra in (0, 3):
    rb = batching.make_round_batches(data, ids, round_idx=0, seed=0, batch_size=4, num_steps=s + extra, epochs=2,
                                     pad_clients_to=c)
    calls.clear()
    st, _, _ = fn(alg.server_init(params, None), rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, 0)
    jax.block_until_ready(st)
    jax.effects_barrier()
    outs.append(st['params'])
    n_calls.append(len(calls))
  valid_steps = sum(int(np.ceil(n / 4)) * 2 for n in SIZES)   # 2 epochs of ceil(n/B) batches each
  if strategy == 'sequential':
    assert n_calls == [valid_steps, valid_steps]
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), *outs)
  else:   # vmap inside a chunk: every (padded) step of every chunk runs
    assert n_calls[1] > n_calls[0] >= valid_steps
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), *outs)


def test_capped_weighting_is_examples_weighting_with_weights_min_n_and_the_cap():
  """client_weighting='capped' (server.weighting): the engine weighs client k by min(N_k, weight_cap); a cap at or
  above every N_k is example weighting itself; a cap of 0 is refused when the round program is built."""
  cfg, data, model, alg, params = _setup()
  ids = np.arange(len(SIZES))
  s = batching.padded_num_steps(data.client_sizes(), 4, epochs=2)
  rb = batching.make_round_batches(data, ids, round_idx=0, seed=0, batch_size=4, num_steps=s, epochs=2,
                                   pad_clients_to=len(SIZES))
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(2), k))(jnp.arange(len(SIZES)))
  valid = rb.client_ids >= 0

  def run(a, weights):
    fn = engine.make_round_fn(a, chunk=len(SIZES), donate=False)
    return fn(a.server_init(params, None), rb.as_dict(), None, rngs, weights, valid, 0)[0]['params']
  capped = run(alg.replace(client_weighting='capped', weight_cap=8.0), rb.num_examples)
  by_hand = run(alg, np.minimum(rb.num_examples, 8.0))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), capped, by_hand)
  full = run(alg.replace(client_weighting='capped', weight_cap=float(max(SIZES))), rb.num_examples)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), full, run(alg, rb.num_examples))
  differs = jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)), capped, full)
  assert any(jax.tree_util.tree_leaves(differs))
  with pytest.raises(ValueError, match='weight_cap > 0'):
    engine.make_round_fn(alg.replace(client_weighting='capped'), chunk=1)
