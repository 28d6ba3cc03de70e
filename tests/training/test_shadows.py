"""LiRA's federated shadows (training/shadows.py): each shadow's data are its half of the candidates at their
home clients; the shadows trained as lanes of one runs program equal each trained alone; LiRA on them is the
Gaussian log ratio of their confidences."""
import jax
import numpy as np
import pytest

from fedjax_flat.analysis import membership as mi
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.errors import BadInputError
from fedjax_flat.models.registry import get_model
from fedjax_flat.training import shadows

from tests.fixtures.configs import small_config

K = 6
jax_map = jax.tree_util.tree_map


def jax_leaves(tree):
  return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def _data():
  return synthetic(K, [6, 4, 8, 5, 3, 7], input_shape=(3, 3, 1), num_classes=4, test_size=40, seed=1)


def _candidates(data, n=12, seed=0):
  rng = np.random.default_rng(seed)
  mi_idx, mo_idx = np.sort(rng.choice(len(data.y), n, replace=False)), np.sort(rng.choice(len(data.test_y), n,
                                                                                     replace=False))
  x = np.concatenate([data.x[mi_idx], data.test_x[mo_idx]])
  y = np.concatenate([data.y[mi_idx], data.test_y[mo_idx]]).astype(np.int32)
  return mi_idx, x, y, np.arange(2 * n) < n


def _config():
  c = small_config(**{'rounds': 3, 'clients_per_round': 3, 'data.num_clients': K, 'engine.strategy': 'sequential'})
  c.progress_every_s = 1e9
  return c


def test_each_shadow_holds_its_half_at_the_home_clients():
  data = _data()
  mi_idx, x, y, member = _candidates(data)
  home = shadows.home_clients(data, mi_idx, int((~member).sum()), seed=3)
  owner = shadows.example_clients(data)
  np.testing.assert_array_equal(home[member], owner[mi_idx])            # a member stays at its client
  assert home.min() >= 0 and home.max() < K
  np.testing.assert_array_equal(home, shadows.home_clients(data, mi_idx, int((~member).sum()), seed=3))
  masks = mi.shadow_masks(2, len(y), seed=0)
  for m, d in zip(masks, shadows.shadow_datasets(data, x, y, home, masks)):
    assert d.num_clients == K and d.x is x
    got = np.sort(np.concatenate([d.client_indices(k) for k in range(K)]))
    np.testing.assert_array_equal(got, np.flatnonzero(m))              # exactly its half, each example once
    for k in range(K):
      assert np.all(home[d.client_indices(k)] == k)
    np.testing.assert_array_equal(d.test_y, data.test_y)


def test_a_dataset_without_examples_in_memory_is_refused_in_one_line():
  with pytest.raises(BadInputError, match='in-memory dataset') as e:
    shadows.shadow_datasets(object(), np.zeros((2, 1)), np.zeros(2), np.zeros(2, int), np.ones((2, 2), bool))
  assert '\n' not in str(e.value)


@pytest.mark.slow    # the shadows batched and alone: ~15 s of CPU, ~35 s on 2 shared cores
def test_shadow_lanes_equal_the_shadows_trained_alone_and_lira_scores_them(tmp_path):
  data = _data()
  mi_idx, x, y, member = _candidates(data)
  home = shadows.home_clients(data, mi_idx, int((~member).sum()), seed=0)
  masks = mi.shadow_masks(2, len(y), seed=0)
  sets = shadows.shadow_datasets(data, x, y, home, masks)
  lanes, res = shadows.train_shadow_runs(_config(), sets, str(tmp_path / 'batched'), seed=5)
  alone, res_alone = shadows.train_shadow_runs(_config(), sets, str(tmp_path / 'alone'), seed=5, alone=True)
  assert [r.lanes for r in res] == [2, 2] and [r.lanes for r in res_alone] == [0, 0]   # one program vs alone
  for a, b in zip(jax_leaves(lanes), jax_leaves(alone), strict=True):
    assert a.shape[0] == 2
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
  assert not np.allclose(jax_leaves(lanes)[0][0], jax_leaves(lanes)[0][1])   # two shadows, not one twice
  m = get_model('mlp', 4, (3, 3, 1))
  target = jax_map(lambda a: a[0], lanes)     # any model: the scores are checked against the formula
  out = mi.lira_from_shadows(m.apply, target, x, y, member, lanes, masks)
  phi = np.stack([mi.example_stats(m.apply, jax_map(lambda a, i=i: a[i], lanes), x, y)['phi'] for i in range(2)])
  want = mi.lira_scores(mi.example_stats(m.apply, target, x, y)['phi'], phi, masks, fixed_variance=True)
  np.testing.assert_array_equal(out['scores'], want)
  assert out['fixed_variance'] and out['masks'].shape == (2, len(y))


def test_a_shadow_config_is_the_targets_with_its_seed_and_without_its_measurements():
  c = _config()
  c.lab.every, c.lab.measures, c.client.lr = 1, 'drift', 0.3
  s = shadows.shadow_config(c, 2, seed=10)
  assert s.seed == 12 and s.eval_every == s.checkpoint_every == c.rounds and s.client.lr == 0.3
  assert s.lab.every == 0 and c.lab.every == 1        # the target's config is left as it was
