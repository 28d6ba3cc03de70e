"""Communication multipliers of every baseline (models per client per round, each way) and their validation.

The run loop counts comm_down * num_phases * |S| * num_params per round (test_client_state checks the totals
end to end for SCAFFOLD)."""
import pytest
from absl import logging

from fedjax_flat.algorithms import registry
from fedjax_flat.config import validate
from fedjax_flat.data.sources.builtin import synthetic
from tests.fixtures.baselines import MODEL, config
from tests.fixtures.paths import REPO

# (algorithm, client optimizer, algo hparams) -> (models server->client, models client->server) per round
EXPECTED = [
    ('fedavg', 'sgd', {}, (1, 1)),
    ('fedprox', 'sgd', {}, (1, 1)),
    ('scaffold', 'sgd', {}, (2, 2)),            # x, c  /  dy, dc
    ('feddyn', 'sam', {}, (1, 1)),
    ('adabest', 'sgd', {}, (1, 1)),
    ('mime', 'sgd', {'beta': 0.9}, (3, 2)),     # x; c, m  /  grad f_k(x); y_k
    ('mime', 'sgd', {'beta': 0.0}, (2, 2)),     # Mime SGD: no momentum state to send
    ('mimelite', 'sgd', {'beta': 0.9}, (2, 2)),  # x, m  /  y_k, grad f_k(x)
    ('mimelite', 'sgd', {'beta': 0.0}, (1, 2)),
    ('fedcm', 'sgd', {}, (2, 1)),               # x, d  /  y_k
    ('fedacg', 'sgd', {}, (1, 1)),              # the lookahead only
    ('fedspeed', 'sam', {}, (1, 1)),            # x  /  x^_k
    ('fedsmoo', 'sam', {}, (2, 2)),             # w, s  /  w_k, mu_k
    ('fedgamma', 'sam', {}, (2, 2)),            # as SCAFFOLD
]


@pytest.mark.parametrize('name,optimizer,hp,want', EXPECTED)
def test_communication_per_client_round(name, optimizer, hp, want):
  alg = registry.build_algorithm(config(name, optimizer=optimizer, **hp), MODEL)
  assert (alg.comm_down * alg.num_phases, alg.comm_up * alg.num_phases) == want


def _err(cfg, data=None):
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_config(cfg)
    if data is not None:
      validate.validate_against_data(cfg, data)
  return e.value


def test_baseline_hparams_are_validated():
  assert _err(config('fedprox', mu=-1.0)).field == 'algo.mu'
  assert _err(config('fedcm', alpha=1.5)).field == 'algo.alpha'
  assert _err(config('adabest', adaptive_mu=1)).field == 'algo.adaptive_mu'
  assert _err(config('scaffold', population=-2)).field == 'algo.population'
  assert _err(config('fedspeed', optimizer='sgd')).field == 'client.optimizer'
  assert _err(config('fedgamma', optimizer='sgd')).field == 'client.optimizer'
  c = config('mime')
  c.client.momentum = 0.9
  assert _err(c).field == 'client.momentum'
  assert _err(config('feddyn', alpha=0.0)).field == 'algo.alpha'
  assert _err(config('fedspeed', optimizer='sam', dual_mean='all')).field == 'algo.dual_mean'


def test_population_must_match_the_data():
  data = synthetic(3, 4, input_shape=(2, 1, 1), num_classes=3)
  cfg = config('scaffold')                                  # data.num_clients = 3: fine
  cfg.clients_per_round = 2
  validate.validate_config(cfg)
  validate.validate_against_data(cfg, data)
  cfg.data.num_clients = 7
  assert _err(cfg, data).field == 'data.num_clients'
  cfg.algo.population = 5
  assert 'algo.population=3' in str(_err(cfg, data))
  cfg.algo.population = 3
  validate.validate_against_data(cfg, data)
  cfg = config('fedprox')                                   # no population needed
  cfg.data.num_clients = 7
  cfg.clients_per_round = 2
  validate.validate_against_data(cfg, data)


