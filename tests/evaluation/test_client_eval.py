"""Every client evaluated (evaluation/client_eval.py): each client's accuracy / loss against model.apply by hand,
the distribution statistics against NumPy, the seeded sample, the label-matched examples, k fine-tuning steps
against k manual SGD steps, and the config's one-line refusals."""
import json
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.config.default_config import default_config
from fedjax_flat.config.validate import validate_config
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.errors import ConfigError
from fedjax_flat.evaluation import client_eval as ce
from fedjax_flat.models import registry as model_registry
from tests.fixtures.paths import REPO

C, D = 4, 6
MODEL = model_registry.get_model('mlp', C, (D,), hidden=(8,))


def _data(own_split: bool, sizes=(5, 9, 0, 13, 7, 3, 11)):
  rng = np.random.default_rng(1)
  n = sum(sizes)
  x = rng.normal(size=(n, D)).astype(np.float32)
  y = rng.integers(0, C, n).astype(np.int32)
  tx = rng.normal(size=(60, D)).astype(np.float32)
  ty = rng.integers(0, C, 60).astype(np.int32)
  bounds = np.cumsum((0,) + tuple(sizes))
  idx = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
  test_idx = [np.arange(60)[i::len(sizes)][:(2 + i)] for i in range(len(sizes))] if own_split else None
  return FederatedDataset.from_client_indices(x, y, idx, tx, ty, C, client_test_indices=test_idx)


def _params(seed=0):
  return MODEL.init(jax.random.key(seed), jnp.zeros((1, D)))


def _by_hand(params, x, y):
  """Accuracy and mean cross-entropy of one client in float64 from model.apply's logits."""
  if len(y) == 0:
    return 0.0, 0.0
  logits = np.asarray(MODEL.apply(params, jnp.asarray(x), train=False), np.float64)
  m = logits.max(1, keepdims=True)
  logp = logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))
  return float(np.mean(logits.argmax(1) == y)), float(-np.mean(logp[np.arange(len(y)), y]))


def test_every_client_on_its_own_split_equals_model_apply_by_hand_across_padded_chunks(monkeypatch):
  monkeypatch.setattr(ce, 'CHUNK', 3)        # 7 clients: chunks of 3, the last padded with 2 empty clients
  data, params = _data(own_split=True), _params()
  prog = ce.ClientEvalProgram(MODEL, data, np.arange(7), seed=0, batch_size=2)
  assert prog.source == 'own_split' and prog.chunk == 3
  res = prog(params)
  for k in range(7):
    x, y = data.client_test_examples(k)
    acc, loss = _by_hand(params, x, y)
    assert res['n'][k] == len(y)
    assert res['acc'][k] == pytest.approx(acc, abs=1e-6)
    assert res['loss'][k] == pytest.approx(loss, rel=1e-5)
  # a second model: the same compiled programs (compiled ahead for the arguments' shapes: no retrace per call)
  before = dict(prog.compiled)
  prog(_params(1))
  assert prog.compiled == before and 'clients' in before


@pytest.mark.parametrize('own_split, batch_size, steps', [(True, 2, 0), (False, 4, 2), (True, 64, 1)])
def test_auto_layout_is_the_clients_layout_bit_for_bit_at_every_call(monkeypatch, own_split, batch_size, steps):
  """'auto' keeps the packed 'batches' layout only when its sums are the 'clients' layout's bits (checked at the
  first call); either way every call's results equal the 'clients' layout's exactly, for other params too, with
  clients of several batches, an empty client, padded chunks and fine-tuning."""
  monkeypatch.setattr(ce, 'CHUNK', 3)
  data = _data(own_split)
  cfg = default_config().client
  cfg.lr, cfg.batch_size = 0.1, 3
  kw = dict(seed=2, batch_size=batch_size, steps=steps, client_cfg=cfg)
  auto = ce.ClientEvalProgram(MODEL, data, np.arange(7), layout='auto', **kw)
  ref = ce.ClientEvalProgram(MODEL, data, np.arange(7), layout='clients', **kw)
  fast = ce.ClientEvalProgram(MODEL, data, np.arange(7), layout='batches', **kw)
  for seed in (0, 1, 2):
    want, got, packed = ref(_params(seed)), auto(_params(seed)), fast(_params(seed))
    assert want.keys() == got.keys() == packed.keys()
    for k in want:
      assert np.array_equal(want[k], got[k]), (seed, k)
      np.testing.assert_allclose(packed[k], want[k], rtol=1e-6, atol=1e-7)     # 'batches' alone: fp32 rounding
  check = auto.layout_check
  d = jax.local_device_count()
  cands = {f'batches{d}', 'batches1'}
  assert check['layout'] == auto.layout in ('clients', 'batches') and set(check['seconds']) == {'clients'} | cands
  assert set(check['same_bits']) == cands
  if auto.layout == 'batches':      # the kept candidate gave the reference's bits and was the fastest of those
    kept = f"batches{auto.devices}"
    assert check['same_bits'][kept] and check['seconds'][kept] <= check['seconds']['clients']
  else:
    assert auto.devices is None


