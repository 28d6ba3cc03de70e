r"""FedAvg + WiMA on CIFAR10 (ResNet20-GN, 100 clients x 500 images,
Dirichlet alpha, 10 clients per round, 10k rounds).

Reproduces thesis Table 4.22 (WiMA on top of SOTA, W = 100), row "FedAvg": published accuracy % without -> with
WiMA: 64.37 -> 69.95 (alpha=0), 68.50 -> 72.69 (alpha=0.05).
Window ablation (Table 4.24, alpha=0): W = 5 / 10 / 50 / 100 / 200.
This config: alpha=0 (published 69.95 with WiMA; the WiMA model is the reported one, summary.json
"reported_model": "wima"; the FedAvg chain is logged beside it).

Command:
  .venv/bin/python experiments/train.py --config=configs/cifar10_resnet20_fedavg_wima.py --workdir=runs/cifar10_resnet20_fedavg_wima_a0
Variants: --config.data.alpha=0 | 0.05 | --config.wima.window=5|10|50|200 |
--config.wima.subset=classifier|features (Table 4.25; that table used batch 20: --config.client.batch_size=20)
| --config.algorithm=<any registered algorithm> (WiMA wraps any server).

Setting (thesis A.3.1): client SGD lr 0.1, no momentum, no weight decay, batch 100, 1 local epoch; server FedAvg
(lr 1, no momentum); ResNet20-GN [U: GN groups not given, 2 used]; augmentation not stated [U], CIFAR crop +
flip used. Evaluation every 100 rounds and
every round of the last 100; summary = mean over the last 100 rounds.
"""
from fedjax_flat.training import paper_hparams


def get_config():
  c = paper_hparams.cifar_cnn_config('cifar10', 'fedavg', alpha=0.0, clients_per_round=10)
  c.model = 'resnet20_gn'
  c.rounds = 10000
  c.client.lr = 0.1
  c.client.momentum = 0.0
  c.client.weight_decay = 0.0
  c.client.batch_size = 100
  c.swa.enabled = False
  c.wima.enabled = True
  c.wima.window = 100
  return c
