"""The sharded, multi-model Evaluator (evaluation/evaluator.py) against the reference path it replaced
(LegacyEvaluator: one device, one model per call) and against the loss / accuracy formulas computed directly."""
import json
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config
from fedjax_flat.evaluation import evaluator as ev_lib
from fedjax_flat.models import registry as model_registry
from fedjax_flat.training.evals import eval_batch

from tests.fixtures.paths import REPO

MODEL = model_registry.get_model('pfl_cnn', 10, (8, 8, 3))


def _prep(x):
  return x.astype(jnp.float32) / 255.0 - 0.5


def _problem(n=37, models=3):
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (n, 8, 8, 3)).astype(np.uint8)
  y = rng.integers(0, 10, n).astype(np.int32)
  # Parameters drawn with NumPy in the init's shapes: the model's own init, op by op, compiled for seconds in
  # this process and again in the 2-device subprocess; any values serve these equalities.
  shapes = jax.eval_shape(MODEL.init, jax.random.key(0), jax.ShapeDtypeStruct((1, 8, 8, 3), jnp.float32))
  params = [jax.tree_util.tree_map(lambda s: jnp.asarray(0.1 * rng.standard_normal(s.shape), s.dtype), shapes)
            for _ in range(models)]
  return x, y, params


def _formula(params, x, y):
  """Mean cross-entropy and accuracy over every example, in float64 from the logits of one call."""
  logits = np.asarray(MODEL.apply(params, _prep(jnp.asarray(x)), train=False), np.float64)
  logz = np.log(np.sum(np.exp(logits - logits.max(1, keepdims=True)), 1)) + logits.max(1)
  return float(np.mean(logz - logits[np.arange(len(y)), y])), float(np.mean(np.argmax(logits, 1) == y))


def test_metrics_equal_the_reference_path_and_the_formula():
  x, y, params = _problem()             # 37 examples in batches of 8: the last batch padded (mask 0)
  new = ev_lib.Evaluator(MODEL, x, y, 8, preprocess=_prep)
  old = ev_lib.LegacyEvaluator(MODEL, x, y, 8, preprocess=_prep)
  for p in params:
    got = new(p)
    assert got == old(p)                # the same per-batch sums, added in the same order: the same bits
    loss, acc = _formula(p, x, y)
    assert got['count'] == 37.0
    np.testing.assert_allclose(got['loss'], loss, rtol=1e-5)
    np.testing.assert_allclose(got['accuracy'], acc, rtol=1e-6)


def test_many_models_in_one_pass_equal_each_alone_and_compile_once():
  x, y, params = _problem()
  ev = ev_lib.Evaluator(MODEL, x, y, 8, preprocess=_prep)
  alone = {k: ev(p) for k, p in zip('abc', params)}
  assert ev._cache_size() == 1
  models = dict(zip('abc', params))
  many = ev.evaluate_many(models)
  assert list(many) == ['a', 'b', 'c']
  for k in 'abc':
    for m in ('loss', 'accuracy', 'count'):
      np.testing.assert_allclose(many[k][m], alone[k][m], rtol=2e-7)    # fp32 rounding at most
  assert ev._cache_size() == 2          # one program for one model, one for three
  shifted = {k: jax.tree_util.tree_map(lambda a: a * 1.5, p) for k, p in models.items()}
  again = ev.evaluate_many(shifted)      # new values, same shapes: no recompilation
  ev(params[0])
  assert ev._cache_size() == 2
  np.testing.assert_allclose(again['b']['loss'], _formula(shifted['b'], x, y)[0], rtol=1e-5)


def test_auto_batch_size_is_measured_once_and_recorded():
  x, y, params = _problem(n=40)
  ev = ev_lib.Evaluator(MODEL, x, y, 'auto', preprocess=_prep)
  assert ev.batch_size is None and ev.batches is None
  res = ev(params[0])
  choice = ev.batch_choice
  assert choice['batch_size'] == ev.batch_size and ev.batch_size in choice['images_per_s']
  assert choice['sample'] == 40 and set(choice['images_per_s']) <= {8, 16, 32, 40}
  assert choice['images_per_s'][ev.batch_size] == max(choice['images_per_s'].values())
  loss, acc = _formula(params[0], x, y)
  np.testing.assert_allclose(res['loss'], loss, rtol=1e-5)
  ev(params[1])
  assert ev.batch_choice is choice        # measured once per run
  summary = {}
  eval_batch._final(types.SimpleNamespace(plan=types.SimpleNamespace(evaluator=ev)), summary, 'global')
  assert summary['evaluation']['batch_size'] == ev.batch_size and summary['evaluation']['auto']
  assert summary['evaluation']['images_per_s'][str(ev.batch_size)] == choice['images_per_s'][ev.batch_size]


def test_auto_choice_follows_the_clock():
  # A clock that makes each timed call last (B - 16)^2 + 1: 16 wins; the ascent stops after 32 (64 / 257 images
  # per unit: under 0.8x the best rate), so 64 is never tried.
  x, y, params = _problem(n=64, models=1)
  state = {'t': 0.0, 'calls': 0, 'bs': 0}
  sizes = iter([8, 8, 16, 16, 32, 32])

  def clock():
    state['calls'] += 1
    if state['calls'] % 2:              # a start: the next timed call is of the next candidate's size
      state['bs'] = next(sizes)
      return state['t']
    state['t'] += (state['bs'] - 16) ** 2 + 1
    return state['t']
  choice = ev_lib.choose_batch_size(MODEL, x, y, _prep, params=params[0], candidates=(8, 16, 32, 64), clock=clock)
  assert choice['batch_size'] == 16 and list(choice['images_per_s']) == [8, 16, 32]
  np.testing.assert_allclose([choice['images_per_s'][b] for b in (8, 16, 32)], [64 / 65, 64 / 1, 64 / 257])


