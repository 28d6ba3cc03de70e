r"""FedSAM+SWA on CIFAR10: CNN, 100 clients x 500 images (Dirichlet alpha), 10k rounds.

Reproduces thesis Table 4.3 (FedSAM paper, CNN), row "C10 FedSAM+SWA": published mean test accuracy (%)
over the last 100 rounds, at 5 / 10 / 20 clients per round:
  alpha=0     74.97 / 73.73 / 73.06
  alpha=0.05  76.61 / 75.84 / 76.22
  alpha=100   84.23 / 84.37 / 84.63
This config: alpha=0, 5 clients per round (published 74.97).

Command:
  .venv/bin/python experiments/train.py --config=configs/cifar10_cnn_fedsam_swa.py --workdir=runs/cifar10_cnn_fedsam_swa_a0

Other alphas (Table A.2 gives the radius per alpha: change both) and participation:
  --config.data.alpha=0 --config.client.rho=0.1
  --config.data.alpha=0.05 --config.client.rho=0.1
  --config.data.alpha=100 --config.client.rho=0.02
  --config.clients_per_round=10 | 20

Setting (Table A.1): client SAM rho=0.1; lr 0.01, batch 64, weight decay 4e-4, 1 local epoch,
no momentum; server FedAvg (SGD lr 1); random crop (pad 4) + flip, CIFAR10 normalization.
Server SWA (Table A.3): from round 7500 = 0.75 T, cycle c=10, cyclic client lr 1e-2 -> 1e-4; the SWA model is
the reported one (summary.json "reported_model": "swa").
Evaluation as in the paper: every 100 rounds, and every round of the last 100; the summary reports the mean
test accuracy over the last 100 rounds (config.eval_every_last, config.summary_last_k).
"""
from fedjax_flat.training import paper_hparams


def get_config():
  return paper_hparams.cifar_cnn_config('cifar10', 'fedsam', alpha=0.0, clients_per_round=5, swa=True)
