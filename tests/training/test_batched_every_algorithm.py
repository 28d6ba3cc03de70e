"""Every registered algorithm either runs in a batched program (two runs with different per-run values: client lr,
weight decay, momentum where allowed) or is refused in one line before compiling (core/contract.py's rule for
per-run values; training/batched.py). The program is traced (`BatchedTrainer` traces it before compiling),
not run: what this holds is that no builder freezes a traced value and that every refusal is one line.
`EXPECTED` is the list: 'batched', or the start of the one line that refuses it, or 'alone' (the run's data
path keeps it out of a device program: batched.run_batch trains it alone, as train.py would)."""
import numpy as np
import pytest

from fedjax_flat import errors
from fedjax_flat.algorithms import registry
from fedjax_flat.data.sources.builtin import synthetic
from fedjax_flat.training import batched
from fedjax_flat.training import loop
from tests.fixtures.configs import small_config

SIZES = [6, 3, 8, 5, 7, 4]

# Algorithms that run only on their own network or data in this harness (their checks refuse the rest).
OWN_MODEL = {'fedcg': 'fedcg_net', 'fedrep': 'mlp', 'fedbabu': 'mlp'}

EXPECTED = {
    'fedsoup': 'alone', 'fedfomo': 'alone',       # validation steps appended on the host (data/validation_steps.py)
    'fedbuff': 'alone', 'fedasync': 'alone',      # server steps on arrivals (training/driver.AsyncDriver)
}
# H-FL (per-client cities) and LADD (a segmentation dataset) do not fit the synthetic harness: skipped, by name.


def _outcome(name):
  spec = registry.spec(name)
  cfgs = []
  for i, (lr, wd) in enumerate(((0.1, 1e-3), (0.05, 4e-4))):
    c = small_config(algorithm=name)
    c.model = OWN_MODEL.get(name, 'mlp')
    c.data.num_clients = len(SIZES)
    c.client.lr, c.client.weight_decay, c.seed = lr, wd, i
    c.client.momentum = 0.0 if name in ('mime', 'mimelite') else (0.9, 0.5)[i]
    if spec.client_optimizers is not None:
      c.client.optimizer = spec.client_optimizers[0]
    c.algo.update({**registry.default_hparams(name), **c.algo.to_dict()})
    if 'val_source' in c.algo:                    # the synthetic data have no validation split: local test
      c.algo.val_source = 'local_test'
    cfgs.append(c)
  why = batched.batch_blocker(cfgs[0])
  if why:
    return f'blocked: {why}'
  data = synthetic(len(SIZES), SIZES, input_shape=(3, 3, 1), num_classes=4, seed=0)
  trainers = [loop.Trainer(c, data=data, write_files=False, shard_clients=False) for c in cfgs]
  if batched._trainer_blocker(trainers[0]):        # pylint: disable=protected-access
    return 'alone'
  try:
    batched.BatchedTrainer(trainers, lanes=2)
  except batched.BatchRefused as e:
    return f'BatchRefused: {e}'
  return 'batched'


@pytest.mark.slow     # builds and traces ~40 programs (minutes on the shared CPU)
@pytest.mark.parametrize('name', [n for n in registry.names() if 'chains' not in registry.needs(n)])
def test_every_algorithm_runs_batched_or_is_refused_in_one_line(name):
  try:
    got = _outcome(name)
  except errors.BadInputError as e:     # this harness's synthetic data / MLP do not fit the algorithm
    pytest.skip(f'not applicable to the synthetic harness: {str(e).splitlines()[0]}')
  assert '\n' not in got
  want = EXPECTED.get(name, 'batched')
  assert got.startswith(want), (name, got)


def test_chain_algorithms_are_refused_before_anything_is_loaded():
  for name in registry.with_need('chains'):
    assert batched.batch_blocker(small_config(algorithm=name)) == ('chain algorithms (FedSeq family) have their '
                                                                   'own trainer')
  assert np.all([batched.batch_blocker(small_config()) is None])
