"""The front door: `fedjax_flat.train(algorithm object or name, config)` and the composition helpers."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_flat as ff
from fedjax_flat.algorithms import registry
from fedjax_flat.errors import BadInputError, ConfigError
from fedjax_flat.registry import DuplicateName
from tests.fixtures.configs import small_config


def _bits(tree):
  return [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)]


def plain_fedavg(ctx):
  """FedAvg written as a user would, through the public face only."""
  return ff.fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)


@pytest.fixture(scope='module')
def by_name():
  return ff.train('fedavg', small_config())


def test_an_unregistered_builder_runs_as_the_registered_algorithm_it_equals_and_stays_unregistered(by_name):
  before = registry.names()
  mine = ff.train(plain_fedavg, small_config())
  assert mine.trainer.config.algorithm == 'plain_fedavg'          # the run names it by its function name
  assert registry.names() == before and registry.name_of(plain_fedavg) is None   # the registry is unchanged
  assert _bits(mine.params) == _bits(by_name.params)              # the same rounds, bit for bit
  assert mine.summary['final_test_accuracy'] == by_name.summary['final_test_accuracy']
  assert [r['round'] for r in mine.records] == [2, 4]
  assert mine.model is mine.trainer.model and mine.data.num_clients == by_name.data.num_clients


def test_a_failed_run_of_an_unregistered_builder_leaves_the_registry_unchanged():
  before = registry.names()
  with pytest.raises(ConfigError, match='clients_per_round'):
    ff.train(plain_fedavg, small_config(clients_per_round=0))
  assert registry.names() == before


def test_a_builder_whose_name_is_taken_by_another_definition_is_refused():
  def fedprox(ctx):       # shadows the built-in name
    return plain_fedavg(ctx)
  with pytest.raises(DuplicateName, match="'fedprox' is already registered"):
    ff.train(fedprox, small_config())


def test_a_builder_that_returns_none_is_one_line(tmp_path):
  """Issue 48: a builder that forgot its `return` failed 10 frames deep with AttributeError; now one line naming
  the builder and what it must return (and, with a workdir, nothing is left behind)."""
  def forgot_return(ctx):
    plain_fedavg(ctx)
  try:
    for wd in (None, str(tmp_path / 'w')):
      with pytest.raises(BadInputError) as e:
        ff.train(forgot_return, small_config(), workdir=wd)
      msg = str(e.value)
      assert '\n' not in msg and 'forgot_return' in msg and 'returned None' in msg, msg
      assert 'must return a FederatedAlgorithm' in msg
    assert not os.path.exists(tmp_path / 'w')
  finally:
    registry.ALGORITHMS._entries.pop('forgot_return', None)


def test_bad_config_is_one_config_error_before_any_data():
  with pytest.raises(ConfigError, match='clients_per_round'):
    ff.train('fedavg', small_config(clients_per_round=0))


def test_with_a_workdir_it_is_the_binarys_run(tmp_path, by_name):
  r = ff.train('fedavg', small_config(), workdir=str(tmp_path))
  assert _bits(r.params) == _bits(by_name.params)
  with open(tmp_path / 'summary.json') as f:
    assert json.load(f)['final_test_accuracy'] == r.summary['final_test_accuracy']
  assert os.path.isdir(tmp_path / 'checkpoints')


def test_clip_by_global_norm_is_the_projection_onto_the_ball():
  t = {'a': jnp.array([3.0, 0.0]), 'b': jnp.array([[4.0]])}        # norm 5
  out = ff.clip_by_global_norm(t, 2.5)
  np.testing.assert_allclose(out['a'], [1.5, 0.0], rtol=1e-6)
  np.testing.assert_allclose(out['b'], [[2.0]], rtol=1e-6)
  np.testing.assert_array_equal(ff.clip_by_global_norm(t, 10.0)['a'], t['a'])     # inside the ball: unchanged
  zero = ff.clip_by_global_norm({'a': jnp.zeros(3)}, 1.0)['a']
  assert np.all(np.isfinite(zero)) and not np.any(zero)


def test_map_upload_changes_only_the_upload():
  def builder(ctx):
    base = plain_fedavg(ctx)
    return ff.map_upload(base, lambda bcast, out: {**out, 'weighted': jax.tree_util.tree_map(jnp.zeros_like,
                                                                                               out['weighted'])})
  try:
    r = ff.train(builder, small_config(rounds=2, eval_every=2))
    init = r.trainer.model.init(jax.random.fold_in(jax.random.key(0), 0),
                                jnp.zeros((1,) + tuple(r.data.input_shape), jnp.float32))
    # zero uploads: the server's pseudo-gradient is zero, so the model never leaves its initial point
    assert _bits(r.params) == _bits(init)
  finally:
    registry.ALGORITHMS._entries.pop('builder', None)


def test_outputs_name_the_given_datas_own_name_not_config_dataset(tmp_path, monkeypatch):
  # Issue 48: ff.train(data=...) labelled summary.json, summary.md and metrics.png with config.dataset.
  import dataclasses

  from fedjax_flat.data.sources.builtin import synthetic
  from fedjax_flat.training import recorder
  data = dataclasses.replace(synthetic(8, [6] * 8, input_shape=(4, 4, 1), num_classes=4, seed=3), name='my_clinics')
  titles = []
  real = recorder.plot_title
  monkeypatch.setattr(recorder, 'plot_title', lambda *a, **k: titles.append(real(*a, **k)) or titles[-1])
  r = ff.train('fedavg', small_config(rounds=2), workdir=str(tmp_path), data=data)
  assert r.summary['dataset'] == 'my_clinics'
  assert json.load(open(tmp_path / 'summary.json'))['dataset'] == 'my_clinics'
  assert 'dataset `my_clinics`' in open(tmp_path / 'summary.md').read()
  assert titles == ['fedavg (sgd clients) on my_clinics']
  assert ff.train('fedavg', small_config(rounds=2)).summary['dataset'] == 'synthetic'   # loaded: config.dataset
