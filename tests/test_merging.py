"""Git Re-Basin weight matching (fedjax_flat/merging.py) against a NumPy implementation written from Ainsworth et
al. 2023 (Alg. 1) on a tiny MLP; a permuted copy recovered exactly; permutations keep a CNN's function; the
server aggregator 'rebasin' in FedAvg rounds against hand-computed rounds; the one-line refusals."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from fedjax_flat import aggregators, merging
from fedjax_flat.config import validate
from fedjax_flat.errors import ConfigError
from fedjax_flat.models.cnn import DigitsCNN
from fedjax_flat.models.registry import get_model
from tests.fixtures.baselines import client_batches, config, run_engine, sgd, SCHEDULE, SIZES
from fedjax_flat.algorithms.local import make_loss

tmap = jax.tree_util.tree_map


def _mlp(key, sizes):
  ks = jax.random.split(key, 2 * len(sizes))
  return {f'Dense_{i}': {'kernel': jax.random.normal(ks[2 * i], (a, b)),
                         'bias': jax.random.normal(ks[2 * i + 1], (b,))}
          for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))}


def np_weight_matching(ref, other, iters):
  """Ainsworth et al. Alg. 1 for an MLP, layers in forward order, from identity permutations."""
  L = len(ref)
  W = lambda p, l: np.asarray(p[f'Dense_{l}']['kernel'], np.float64)   # [in, out]
  b = lambda p, l: np.asarray(p[f'Dense_{l}']['bias'], np.float64)
  perms = [np.arange(W(ref, l).shape[1]) for l in range(L - 1)]
  for _ in range(iters):
    for l in range(L - 1):
      wb = W(other, l) if l == 0 else W(other, l)[perms[l - 1], :]
      cost = W(ref, l).T @ wb + np.outer(b(ref, l), b(other, l))
      nb = W(other, l + 1) if l + 1 == L - 1 else W(other, l + 1)[:, perms[l + 1]]
      cost += W(ref, l + 1) @ nb.T
      perms[l] = linear_sum_assignment(cost, maximize=True)[1]
  return perms


def np_permute(p, perms):
  out = {k: {n: np.asarray(a, np.float64).copy() for n, a in v.items()} for k, v in p.items()}
  for l, q in enumerate(perms):
    out[f'Dense_{l}']['kernel'] = out[f'Dense_{l}']['kernel'][:, q]
    out[f'Dense_{l}']['bias'] = out[f'Dense_{l}']['bias'][q]
    out[f'Dense_{l + 1}']['kernel'] = out[f'Dense_{l + 1}']['kernel'][q, :]
  return out


def np_rebasin(models, weights, ref, iters):
  aligned = [np_permute(m, np_weight_matching(ref, m, iters)) for m in models]
  w = np.asarray(weights, np.float64) / np.sum(weights)
  return tmap(lambda *xs: sum(wi * x for wi, x in zip(w, xs)), *aligned)


SIZES_MLP = (3, 5, 6, 2)


def test_a_permuted_copy_is_aligned_back_exactly():
  ref = _mlp(jax.random.key(0), SIZES_MLP)
  rng = np.random.default_rng(0)
  perms = [rng.permutation(5), rng.permutation(6)]
  other = merging.permute(ref, [jnp.asarray(p) for p in perms])
  assert not np.allclose(other['Dense_0']['kernel'], ref['Dense_0']['kernel'])
  found = merging.weight_matching(ref, other, iters=2)
  back = merging.permute(other, found)
  for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(ref)):
    np.testing.assert_array_equal(a, b)
  # ...and the merge of the model with its permuted copy is the model itself, bit for bit
  stack = tmap(lambda x, y: jnp.stack([x, y]), ref, other)
  merged = merging.rebasin_merge(stack, jnp.ones(2), jnp.ones(2, bool), ref, iters=2)
  for a, b in zip(jax.tree_util.tree_leaves(merged), jax.tree_util.tree_leaves(ref)):
    np.testing.assert_array_equal(a, b)


def test_weight_matching_and_merge_equal_numpy():
  ref = _mlp(jax.random.key(1), SIZES_MLP)
  models = [_mlp(jax.random.key(k), SIZES_MLP) for k in (2, 3, 4)]
  for m in models:
    got = [np.asarray(p) for p in merging.weight_matching(ref, m, iters=3)]
    want = np_weight_matching(ref, m, 3)
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)
  weights = np.array([3.0, 1.0, 2.0])
  # a fourth, masked row full of NaN never enters
  stack = tmap(lambda *xs: jnp.stack(list(xs) + [jnp.full_like(xs[0], jnp.nan)]), *models)
  got = aggregators.rebasin(stack, jnp.asarray(np.append(weights, 5.0)), jnp.array([True, True, True, False]),
                            ref, 3)
  want = np_rebasin(models, weights, ref, 3)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=1e-5, atol=1e-6)
  # the alignment matters: the plain mean differs
  plain = np.mean([np.asarray(m['Dense_0']['kernel']) * w for m, w in zip(models, weights)], 0) * 3 / 6
  assert not np.allclose(plain, want['Dense_0']['kernel'], atol=1e-3)


@pytest.mark.slow   # ~10-20 s on 2 shared cores (an engine run / a 128-unit alignment)
def test_a_permutation_keeps_the_cnn_function_and_is_recovered():
  model = DigitsCNN(num_classes=3, conv_impl='im2col')
  x = jax.random.normal(jax.random.key(0), (2, 8, 8, 1))
  params = model.init(jax.random.key(1), x)['params']
  assert merging.permutation_spec(params) == ['Conv_0', 'Conv_1', 'Dense_0', 'Dense_1']
  rng = np.random.default_rng(1)
  perms = [jnp.asarray(rng.permutation(n)) for n in (32, 32, 128)]
  other = merging.permute(params, perms)
  np.testing.assert_allclose(model.apply({'params': other}, x), model.apply({'params': params}, x),
                             rtol=1e-5, atol=1e-5)
  back = merging.permute(other, merging.weight_matching(params, other, iters=2))
  for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_params_that_are_not_a_chain_are_refused():
  with pytest.raises(ValueError, match='GroupNorm_0'):
    merging.permutation_spec({'Conv_0': {'kernel': jnp.zeros((3, 3, 1, 4)), 'bias': jnp.zeros(4)},
                              'GroupNorm_0': {'scale': jnp.ones(4), 'bias': jnp.zeros(4)}})


HMODEL = get_model('mlp', 3, (2, 1, 1), hidden=(4,))
HPARAMS0 = HMODEL.init(jax.random.key(0), jnp.zeros((1, 2, 1, 1)))
_HLOSS = make_loss(HMODEL)
SERVER_LR = 0.8


def _local_sgd(w, r, k):
  for b in client_batches(r, k):
    w = sgd(w, jax.grad(lambda p: _HLOSS(p, b)[0])(w))
  return w


@pytest.mark.slow   # ~10-20 s on 2 shared cores (an engine run / a 128-unit alignment)
def test_fedavg_rounds_with_rebasin_equal_hand_computed_rounds():
  c = config('fedavg')
  c.server.lr, c.server.aggregator, c.server.rebasin_iters = SERVER_LR, 'rebasin', 2
  c.model_kwargs.hidden = (4,)
  state, _, alg = run_engine(c, model=HMODEL, params0=HPARAMS0)
  assert alg.aggregate == 'stacked'
  w = tmap(lambda x: np.asarray(x, np.float64), HPARAMS0)
  for r, ids in enumerate(SCHEDULE):
    wj = tmap(lambda x: jnp.asarray(x, jnp.float32), w)
    models = [_local_sgd(wj, r, k) for k in ids]
    merged = np_rebasin(models, [SIZES[k] for k in ids], wj, 2)
    w = tmap(lambda g, m: g - SERVER_LR * (g - m), w, merged)
  for a, b in zip(jax.tree_util.tree_leaves(state['params']), jax.tree_util.tree_leaves(w)):
    np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize('over, match', [
    ({'model': 'resnet18_gn'}, "model='resnet18_gn'.*rebasin"),
    ({'model_kwargs.gn_groups': 2}, 'gn_groups'),
])
def test_models_it_cannot_permute_are_refused_in_one_line(over, match):
  c = config('fedavg')
  c.server.aggregator = 'rebasin'
  for k, v in over.items():
    if k.startswith('model_kwargs.'):
      c.model, c.model_kwargs = 'digits_cnn', type(c.model_kwargs)({k.split('.')[1]: v})
    else:
      c.model = v
  with pytest.raises(ConfigError, match=match) as e:
    validate.validate_config(c)
  assert '\n' not in str(e.value)
