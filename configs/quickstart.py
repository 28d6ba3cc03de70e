r"""Quickstart: FedAvg on the embedded handwritten digits, split non-IID (Dirichlet alpha=0.5) over 20 clients.

Command (from the repo root, after the README's set-up):
  .venv/bin/python experiments/train.py --config=configs/quickstart.py --workdir=runs/quickstart

Expected: under a minute on 2 CPU cores (measured: 35 s wall / 21 s CPU with the cores shared, load ~4; about
20 s in the training loop, compilation included), final test accuracy about 0.93-0.96
(359 held-out digits). No download: the data ships with scikit-learn.
Variants: --config.client.optimizer=asam --config.client.rho=0.7 --config.client.asam_eta=0.2 (FedASAM),
--config.data.alpha=0 (one class per client), --config.swa.enabled=True, --config.client.optimizer=ksam
--config.client.rho=0.05 --config.client.ascent_fraction=0.5 (K-SAM: SAM's two gradients on the half of each batch
with the highest loss; --config.client.ksam_descent=full: the descent on the whole batch),
--config.upload.compress=topk --config.upload.fraction=0.01 --config.upload.error_feedback=True (uploads of 1% of
the delta's coordinates; summary.json's compress_* entries say what it cost).
Another algorithm: --config.algorithm=fedprox --config.algo.mu=0.01 (experiments/train.py fills
config.algo with the algorithm's registered defaults, then applies --config.algo.*; the config argument
form --config=configs/quickstart.py:fedprox does the same; see configs/baselines_digits.py for every baseline).
"""
from fedjax_flat.config.default_config import default_config


def get_config(algorithm: str = ''):
  c = default_config()
  if algorithm:
    from fedjax_flat.algorithms import registry
    c.algorithm = algorithm
    c.algo.update(registry.default_hparams(algorithm))
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
  return c
