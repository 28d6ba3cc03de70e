"""Every registered algorithm either runs in a batched program (two runs with different per-run values: client lr,
weight decay, momentum where allowed) or is refused in one line before compiling (core/contract.py's rule for
per-run values; training/batched.py). The program is traced (`BatchedTrainer` traces it before compiling),
not run: what this holds is that no builder freezes a traced value and that every refusal is one line.
`EXPECTED` is the list: 'batched', or the start of the one line that refuses it, or 'alone' (the run's data
path keeps it out of a device program: batched.run_batch trains it alone, as train.py would, after one log line).
`HARNESS` gives the algorithms that need more than the synthetic clients what they read: per-client test splits
(FedSoup's and FedFomo's validation steps), per-client cities (H-FL), a segmentation set with styles (LADD)."""
import dataclasses

import numpy as np
import pytest

from fedjax_flat import errors
from fedjax_flat.algorithms import registry
from fedjax_flat.config.default_config import segmentation_data
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.training import batched_trainer
from fedjax_flat.training import packing
from fedjax_flat.training import loop
from tests.fixtures.configs import small_config

SIZES = [6, 3, 8, 5, 7, 4]

# Algorithms that run only on their own network or data in this harness (their checks refuse the rest).
OWN_MODEL = {'fedcg': 'fedcg_net', 'fedrep': 'mlp', 'fedbabu': 'mlp'}

EXPECTED = {
    'fedsoup': 'alone', 'fedfomo': 'alone',       # validation steps appended on the host (data/validation_steps.py)
    # Built from what the trainer reads from the run's own data (cities; style clusters of its seed), which the
    # one algorithm of a runs program is not given: kept out before anything is loaded, each run trains alone.
    'hfl': "blocked: hfl is built from the run's own client groups",
    'ladd': "blocked: ladd is built from the run's own style clusters",
    'fedbuff': 'alone', 'fedasync': 'alone',      # server steps on arrivals (training/driver.AsyncDriver)
}


def _synthetic():
  return synthetic(len(SIZES), SIZES, input_shape=(3, 3, 1), num_classes=4, seed=0)


def _with_client_tests(c):
  """4 test examples of its own per client: algo.val_source='local_test' selects the soup / the models with them."""
  c.algo.val_source = 'local_test'
  n = len(SIZES)
  return dataclasses.replace(_synthetic(), client_test_index=np.arange(4 * n),
                             client_test_offsets=np.arange(0, 4 * n + 1, 4))


def _with_cities(c):
  """Two cities, clients alternating; one client of each a round (the stratified sampler's clients_per_round)."""
  c.algo.clients_per_group, c.clients_per_round = 1, 2
  data = _synthetic()
  data.client_groups = {'city': np.arange(len(SIZES)) % 2, 'continent': np.zeros(len(SIZES), np.int64)}
  return data


def _segmentation_styles(c):
  """Two planted styles of 2 clients on 16x16 images (the trainer clusters them: force_k=2), random init."""
  c.dataset = 'seg_synthetic_da'
  c.data = segmentation_data('seg_synthetic_da', num_styles=2, clients_per_style=2, examples_per_client=2,
                             source_examples=4, test_per_style=2, image_size=(16, 16), crop=(16, 16))
  c.model, c.model_kwargs = 'seg_cnn', {'norm': 'bn', 'width': 4, 'aux': False, 'conv_impl': 'auto'}
  c.algo.update({'force_k': 2, 'random_init': True})
  c.clients_per_round, c.client.batch_size = 4, 2
  return None                                     # the trainer loads it from the config


# name -> fn(config) -> the run's data (None: loaded from the config), setting the fields that go with them.
HARNESS = {'fedsoup': _with_client_tests, 'fedfomo': _with_client_tests, 'hfl': _with_cities,
           'ladd': _segmentation_styles}


def _outcome(name, config_blocker=True):
  spec = registry.spec(name)
  cfgs, data = [], None
  for i, (lr, wd) in enumerate(((0.1, 1e-3), (0.05, 4e-4))):
    c = small_config(algorithm=name)
    c.model = OWN_MODEL.get(name, 'mlp')
    c.data.num_clients = len(SIZES)
    c.client.lr, c.client.weight_decay, c.seed = lr, wd, i
    c.client.momentum = 0.0 if name in ('mime', 'mimelite') else (0.9, 0.5)[i]
    if spec.client_optimizers is not None:
      c.client.optimizer = spec.client_optimizers[0]
    c.algo.update({**registry.default_hparams(name), **c.algo.to_dict()})
    data = HARNESS[name](c) if name in HARNESS else _synthetic()
    cfgs.append(c)
  why = packing.batch_blocker(cfgs[0])
  if why and config_blocker:
    return f'blocked: {why}'
  trainers = [loop.Trainer(c, data=data, write_files=False, shard_clients=False) for c in cfgs]
  why = packing.trainer_blocker(trainers[0])      # pylint: disable=protected-access
  if why:
    return 'alone' if config_blocker else f'alone: {why}'
  try:
    batched_trainer.BatchedTrainer(trainers, lanes=2)
  except batched_trainer.BatchRefused as e:
    return f'BatchRefused: {e}'
  return 'batched'


@pytest.mark.slow     # builds and traces ~40 programs (minutes on the shared CPU)
@pytest.mark.parametrize('name', [n for n in registry.names() if 'chains' not in registry.needs(n)])
def test_every_algorithm_runs_batched_or_is_refused_in_one_line(name):
  try:
    got = _outcome(name)
  except errors.BadInputError as e:     # every registered algorithm gets the data / model it needs here
    pytest.fail(f'{name}: the harness gives it no data or model it accepts ({str(e).splitlines()[0]}): add them '
                'to _outcome (OWN_MODEL, the per-algorithm datasets)')
  assert '\n' not in got
  want = EXPECTED.get(name, 'batched')
  assert got.startswith(want), (name, got)


@pytest.mark.slow     # loads the styled segmentation set and clusters its styles (~20 s)
@pytest.mark.parametrize('name', ['hfl', 'ladd'])
def test_opened_runs_built_from_their_own_data_train_alone(name):
  """Past the config's blocker (runs opened with their data, as run_batch opens a pack): the trainer built with
  the run's own clusters is kept out of the runs program too, in the same line."""
  assert _outcome(name, config_blocker=False) == 'alone: ' + EXPECTED[name][len('blocked: '):]


def test_chain_algorithms_are_refused_before_anything_is_loaded():
  for name in registry.with_need('chains'):
    assert packing.batch_blocker(small_config(algorithm=name)) == ('chain algorithms (FedSeq family) have their '
                                                                   'own trainer')
  assert np.all([packing.batch_blocker(small_config()) is None])
