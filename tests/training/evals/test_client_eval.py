"""The client_eval plug-in (training/evals/client_eval.py) in a run: the records' distribution is the one of the
rows of clients.jsonl (recomputed with NumPy), the sampled clients are the seed's, `every` skips evaluation rounds,
and the summary, summary.md line and CDF plot are written."""
import json

import numpy as np
import pytest

from fedjax_flat.evaluation.client_eval import select_clients
from fedjax_flat.training import run as run_lib
from tests.fixtures.configs import small_config

N = 10


def _lines(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def _config(rounds=4):
  return small_config(**{'client_eval.clients': 6, 'client_eval.every': 4, 'client_eval.personalize_steps': 1,
                         'data.num_clients': N, 'seed': 3, 'rounds': rounds})


@pytest.fixture(scope='module')
def sampled_run(tmp_path_factory):
  wd = tmp_path_factory.mktemp('client_eval')
  return wd, run_lib.run(_config(), str(wd))


def test_records_carry_the_distribution_of_the_clients_rows(sampled_run):
  wd, summary = sampled_run
  recs = _lines(wd / 'metrics.jsonl')
  assert [r['round'] for r in recs] == [2, 4]
  assert 'clients_acc_mean' not in recs[0]            # every=4: the round-2 evaluation skips the clients
  rows = _lines(wd / 'clients.jsonl')
  assert {r['round'] for r in rows} == {4}
  assert [r['client'] for r in rows] == select_clients(6, N, 3).tolist()
  rec = recs[1]
  for prefix, key in (('clients_acc', 'acc'), ('clients_ft_acc', 'ft_acc')):
    a = np.array([r[key] for r in rows if r['n'] > 0])
    s = np.sort(a)
    gini = np.sum((2 * np.arange(1, len(s) + 1) - len(s) - 1) * s) / (len(s) * s.sum())
    assert rec[f'{prefix}_mean'] == pytest.approx(a.mean(), rel=1e-12)
    assert rec[f'{prefix}_std'] == pytest.approx(a.std(), rel=1e-12, abs=1e-15)
    assert rec[f'{prefix}_p10'] == pytest.approx(np.percentile(a, 10), rel=1e-12)
    assert rec[f'{prefix}_p90'] == pytest.approx(np.percentile(a, 90), rel=1e-12)
    assert rec[f'{prefix}_worst'] == a.min()
    assert rec[f'{prefix}_gini'] == pytest.approx(gini, rel=1e-9, abs=1e-15)
  assert rec['clients_loss_mean'] == pytest.approx(np.mean([r['loss'] for r in rows if r['n'] > 0]), rel=1e-12)


def test_summary_plot_and_the_line_in_summary_md(sampled_run):
  wd, summary = sampled_run
  s = summary['client_eval']
  assert s['clients'] == 6 and s['population'] == N and s['selection'] == 'sampled from the seed'
  assert s['source'] == 'label_matched' and s['personalize_steps'] == 1 and s['round'] == 4
  assert s['clients_acc_mean'] == _lines(wd / 'metrics.jsonl')[-1]['clients_acc_mean']
  assert s['examples_per_s'] > 0 and s['layout'] in ('clients', 'batches')
  assert s['layout_check']['layout'] == s['layout']
  assert (wd / 'clients_cdf.png').stat().st_size > 0
  assert "training label distribution" in (wd / 'summary.md').read_text()
  assert json.loads((wd / 'summary.json').read_text())['client_eval']['clients'] == 6


def test_a_resumed_run_rewrites_the_rows_past_its_checkpoint_and_matches_the_uninterrupted_one(sampled_run, tmp_path):
  wd, _ = sampled_run
  run_lib.run(_config(rounds=2), str(tmp_path))        # stops after round 2 (its last round: clients evaluated)
  with open(tmp_path / 'clients.jsonl', 'a') as f:     # as if it had gone on to evaluate round 4, then died
    f.write(json.dumps({'round': 4, 'client': -1, 'n': 1, 'acc': 0.0, 'loss': 0.0}) + '\n')
  run_lib.run(_config(), str(tmp_path))                # resumes from round 2
  rows = _lines(tmp_path / 'clients.jsonl')
  assert [r['round'] for r in rows] == [2] * 6 + [4] * 6
  assert [r for r in rows if r['round'] == 4] == _lines(wd / 'clients.jsonl')


@pytest.mark.parametrize('store', ['device', 'host'])
def test_the_personal_models_are_gathered_in_one_program_and_equal_each_clients_own(store):
  """Ditto after 2 rounds (some clients never sampled): the stacked personal models of the plug-in (the store's
  gather, the personalizer mapped over the states) are every client's `personal_params` bit for bit: v_k for a
  sampled client, the global model for one never sampled."""
  import jax
  from fedjax_flat.algorithms.personalization import personal_params
  from fedjax_flat.training import trainers
  from fedjax_flat.training.evals import client_eval as plugin
  cfg = small_config(algorithm='ditto', rounds=2, seed=1, **{'algo.lam': 0.3, 'data.num_clients': 8,
                                                             'client_state_store': store})
  t = trainers.make_trainer(cfg, None, write_files=False)
  t.train()
  ids = np.arange(8)
  written = t.store.written(ids)
  assert 0 < written.sum() < 8 and t.store.kind == store
  got = plugin._personal_models(t)(ids)
  states = {int(k): jax.tree_util.tree_map(lambda a, i=i: np.asarray(a[i]), t.store.state_dict()['states'])
            for i, k in enumerate(t.store.state_dict()['ids'])}
  for k in ids:
    want = personal_params(t.plan.algorithm, t.server_state, states.get(int(k)))
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
      np.testing.assert_array_equal(np.asarray(a)[k], np.asarray(b))
  glob = t.plan.algorithm.eval_models(t.server_state)['global'][0]
  k = int(np.flatnonzero(written)[0])
  assert not all(np.array_equal(np.asarray(a)[k], np.asarray(b)) for a, b in zip(
      jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(glob)))      # a sampled client's own v_k


def test_an_untraceable_personalizer_is_one_line_naming_it():
  """A user's personalizer that branches in Python on a state value cannot be mapped over the stacked states: one
  BadInputError naming it and the fix, not JAX's tracer error."""
  import dataclasses
  import jax
  from fedjax_flat.core.contract import Personalizer
  from fedjax_flat.errors import BadInputError
  from fedjax_flat.training import trainers
  from fedjax_flat.training.evals import client_eval as plugin
  cfg = small_config(algorithm='ditto', rounds=1, seed=1, **{'algo.lam': 0.3, 'data.num_clients': 8})
  t = trainers.make_trainer(cfg, None, write_files=False)
  t.train()
  inner = t.plan.algorithm.personalizer.fn

  def branching(alg, server_state, client_state):
    leaf = next(iter(jax.tree_util.tree_leaves(client_state)))
    return inner(alg, server_state, client_state) if float(leaf.ravel()[0]) > -1e30 else None
  t.plan.algorithm = dataclasses.replace(t.plan.algorithm, personalizer=Personalizer('branchy', branching))
  with pytest.raises(BadInputError, match="personalizer 'branchy' of .* is not traceable .*jnp.where"):
    plugin._personal_models(t)(np.arange(8))
