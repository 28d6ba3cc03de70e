"""pfl-research's CIFAR10 protocol (configs/pfl_cifar10.py): its CNN against a numpy forward and the reference's
parameter count, dropout keys, uniform (per-user) aggregation against the formula, the random partition, and
the config trained for 2 rounds on generated official-format CIFAR10 files."""
import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import registry as alg_registry
from fedjax_flat.config import families as config_strings
from fedjax_flat.config import validate
from fedjax_flat.config.default_config import default_config
from fedjax_flat.core import engine
from fedjax_flat.data import batching
from fedjax_flat.data.sources import cifar
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.errors import ConfigError
from fedjax_flat.models.registry import get_model
from fedjax_flat.training import run as run_lib
from tests.fixtures.data_files import make_cifar10
from tests.fixtures.paths import REPO


def _dense(i, o):
  return i * o + o


def _init(shape=(32, 32, 3), **kw):
  m = get_model('pfl_cnn', 10, shape, **kw)
  return m, jax.jit(m.init)(jax.random.key(0), jnp.zeros((1,) + shape, jnp.float32))


def test_pfl_cnn_parameter_count_is_the_references():
  # simple_cnn: Conv2d(3, 32, 3), Conv2d(32, 64, 3) (VALID: 32 -> 30 -> 28), pool -> 14x14x64, fc 128, fc 10.
  want = (9 * 3 * 32 + 32) + (9 * 32 * 64 + 64) + _dense(14 * 14 * 64, 128) + _dense(128, 10)
  assert want == 1_626_442
  m = get_model('pfl_cnn', 10, (32, 32, 3))
  p = jax.eval_shape(m.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  assert sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(p)) == want
  assert p['Dense_0']['kernel'].shape == (12544, 128)


def _np_conv_valid(x, k, b):
  """Cross-correlation, VALID, NHWC x HWIO (what flax and torch compute), in float64."""
  kh, kw = k.shape[:2]
  h, w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
  out = np.zeros((x.shape[0], h, w, k.shape[3]))
  for i in range(kh):
    for j in range(kw):
      out += np.einsum('nhwc,co->nhwo', x[:, i:i + h, j:j + w, :], k[i, j])
  return out + b


def _np_forward(p, x):
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), p)
  relu = lambda v: np.maximum(v, 0)  # noqa: E731
  v = relu(_np_conv_valid(x, p['Conv_0']['kernel'], p['Conv_0']['bias']))
  v = relu(_np_conv_valid(v, p['Conv_1']['kernel'], p['Conv_1']['bias']))
  n, h, w, c = v.shape
  v = v.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))
  v = relu(v.reshape(n, -1) @ p['Dense_0']['kernel'] + p['Dense_0']['bias'])
  return v @ p['Dense_1']['kernel'] + p['Dense_1']['bias']


@pytest.mark.parametrize('conv_impl', ['im2col', 'lax'])
def test_pfl_cnn_forward_equals_numpy(conv_impl):
  m, p = _init(conv_impl=conv_impl)
  rng = np.random.default_rng(0)
  # Non-zero biases so that their place in the computation is checked too.
  p = jax.tree_util.tree_map(lambda a: a + 0.05 * rng.standard_normal(a.shape).astype(np.float32), p)
  x = rng.standard_normal((2, 32, 32, 3)).astype(np.float32)
  got = np.asarray(jax.jit(lambda p, x: m.apply(p, x))(p, x))
  np.testing.assert_allclose(got, _np_forward(p, x.astype(np.float64)), rtol=1e-4, atol=1e-4)


def test_pfl_cnn_init_is_glorot_uniform_with_zero_biases():
  _, p = _init()
  for name, (fan_in, fan_out) in {'Conv_0': (27, 288), 'Conv_1': (288, 576), 'Dense_0': (12544, 128),
                                  'Dense_1': (128, 10)}.items():
    k, limit = np.asarray(p[name]['kernel']), np.sqrt(6.0 / (fan_in + fan_out))
    assert np.abs(k).max() <= limit
    assert abs(k.std() - limit / np.sqrt(3)) < 0.1 * limit / np.sqrt(3)   # U(-l, l) has std l / sqrt(3)
    np.testing.assert_array_equal(np.asarray(p[name]['bias']), 0)


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_pfl_cnn_dropout_draws_from_the_step_key():
  m, p = _init((8, 8, 3))
  x = jax.random.uniform(jax.random.key(1), (4, 8, 8, 3))
  run = jax.jit(lambda p, x, k, train: m.apply(p, x, train=train, rng=k), static_argnums=3)
  a = run(p, x, jax.random.key(2), True)
  np.testing.assert_array_equal(a, run(p, x, jax.random.key(2), True))
  assert not np.allclose(a, run(p, x, jax.random.key(3), True))
  np.testing.assert_array_equal(run(p, x, jax.random.key(2), False), run(p, x, jax.random.key(3), False))
  # Without dropout, training mode is the evaluation function.
  m0, _ = _init((8, 8, 3), dropout=False)
  np.testing.assert_allclose(jax.jit(lambda p, x, k: m0.apply(p, x, train=True, rng=k))(p, x, jax.random.key(2)),
                             run(p, x, jax.random.key(3), False), rtol=1e-6)


