r"""FedAvg on CIFAR100-PAM (500 clients x 100 images, TFF Pachinko split), ResNet18-GN, 10k rounds.

Reproduces thesis Table 4.4 (FedSAM paper, CIFAR100-PAM, no augmentation), row "FedAvg" (E=1): published
accuracy % at 10 clients per round: 47.03 @10k rounds, 52.70 with SWA; at 20 clients: 45.83, 50.28 with SWA.
This config: 10 clients per round, no SWA (published 47.03).

Command:
  .venv/bin/python experiments/train.py --config=configs/pam_resnet18_fedavg.py --workdir=runs/pam_resnet18_fedavg
Variants: --config.swa.enabled=True (Table A.3: c=5, lr 1e-2 -> 1e-4, start 7500 = 0.75 T; the table's 15000
exceeds T, digest [U]) | --config.clients_per_round=20 | --config.client.local_epochs=2 (the "E=2" rows).

Setting (Table A.1): client SGD; lr 0.01, batch 20, weight decay 4e-4, 1 local epoch, client momentum 0.9;
server FedAvg; ResNet18-GN with 2 groups per GroupNorm; CIFAR100 normalization, no augmentation.
Data: dataset 'cifar100_pam' (the TFF SQLite files; see experiments/download.py). Evaluation every 10 rounds
and every round of the last 100; summary = mean over the last 100 rounds (as in the papers).
"""
import ml_collections

from fedjax_flat.training import paper_hparams
from fedjax_flat.training.default_config import default_config


def get_config():
  c = default_config()
  c.dataset = 'cifar100_pam'
  c.data = ml_collections.ConfigDict({'data_dir': '', 'source': 'sqlite', 'seed': 0})
  c.model = 'resnet18_gn'
  c.augment = 'none'
  c.normalize = 'cifar100'
  paper_hparams.apply_training(c, 'cifar100_pam')
  c.clients_per_round = 10
  for k, v in paper_hparams.client_optimizer('cifar100_pam', 0.1, 'fedavg').items():
    c.client[k] = v
  paper_hparams.apply_swa(c, 'cifar100_pam', enabled=False)
  c.eval_every = 10
  c.eval_every_last = 100       # the papers: mean test accuracy over the last 100 rounds, each evaluated
  c.summary_last_k = 100
  return c
