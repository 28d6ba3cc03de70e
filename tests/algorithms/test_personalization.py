"""Personalizers (algorithms/personalization.py) are traceable in the client state: mapped over stacked states in
one program they give every client's model as calling them client by client does, bit for bit, a client whose
state was never written (seen = 0) the global model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry
from fedjax_flat.algorithms.personalization import global_params, if_seen, personal_params
from fedjax_flat.training import trainers
from tests.fixtures.configs import small_config

CASES = {'ditto': {'algorithm': 'ditto'},
         'fedbn': {'algorithm': 'fedbn', 'model': 'resnet20_gn', 'data.input_shape': (8, 8, 3)}}


def test_if_seen_selects_leaf_by_leaf():
  a, b = {'w': jnp.arange(3.0)}, {'w': -jnp.arange(3.0)}
  np.testing.assert_array_equal(if_seen(1.0, a, b)['w'], a['w'])
  np.testing.assert_array_equal(if_seen(jnp.float32(0), a, b)['w'], b['w'])
  got = jax.vmap(lambda s: if_seen(s, a, b))(jnp.array([0.0, 1.0]))
  np.testing.assert_array_equal(got['w'], np.stack([b['w'], a['w']]))


@pytest.mark.parametrize('case', sorted(CASES))
def test_a_personalizer_mapped_over_stacked_states_equals_each_client_alone(case):
  c = small_config(rounds=1, **CASES[case])
  c.algo.update({**registry.default_hparams(c.algorithm), **c.algo.to_dict()})
  t = trainers.make_trainer(c, None, write_files=False)
  alg, state = t.plan.algorithm, t.server_state
  template = t.store.template
  rng = np.random.default_rng(0)
  rows = []
  for seen in (1.0, 0.0, 1.0):         # random states; the second never written
    leaves, tree = jax.tree_util.tree_flatten(template)
    row = jax.tree_util.tree_unflatten(tree, [rng.normal(size=np.shape(a)).astype(np.asarray(a).dtype)
                                              for a in leaves])
    rows.append(_with_seen(row, seen))
  stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *rows)
  got = jax.jit(jax.vmap(lambda cs: personal_params(alg, state, cs)))(stacked)
  glob = global_params(alg, state)
  for k, row in enumerate(rows):
    want = personal_params(alg, state, row)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
      np.testing.assert_array_equal(np.asarray(a)[k], np.asarray(b))
  unseen = jax.tree_util.tree_map(lambda a: np.asarray(a)[1], got)
  for a, b in zip(jax.tree_util.tree_leaves(unseen), jax.tree_util.tree_leaves(glob), strict=True):
    np.testing.assert_array_equal(a, np.asarray(b))          # the global model for a client never written
  first = jax.tree_util.tree_map(lambda a: np.asarray(a)[0], got)
  assert not all(np.array_equal(a, np.asarray(b)) for a, b in zip(
      jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(glob)))     # a written client: its own leaves


def _with_seen(state, seen):
  """The state with every 'seen' flag set (nested ones too: local normalization wraps the inner state)."""
  if isinstance(state, dict):
    return {k: (np.float32(seen) if k == 'seen' else _with_seen(v, seen)) for k, v in state.items()}
  return state
