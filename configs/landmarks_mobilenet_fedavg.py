r"""FedAvg on Landmarks-User-160k (1,262 clients, GLDv2), MobileNetV2-GN, 10 clients per round, 5k rounds.

Reproduces thesis Table 4.9 (FedSAM paper), row "FedAvg": published accuracy % 61.91 @5k rounds,
66.05 with SWA from 75% of the rounds, 67.52 with SWA "from 100%" (centralized: 74.03).
This config: no SWA (published 61.91).

Command:
  .venv/bin/python experiments/train.py --config=configs/landmarks_mobilenet_fedavg.py --workdir=runs/landmarks_mobilenet_fedavg
Variants: --config.swa.enabled=True (Table A.3: c=5, lr 1e-1 -> 1e-3, start 3750 = 0.75 T).

Setting (Table A.1): client SGD; lr 0.1, batch 64, weight decay 4e-5, 5 local epochs, no momentum; server
FedAvg; MobileNetV2 (width 1.0) with GroupNorm (8 groups), no bottleneck before the classifier. The paper
starts from ImageNet-pretrained weights (about 68% top-1); no weights ship with the project: convert them
offline and load them with fedjax_flat/models/pretrained.py. Train augmentation (Flax ImageNet
random-resized-crop 224 + flip) runs in the data loader (data.train_augment), so augment='none' here; ImageNet
normalization.
Data: dataset 'gld160k' (experiments/download.py + experiments/prepare.py). Evaluation every 10 rounds
and every round of the last 100; summary = mean over the last 100 rounds (as in the papers).
"""
import ml_collections

from fedjax_flat.training import paper_hparams
from fedjax_flat.training.default_config import default_config


def get_config():
  c = default_config()
  c.dataset = 'gld160k'
  c.data = ml_collections.ConfigDict({'data_dir': '', 'train_augment': True, 'seed': 0})
  c.model = 'mobilenet_v2_gn'
  c.augment = 'none'
  c.normalize = 'imagenet'
  paper_hparams.apply_training(c, 'gld160k')
  c.clients_per_round = 10
  for k, v in paper_hparams.client_optimizer('gld160k', None, 'fedavg').items():
    c.client[k] = v
  paper_hparams.apply_swa(c, 'gld160k', enabled=False)
  c.eval_every = 10
  c.eval_every_last = 100       # the papers: mean test accuracy over the last 100 rounds, each evaluated
  c.summary_last_k = 100
  return c
