"""Membership inference: the ROC / AUC against pairwise counting, Clopper-Pearson against the binomial tails,
the epsilon bound by hand, LiRA's Gaussian ratio by hand, and LiRA against a target that memorised its members."""
import math

import jax
import numpy as np
import pytest

from fedjax_flat.analysis import membership as mi
from fedjax_flat.models.registry import get_model


def _binom_sf(k, n, p):       # P(X >= k), X ~ Bin(n, p)
  return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _bisect(f, target):       # the p in (0, 1) where the increasing f(p) = target
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
  return (lo + hi) / 2


def test_clopper_pearson_is_the_binomial_tail_inversion():
  for k, n in ((0, 20), (3, 20), (17, 20), (20, 20), (40, 100)):
    lo, hi = mi.clopper_pearson(k, n, 0.05)
    want_lo = 0.0 if k == 0 else _bisect(lambda p: _binom_sf(k, n, p), 0.025)
    want_hi = 1.0 if k == n else _bisect(lambda p: _binom_sf(k + 1, n, p), 0.975)
    np.testing.assert_allclose([lo, hi], [want_lo, want_hi], atol=1e-7)


def test_roc_auc_and_epsilon_bound_by_hand():
  rng = np.random.default_rng(0)
  m = np.round(rng.normal(1.0, 1.0, 300), 1)           # rounded: ties between the sets
  o = np.round(rng.normal(0.0, 1.0, 400), 1)
  r = mi.roc(m, o)
  pairs = (m[:, None] > o[None, :]).mean() + 0.5 * (m[:, None] == o[None, :]).mean()
  np.testing.assert_allclose(r['auc'], pairs, rtol=1e-12)
  i = 17
  assert r['tpr'][i] == np.mean(m >= r['thresholds'][i]) and r['fpr'][i] == np.mean(o >= r['thresholds'][i])
  # tp 900 / 1000, fp 10 / 1000, delta 1e-5: the formula with the Clopper-Pearson bounds
  tpr_lo = mi.clopper_pearson(900, 1000)[0]
  fpr_hi = mi.clopper_pearson(10, 1000)[1]
  want = max(math.log((tpr_lo - 1e-5) / fpr_hi), math.log((1 - 1e-5 - fpr_hi) / (1 - tpr_lo)))
  np.testing.assert_allclose(mi.epsilon_bound(900, 1000, 10, 1000, 1e-5), want, rtol=1e-12)
  assert 3.5 < want < math.log(90)                        # below the point estimate log(0.9 / 0.01)
  assert mi.epsilon_bound(500, 1000, 500, 1000) == 0.0


def test_separated_losses_give_a_bound_and_identical_ones_none():
  rng = np.random.default_rng(1)
  members, nonmembers = rng.exponential(0.05, 2000), rng.exponential(1.0, 2000)
  rep = mi.attack_report(-members, -nonmembers, delta=1e-5)
  assert rep['auc'] > 0.9 and rep['epsilon_lower_bound'] > 1.0
  assert rep['epsilon_lower_bound'] <= rep['epsilon_all_thresholds'] + 1e-12
  assert rep['n_members_eval'] == 1000 and 0 <= rep['fpr'] < rep['tpr'] <= 1
  same = mi.attack_report(-rng.exponential(1.0, 2000), -rng.exponential(1.0, 2000), delta=1e-5)
  assert abs(same['auc'] - 0.5) < 0.05 and same['epsilon_lower_bound'] < 0.1


def test_lira_scores_are_the_gaussian_log_ratio():
  phi = np.array([[1.0, 0.0], [3.0, 1.0], [0.0, 2.0], [2.0, 5.0]])
  inn = np.array([[True, False], [True, True], [False, True], [False, False]])
  got = mi.lira_scores([2.5, 1.0], phi, inn)
  # example 0: in {1, 3} (mean 2, var 2), out {0, 2} (mean 1, var 2); example 1: in {1, 2}, out {0, 5}
  want = [-0.5 * ((2.5 - 2) ** 2 / 2 - (2.5 - 1) ** 2 / 2),
          -0.5 * ((1 - 1.5) ** 2 / 0.5 + math.log(0.5) - (1 - 2.5) ** 2 / 12.5 - math.log(12.5))]
  np.testing.assert_allclose(got, want, rtol=1e-12)
  masks = mi.shadow_masks(8, 50, seed=3)
  assert (masks.sum(0) == 4).all() and masks.shape == (8, 50)


@pytest.mark.slow   # ~15-20 s on 2 shared cores, mostly compiling the vmapped trainer
def test_lira_finds_the_members_a_target_memorised():
  """64 random images with random labels, a target trained on half: only memorisation can fit them, so the
  members' confidence stands out against the shadows' out-distribution."""
  rng = np.random.default_rng(2)
  x = rng.uniform(0, 1, (64, 8, 8, 1)).astype(np.float32)
  y = rng.integers(0, 10, 64).astype(np.int32)
  m = get_model('mlp', 10, (8, 8, 1), hidden=(64,))
  member = np.arange(64) < 32
  kw = dict(epochs=100, batch_size=32, lr=0.5)
  # the target as lane 0 of a program of LiRA's shape: one compilation serves both
  lanes = mi.shadow_masks(8, 64, seed=7)
  lanes[0] = member
  target = jax.tree_util.tree_map(lambda a: a[0], mi.train_shadows(m.init, m.apply, x, y, lanes,
                                                                   jax.random.key(9), **kw))
  stats = mi.example_stats(m.apply, target, x, y, batch_size=48)
  assert stats['loss'][member].mean() < 0.5 * stats['loss'][~member].mean()
  out = mi.lira(m.init, m.apply, target, x, y, member, jax.random.key(5), num_shadows=8, **kw)
  assert out['fixed_variance'] and out['masks'].shape == (8, 64)
  rep = mi.attack_report(out['scores'][member], out['scores'][~member])
  assert rep['auc'] > 0.8, rep


def test_lira_is_lira_from_shadows_of_the_same_shadows():
  """The pipeline split in two (training/shadows.py brings its own shadows): the same central shadows give the
  same scores, bit for bit."""
  rng = np.random.default_rng(0)
  x = rng.uniform(0, 1, (16, 2, 2, 1)).astype(np.float32)
  y = rng.integers(0, 3, 16).astype(np.int32)
  m = get_model('mlp', 3, (2, 2, 1), hidden=(4,))
  member = np.arange(16) < 8
  kw = dict(epochs=2, batch_size=8, lr=0.1)
  target = m.init(jax.random.key(0), x[:1])
  out = mi.lira(m.init, m.apply, target, x, y, member, jax.random.key(1), num_shadows=4, seed=2, **kw)
  masks = mi.shadow_masks(4, 16, seed=2)
  shadows = mi.train_shadows(m.init, m.apply, x, y, masks, jax.random.key(1), **kw)
  again = mi.lira_from_shadows(m.apply, target, x, y, member, shadows, masks)
  np.testing.assert_array_equal(out['scores'], again['scores'])
  np.testing.assert_array_equal(out['masks'], again['masks'])
  assert out['shadow_heldout_accuracy'] == again['shadow_heldout_accuracy']
