r"""FedGloSS on the embedded digits: the quickstart setting (20 clients, 5 per round, digits CNN) with FedGloSS.

Command:
  .venv/bin/python experiments/train.py --config=configs/quickstart_fedgloss.py --workdir=runs/quickstart_fedgloss
This file exists so that the FedGloSS hyperparameters can be overridden from the command line
(--config.algo.beta=100, --config.algo.dual_variant=release, --config.algo.admm=False, ...): they live in
config.algo, which the plain quickstart leaves empty. Defaults: the CIFAR10 CNN values of the paper scripts
(rho_s 0.15, beta 10), SGD client; --config.client.optimizer=sam --config.client.rho=0.1 for a SAM client.
No published number: a small-scale check (benchmarks/studies/README.flat_minima.md), not a reproduction.
"""
import ml_collections

from fedjax_flat.algorithms import registry
from fedjax_flat.config.default_config import default_config


def get_config():
  c = default_config()
  c.dataset = 'digits'
  c.data.num_clients = 20
  c.data.alpha = 0.5
  c.model = 'digits_cnn'
  c.rounds = 100
  c.clients_per_round = 5
  c.client.lr = 0.05
  c.client.batch_size = 16
  c.client.local_epochs = 1
  c.client.weight_decay = 4e-4
  c.eval_every = 5
  c.summary_last_k = 5
  c.algorithm = 'fedgloss'
  c.algo = ml_collections.ConfigDict(registry.default_hparams('fedgloss'))
  return c
