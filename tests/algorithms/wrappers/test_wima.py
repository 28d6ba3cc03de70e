"""WiMA (algorithms/wrappers/wima.py): the ring buffer + running sum equals the mean of the last W global models."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.core.contract import FederatedAlgorithm
from fedjax_flat.models.registry import get_model
from fedjax_flat.algorithms.wrappers.wima import classifier_key, selected_paths, with_wima
from fedjax_flat.config.default_config import default_config

W = 3


def models_of_round(i):
  """The toy server's global model after round i: w^{i+1}, pseudo-random but reproducible."""
  rng = np.random.default_rng(100 + i)
  return {'Dense_0': {'kernel': rng.normal(size=(2, 3)).astype(np.float32),
                      'bias': rng.normal(size=(3,)).astype(np.float32)},
          'Dense_1': {'kernel': rng.normal(size=(3, 2)).astype(np.float32),
                      'bias': rng.normal(size=(2,)).astype(np.float32)}}


def toy_algorithm():
  table = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[models_of_round(i) for i in range(10)])

  def server_update(state, agg, round_idx, phase=0):
    return {'params': jax.tree_util.tree_map(lambda t: t[round_idx], table)}

  nope = lambda *a, **k: None
  return FederatedAlgorithm(
      'toy', lambda p, r: {'params': p}, lambda s, r, phase=0: {'params': s['params'], 'hparams': {}},
      nope, nope, nope, server_update, lambda s: {'global': (s['params'], jnp.bool_(True))})


def wima_config(subset='all', window=W, buffer=0):
  c = default_config()
  c.wima.enabled = True
  c.wima.window = window
  c.wima.buffer = buffer
  c.wima.subset = subset
  return c


def run(subset, rounds=7, buffer=0):
  alg = with_wima(toy_algorithm(), wima_config(subset, buffer=buffer))
  state = alg.server_init(jax.tree_util.tree_map(jnp.asarray, models_of_round(-1)), None)
  assert not bool(alg.eval_models(state)['wima'][1]), 'no window average before the first update'
  update = jax.jit(alg.server_update)
  evals = []
  for i in range(rounds):
    state = update(state, {}, jnp.int32(i))
    evals.append(alg.eval_models(state))
  assert update._cache_size() == 1
  return state, evals


def mean_of(rounds):
  return jax.tree_util.tree_map(lambda *xs: np.mean(np.stack(xs), axis=0), *[models_of_round(j) for j in rounds])


def close(a, b):
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), a, b)


def test_window_average_equals_mean_of_last_w_models():
  _, evals = run('all')
  for i, models in enumerate(evals):
    params, active = models['wima']
    assert bool(active)
    # After round i the window holds w^{max(1, i-W+2)} .. w^{i+1} (models of rounds max(0, i-W+1)..i).
    close(params, mean_of(range(max(0, i - W + 1), i + 1)))
    close(models['global'][0], models_of_round(i))


@pytest.mark.parametrize('traced', [False, True])
def test_a_larger_buffer_keeps_the_window_and_a_traced_window_works(traced):
  """wima.buffer > W (a window grid's shared capacity): the slots past W stay zero and the average is still the
  mean of the last W models, also with W a per-run value (a float32 RunValue: what a batched program passes)."""
  from fedjax_flat.core import runs as runs_lib
  c = wima_config(buffer=W + 3)
  if traced:
    c = runs_lib.traced_config(c, {'wima.window': jnp.float32(W)})
  alg = with_wima(toy_algorithm(), c)
  state = alg.server_init(jax.tree_util.tree_map(jnp.asarray, models_of_round(-1)), None)
  for i in range(8):
    state = jax.jit(alg.server_update)(state, {}, jnp.int32(i))
    close(alg.eval_models(state)['wima'][0], mean_of(range(max(0, i - W + 1), i + 1)))
  buf = state['wima']['buf']['Dense_0']['kernel']
  assert buf.shape[0] == W + 3 and not np.any(np.asarray(buf[W:]))
  close(state['wima']['sum'], jax.tree_util.tree_map(lambda x: x * W, mean_of(range(5, 8))))


