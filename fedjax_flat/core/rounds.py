"""Many rounds in one compiled program (`engine.rounds_per_call`), with sampling and batching on the device.

Everything a round needs that is a function of (seed, round) runs inside the program: client sampling
(data/sampling.sample_ids), the batch positions and the gather from the training arrays kept on the device
(data/batching.gather_round_device), the clients' keys (sampling.client_keys), the client states of a
device store (core/client_state._gather_dev/_scatter_dev, carried through the rounds). Each call is

  block(server_state, store, data, key, start_round, num_rounds) ->
      (server_state', store', per-round metrics [R, ...])

a `lax.scan` over a static R rounds; a round i runs only if i < num_rounds (traced: a shortened block, e.g.
up to the next evaluation or checkpoint round, reuses the same program: one compilation per run) and no
earlier round of the block diverged (so the state returned is that of the divergent round, as with R=1).
The host checks divergence, records per-round train metrics, evaluates and checkpoints at block ends
(training/loop.py picks block ends at every evaluation / checkpoint round and the last round).

Why the round body is the same computation as the one-round program: it is `engine.make_round_fn(jit=False)`
called with the same inputs, which the one-round host path builds with the same definitions
(tests/core/test_rounds.py checks bit equality for R=1 vs R>1 and for device vs host batches).
"""
from __future__ import annotations


import jax
import jax.numpy as jnp

from fedjax_flat.data import sampling
from fedjax_flat.core.client_state import _gather_dev, _scatter_dev
from fedjax_flat.data import batching


def _finite_tree(tree):
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def make_block_fn(round_fn, *, plan: batching.BatchPlan, num_clients: int, clients_per_round: int,
                  cohort: int, rounds_per_call: int, has_store: bool, donate: bool = True, mesh=None,
                  jit: bool = True, sample_fn=None, population_size=None):
  """Jitted block(server_state, store_arrays, store_template, data, key, start_round, num_rounds, limits=None).

  limits: the virtual clock's {'fit': int32 [rounds_per_call, cohort] local steps that fit, 'reports': bool
  [rounds_per_call, cohort]} (systems/clock.py, computed on the host), or None (no clock: the program is unchanged).

  sample_fn(key, r) -> int32 [clients_per_round] client ids (traceable); None: the uniform sampler
  (data/sampling.sample_ids). H-FL's stratified sampler (data/sampling.stratified_ids) comes this way.

  jit=False: the plain function (core/runs.py vmaps it over a leading runs axis).

  population_size: the padded population of a batched program whose runs have different populations (static);
  num_clients may then be a run's traced value and the uniform sampler draws from the run's own clients only.

  round_fn: the un-jitted round of engine.make_round_fn (with mesh=: its client block sharded over the mesh,
  core/sharding.make_sharded_block). store_arrays/template: the device store's
  [K, ...] arrays and its template (None without per-client state). Returns (server_state, store_arrays,
  metrics) with metrics leaves [R, cohort] ('ids', 'loss_sum', 'count', 'finite') and [R] ('ran',
  'server_finite').
  """

  def one_round(server_state, store, template, data, key, r, limit):
    if sample_fn is None:
      ids = sampling.sample_ids(key, r, num_clients, clients_per_round, size=population_size)
    else:
      ids = sample_fn(key, r)
    ids = jnp.concatenate([ids, jnp.full((cohort - clients_per_round,), -1, jnp.int32)])
    batches, weights = batching.gather_round_device(plan, data, key, r, ids)
    valid, written = ids >= 0, ids
    if limit is not None:        # the virtual clock: steps past those that fit masked, non-reporters weigh 0
      batches = {**batches, 'mask': batching.step_limit(batches['mask'], limit['fit'])}
      valid = valid & limit['reports']
      weights = jnp.where(valid, weights, 0.0)
      written = jnp.where(valid, ids, -1)       # a client that does not report keeps its state
    states = _gather_dev(store, template, ids) if has_store else None
    rngs = sampling.client_keys(key, r, ids)
    server_state, new_states, m = round_fn(server_state, batches, states, rngs, weights, valid, r)
    if has_store:
      store = _scatter_dev(store, written, new_states)
    metrics = {'ids': ids, 'loss_sum': m['loss_sum'], 'count': m['count'], 'finite': m['finite'],
               'server_finite': _finite_tree(server_state), 'ran': jnp.array(True)}
    return server_state, store, metrics

  def block(server_state, store, template, data, key, start_round, num_rounds, limits=None):
    def body(carry, i):
      server_state, store, ok = carry
      r = start_round + i
      limit = None if limits is None else jax.tree_util.tree_map(lambda a: a[i], limits)

      def run(args):
        s, st = args
        s, st, m = one_round(s, st, template, data, key, r, limit)
        return (s, st), m

      def skip(args):
        shapes = jax.eval_shape(run, args)[1]
        return args, jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)

      def maybe_run(args):
        return jax.lax.cond(ok, run, skip, args)

      # Two conds, not one on `ok & (i < num_rounds)`: under a vmap over runs (core/runs.py) `ok` is per
      # run and its cond becomes a select, while `i < num_rounds` stays shared, so the rounds past a
      # shortened block are still skipped, not computed and discarded.
      (server_state, store), m = jax.lax.cond(i < num_rounds, maybe_run, skip, (server_state, store))
      # A divergent round (non-finite client or server) stops the block: later rounds are skipped.
      ok = ok & (~m['ran'] | (m['server_finite'] & jnp.all(m['finite'])))
      return (server_state, store, ok), m

    (server_state, store, _), metrics = jax.lax.scan(
        body, (server_state, store, jnp.array(True)), jnp.arange(rounds_per_call, dtype=jnp.int32))
    return server_state, store, metrics

  if not jit:
    return block
  donate_argnums = (0, 1) if donate else ()
  if mesh is None:
    return jax.jit(block, donate_argnums=donate_argnums)
  # Clients sharded over the mesh (round_fn's client block is core/sharding.make_sharded_block): everything
  # in and out is replicated, so every block call reuses one compiled program.
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.jit(block, in_shardings=rep, out_shardings=rep, donate_argnums=donate_argnums)
