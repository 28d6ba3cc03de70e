r"""FedAvg+SWA on CIFAR10: CNN, 100 clients x 500 images (Dirichlet alpha), 10k rounds.

Reproduces thesis Table 4.3 (FedSAM paper, CNN), row "C10 FedAvg+SWA": published mean test accuracy (%)
over the last 100 rounds, at 5 / 10 / 20 clients per round:
  alpha=0     69.71 / 69.54 / 70.19
  alpha=0.05  73.48 / 72.80 / 73.81
  alpha=100   84.35 / 84.32 / 84.47
This config: alpha=0, 5 clients per round (published 69.71).

Command:
  .venv/bin/python experiments/train.py --config=configs/cifar10_cnn_fedavg_swa.py --workdir=runs/cifar10_cnn_fedavg_swa_a0

Other alphas (Table A.2 gives the radius per alpha: change both) and participation:
  --config.data.alpha=0 | 0.05 | 100   (FedAvg has no rho; nothing else changes)
  --config.clients_per_round=10 | 20

Setting (Table A.1): client SGD (FedAvg); lr 0.01, batch 64, weight decay 4e-4, 1 local epoch,
no momentum; server FedAvg (SGD lr 1); random crop (pad 4) + flip, CIFAR10 normalization.
Server SWA (Table A.3): from round 7500 = 0.75 T, cycle c=10, cyclic client lr 1e-2 -> 1e-4; the SWA model is
the reported one (summary.json "reported_model": "swa").
Evaluation as in the paper: every 100 rounds, and every round of the last 100; the summary reports the mean
test accuracy over the last 100 rounds (config.eval_every_last, config.summary_last_k).
"""
from fedjax_flat.training import paper_hparams


def get_config():
  return paper_hparams.cifar_cnn_config('cifar10', 'fedavg', alpha=0.0, clients_per_round=5, swa=True)
