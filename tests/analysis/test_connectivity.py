"""Mode connectivity (analysis/connectivity.py) against the formulas in NumPy on a ring-shaped valley
L(w) = (|w|^2 - 1)^2 in two dimensions: the straight line between (-1, 0) and (1, 0) crosses the peak at the origin
(barrier 1, Frankle et al. 2020's definition), a quadratic Bezier curve (Garipov et al. 2018) can go round it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat import analysis


def ring(w):
  r2 = jnp.sum(jnp.square(w['v']))
  return (r2 - 1.0) ** 2, 1.0 - r2      # (loss, a second output standing in for the accuracy)


def np_ring(v):
  return (np.sum(np.square(v)) - 1.0) ** 2


W1, W2 = {'v': jnp.array([-1.0, 0.0])}, {'v': jnp.array([1.0, 0.2])}


def test_loss_barrier_equals_the_definition():
  res = analysis.loss_barrier(ring, W1, W2, n=11)
  ts = np.linspace(0, 1, 11)
  a, b = np.asarray(W1['v'], np.float64), np.asarray(W2['v'], np.float64)
  loss = np.array([np_ring((1 - t) * a + t * b) for t in ts])
  rise = loss - ((1 - ts) * loss[0] + ts * loss[-1])
  np.testing.assert_allclose(res['loss'], loss, rtol=1e-5, atol=1e-6)
  assert res['barrier'] == pytest.approx(rise.max(), abs=1e-5)
  assert res['t_barrier'] == pytest.approx(ts[np.argmax(rise)])
  assert res['max_loss'] == pytest.approx(loss.max(), abs=1e-5)
  assert 'accuracy' in res and res['barrier'] > 0.9


def test_bezier_curve_goes_round_the_peak_and_is_measured_by_the_formula():
  res = analysis.bezier_curve(lambda p, k: ring(p)[0], ring, W1, W2, jax.random.key(0), steps=300, lr=0.05, n=21)
  th = np.asarray(res['theta']['v'], np.float64)
  a, b = np.asarray(W1['v'], np.float64), np.asarray(W2['v'], np.float64)
  ts = np.linspace(0, 1, 21)
  loss = np.array([np_ring((1 - t) ** 2 * a + 2 * t * (1 - t) * th + t ** 2 * b) for t in ts])
  rise = loss - ((1 - ts) * loss[0] + ts * loss[-1])
  np.testing.assert_allclose(res['loss'], loss, rtol=1e-4, atol=1e-5)
  assert res['barrier'] == pytest.approx(rise.max(), abs=1e-5)
  line = analysis.loss_barrier(ring, W1, W2, n=21)['barrier']
  assert res['barrier'] < 0.25 * line, (res['barrier'], line)
  assert res['train_loss'].shape == (300,)


def test_a_path_of_one_point_is_refused():
  with pytest.raises(ValueError, match='n=1'):
    analysis.loss_barrier(ring, W1, W2, n=1)


def test_barrier_table_pairs_every_client_and_each_with_the_global_model():
  w3 = {'v': jnp.array([0.0, 1.0])}
  rows = analysis.barrier_table(ring, {'c0': W1, 'c1': W2, 'c2': w3}, W1, n=5)
  assert [(r['a'], r['b']) for r in rows] == [('c0', 'c1'), ('c0', 'c2'), ('c1', 'c2'), ('c0', 'global'),
                                              ('c1', 'global'), ('c2', 'global')]
  assert rows[0]['barrier'] == pytest.approx(analysis.loss_barrier(ring, W1, W2, n=5)['barrier'])
  assert rows[3]['barrier'] == pytest.approx(0.0, abs=1e-6)     # a model against itself
  md = analysis.barrier_markdown(rows)
  assert md.count('\n') == len(rows) + 2 and '| c0 - c1 |' in md
