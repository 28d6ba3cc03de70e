"""Grouping passes on the engine (fedjax_flat/grouping/pretrain.py, superclients.py): equal to a per-client
Python loop, cached and reused, one compiled program for every block, Task2Vec probe handling."""
import json
import logging as pylogging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_flat.algorithms import local as local_lib
from fedjax_flat.core import engine
from fedjax_flat.data import batching
from fedjax_flat.data.sources import builtin
from fedjax_flat.grouping import estimators, pretrain
from fedjax_flat.grouping import superclients as sc
from fedjax_flat.models import pretrained
from fedjax_flat.optimizers.client import make_client_tx
from fedjax_flat.config.default_config import default_config
from fedjax_flat.training import init as init_lib

SIZES = [7, 3, 12, 5, 9, 1]


def _config():
  c = default_config()
  c.dataset = 'synthetic'
  c.model = 'mlp'
  c.model_kwargs.hidden = (6,)
  c.client.optimizer = 'sam'          # the passes turn SAM off
  c.client.lr = 0.1
  c.client.momentum = 0.5
  c.client.weight_decay = 1e-3
  c.client.batch_size = 4
  c.grouping.pretrain_epochs = 2
  c.grouping.public_per_class = 3
  c.grouping.min_examples = 10
  c.grouping.max_clients = 3
  c.grouping.seed = 7
  return c


@pytest.fixture(scope='module')
def ctx():
  data = builtin.synthetic(len(SIZES), SIZES, input_shape=(4,), num_classes=3, test_size=30, alpha=None, seed=1)
  return sc.GroupingContext.from_config(_config(), data)


def _loop_train(config, model, data, params0, summarize, trainable=None, ccfg=None):
  """Reference: each client alone, step by step, with the same batches (the engine's batching)."""
  g = config.grouping
  ccfg = ccfg or pretrain.plain_client_cfg(config.client, g.pretrain_lr)
  sizes = data.client_sizes()
  b = ccfg.batch_size
  steps = batching.padded_num_steps(sizes, b, epochs=g.pretrain_epochs)
  plan = batching.batch_plan(sizes, batch_size=b, num_steps=steps, epochs=g.pretrain_epochs, shuffle=True)
  hp = pretrain.hparams(ccfg)
  tx = make_client_tx(ccfg, hp)
  loss = local_lib.make_loss(model)
  out = []

  @jax.jit
  def step(local, batch):
    new, _ = local_lib.local_step(local, batch, None, loss_fn=loss, tx=tx)
    if trainable is not None:        # only these leaves change
      new = new._replace(params=estimators.merge(local.params, estimators.subtree(new.params, trainable)))
    return new

  for k in range(data.num_clients):
    rb = batching.make_round_batches(data, [k], round_idx=pretrain.STREAM_ROUND, seed=g.seed, batch_size=b,
                                     num_steps=steps, epochs=g.pretrain_epochs, plan=plan)
    local = local_lib.LocalState(params0, tx.init(params0), params0)
    for s in range(steps):
      if rb.mask[0, s].sum() == 0:
        continue
      batch = {'x': jnp.asarray(rb.x[0, s]), 'y': jnp.asarray(rb.y[0, s]), 'mask': jnp.asarray(rb.mask[0, s])}
      local = step(local, batch)
    out.append(summarize(local.params))
  return out


