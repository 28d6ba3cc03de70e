"""The embedded digits read without importing scikit-learn equal scikit-learn's own loader's arrays."""
import numpy as np

from fedjax_flat.data.sources import builtin


def test_digits_arrays_equal_sklearns_load_digits():
  from sklearn import datasets as skd
  d = skd.load_digits()
  images, target = builtin.digits_arrays()
  assert images.shape == (1797, 8, 8) and images.dtype == d.images.dtype
  assert np.array_equal(images, d.images) and np.array_equal(target, d.target)