_TWO_DEVICES = r"""
import json, jax, numpy as np
from tests.evaluation import test_client_eval as t
t.ce.CHUNK = 3
data = t._data(True)
ref = t.ce.ClientEvalProgram(t.MODEL, data, np.arange(7), seed=0, batch_size=2, layout='clients')
two = t.ce.ClientEvalProgram(t.MODEL, data, np.arange(7), seed=0, batch_size=2, layout='batches')
auto = t.ce.ClientEvalProgram(t.MODEL, data, np.arange(7), seed=0, batch_size=2)
from jax.sharding import Mesh, NamedSharding, PartitionSpec
# as the trainer hands them over: replicated on its own mesh of every device (regression: the one-device
# candidate was compiled for its own mesh and refused these)
on_clients = NamedSharding(Mesh(np.array(jax.local_devices()), ('clients',)), PartitionSpec())
same, close = [], []
for seed in (0, 1):
  p = jax.device_put(t._params(seed), on_clients)
  want, got, fast = ref(p), auto(p), two(p)
  same.append(all(np.array_equal(want[k], got[k]) for k in want))
  close.append(all(np.allclose(want[k], fast[k], rtol=1e-6, atol=1e-7) for k in want))
print(json.dumps({'devices': jax.local_device_count(), 'two': two.devices,
                  'shards': len(two._packed[2]['x'].sharding.device_set), 'same': same, 'close': close,
                  'candidates': sorted(auto.layout_check['same_bits'])}))
"""


def test_two_host_devices_split_the_batches_and_auto_keeps_the_reference_bits():
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=2', 'JAX_PLATFORMS': 'cpu',
         'PYTHONPATH': REPO}
  out = subprocess.run([sys.executable, '-c', _TWO_DEVICES], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  res = json.loads(out.stdout.strip().splitlines()[-1])
  assert res['devices'] == 2 and res['two'] == 2 and res['shards'] == 2
  assert res['candidates'] == ['batches1', 'batches2']
  assert res['same'] == [True, True] and res['close'] == [True, True]


def test_bad_layout_is_refused():
  with pytest.raises(ValueError, match="layout='rows'"):
    ce.ClientEvalProgram(MODEL, _data(True), np.arange(2), seed=0, layout='rows')


def test_personal_models_are_each_clients_own_across_padded_chunks(monkeypatch):
  """personal=: client k's row is its own model's (a different init per client), beside the global model's."""
  monkeypatch.setattr(ce, 'CHUNK', 3)
  data = _data(own_split=True)
  own = {k: _params(10 + k) for k in range(7)}
  prog = ce.ClientEvalProgram(MODEL, data, np.arange(7), seed=0, batch_size=2)
  asked = []

  def personal(ids):
    asked.append(list(ids))
    return jax.tree_util.tree_map(lambda *a: np.stack(a), *[own[int(k)] for k in ids])
  res = prog(_params(), personal=personal)
  assert asked == [[0, 1, 2], [3, 4, 5], [6, 6, 6]]       # the last chunk's padding repeats its first client
  for k in range(7):
    acc, loss = _by_hand(own[k], *data.client_test_examples(k))
    assert res['personal_acc'][k] == pytest.approx(acc, abs=1e-6)
    assert res['personal_loss'][k] == pytest.approx(loss, rel=1e-5)
  assert 'personal_acc' not in prog(_params())


def test_label_matched_examples_carry_each_clients_training_label_counts():
  data = _data(own_split=False)
  sets, source = ce.client_eval_sets(data, [0, 1, 2, 3], seed=3)
  assert source == 'label_matched'
  for k, (x, y) in zip([0, 1, 2, 3], sets):
    train_y = data.client_examples(k)[1]
    want = np.bincount(train_y, minlength=C)
    assert np.array_equal(np.bincount(y, minlength=C), want)
    tx, ty = data.test_examples()
    # each drawn example is a real test example of that label
    for xi, yi in zip(x, y):
      assert any(np.array_equal(xi, t) and yi == l for t, l in zip(tx, ty))
  again, _ = ce.client_eval_sets(data, [0, 1, 2, 3], seed=3)
  assert all(np.array_equal(a[0], b[0]) for a, b in zip(sets, again))


def test_the_statistics_equal_numpy():
  a = np.array([0.2, 0.9, 0.55, 0.55, 1.0, 0.0, 0.35])
  got = ce.distribution(a)
  s = np.sort(a)
  n = len(a)
  gini = np.sum((2 * np.arange(1, n + 1) - n - 1) * s) / (n * s.sum())   # the sorted-rank form of the Gini
  want = {'acc_mean': a.mean(), 'acc_std': a.std(), 'acc_p10': np.percentile(a, 10), 'acc_p90': np.percentile(a, 90),
          'acc_worst': a.min(), 'acc_gini': gini}
  assert got.keys() == want.keys()
  for k in want:
    assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-15), k
  assert ce.distribution([0.5] * 4)['acc_gini'] == 0.0
  assert ce.distribution([0.0, 0.0])['acc_gini'] == 0.0


