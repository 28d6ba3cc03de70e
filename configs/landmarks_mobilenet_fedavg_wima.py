r"""FedAvg + WiMA on Landmarks-User-160k, MobileNetV2-GN, 10 clients per round, 3k rounds, window W = 370.

Reproduces thesis Table 4.23 (WiMA on GLDv2), row "FedAvg": published accuracy % 58.17 without -> 63.05 with
WiMA (SCAFFOLD: 62.32 -> 68.30, --config.algorithm=scaffold once registered).

Command:
  .venv/bin/python experiments/train.py --config=configs/landmarks_mobilenet_fedavg_wima.py --workdir=runs/lm_fedavg_wima

Setting (thesis A.3.2): the FedSAM Landmarks setup (configs/landmarks_mobilenet_fedavg.py: SGD lr 0.1, weight
decay 4e-5, 5 local epochs, ImageNet-pretrained MobileNetV2-GN) except batch 50 and 3k rounds; W = 370.
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
  c.rounds = 3000
  c.client.batch_size = 50
  c.clients_per_round = 10
  c.wima.enabled = True
  c.wima.window = 370
  c.eval_every = 10
  c.eval_every_last = 100       # the papers: mean test accuracy over the last 100 rounds, each evaluated
  c.summary_last_k = 100
  return c