def test_pretraining_equals_a_per_client_python_loop(ctx):
  config = _config()
  params0 = sc.initial_params(config, ctx.model, ctx.data)
  got = sc.pretrain_outputs(config, ctx.model, ctx.data, params0, workdir=None)
  tx, ty = ctx.data.test_examples()
  pub = estimators.public_set(ty, 3, 3, seed=7)
  ckey = pretrained.find_classifier_key(params0, 3)

  def summarize(p):
    return (np.asarray(estimators.classifier_vector(p, ckey)),
            np.asarray(estimators.confidence_vector(ctx.model.apply(p, jnp.asarray(tx[pub])), jnp.asarray(ty[pub]), 3)))
  ref = _loop_train(config, ctx.model, ctx.data, params0, summarize)
  np.testing.assert_allclose(got['clf'], np.stack([r[0] for r in ref]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got['conf'], np.stack([r[1] for r in ref]), rtol=1e-5, atol=1e-6)
  # Trained: every client moved away from w_0 (client 5 has one example and one step per epoch).
  w0 = np.asarray(estimators.classifier_vector(params0, ckey))
  assert np.all(np.abs(got['clf'] - w0).max(axis=1) > 1e-4)


def test_one_compiled_program_for_blocks_of_unequal_clients(ctx, monkeypatch):
  config = _config()
  params0 = sc.initial_params(config, ctx.model, ctx.data)
  traces = []
  real = engine.run_clients
  monkeypatch.setattr(engine, 'run_clients', lambda *a, **k: traces.append(1) or real(*a, **k))
  ccfg = pretrain.plain_client_cfg(config.client)
  alg = pretrain.training_algorithm(ctx.model, ccfg, lambda p: estimators.classifier_vector(p, 'Dense_1'))
  bcast = {'params': params0, 'hparams': pretrain.hparams(ccfg)}
  kw = dict(batch_size=4, epochs=2, seed=7, strategy='sequential')
  whole = pretrain.run_pass(alg, bcast, ctx.data, block=len(SIZES), **kw)
  n_whole = len(traces)
  blocks = pretrain.run_pass(alg, bcast, ctx.data, block=2, **kw)      # 3 blocks of other client sizes
  assert len(traces) - n_whole == n_whole                              # traced for one program only
  np.testing.assert_allclose(blocks, whole, rtol=1e-6, atol=1e-7)
  vm = pretrain.run_pass(alg, bcast, ctx.data, block=4, **{**kw, 'strategy': 'vmap'})
  np.testing.assert_allclose(vm, whole, rtol=1e-5, atol=1e-6)


def _counting(monkeypatch):
  calls = []
  real = pretrain.run_pass
  monkeypatch.setattr(pretrain, 'run_pass', lambda *a, **k: calls.append(k.get('label')) or real(*a, **k))
  return calls


def test_cache_is_reused_by_regrouping_and_resumes(ctx, tmp_path, monkeypatch):
  calls = _counting(monkeypatch)
  config = _config()
  config.grouping.method = 'greedy'
  config.grouping.estimator = 'conf'
  wd = str(tmp_path)
  first = sc.build_superclients(config, ctx, wd)
  assert calls == ['pre-training']
  again = sc.build_superclients(config, ctx, wd)                      # a resumed run: no training
  assert calls == ['pre-training']
  assert [g.tolist() for g in again] == [g.tolist() for g in first]
  # Another grouper / distance / estimator of the same pass, or FedSeq2Par's regrouping: still none.
  config.grouping.method, config.grouping.estimator = 'kmeans', 'clf'
  grown = sc.build_superclients(config, ctx, wd, num_superclients=3)
  assert calls == ['pre-training'] and len(grown) == 3
  rec = json.load(open(os.path.join(wd, 'grouping', 'superclients-n3.json')))
  assert rec['groups'] == [g.tolist() for g in grown] and rec['summary']['each_client_once']
  assert os.path.exists(os.path.join(wd, 'grouping', 'superclients.json'))
  # What determines the result changes: computed again (and cached beside the first).
  config.grouping.pretrain_epochs = 3
  sc.build_superclients(config, ctx, wd)
  assert calls == ['pre-training'] * 2
  files = sorted(f for f in os.listdir(os.path.join(wd, 'grouping')) if f.endswith('.npz'))
  assert len(files) == 2
  spec = json.load(open(os.path.join(wd, 'grouping', files[0][:-4] + '.json')))
  assert spec['procedure'] == pretrain.PROCEDURE and spec['kind'] == 'pretrain'


def test_without_a_workdir_regroupings_reuse_the_passes_in_memory(ctx, monkeypatch):
  calls = _counting(monkeypatch)
  config = _config()
  config.grouping.method, config.grouping.estimator = 'icg', 'conf'
  config.grouping.seed = 11                       # a key no other test computed in this process
  a = [sc.build_superclients(config, ctx, None, num_superclients=n) for n in (2, 3, 2)]
  assert calls == ['pre-training'] and [len(g) for g in a] == [2, 3, 2]
  assert [g.tolist() for g in a[0]] == [g.tolist() for g in a[2]]


def test_a_corrupt_cache_file_is_recomputed(ctx, tmp_path, monkeypatch, caplog):
  calls = _counting(monkeypatch)
  config = _config()
  config.grouping.method = 'icg'
  wd = str(tmp_path)
  first = sc.build_superclients(config, ctx, wd)
  path = [os.path.join(wd, 'grouping', f) for f in os.listdir(os.path.join(wd, 'grouping')) if f.endswith('.npz')][0]
  with open(path, 'wb') as f:
    f.write(b'not an npz')
  with caplog.at_level(pylogging.WARNING):
    second = sc.build_superclients(config, ctx, wd)
  assert 'recomputing' in caplog.text and len(calls) == 2
  assert [g.tolist() for g in second] == [g.tolist() for g in first]   # deterministic from the seed
  np.savez(path, clf=np.full((len(SIZES), 4), np.nan), conf=np.ones((len(SIZES), 3)))
  sc.build_superclients(config, ctx, wd)                                # non-finite: recomputed too
  assert len(calls) == 3


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_task2vec_pass_equals_direct_fisher_and_uses_the_probe_file(ctx, tmp_path, caplog):
  config = _config()
  config.grouping.estimator = 't2v'
  config.grouping.fisher = 'exact'
  with caplog.at_level(pylogging.WARNING):
    random_probe = sc.task2vec_outputs(config, ctx.data, None)['t2v']
  assert 'randomly initialized' in caplog.text
  model, params, source = sc.probe_network(config, ctx.data)
  assert source.startswith('random init')
  feat, clf = estimators.split_paths(params, 'Dense_1')
  # Direct: fine-tune the classifier per client (Python loop), then the Fisher over one epoch of batches.
  ccfg = pretrain.probe_client_cfg(config.client, config.grouping.probe_lr)
  assert (ccfg.base_optimizer, ccfg.lr, ccfg.weight_decay) == ('adam', 4e-4, 1e-4)   # Task2Vec's head fit
  heads = _loop_train(config, model, ctx.data, params, lambda p: estimators.subtree(p, clf), trainable=clf,
                      ccfg=ccfg)
  sizes = ctx.data.client_sizes()
  steps = batching.padded_num_steps(sizes, 4, epochs=1)
  plan = batching.batch_plan(sizes, batch_size=4, num_steps=steps, epochs=1, shuffle=True)
  apply_fn = lambda p, x: model.apply(p, x)
  fisher = jax.jit(lambda p, batch: estimators.fisher_sums(apply_fn, p, batch, jax.random.key(0),
                                                           feature_paths=feat, mode='exact'))
  for k in range(len(SIZES)):
    rb = batching.make_round_batches(ctx.data, [k], round_idx=pretrain.STREAM_ROUND, seed=7, batch_size=4,
                                     num_steps=steps, epochs=1, plan=plan)
    p = estimators.merge(params, heads[k])
    total, count = None, 0.0
    for s in range(steps):
      batch = {'x': jnp.asarray(rb.x[0, s]), 'y': jnp.asarray(rb.y[0, s]), 'mask': jnp.asarray(rb.mask[0, s])}
      sums, n = fisher(p, batch)
      total = sums if total is None else jax.tree_util.tree_map(jnp.add, total, sums)
      count += float(n)
    want = estimators.task2vec_vector({q: v / count for q, v in total.items()})
    np.testing.assert_allclose(random_probe[k], np.asarray(want), rtol=1e-4, atol=1e-9)
  # A pretrained probe, loaded with the pretrained loader: no warning, other embeddings, recorded source.
  other = model.init(jax.random.key(42), jnp.zeros((1, 4)))
  path = str(tmp_path / 'probe.npz')
  pretrained.save_params(path, other)
  config.grouping.probe_pretrained = path
  caplog.clear()
  with caplog.at_level(pylogging.WARNING):
    loaded = sc.task2vec_outputs(config, ctx.data, str(tmp_path))['t2v']
  assert 'randomly initialized' not in caplog.text
  assert not np.allclose(loaded, random_probe)
  _, lp, source = sc.probe_network(config, ctx.data)
  assert source == path
  np.testing.assert_array_equal(np.asarray(lp['Dense_0']['kernel']), np.asarray(other['Dense_0']['kernel']))
  # The head is always the fresh one (Task2Vec fits a new classifier), whatever the file holds there.
  np.testing.assert_array_equal(np.asarray(lp['Dense_1']['kernel']), np.asarray(params['Dense_1']['kernel']))
  spec = [f for f in os.listdir(tmp_path / 'grouping') if f.startswith('t2v') and f.endswith('.json')]
  assert json.load(open(tmp_path / 'grouping' / spec[0]))['probe_source'] == path


def test_probe_from_config_init_keeps_features_and_refits_the_head(ctx, tmp_path):
  config = _config()
  model = ctx.model
  src = model.init(jax.random.key(9), jnp.zeros((1, 4)))
  path = str(tmp_path / 'init.npz')
  pretrained.save_params(path, src)
  config.init.pretrained = path
  # grouping/ is pure: with config.init set, the training layer gives it w_0 (and the run loader).
  gctx = init_lib.grouping_context(config, ctx.data, model)
  _, params, source = sc.probe_network(config, ctx.data, gctx.params0)
  assert source == 'config.init'
  np.testing.assert_array_equal(np.asarray(params['Dense_0']['kernel']), np.asarray(src['Dense_0']['kernel']))
  assert not np.allclose(np.asarray(params['Dense_1']['kernel']), np.asarray(src['Dense_1']['kernel']))
  # The pre-training of clf / conf starts from exactly the Trainer's w_0: config.init's params.
  w0 = gctx.params0
  with pytest.raises(ValueError, match='config.init is set'):   # never a silently different w_0
    sc.initial_params(config, model, ctx.data)
  np.testing.assert_array_equal(np.asarray(w0['Dense_1']['kernel']), np.asarray(src['Dense_1']['kernel']))


@pytest.mark.slow   # long (CI time budget): run with `pytest -m slow`
def test_next_token_data_pretrain_on_the_task_loss_and_refuse_per_example_estimators(tmp_path):
  """A per-position task (next_token): clf groups with the task's loss (pad targets excluded); conf and t2v,
  which score one label per example, are a ConfigError naming grouping.estimator."""
  from fedjax_flat.tasks import next_token as text_tasks
  from fedjax_flat.data.federated import FederatedDataset
  from fedjax_flat.config import validate
  rng = np.random.default_rng(0)
  x = rng.integers(1, 12, size=(40, 6)).astype(np.int32)
  y = np.concatenate([x[:, 1:], np.zeros((40, 1), np.int32)], axis=1)      # last target is pad (0)
  data = FederatedDataset.from_client_indices(x, y, [np.arange(i * 10, i * 10 + 10) for i in range(4)], x[:8],
                                              y[:8], 12, name='tiny_text',
                                              task=text_tasks.NextToken(ignore_index=0))
  config = _config()
  config.model, config.model_kwargs = 'char_lstm', type(config.model_kwargs)({'embed': 4, 'hidden': 8,
                                                                              'num_layers': 1})
  config.grouping.method, config.grouping.estimator = 'kmeans', 'clf'
  config.grouping.pretrain_epochs, config.grouping.num_clusters = 1, 2
  ctx = sc.GroupingContext.from_config(config, data)
  groups = sc.build_superclients(config, ctx, str(tmp_path), num_superclients=2)
  assert sorted(np.concatenate(groups).tolist()) == [0, 1, 2, 3]
  params0 = sc.initial_params(config, ctx.model, data)
  pretrained.find_classifier_key(params0, 12)          # a 12-way head is found (raises otherwise)
  from fedjax_flat.tasks import base as tasks_lib
  got = sc.pretrain_outputs(config, ctx.model, data, params0, None)['clf']
  rec = json.load(open(tmp_path / 'grouping' / 'superclients-n2.json'))
  assert rec['summary']['examples']['mean'] == 20       # 2 clients x 10 sequences
  assert sum(r['classes'] for r in rec['superclients']) > 2  # token histograms (pad excluded)
  loss = local_lib.make_loss(ctx.model, task=tasks_lib.task_of(data))
  assert float(loss(params0, {'x': jnp.asarray(x[:2]), 'y': jnp.asarray(y[:2]), 'mask': jnp.ones(2)})[1][1]) == 10
  for est in ('conf', 't2v'):
    config.grouping.estimator = est
    with pytest.raises(validate.ConfigError, match='one label per example'):
      sc.build_superclients(config, ctx, None)
  assert got.shape[0] == 4 and np.all(np.isfinite(got))