def test_the_sample_is_a_function_of_the_seed():
  a = ce.select_clients(10, 100, seed=7)
  assert np.array_equal(a, ce.select_clients(10, 100, seed=7))
  assert len(set(a.tolist())) == 10 and np.all(np.diff(a) > 0) and a.max() < 100
  assert not np.array_equal(a, ce.select_clients(10, 100, seed=8))
  assert np.array_equal(ce.select_clients(500, 100, seed=7), np.arange(100))     # capped at the population
  assert np.array_equal(ce.select_clients('all', 5, seed=0), np.arange(5))


def test_personalize_steps_equal_k_manual_sgd_steps():
  data, params = _data(own_split=True), _params()
  cfg = default_config().client
  cfg.lr, cfg.batch_size = 0.3, 4
  k = 3
  prog = ce.ClientEvalProgram(MODEL, data, [1, 3], seed=5, batch_size=8, steps=k, client_cfg=cfg)
  res = prog(params)
  tb = ce.finetune_batches(data, [3], k, 4, seed=5)          # client 3's fine-tuning batches

  def loss(p, xb, yb):
    logp = jax.nn.log_softmax(MODEL.apply(p, xb, train=False))
    return -jnp.mean(logp[jnp.arange(len(yb)), yb])
  p = params
  for s in range(k):
    g = jax.grad(loss)(p, jnp.asarray(tb['x'][0, s]), jnp.asarray(tb['y'][0, s]))
    p = jax.tree_util.tree_map(lambda w, gw: w - 0.3 * gw, p, g)
  acc, lss = _by_hand(p, *data.client_test_examples(3))
  assert res['ft_acc'][1] == pytest.approx(acc, abs=1e-6)
  assert res['ft_loss'][1] == pytest.approx(lss, rel=1e-4)
  assert res['acc'][1] == pytest.approx(_by_hand(params, *data.client_test_examples(3))[0], abs=1e-6)


@pytest.mark.parametrize('over, field', [
    ({'client_eval.clients': 0}, 'client_eval.clients=0'),
    ({'client_eval.clients': 'some'}, "client_eval.clients='some'"),
    ({'client_eval.clients': 'all', 'client_eval.every': -1}, 'client_eval.every=-1'),
    ({'client_eval.clients': 'all', 'client_eval.personalize_steps': -2}, 'client_eval.personalize_steps=-2'),
    ({'client_eval.personalize_steps': 2}, 'client_eval.personalize_steps=2'),     # with the feature off
])
def test_bad_values_are_one_config_error_line(over, field):
  c = default_config()
  for key, v in over.items():
    c.client_eval[key.split('.')[1]] = v
  with pytest.raises(ConfigError) as e:
    validate_config(c)
  msg = str(e.value)
  assert field in msg and '\n' not in msg


def test_a_dataset_without_client_splits_or_class_labels_is_refused_when_the_run_is_built():
  """Before anything compiles (the recorder runs the plug-in's check when the trainer is built)."""
  dense = types.SimpleNamespace(name='seg',
                                test_examples=lambda: (np.zeros((4, 2, 2)), np.zeros((4, 2, 2), np.int32)))
  with pytest.raises(ConfigError, match=r'client_eval\.clients.*not class ids'):
    ce.check_data(dense)
  labels = types.SimpleNamespace(name='ok', test_examples=lambda: (np.zeros((4, 2)), np.arange(4)))
  ce.check_data(labels)     # class ids: label-matched examples serve
