r"""FedSAM+SWA on CIFAR100: CNN, 100 clients x 500 images (Dirichlet alpha), 20k rounds.

Reproduces thesis Table 4.3 (FedSAM paper, CNN), row "C100 FedSAM+SWA": published mean test accuracy (%)
over the last 100 rounds, at 5 / 10 / 20 clients per round:
  alpha=0     39.30 / 39.51 / 39.24
  alpha=0.5   47.96 / 46.76 / 46.47
  alpha=1000  53.90 / 53.67 / 54.36
This config: alpha=0, 5 clients per round (published 39.30).

Command:
  .venv/bin/python experiments/train.py --config=configs/cifar100_cnn_fedsam_swa.py --workdir=runs/cifar100_cnn_fedsam_swa_a0

Other alphas (Table A.2 gives the radius per alpha: change both) and participation:
  --config.data.alpha=0 --config.client.rho=0.02
  --config.data.alpha=0.5 --config.client.rho=0.05
  --config.data.alpha=1000 --config.client.rho=0.05
  --config.clients_per_round=10 | 20

Setting (Table A.1): client SAM rho=0.02; lr 0.01, batch 64, weight decay 4e-4, 1 local epoch,
no momentum; server FedAvg (SGD lr 1); random crop (pad 4) + flip, CIFAR100 normalization.
Server SWA (Table A.3): from round 15000 = 0.75 T, cycle c=20, cyclic client lr 1e-2 -> 1e-4; the SWA model is
the reported one (summary.json "reported_model": "swa").
Evaluation as in the paper: every 100 rounds, and every round of the last 100; the summary reports the mean
test accuracy over the last 100 rounds (config.eval_every_last, config.summary_last_k).
"""
from fedjax_flat.training import paper_hparams


def get_config():
  return paper_hparams.cifar_cnn_config('cifar100', 'fedsam', alpha=0.0, clients_per_round=5, swa=True)
