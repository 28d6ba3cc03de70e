"""Per-client sharpness (thesis Table 4.13) on a softmax-regression problem whose Hessians are known in closed form.

At zero parameters a linear softmax model with C classes has p = 1/C for every class, and the Hessian of the
mean cross-entropy over (W, b) is (1/C)(I - 11^T/C) (x) E[z z^T] with z = [x, 1]; (I - 11^T/C) has top
eigenvalue 1, so lambda_max = lambda_max(E[z z^T]) / C. Train and test inputs are chosen so that the local
model's lambda_max on the whole training set differs from the one on the test set.
"""
import types

import jax
import numpy as np
import pytest

from fedjax_flat.analysis import local_models as lm
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.models.registry import get_model

C = 2


def _expected(xs):
  z = np.stack([np.asarray(xs, np.float64), np.ones(len(xs))], 1)
  return float(np.linalg.eigvalsh(z.T @ z / len(xs))[-1]) / C


def _trainer():
  # client 0 holds x = 1 (twice), client 1 holds x = 3 (twice); the test set is x = 0.5 (four times)
  x = np.asarray([1., 3., 1., 3.], np.float32).reshape(4, 1, 1, 1)
  data = FederatedDataset(x=x, y=np.asarray([0, 1, 1, 0], np.int32), client_index=np.asarray([0, 2, 1, 3]),
                       client_offsets=np.asarray([0, 2, 4]), test_x=np.full((4, 1, 1, 1), 0.5, np.float32),
                       test_y=np.asarray([0, 1, 0, 1], np.int32), num_classes=C)
  model = get_model('mlp', C, (1, 1, 1), hidden=())
  return types.SimpleNamespace(model=model, plan=types.SimpleNamespace(eval_transform=lambda a: a), task=None,
                               data=data)


@pytest.fixture
def zero_local_models(monkeypatch):
  """Both clients' local models (and the global model) at zero: the closed form above applies."""
  t = _trainer()
  p = t.model.init(jax.random.key(0), np.zeros((1, 1, 1, 1), np.float32))
  zero = {k: {n: np.zeros_like(v) for n, v in d.items()} for k, d in p.items()}
  monkeypatch.setattr(lm, 'local_models', lambda trainer, r: ([0, 1], [zero, zero]))
  return t, zero


def test_global_set_train_is_the_whole_training_set_not_the_test_set(zero_local_models):
  t, zero = zero_local_models
  rep = lm.per_client_sharpness(t, zero, 3, num_examples=100, batch_size=3, num_iters=100, tol=1e-7,
                                global_set='both')
  want_train, want_test = _expected([1, 3, 1, 3]), _expected([0.5] * 4)     # 3 + 2 sqrt 2 over C; 1.25 over C
  np.testing.assert_allclose(want_train, (3 + 2 * np.sqrt(2)) / C, rtol=1e-12)
  assert rep['global_set'] == 'both' and rep['all_converged']
  for r, own in zip(rep['clients'], ([1, 1], [3, 3])):
    np.testing.assert_allclose(r['lambda_local_train'], want_train, rtol=1e-4)
    np.testing.assert_allclose(r['lambda_local_global'], want_test, rtol=1e-4)
    np.testing.assert_allclose(r['lambda_local_own'], _expected(own), rtol=1e-4)
    np.testing.assert_allclose(r['lambda_global_own'], _expected(own), rtol=1e-4)
  np.testing.assert_allclose(rep['mean_lambda_local_train'], want_train, rtol=1e-4)
  assert abs(want_train - want_test) > 1.0                                  # the two "global" values differ


def test_global_set_keys_and_default(zero_local_models):
  t, zero = zero_local_models
  test_only = lm.per_client_sharpness(t, zero, 3, num_examples=100, batch_size=4, num_iters=50)
  train_only = lm.per_client_sharpness(t, zero, 3, num_examples=100, batch_size=4, num_iters=50, global_set='train')
  assert test_only['global_set'] == 'test'        # the default keeps the earlier report
  assert 'lambda_local_global' in test_only['clients'][0] and 'lambda_local_train' not in test_only['clients'][0]
  assert 'lambda_local_train' in train_only['clients'][0] and 'lambda_local_global' not in train_only['clients'][0]
  with pytest.raises(ValueError, match="global_set='valid'"):
    lm.per_client_sharpness(t, zero, 3, global_set='valid')


def test_global_train_subset_spans_clients_and_is_seeded():
  data = _trainer().data
  np.testing.assert_array_equal(lm.global_train_subset(data, 10), [0, 1, 2, 3])   # all of D, in order
  a, b = lm.global_train_subset(data, 2, seed=1), lm.global_train_subset(data, 2, seed=1)
  np.testing.assert_array_equal(a, b)
  assert len(np.unique(a)) == 2 and set(a) <= {0, 1, 2, 3}
  draws = {tuple(lm.global_train_subset(data, 2, seed=s)) for s in range(20)}
  assert len(draws) > 1 and any(not set(d) <= {0, 2} for d in draws)   # not only the first client's examples