def test_eval_batch_size_auto_is_a_valid_config():
  c = default_config()
  c.eval_batch_size = 'auto'
  validate.validate_config(c)
  assert ev_lib.fixed_batch_size('auto') == ev_lib.DEFAULT_BATCH_SIZE and ev_lib.fixed_batch_size(64) == 64


def test_held_out_evaluator_sums_every_batch_in_one_program_with_the_same_bits():
  from fedjax_flat.data.federated import FederatedDataset
  x, y, params = _problem(n=37, models=1)
  data = FederatedDataset.from_client_indices(x, y, [np.arange(37)], x, y, num_classes=10)
  ev = ev_lib.HeldOutEvaluator(MODEL, data, batch_size=8, preprocess=_prep)
  got = ev(params[0])
  ref = None                             # the per-batch path it replaced: one call per batch, host int64 / float64
  for b in ev.batches(None):
    ref = ev_lib.host_add(ref, ev.sums_fn(params[0], b))
  assert got == ev._host(ev_lib.host_metrics(ev.task, ref))
  assert got['count'] == 37.0
  np.testing.assert_allclose(got['loss'], _formula(params[0], x, y)[0], rtol=1e-5)
  ev(params[0])
  assert ev.map_fn._cache_size() == 1 and len(ev.batches(None)) == 5


_TWO_DEVICES = r'''
import json, jax, jax.numpy as jnp, numpy as np
from tests.evaluation import test_evaluator as t
x, y, params = t._problem(n=37)          # 5 batches of 8 over 2 devices: one all-padding batch added
two = t.ev_lib.Evaluator(t.MODEL, x, y, 8, preprocess=t._prep)
one = t.ev_lib.LegacyEvaluator(t.MODEL, x, y, 8, preprocess=t._prep)
many = two.evaluate_many(dict(zip('abc', params)))
auto = t.ev_lib.Evaluator(t.MODEL, x[:20], y[:20], 'auto', preprocess=t._prep)     # few candidates: 8, 10 / 8, 16, 20
got = auto(params[0])
ref = t.ev_lib.LegacyEvaluator(t.MODEL, x[:20], y[:20], auto.batch_size, preprocess=t._prep)(params[0])
print(json.dumps({'devices': int(two.mesh.devices.size), 'shards': len(two.batches['x'].sharding.device_set),
                  'auto_same': got == ref, 'auto_layouts': sorted(auto.batch_choice['by_devices']),
                  'auto_devices': [auto.batch_choice['devices'], int(auto.mesh.devices.size)],
                  'padded': int(two.batches['mask'].shape[0]),
                  'same': [two(p) == one(p) for p in params],
                  'many': [many[k] == one(p) for k, p in zip('abc', params)], 'cache': two._cache_size()}))
'''


def test_two_host_devices_give_the_single_device_bits():
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=2', 'JAX_PLATFORMS': 'cpu',
         'PYTHONPATH': REPO}
  out = subprocess.run([sys.executable, '-c', _TWO_DEVICES], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  res = json.loads(out.stdout.strip().splitlines()[-1])
  assert res['devices'] == 2 and res['shards'] == 2 and res['padded'] == 6
  assert res['same'] == [True] * 3
  assert res['many'] == [True] * 3, 'several models in one pass: each as alone (here bit for bit)'
  assert res['cache'] == 2
  # 'auto' on 2 host devices times both layouts (all devices, one) and takes the faster: the same bits either way
  assert res['auto_layouts'] == [1, 2] and res['auto_devices'][0] == res['auto_devices'][1] in (1, 2)
  assert res['auto_same']


if __name__ == '__main__':
  sys.exit(pytest.main([__file__, '-q']))


def test_auto_choice_is_kept_beside_the_compilation_cache_and_read_by_the_next_run(tmp_path, monkeypatch):
  """With a compilation cache (the binaries'), the first 'auto' run measures and stores its choice; a run of
  the same model, test set and devices reads it instead of measuring; another test set measures again."""
  from fedjax_flat import devices
  monkeypatch.setattr(devices, '_CACHE', devices.CompilationCache(dir=str(tmp_path), why='test', source='flag',
                                                                   warning=''))
  x, y, params = _problem(n=40)
  first = ev_lib.Evaluator(MODEL, x, y, 'auto', preprocess=_prep)
  want = first(params[0])
  assert first.batch_choice['source'] == 'measured'
  stored = json.loads((tmp_path / ev_lib.CHOICES_FILE).read_text())
  assert [v['batch_size'] for v in stored.values()] == [first.batch_size]
  measured = []
  real = ev_lib.choose_layout
  monkeypatch.setattr(ev_lib, 'choose_layout', lambda *a, **k: measured.append(1) or real(*a, **k))
  second = ev_lib.Evaluator(MODEL, x, y, 'auto', preprocess=_prep)
  got = second(params[0])
  assert not measured and second.batch_size == first.batch_size and second.batch_choice['source'].startswith('read')
  assert got == want                                   # the same batches: the same bits
  third = ev_lib.Evaluator(MODEL, x[:24], y[:24], 'auto', preprocess=_prep)
  third(params[0])
  assert measured == [1] and len(json.loads((tmp_path / ev_lib.CHOICES_FILE).read_text())) == 2
