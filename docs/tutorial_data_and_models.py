# %% [markdown]
r"""# Tutorial, part 2: your own data and your own model

Part 1 (docs/tutorial_custom_algorithm.py) wrote an algorithm. Here the data and the network are ours: a small
federated dataset made of per-client arrays (some clients' labels are corrupted), a Flax NNX model, FedAvg with a
robust aggregator (the coordinate-wise median of the client updates) against the plain mean, and a sweep over
two client learning rates trained as two lanes of one compiled program.

Run it whole (about half a minute on 2 CPU cores; the test suite runs it with --rounds=3):

    .venv/bin/python docs/tutorial_data_and_models.py [--rounds=20]

Each `# %%` cell also runs in a notebook, in order.
"""
# %%
import argparse
import math

import numpy as np
from flax import nnx

import fedjax_flat as ff

# %% [markdown]
# ## 1. A dataset of one's own
#
# A function of its `config.data` fields (here `num_clients`, `seed`; setting any other field is refused by the
# config validation) returning each client's `(x, y)` arrays, as a list or, as here, a generator, and the
# global test split. `ff.register_dataset` checks what it returns when the run loads it (every client shares
# one element spec, labels in [0, num_classes), ...: one line naming the dataset, the client and the array),
# and `config.dataset = 'sensors'` then works in `ff.train`, `ff.sweep` and the binaries. A client whose data
# are too large for memory can instead be a function k -> (x_k, y_k) with the clients' `sizes` (read when its
# round batches are built).
#
# Four classes of 12-feature readings around class means; every fourth client has its labels shifted by one
# (a faulty site), the setting robust aggregation is for.

NUM_CLASSES, FEATURES = 4, 12


def sensors(num_clients: int = 12, seed: int = 0):
  rng = np.random.default_rng(seed)
  means = rng.normal(0, 1.5, (NUM_CLASSES, FEATURES))

  def draw(n):
    y = rng.integers(0, NUM_CLASSES, n)
    return (means[y] + rng.normal(0, 1, (n, FEATURES))).astype(np.float32), y

  def clients():
    for k in range(num_clients):
      x, y = draw(int(rng.integers(20, 40)))
      yield x, (y + 1) % NUM_CLASSES if k % 4 == 3 else y       # a faulty site: every label off by one

  return {'clients': clients(), 'test': draw(400), 'num_classes': NUM_CLASSES}


ff.register_dataset('sensors', sensors)

# %% [markdown]
# ## 2. A model of one's own, in Flax NNX
#
# NNX modules are built eagerly from their `rngs`. Registered by class, the model is built from the run's key
# (the seed picks the initial values); its signature may take `num_classes`, `input_shape` and any
# `config.model_kwargs`. The library splits it once into a graph definition and its parameter state
# (`nnx.split`), so every algorithm, optimizer, checkpoint and the Hessian tools see a plain params pytree
# and pure init / apply functions, as for the built-in Linen models.


class SensorNet(nnx.Module):
  def __init__(self, num_classes, input_shape, width: int = 32, *, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(math.prod(input_shape), width, rngs=rngs)
    self.out = nnx.Linear(width, num_classes, rngs=rngs)

  def __call__(self, x):
    return self.out(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))


ff.register_model('sensor_net', SensorNet)

# %% [markdown]
# ## 3. Train with a robust aggregator
#
# `config.server.aggregator='median'` replaces the streaming mean of the client updates with their
# coordinate-wise median over the round's cohort (docs/aggregation.md; 'trimmed_mean', 'krum', ... too).


def get_config(aggregator: str = 'mean', rounds: int = 20):
  c = ff.default_config()
  c.dataset, c.model = 'sensors', 'sensor_net'
  c.data.num_clients = 12
  c.model_kwargs = {'width': 32}
  c.rounds, c.clients_per_round, c.eval_every, c.summary_last_k = rounds, 8, min(5, rounds), 1
  c.client.lr, c.client.batch_size, c.client.epochs = 0.1, 8, 1
  c.server.aggregator = aggregator
  return c


def train_both(rounds: int):
  results = {}
  for aggregator in ('mean', 'median'):
    results[aggregator] = r = ff.train('fedavg', get_config(aggregator, rounds))
    print(f"FedAvg, {aggregator} aggregation: test accuracy {r.summary['final_test_accuracy']:.4f} after "
          f"{r.summary['rounds_completed']} rounds")
  return results


# %% [markdown]
# ## 4. Sweep two learning rates in one program
#
# `ff.sweep` trains a grid over config fields x seeds from Python; runs that differ only in values (here the
# client learning rate) share one compiled program, one lane each (`batch_runs`), and each returns its summary.


def sweep(rounds: int):
  runs = ff.sweep('fedavg', get_config('median', rounds), grid={'client.lr': [0.05, 0.2]}, seeds=[0],
                  batch_runs=2)
  for r in runs:
    print(f"sweep {r.name} seed={r.seed}: {r.status} in a program of {r.lanes} lanes, test accuracy "
          f"{r.summary['final_test_accuracy']:.4f}")
  return runs


# %%
def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--rounds', type=int, default=20)
  args = parser.parse_args(argv)
  train_both(args.rounds)
  sweep(args.rounds)


if __name__ == '__main__':
  main()