# --- server.weighting: every sampled client counts once ('uniform') or N_k times ('examples'). ---

def _ce(model, p, x, y):
  logits = model.apply(p, x)
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


# slow [*-sequential], [*-chunked]: the client weights enter the same accumulation in every strategy; the default
# suite covers the weighting by [*-vmap] and the strategies' agreement by
# tests/core/test_engine.py::test_strategies_agree
@pytest.mark.parametrize('strategy', [pytest.param('sequential', marks=pytest.mark.slow), 'vmap',
                                      pytest.param('chunked', marks=pytest.mark.slow)])
@pytest.mark.parametrize('weighting', ['uniform', 'examples'])
def test_weighting_is_the_formula(strategy, weighting):
  """One full-batch SGD step per client, server SGD lr 0.5: w' = w - 0.5 sum_k a_k (w - w_k), with
  w_k = w - lr grad L_k(w) and a_k = 1/|C| (uniform) or N_k / N (examples); a padding client counts 0."""
  sizes, shape, lr, lr_s = [2, 5, 9], (3, 2, 1), 0.3, 0.5
  data = synthetic(3, sizes, input_shape=shape, num_classes=3, seed=1)
  c = default_config()
  c.model, c.client.lr, c.client.weight_decay, c.client.batch_size = 'mlp', lr, 0.0, 9
  c.server.lr, c.server.weighting = lr_s, weighting
  c.engine.strategy, c.engine.clients_per_chunk = strategy, 2
  validate.validate_config(c)
  model = get_model('mlp', 3, shape, hidden=(4,))
  params = model.init(jax.random.key(0), jnp.zeros((1,) + shape))
  alg = alg_registry.build_algorithm(c, model)
  assert alg.client_weighting == weighting
  cohort = engine.padded_cohort(strategy, 3, 2)          # chunked: 4, one masked padding client
  rb = batching.make_round_batches(data, [0, 1, 2], round_idx=0, seed=0, batch_size=9, num_steps=1,
                                   pad_clients_to=cohort)
  fn = engine.make_round_fn(alg, chunk=engine.chunk_size(strategy, cohort, 2), donate=False)
  rngs = jax.vmap(lambda k: jax.random.fold_in(jax.random.key(1), k))(jnp.arange(cohort))
  got = fn(alg.server_init(params, None), rb.as_dict(), None, rngs, rb.num_examples, rb.client_ids >= 0, 0)[0]

  a = np.full(3, 1 / 3) if weighting == 'uniform' else np.asarray(sizes) / sum(sizes)
  deltas = []
  for k in range(3):
    idx = data.client_indices(k)
    g = jax.grad(lambda p: _ce(model, p, jnp.asarray(data.x[idx]), jnp.asarray(data.y[idx])))(params)
    deltas.append(jax.tree_util.tree_map(lambda gi: lr * gi, g))                     # w - w_k
  want = jax.tree_util.tree_map(lambda w, *d: w - lr_s * sum(ak * dk for ak, dk in zip(a, d)), params, *deltas)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(got['params']), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=str(path))


def test_weighting_is_validated():
  c = default_config()
  c.server.weighting = 'median'
  with pytest.raises(ConfigError, match='server.weighting') as e:
    validate.validate_config(c)
  assert "'examples', 'uniform'" in str(e.value)
  c = default_config()
  c.algorithm, c.server.weighting = 'fedseq', 'uniform'
  with pytest.raises(ConfigError, match="server.weighting.*use 'examples'"):
    validate.validate_config(c)


# --- data.partition='random': pfl-research's IID users. ---

def test_random_split_is_one_permutation_cut_in_runs():
  parts = cifar.random_split(1000, 7, 50, seed=3)
  perm = np.random.default_rng(3).permutation(1000)
  assert [len(p) for p in parts] == [50] * 7
  np.testing.assert_array_equal(np.concatenate(parts), perm[:350])
  assert len(np.unique(np.concatenate(parts))) == 350
  with pytest.raises(ValueError, match='1000 \\* 50 = 50000 exceeds the 49999'):
    cifar.random_split(49999, 1000, 50, seed=0)


