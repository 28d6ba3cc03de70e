r"""FedSAM on CIFAR100: CNN, 100 clients x 500 images (Dirichlet alpha), 20k rounds.

Reproduces thesis Table 4.3 (FedSAM paper, CNN), row "C100 FedSAM": published mean test accuracy (%)
over the last 100 rounds, at 5 / 10 / 20 clients per round:
  alpha=0     31.04 / 36.93 / 38.56
  alpha=0.5   44.73 / 44.84 / 46.05
  alpha=1000  54.01 / 53.39 / 53.97
This config: alpha=0, 5 clients per round (published 31.04).

Command:
  .venv/bin/python experiments/train.py --config=configs/cifar100_cnn_fedsam.py --workdir=runs/cifar100_cnn_fedsam_a0

Other alphas (Table A.2 gives the radius per alpha: change both) and participation:
  --config.data.alpha=0 --config.client.rho=0.02
  --config.data.alpha=0.5 --config.client.rho=0.05
  --config.data.alpha=1000 --config.client.rho=0.05
  --config.clients_per_round=10 | 20

Setting (Table A.1): client SAM rho=0.02; lr 0.01, batch 64, weight decay 4e-4, 1 local epoch,
no momentum; server FedAvg (SGD lr 1); random crop (pad 4) + flip, CIFAR100 normalization.
+SWA: configs/cifar100_cnn_fedsam_swa.py (or --config.swa.enabled=True: the Table A.3 SWA
settings, c=20, lr 1e-2 -> 1e-4, start 0.75 T, are preset).
Evaluation as in the paper: every 100 rounds, and every round of the last 100; the summary reports the mean
test accuracy over the last 100 rounds (config.eval_every_last, config.summary_last_k).
"""
from fedjax_flat.training import paper_hparams


def get_config():
  return paper_hparams.cifar_cnn_config('cifar100', 'fedsam', alpha=0.0, clients_per_round=5, swa=False)