def test_baseline_configs_validate():
  import importlib.util
  import os
  path = os.path.join(REPO, 'configs',
                      'baselines_cifar_cnn.py')
  spec = importlib.util.spec_from_file_location('baselines_cifar_cnn', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  algos = ['fedavg', 'fedavgm', 'fedadam', 'fedadagrad'] + list(mod.ALGO)
  for ds, het in (('cifar10', 0.05), ('cifar100', 0.5)):
    for algo in algos:
      for client in ('sgd', 'asam'):
        cfg = mod.get_config(f'dataset={ds},algo={algo},client={client},alpha={het},clients=20,swa=1')
        validate.validate_config(cfg)
        assert cfg.algorithm == (algo if algo in mod.ALGO else 'fedavg')
  c = mod.get_config('dataset=cifar100,algo=fedsmoo')
  assert (c.client.optimizer, c.client.rho, c.algo.beta) == ('sam', 0.1, 100.0)
  c = mod.get_config('dataset=cifar10,algo=feddyn,client=sam')
  assert (c.client.optimizer, c.client.rho, c.client.grad_clip) == ('sam', 0.15, 30.0)
  c = mod.get_config('dataset=cifar100,algo=fedadam,eta_g=1')
  assert (c.server.optimizer, c.server.lr, c.server.eps, c.server.adaptive_form) == ('adam', 1.0, 0.1, 'torch')
  assert mod.PUBLISHED[('4.8', 'cifar10', 'scaffold+asam', 0.0, 5)] == 77.78
  assert mod.PUBLISHED[('4.15', 'cifar100', 'fedsmoo+sam', 0.5, 5)] == 51.7
  assert mod.PUBLISHED[('4.2', 'cifar100', 'fedadagrad@0.01', 1000.0, 5)] == 51.44
  with pytest.raises(ValueError, match='unknown key'):
    mod.get_config('algorithm=fedprox')


def test_fedspeed_active_dual_mean_at_partial_participation_warns(monkeypatch):
  data = synthetic(3, 4, input_shape=(2, 1, 1), num_classes=3)
  said = []
  monkeypatch.setattr(logging, 'warning', lambda msg, *a: said.append(msg % a))
  for dual_mean, per_round, warned in (('active', 2, True), ('active', 3, False), ('population', 2, False)):
    said.clear()
    cfg = config('fedspeed', optimizer='sam', dual_mean=dual_mean)
    cfg.clients_per_round = per_round
    validate.validate_config(cfg)
    validate.validate_against_data(cfg, data)
    assert bool(said) == warned, (dual_mean, per_round, said)
    if warned:
      assert 'dual_mean=population' in said[0] and 'clients_per_round=2 of 3' in said[0]


def test_population_comes_from_the_dataset_when_the_config_has_none(monkeypatch):
  """PAM / Landmarks configs have no data.num_clients: SCAFFOLD takes N from the data, no flag needed."""
  from fedjax_flat.algorithms import common, scaffold
  from fedjax_flat.training import trainers
  seen = []
  orig = common.population
  monkeypatch.setattr(scaffold, 'population', lambda ctx, hp: seen.append(orig(ctx, hp)) or seen[-1])
  data = synthetic(4, 6, input_shape=(2, 1, 1), num_classes=3)
  cfg = config('scaffold')
  cfg.clients_per_round = 2
  del cfg.data['num_clients']
  cfg.model = 'mlp'
  cfg.rounds, cfg.eval_every, cfg.progress_every_s = 1, 1, 1e9
  validate.validate_config(cfg)
  validate.validate_against_data(cfg, data)
  t = trainers.make_trainer(cfg, data=data)
  t.train()
  assert seen == [4]
  alg = registry.build_algorithm(cfg, t.model, population=4)
  assert alg.name == 'scaffold'
  with pytest.raises(ValueError, match='population size N'):
    registry.build_algorithm(cfg, t.model)        # nothing says N: a clear error, not a silent 0


def test_fedgloss_with_cyclic_swa_warns(monkeypatch):
  data = synthetic(3, 4, input_shape=(2, 1, 1), num_classes=3)
  said = []
  monkeypatch.setattr(logging, 'warning', lambda msg, *a: said.append(msg % a))
  for cyclic, warned in ((True, True), (False, False)):
    said.clear()
    cfg = config('fedgloss', optimizer='sam')
    cfg.clients_per_round, cfg.data.num_clients = 2, 3
    cfg.swa.enabled, cfg.swa.cyclic_lr = True, cyclic
    validate.validate_against_data(cfg, data)
    assert bool(said) == warned, said
    if warned:
      assert 'swa.cyclic_lr=False' in said[0]


def test_mime_lr_above_the_measured_range_warns(monkeypatch):
  """lr / (1 - beta) > 0.1 warns (MimeLite diverged at lr 0.02, beta 0.9, alpha 0 on the digits)."""
  said = []
  monkeypatch.setattr(logging, 'warning', lambda msg, *a: said.append(msg % a))
  for algo, lr, beta, warned in (('mimelite', 0.05, 0.9, True), ('mimelite', 0.01, 0.9, False),
                                 ('mimelite', 0.02, 0.9, True), ('mime', 0.05, 0.0, False),
                                 ('mime', 0.2, 0.0, True), ('mimelite', 0.005, 0.95, False)):
    said.clear()
    cfg = config(algo, beta=beta)
    cfg.client.lr = lr
    validate.validate_config(cfg)
    assert bool([m for m in said if 'lr/(1-beta)' in m]) == warned, (algo, lr, beta, said)
    if warned:
      assert f'client.lr={lr:g}' in said[0] and 'try client.lr <= ' in said[0]
