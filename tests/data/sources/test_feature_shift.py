"""The cross-silo feature-shift digits: splits, balance, determinism, leave-one-client-out."""
import numpy as np
import pytest

from fedjax_flat.data import registry
from fedjax_flat.data.sources.feature_shift import TRANSFORMS, load_digits_feature_shift

N_DIGITS = 1797


@pytest.fixture(scope='module')
def data():
  return registry.get_dataset('digits_feature_shift', num_clients=5, seed=0, alpha=0.0)  # alpha: ignored


def test_registered_and_splits_partition_each_source(data):
  assert data.num_clients == 5
  assert data.client_names == [f'h{s}:{TRANSFORMS[s][0]}' for s in range(5)]
  train, val = data.client_sizes(), data.client_val_sizes()
  local = np.array([len(data.client_test_examples(k)[1]) for k in range(5)])
  gx, gy = data.test_examples()
  # Every example lands in exactly one split (up to the global set's trim to an equal count per source).
  total = train.sum() + val.sum() + local.sum() + len(gy)
  assert N_DIGITS - 5 <= total <= N_DIGITS
  # Fractions: ~15% local test, ~10% validation, the global set about one local test set in size.
  sizes = train + val + local
  np.testing.assert_allclose(local / sizes, 0.15, atol=0.02)
  np.testing.assert_allclose(val / sizes, 0.10, atol=0.02)
  assert 0.7 * local.mean() <= len(gy) <= 1.3 * local.mean()
  # Class-stratified clients.
  for k in range(5):
    counts = np.bincount(data.client_labels(k), minlength=10)
    assert counts.max() - counts.min() <= 3


def test_global_test_is_balanced_across_sources():
  d = load_digits_feature_shift(4, seed=1)
  gx, gy = d.test_examples()
  assert len(gy) % 4 == 0
  per = len(gy) // 4
  # The global set is the sources' shares in order; each share is that source's transform of some digits.
  for s in range(4):
    share = gx[s * per:(s + 1) * per]
    kx, _ = d.client_examples(s)
    # Same source statistics (transform signature): mean intensity close to the client's training data.
    assert abs(share.mean() - kx.mean()) < 0.05


def test_global_fraction_sets_the_global_test_size():
  d = registry.get_dataset('digits_feature_shift', num_clients=4, global_fraction=0.1)
  assert len(d.test_examples()[1]) == pytest.approx(0.1 * N_DIGITS, abs=8)
  assert len(d.test_examples()[1]) % 4 == 0


def test_transforms_make_clients_distinct(data):
  means = [data.client_examples(k)[0].mean() for k in range(5)]
  stds = [data.client_examples(k)[0].std() for k in range(5)]
  feats = np.stack([means, stds], 1)
  dist = np.linalg.norm(feats[:, None] - feats[None], axis=-1) + np.eye(5)
  assert dist.min() > 0.01
  for k in range(5):
    x = data.client_examples(k)[0]
    assert x.dtype == np.float32 and x.min() >= 0 and x.max() <= 1


def test_deterministic_in_seed(data):
  again = load_digits_feature_shift(5, seed=0)
  np.testing.assert_array_equal(again.x, data.x)
  np.testing.assert_array_equal(again.test_x, data.test_x)
  np.testing.assert_array_equal(again.client_val_index, data.client_val_index)
  other = load_digits_feature_shift(5, seed=1)
  assert not np.array_equal(other.client_labels(0), data.client_labels(0))


def test_leave_one_client_out():
  d = load_digits_feature_shift(5, seed=0, leave_out=2)
  assert d.num_clients == 4 and d.leave_out == 2
  assert [n.split(':')[0] for n in d.client_names] == ['h0', 'h1', 'h3', 'h4']
  ux, uy = d.unseen_examples()
  assert abs(len(uy) - N_DIGITS / 5) <= 2                  # the whole left-out source
  full = load_digits_feature_shift(5, seed=0)
  # The left-out source's data are source 2's transform (same as client 2 of the full split).
  assert abs(ux.mean() - full.client_examples(2)[0].mean()) < 0.03
  assert len(d.test_examples()[1]) % 4 == 0                # global set: training sources only
  with pytest.raises(ValueError, match='no left-out client'):
    full.unseen_examples()


@pytest.mark.parametrize('kw', [{'num_clients': 1}, {'num_clients': 9}, {'leave_out': 5},
                                {'val_fraction': 0.5, 'test_fraction': 0.3}])
def test_bad_arguments(kw):
  with pytest.raises(ValueError, match='digits_feature_shift'):
    load_digits_feature_shift(**{'num_clients': 5, **kw})
