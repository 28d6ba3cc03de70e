"""ff.sweep: a grid x seeds from Python, runs sharing one compiled program (sweeps/api.py)."""
import pytest

import fedjax_flat as ff
from fedjax_flat.algorithms import registry
from fedjax_flat.errors import BadInputError, ConfigError
from tests.fixtures.configs import small_config


def my_fedavg(ctx):
  return ff.fedavg(ctx.model, ctx.loss_fn, ctx.client_tx, ctx.hparams_fn, ctx.server_tx)


def test_two_values_train_in_one_program_as_each_would_alone_and_the_registry_is_unchanged(tmp_path):
  before = registry.names()
  c = small_config(rounds=2)
  runs = ff.sweep(my_fedavg, c, grid={'client.lr': [0.05, 0.1]}, seeds=[0], batch_runs=2,
                  sweep_dir=str(tmp_path))
  assert registry.names() == before and registry.name_of(my_fedavg) is None
  assert [(r.name, r.seed, r.status, r.lanes) for r in runs] == [('client.lr=0.05', 0, 'done', 2),
                                                                  ('client.lr=0.1', 0, 'done', 2)]
  assert runs[0].workdir == str(tmp_path / 'client.lr=0.05' / 'seed=0')
  alone = ff.train('fedavg', small_config(rounds=2, **{'client.lr': 0.1}))
  assert runs[1].summary['final_test_accuracy'] == pytest.approx(alone.summary['final_test_accuracy'], abs=1e-6)
  assert runs[1].summary['algorithm'] == 'my_fedavg'


def test_bad_grids_are_one_line_before_any_run(tmp_path):
  c = small_config(rounds=2)
  with pytest.raises(ConfigError, match='client.nope'):
    ff.sweep('fedavg', c, grid={'client.nope': [1]}, sweep_dir=str(tmp_path))
  with pytest.raises(ConfigError, match='client.lr'):
    ff.sweep('fedavg', c, grid={'client.lr': [-1.0]}, sweep_dir=str(tmp_path))
  with pytest.raises(BadInputError, match='non-empty list of values'):
    ff.sweep('fedavg', c, grid={'client.lr': []})
  with pytest.raises(BadInputError, match='seeds='):
    ff.sweep('fedavg', c, seeds=[0, 0])
  assert not list(tmp_path.iterdir())
