r"""FedSoup on the cross-silo feature-shift digits (5 "hospitals", one acquisition transform each).

The quickstart-sized stand-in for FedSoup's setting (Chen et al., MICCAI 2023; digest part A): few clients
with domain shift, all participating every round, 1 local epoch per round, the soup from 75% of training,
accepted on each client's validation split with the paper's `>=`. At the end, every personalized model
(client k's last patched upload) is evaluated by the protocols of core/personalized.py (summary.json
'personalized': local / global / other clients / server, accuracy and micro-AUC), then fine-tuned for 15
local epochs with evaluation after each (Fig. 2b's trade-off; the paper shows iterations 1, 7, 15).

Commands (the comparison; benchmarks/README.fedsoup.md has the measured table):
  .venv/bin/python experiments/train.py --config=configs/fedsoup_digits_fedsoup.py --workdir=runs/fs_fedsoup
  .venv/bin/python experiments/train.py --config=configs/fedsoup_digits_fedavg.py  --workdir=runs/fs_fedavg
  .venv/bin/python experiments/train.py --config=configs/fedsoup_digits_fedprox.py --workdir=runs/fs_fedprox
Unseen domain (leave-one-client-out, digest A4; the left-out hospital never trains, summary 'unseen'):
  --config.data.leave_out=1 --config.clients_per_round=4   (folds 0..4; the paper: all folds x 3 seeds)
Reference-code variants: --config.algo.strict=True (`>`), --config.algo.val_source=local_test (selection on
the local test split), --config.algo.persist_opt_state=True (client optimizer state kept across rounds).

Paper Table 1 (real data; ResNet-18, Adam 1e-3, batch 16, 1000 rounds; mean (std)), for reference only:
                 Pathology (Camelyon17, 5 clients)       Retina (4 institutions)
                 Local Acc  Local AUC  Glob Acc  Glob AUC   Local Acc  Local AUC  Glob Acc  Glob AUC
  FedAvg         82.41      90.44      70.18     78.74      89.81      95.24      73.27     81.02
  FedProx        86.34      92.78      67.42     77.18      90.14      95.47      70.46     76.84
  FedBN          82.32      90.07      65.16     71.61      89.70      95.49      75.11     82.70
  FedSoup        85.71      92.47      72.87     81.45      90.92      96.00      78.64     86.24
(unseen-domain pathology, Fig. 2c: FedSoup +2.87 AUC over FedAvg.) Those are binary tasks; the digits have
10 classes, so AUC here is the micro-averaged one-vs-rest AUC.

Setting here: digits_cnn, client SGD lr 0.05 (no momentum, weight decay 4e-4), batch 16, 1 local epoch,
100 rounds, 5 clients per round (all), server FedAvg; fine-tuning at lr 0.01. The global test set takes 10%
of every source (data.global_fraction=0.1, about 190 digits: the paper-sized set, about one local test set
of about 50 digits, is data.global_fraction=0 and too small to separate the methods). Differences from the
paper: SGD instead of Adam (the paper's client: --config.client.base_optimizer=adam --config.client.lr=1e-3
--config.client.adam_b2=0.99 [--config.algo.persist_opt_state=True for the code's persistent moments]), a tiny
CNN without normalization layers by default (--config.model_kwargs.gn_groups=4 adds GroupNorm, the network of
configs/fedsoup_digits_fedbn.py), 10-class digits instead of binary medical images.
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
  c.algorithm = 'fedsoup'
  c.algo.start_fraction = 0.75
  c.algo.strict = False
  c.algo.val_source = 'val'
  c.algo.persist_opt_state = False
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