def test_random_partition_is_saved_and_reused(tmp_path):
  arrays = make_cifar10(str(tmp_path / 'data'), per_batch=20, n_test=10)
  arrays = {**arrays, 'num_classes': 10}
  kw = dict(data_dir=str(tmp_path / 'data'), num_clients=5, examples_per_client=20, seed=1, partition='random')
  ds = cifar.federate('cifar10', arrays, **kw)
  path = tmp_path / 'data' / 'splits' / 'cifar10_random_clients5_epc20_seed1.npz'
  assert path.exists()
  perm = np.random.default_rng(1).permutation(100)
  for k in range(5):
    np.testing.assert_array_equal(ds.client_indices(k), perm[20 * k:20 * (k + 1)])
  again = cifar.federate('cifar10', arrays, **kw)
  np.testing.assert_array_equal(again.client_index, ds.client_index)
  with pytest.raises(ValueError, match="partition='sorted'"):
    cifar.federate('cifar10', arrays, **{**kw, 'partition': 'sorted'})


def test_partition_field_is_checked_before_loading():
  c = config_strings.load_config(os.path.join(REPO, 'configs', 'pfl_cifar10.py'))
  validate.validate_config(c)
  c.data.partition = 'sorted'
  with pytest.raises(ConfigError, match="data.partition.*allows \\['dirichlet', 'random'\\]"):
    validate.validate_config(c)


# --- The config. ---

def test_config_is_the_protocol():
  c = config_strings.load_config(os.path.join(REPO, 'configs', 'pfl_cifar10.py'))
  validate.validate_config(c)
  assert (c.dataset, c.data.partition, c.data.num_clients, c.data.examples_per_client) == ('cifar10', 'random',
                                                                                          1000, 50)
  assert (c.model, c.algorithm, c.clients_per_round, c.rounds, c.eval_every) == ('pfl_cnn', 'fedavg', 50, 1500, 10)
  assert (c.client.optimizer, c.client.lr, c.client.momentum, c.client.weight_decay) == ('sgd', 0.1, 0.0, 0.0)
  assert (c.client.batch_size, c.client.local_epochs, c.client.local_steps) == (10, 1, 0)
  assert (c.server.optimizer, c.server.lr, c.server.weighting) == ('sgd', 1.0, 'uniform')
  assert batching.padded_num_steps([50] * 1000, c.client.batch_size) == 5


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_config_trains_two_rounds_on_official_files(tmp_path):
  make_cifar10(str(tmp_path / 'data'), per_batch=100, n_test=20)      # 500 training images
  c = config_strings.load_config(os.path.join(REPO, 'configs', 'pfl_cifar10.py'))
  c.data.data_dir = str(tmp_path / 'data')
  c.data.num_clients = 10                         # 10 users x 50, B=10: the protocol's 5 steps per client
  c.data.check_official_sizes = False
  c.clients_per_round, c.rounds, c.eval_every, c.summary_last_k = 5, 2, 1, 1
  c.eval_batch_size, c.progress_every_s = 16, 1e9
  wd = str(tmp_path / 'run')
  s = run_lib.run(c, wd)
  assert s['dataset'] == 'cifar10' and s['model'] == 'pfl_cnn' and s['rounds_completed'] == 2
  assert s['num_params'] == 1_626_442
  recs = [json.loads(line) for line in open(os.path.join(wd, 'metrics.jsonl'))]
  assert [r['round'] for r in recs] == [1, 2] and all(np.isfinite(r['test_loss']) for r in recs)
  assert (tmp_path / 'data' / 'splits' / 'cifar10_random_clients10_epc50_seed0.npz').exists()
  assert json.load(open(os.path.join(wd, 'config.json')))['server']['weighting'] == 'uniform'


