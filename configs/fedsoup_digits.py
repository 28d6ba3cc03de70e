r"""FedSoup and its baselines (FedAvg, FedProx, FedBN) on the cross-silo feature-shift digits (5 "hospitals",
one acquisition transform each): the quickstart-sized stand-in for FedSoup's Table 1 (Chen et al., MICCAI
2023).

Commands (the comparison; benchmarks/studies/README.fedsoup.md has the measured table):
  .venv/bin/python experiments/train.py --config=configs/fedsoup_digits.py:fedsoup --workdir=runs/fs_fedsoup
  .venv/bin/python experiments/train.py --config=configs/fedsoup_digits.py:fedavg  --workdir=runs/fs_fedavg
  .venv/bin/python experiments/train.py --config=configs/fedsoup_digits.py:fedprox --workdir=runs/fs_fedprox
  .venv/bin/python experiments/train.py --config=configs/fedsoup_digits.py:fedbn   --workdir=runs/fs_fedbn
Grammar: fedsoup | fedavg | fedprox | fedbn | moon | fedfomo | fedrep | fedbabu (default fedsoup);
leave_out=-1 | 0..4 (unseen domain, digest A4: the left-out hospital never trains, summary 'unseen'; the
clients per round drop to 4). CELLS: the 8 methods x (all clients, each of the 5 folds).

Every run ends with the personalized evaluation of evaluation/personalized.py (summary.json 'personalized': local /
global / other clients / server, accuracy and micro-AUC), then 15 fine-tuning epochs with evaluation after each
(Fig. 2b's trade-off; the paper shows iterations 1, 7, 15).
  FedSoup: the soup from 75% of training, accepted on each client's validation split with the paper's `>=`.
    Reference-code variants: --config.algo.strict=True (`>`), --config.algo.val_source=local_test (selection on
    the local test split), --config.algo.persist_opt_state=True (client optimizer state kept across rounds).
  FedAvg / FedProx: a client's personalized model is the global model, so "local" is the global model on each
    client's test split; the fine-tuning epochs personalize it afterwards. FedProx mu = 0.01 (the paper gives
    no mu; its code defaults to mu = 0).
  FedBN (Li et al. 2021): FedAvg with the normalization layers kept local, on digits_cnn with GroupNorm after
    each conv (model_kwargs.gn_groups=4); a client's personalized model is the global model with its own norm
    params. For a like-for-like comparison run the others on the same network: --config.model_kwargs.gn_groups=4
    (benchmarks/studies/fedsoup_compare.py --gn_groups=4).

  MOON (mu 1, tau 0.5: MOON's defaults), FedFomo (M = 4 other clients, epsilon 0.3 decaying 0.05 per round,
    weights on each client's validation split), FedRep (1 head epoch, then 1 body epoch; heads local), FedBABU
    (the head fixed at its random init; personalized by the 15 fine-tuning epochs): the other PFL baselines of
    Table 1 (configs/fedsoup_table1.py has them in the paper's setting); head = digits_cnn's last Dense.

Setting: digits_cnn, client SGD lr 0.05 (no momentum, weight decay 4e-4), batch 16, 1 local epoch, 100 rounds,
5 clients per round (all), server FedAvg; fine-tuning at lr 0.01. The global test set takes 10% of every source
(data.global_fraction=0.1, about 190 digits: the paper-sized set, about one local test set of about 50 digits,
is data.global_fraction=0 and too small to separate the methods). Differences from the paper: SGD instead of
Adam (the paper's client: --config.client.base_optimizer=adam --config.client.lr=1e-3 --config.client.adam_b2=0.99
[--config.algo.persist_opt_state=True for the code's persistent moments]), a tiny CNN without normalization
layers by default, 10-class digits instead of binary medical images.

No published numbers in config.published: the paper's Table 1 is on real pathology / retina data with
ResNet-18, not on these digits. For reference only (Local / Global Acc and AUC; mean over folds x seeds):
                 Pathology (Camelyon17, 5 clients)       Retina (4 institutions)
                 Local Acc  Local AUC  Glob Acc  Glob AUC   Local Acc  Local AUC  Glob Acc  Glob AUC
  FedAvg         82.41      90.44      70.18     78.74      89.81      95.24      73.27     81.02
  FedProx        86.34      92.78      67.42     77.18      90.14      95.47      70.46     76.84
  FedBN          82.32      90.07      65.16     71.61      89.70      95.49      75.11     82.70
  FedSoup        85.71      92.47      72.87     81.45      90.92      96.00      78.64     86.24
(unseen-domain pathology, Fig. 2c: FedSoup +2.87 AUC over FedAvg.) Those are binary tasks; the digits have
10 classes, so AUC here is the micro-averaged one-vs-rest AUC.
"""
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import data_section, default_config

FAMILY = 'configs/fedsoup_digits.py'
METHODS = ('fedsoup', 'fedavg', 'fedprox', 'fedbn', 'moon', 'fedfomo', 'fedrep', 'fedbabu')
FIELDS = {'method': ('fedsoup', METHODS), 'leave_out': (-1, int)}
NUM_CLIENTS = 5
CELLS = [f'{m},leave_out={f}' for m in METHODS for f in range(-1, NUM_CLIENTS)]


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  method, leave_out = o['method'], o['leave_out']
  config_strings.check(FAMILY, 'leave_out', leave_out, tuple(range(-1, NUM_CLIENTS)))
  c = default_config()
  c.dataset = 'digits_feature_shift'
  c.data = data_section(num_clients=NUM_CLIENTS, seed=0, val_fraction=0.1, test_fraction=0.15,
                               leave_out=leave_out, global_fraction=0.1)
  c.model = 'digits_cnn'
  c.model_kwargs.gn_groups = 4 if method == 'fedbn' else 0   # FedBN: GroupNorm after each conv, kept local
  c.algorithm = method
  if method == 'fedsoup':
    c.algo.start_fraction = 0.75
    c.algo.strict = False
    c.algo.val_source = 'val'
    c.algo.persist_opt_state = False
  elif method == 'fedprox':
    c.algo.mu = 0.01
  elif method == 'moon':
    c.algo.mu = 1.0
    c.algo.tau = 0.5
  elif method == 'fedfomo':
    c.algo.models = 5            # capped at the other clients (4)
    c.algo.epsilon = 0.3
    c.algo.epsilon_decay = 0.05
    c.algo.val_source = 'val'
    c.algo.population = NUM_CLIENTS - (leave_out >= 0)     # N: the training clients (the held-out one never trains)
  elif method == 'fedrep':
    c.algo.head_epochs = 1
  c.rounds = 100
  c.clients_per_round = NUM_CLIENTS - (leave_out >= 0)
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