def test_a_window_grid_shares_a_program_only_with_a_buffer():
  from fedjax_flat.config import validate
  from fedjax_flat.core import runs as runs_lib
  grid = lambda buffer: [wima_config(window=w, buffer=buffer) for w in (2, 5, 10)]
  keys = lambda cs: {runs_lib.compat_key(c) for c in cs}
  assert len(keys(grid(10))) == 1 and all('wima.window' in runs_lib.present_value_fields(c) for c in grid(10))
  assert len(keys(grid(0))) == 3 and all('wima.window' not in runs_lib.present_value_fields(c) for c in grid(0))
  with pytest.raises(Exception, match='wima.buffer'):
    validate.validate_config(wima_config(window=5, buffer=3))


def test_first_rounds_average_all_models_so_far():
  _, evals = run('all', rounds=2)
  close(evals[0]['wima'][0], models_of_round(0))
  close(evals[1]['wima'][0], mean_of([0, 1]))


@pytest.mark.parametrize('subset,averaged', [('classifier', 'Dense_1'), ('features', 'Dense_0')])
def test_subset_averages_only_part_of_the_network(subset, averaged):
  state, evals = run(subset)
  assert set(state['wima']['buf']) == {averaged}   # only that part is buffered
  for i, models in enumerate(evals):
    params = models['wima'][0]
    window = mean_of(range(max(0, i - W + 1), i + 1))
    for mod in ('Dense_0', 'Dense_1'):
      close(params[mod], window[mod] if mod == averaged else models_of_round(i)[mod])


@pytest.mark.parametrize('traced', [False, True])
@pytest.mark.parametrize('subset', ['classifier', 'features', 'all'])
def test_buffering_every_parameter_gives_the_subset_s_averages_bit_for_bit(subset, traced):
  """wima.buffer_all (a subset grid's shared buffer): every parameter is buffered and the subset is a mask when
  the average is read, also with the subset a per-run value (its index, a float32 RunValue as a batched program
  passes): the WiMA model equals the subset-only buffer's exactly (each parameter's window sum is its own)."""
  from fedjax_flat.core import runs as runs_lib
  _, ref = run(subset)
  c = wima_config(subset)
  c.wima.buffer_all = True
  assert ('wima.subset' in runs_lib.present_value_fields(c)) and 'wima.subset' not in runs_lib.present_value_fields(
      wima_config(subset))
  if traced:
    c = runs_lib.traced_config(c, runs_lib.run_values(c, ('wima.subset',)))
    assert isinstance(c.wima.subset, runs_lib.RunValue)
  alg = with_wima(toy_algorithm(), c)
  state = alg.server_init(jax.tree_util.tree_map(jnp.asarray, models_of_round(-1)), None)
  assert set(state['wima']['buf']) == {'Dense_0', 'Dense_1'}      # every parameter buffered
  update = jax.jit(alg.server_update)
  for i in range(7):
    state = update(state, {}, jnp.int32(i))
    jax.tree_util.tree_map(np.testing.assert_array_equal, alg.eval_models(state)['wima'][0], ref[i]['wima'][0])


def test_a_subset_grid_shares_a_program_only_when_every_parameter_is_buffered():
  from fedjax_flat.core import runs as runs_lib
  def keys(buffer_all):
    cs = [wima_config(subset=s) for s in ('classifier', 'features', 'all')]
    for c in cs:
      c.wima.buffer_all = buffer_all
    return {runs_lib.compat_key(c) for c in cs}
  assert len(keys(True)) == 1 and len(keys(False)) == 3
  assert runs_lib.run_values(wima_config(subset='features'), ('wima.subset',)) == {'wima.subset': 2.0}


def test_running_sum_resync_keeps_it_exact_over_many_wraps():
  state, evals = run('all', rounds=10)
  close(state['wima']['sum'], jax.tree_util.tree_map(lambda x: x * W, mean_of(range(7, 10))))


def test_classifier_detection_on_real_models():
  for name, kw, want in [('mlp', {'hidden': (4, 5)}, 'Dense_2'), ('cifar_cnn', {}, 'Dense_2'),
                         ('digits_cnn', {}, 'Dense_1')]:
    shape = (32, 32, 3) if name == 'cifar_cnn' else (8, 8, 1)
    model = get_model(name, 10, shape, **kw)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1,) + shape)))
    assert classifier_key(params) == want, name
    head = selected_paths(params, 'classifier')
    assert sorted(head) == [f'{want}/bias', f'{want}/kernel']
    assert len(selected_paths(params, 'features')) + 2 == len(selected_paths(params, 'all'))
  assert classifier_key({'classifier': {'kernel': 0}, 'layer1': {'kernel': 0}}) == 'classifier'
  assert classifier_key({'a': {'kernel': 0}, 'b': {'kernel': 0}}, override='a') == 'a'
