r"""FedProx (mu = 0.01: the paper gives no mu; its code defaults to mu = 0) on the cross-silo feature-shift digits.

A baseline of the FedSoup comparison: same setting and end-of-training personalized evaluation as
configs/fedsoup_digits_fedsoup.py (its docstring has the three commands and the full Table 1). The
personalized model of a FedAvg/FedProx client is the global model (core/personalized.py), so "local" is the
global model on each client's test split; the 15 fine-tuning epochs personalize it afterwards.

Command:
  .venv/bin/python experiments/train.py --config=configs/fedsoup_digits_fedprox.py --workdir=runs/fs_fedprox
Unseen domain (leave-one-client-out): --config.data.leave_out=1 --config.clients_per_round=4 (folds 0..4).

Paper Table 1 row (real data; ResNet-18, Adam; mean over folds x seeds), for reference only:
                 Pathology (Camelyon17, 5 clients)       Retina (4 institutions)
                 Local Acc  Local AUC  Glob Acc  Glob AUC   Local Acc  Local AUC  Glob Acc  Glob AUC
  FedProx        86.34      92.78      67.42     77.18      90.14      95.47      70.46     76.84
  FedSoup        85.71      92.47      72.87     81.45      90.92      96.00      78.64     86.24
"""
import ml_collections

from fedjax_flat.training.default_config import default_config


def get_config():
  c = default_config()
  c.dataset = 'digits_feature_shift'
  c.data = ml_collections.ConfigDict({'num_clients': 5, 'seed': 0, 'val_fraction': 0.1, 'test_fraction': 0.15,
                                      'leave_out': -1, 'global_fraction': 0.1})
  c.model = 'digits_cnn'
  c.model_kwargs.gn_groups = 0   # 4: GroupNorm after each conv (FedBN's network; --config.model_kwargs.gn_groups=4)
  c.algorithm = 'fedprox'
  c.algo.mu = 0.01
  c.rounds = 100
  c.clients_per_round = 5
  c.client.lr = 0.05
  c.client.batch_size = 16
  c.client.local_epochs = 1
  c.client.weight_decay = 4e-4
  c.eval_every = 10
  c.summary_last_k = 1
  c.personalized.enabled = True
  c.personalized.finetune_epochs = 15
  c.personalized.finetune_lr = 0.01
  c.personalized.per_client = True
  return c