@pytest.mark.slow
def test_benchmark_script_smoke(tmp_path):
  """benchmarks/speed/pfl_cifar10.py --smoke end to end: a trainer row, an engine row, the 2-device subprocess and
  the torch peer (when installed), the JSON's ratios from its own medians, the Markdown table."""
  has_torch = importlib.util.find_spec('torch') is not None
  variants = 'trainer,engine_sequential,ours_Ndev' + (',torch' if has_torch else '')
  out = tmp_path / 'pfl'
  proc = subprocess.run([sys.executable, '-m', 'benchmarks.speed.pfl_cifar10', '--smoke',
                         '--conv_impl=lax', f'--variants={variants}', '--peers=' + ('torch' if has_torch else 'none'),
                         f'--out={out}'], capture_output=True, text=True, cwd=REPO, timeout=1200)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads((tmp_path / 'pfl.json').read_text())
  md = (tmp_path / 'pfl.md').read_text()
  want = ['trainer', 'engine_sequential', 'ours_2dev'] + (['torch'] if has_torch else [])
  assert list(res['rows']) == want and res['smoke'] and (res['users'], res['cohort']) == (40, 4)
  for v, r in res['rows'].items():
    assert 'error' not in r, (v, r)
    assert r['s_per_round'] == sorted(r['s_per_round_all'])[len(r['s_per_round_all']) // 2]
    assert abs(r['examples_per_s'] - 80 / r['s_per_round']) < 1e-6 * r['examples_per_s']
    assert abs(r['wall_1500_s'] - 1500 * r['s_per_round']) < 1e-9 * r['wall_1500_s']
    if has_torch:
      assert abs(r['x_torch'] - res['rows']['torch']['s_per_round'] / r['s_per_round']) < 1e-12
    assert f'| {v} |' in md
  assert '2 host devices' in res['rows']['ours_2dev']['note']
  assert res['rows']['trainer']['wall_1500_with_eval_s'] > res['rows']['trainer']['wall_1500_s']


def test_benchmark_trainer_times_training_rounds_only():
  """The benchmark's trainer rows leave evaluation out of every timed `train(num_rounds=K)` call (the recorder
  evaluates at the end of each call: patching `Trainer.evaluate` once left a test-set pass in every call);
  the evaluation stays callable beside (eval_s)."""
  from benchmarks.speed import pfl_cifar10 as bench
  c = bench.protocol_config(True, conv_impl='lax')
  prob = bench.TrainerProblem(c, bench.make_data(c, True), 2)
  prob.round()
  prob.round()
  assert prob.t.round == 4 and prob.t.records            # each call ends on an evaluation round ...
  assert all('test_accuracy' not in r and 'train_loss' in r for r in prob.t.records)   # ... left out
  res = prob.evaluate()
  assert 0.0 <= res['test_accuracy'] <= 1.0 and np.isfinite(res['test_loss'])


def test_round_profile_self_times_and_categories(tmp_path):
  """benchmarks/speed/pfl_round_profile.py: a thunk's self time leaves out the thunks nested in it (per thread),
  Python threads are left out; ops are put in categories by their HLO name and jax op name."""
  import gzip
  from benchmarks.speed import pfl_round_profile as prof
  ev = [{'ph': 'M', 'name': 'thread_name', 'pid': 1, 'tid': t, 'args': {'name': n}}
        for t, n in ((1, 'python'), (2, 'tf_XLAEigen/1'), (3, 'tf_XLAEigen/2'))]
  ev += [{'ph': 'X', 'pid': 1, 'tid': 1, 'name': 'train', 'ts': 0, 'dur': 1000},
         {'ph': 'X', 'pid': 1, 'tid': 2, 'name': 'while.1', 'ts': 0, 'dur': 100},
         {'ph': 'X', 'pid': 1, 'tid': 2, 'name': 'ynn_fusion', 'ts': 10, 'dur': 30},
         {'ph': 'X', 'pid': 1, 'tid': 2, 'name': 'copy.3', 'ts': 50, 'dur': 20},
         {'ph': 'X', 'pid': 1, 'tid': 3, 'name': 'ynn_fusion', 'ts': 5, 'dur': 7}]
  d = tmp_path / 'plugins' / 'profile' / 'x'
  d.mkdir(parents=True)
  with gzip.open(d / 'perfetto_trace.json.gz', 'wt') as f:
    json.dump({'traceEvents': ev}, f)
  selft, count = prof.self_times(str(tmp_path))
  assert dict(selft) == {'while.1': 50, 'ynn_fusion': 37, 'copy.3': 20} and count['ynn_fusion'] == 2
  step = 'jit(block)/while/body/closed_call/cond/branch_1_fun/'
  assert prof.category('ynn_fusion.4', '') == 'GEMM'
  assert prof.category('broadcast_add_fusion', step + 'vmap(jvp(PflCNN))/Dropout_0/jit(_bernoulli)/add') == \
      'dropout mask'
  assert prof.category('add_bitcast_fusion.2', step + 'vmap()/add') == 'parameter update'
  assert prof.category('add_select_fusion', step + 'vmap(transpose(vmap(jvp(PflCNN))))/select_n') == \
      'backward (elementwise)'
  assert prof.category('concatenate.14', step + 'vmap(jvp(PflCNN))/Conv_1/concatenate') == \
      'forward (elementwise, im2col)'
  assert prof.category('ThunkExecutor::Execute', '') == 'thunk runtime'
  assert prof.category('multiply_add_fusion.2', 'jit(block)/while/body/closed_call/add').startswith('other')
