"""The published hyperparameters of the flat-minima papers (thesis Appendix A.1-A.4, digest sections 3.1-3.5)
and the few helpers the `configs/` files use to build their settings from them.

Tables (values transcribed from ../shared/reference/flat_minima_chapter4_digest.md):
  TRAINING     Table A.1: local lr, batch, weight decay, local epochs, client momentum, rounds
  RHO          Table A.2: SAM rho, ASAM rho and ASAM eta per (dataset, alpha)
  SWA          Table A.3: cycle c, gamma1, gamma2, start round
  FEDGLOSS     Table A.5 / release scripts: rho_l, rho_s, beta, T_s (CNN)
  PUBLISHED    Table 4.3 (CIFAR CNN, FedSAM paper) accuracies, for the configs' docstrings and reports
  T419         Table 4.19: rounds and bits (in units of FedAvg's T-round bits) to reach FedAvg's final accuracy,
               shared by the FedGloSS comparison families (`comm_to_target`)
"""
from __future__ import annotations

import math
from typing import Tuple

import ml_collections

from fedjax_flat.config.default_config import data_section, default_config

# Table A.1 (FedSAM training setup).
TRAINING = {
    'cifar10': dict(lr=0.01, batch_size=64, weight_decay=4e-4, local_epochs=1, momentum=0.0, rounds=10000),
    'cifar100': dict(lr=0.01, batch_size=64, weight_decay=4e-4, local_epochs=1, momentum=0.0, rounds=20000),
    'cifar100_pam': dict(lr=0.01, batch_size=20, weight_decay=4e-4, local_epochs=1, momentum=0.9, rounds=10000),
    'gld160k': dict(lr=0.1, batch_size=64, weight_decay=4e-5, local_epochs=5, momentum=0.0, rounds=5000),
    # Segmentation (FedDrive, BiSeNetV2; 5 clients per round; batch 8 = FedDrive's 16 without mixed precision).
    'cityscapes': dict(lr=0.05, batch_size=8, weight_decay=5e-4, local_epochs=2, momentum=0.9, rounds=1500),
    'idda': dict(lr=0.1, batch_size=8, weight_decay=0.0, local_epochs=2, momentum=0.9, rounds=1500),
}

# Table A.2: (dataset, alpha) -> (SAM rho, ASAM rho, ASAM eta). PAM / Landmarks: ASAM eta 0.2 (0 with MixUp).
RHO = {
    ('cifar10', 0.0): (0.1, 0.7, 0.2),
    ('cifar10', 0.05): (0.1, 0.7, 0.2),
    ('cifar10', 100.0): (0.02, 0.05, 0.2),
    ('cifar100', 0.0): (0.02, 0.5, 0.2),
    ('cifar100', 0.5): (0.05, 0.5, 0.2),
    ('cifar100', 1000.0): (0.05, 0.5, 0.2),
    ('cifar100_pam', 0.1): (0.05, 0.5, 0.2),
    ('gld160k', None): (0.05, 0.5, 0.2),
    ('cityscapes', None): (0.01, 0.1, 0.2),
    ('idda', None): (0.01, 0.5, 0.2),
}

# Table A.3 (server SWA): cycle, gamma1, gamma2, start round (PAM: the table's 15000 exceeds T = 10k, [U];
# 0.75 T = 7500 is used; Landmarks: 3750 = 0.75 T).
SWA = {
    'cifar10': dict(cycle=10, lr1=1e-2, lr2=1e-4, start=7500),
    'cifar100': dict(cycle=20, lr1=1e-2, lr2=1e-4, start=15000),
    'cifar100_pam': dict(cycle=5, lr1=1e-2, lr2=1e-4, start=7500),
    'gld160k': dict(cycle=5, lr1=1e-1, lr2=1e-3, start=3750),
    'cityscapes': dict(cycle=5, lr1=5e-2, lr2=5e-4, start=1125),
    'idda': dict(cycle=5, lr1=1e-1, lr2=1e-3, start=1125),
}

# FedGloSS CNN (Table A.5 reconstructed, confirmed by the release scripts paper_experiments/cnn_cifar*.sh).
FEDGLOSS = {
    'cifar10': dict(rho_l=0.15, rho_s=0.15, beta=10.0, warmup_rounds=2000, rho0=0.001, rounds=10000),
    'cifar100': dict(rho_l=0.2, rho_s=0.01, beta=100.0, warmup_rounds=15000, rho0=0.001, rounds=20000),
}

# Table 4.3 (CNN; C10 10k rounds, C100 20k rounds): accuracy % for 5 / 10 / 20 clients per round.
PUBLISHED = {
    ('cifar10', 0.0): {'fedavg': (65.00, 65.54, 68.52), 'fedsam': (70.16, 71.09, 72.90),
                       'fedasam': (73.66, 74.10, 76.09), 'fedavg+swa': (69.71, 69.54, 70.19),
                       'fedsam+swa': (74.97, 73.73, 73.06), 'fedasam+swa': (76.44, 75.51, 76.36)},
    ('cifar10', 0.05): {'fedavg': (69.24, 72.50, 73.07), 'fedsam': (73.52, 74.81, 76.04),
                        'fedasam': (75.61, 76.22, 76.98), 'fedavg+swa': (73.48, 72.80, 73.81),
                        'fedsam+swa': (76.61, 75.84, 76.22), 'fedasam+swa': (76.12, 76.16, 76.86)},
    ('cifar10', 100.0): {'fedavg': (84.46, 84.50, 84.59), 'fedsam': (84.58, 84.67, 84.82),
                         'fedasam': (84.77, 84.72, 84.75), 'fedavg+swa': (84.35, 84.32, 84.47),
                         'fedsam+swa': (84.23, 84.37, 84.63), 'fedasam+swa': (84.88, 84.80, 84.79)},
    ('cifar100', 0.0): {'fedavg': (30.25, 36.74, 38.59), 'fedsam': (31.04, 36.93, 38.56),
                        'fedasam': (36.04, 39.76, 40.81), 'fedavg+swa': (39.34, 39.74, 39.85),
                        'fedsam+swa': (39.30, 39.51, 39.24), 'fedasam+swa': (42.01, 42.64, 41.62)},
    ('cifar100', 0.5): {'fedavg': (40.43, 41.27, 42.17), 'fedsam': (44.73, 44.84, 46.05),
                        'fedasam': (45.61, 46.58, 47.78), 'fedavg+swa': (43.90, 44.02, 42.09),
                        'fedsam+swa': (47.96, 46.76, 46.47), 'fedasam+swa': (49.17, 48.72, 48.27)},
    ('cifar100', 1000.0): {'fedavg': (49.92, 50.25, 50.66), 'fedsam': (54.01, 53.39, 53.97),
                           'fedasam': (54.81, 54.97, 54.50), 'fedavg+swa': (50.98, 50.87, 50.92),
                           'fedsam+swa': (53.90, 53.67, 54.36), 'fedasam+swa': (53.86, 54.79, 54.10)},
}

METHODS = ('fedavg', 'fedsam', 'fedasam')


def _alpha_key(dataset, alpha):
  for (d, a) in RHO:
    if d == dataset and (a is None or alpha is None or math.isclose(a, float(alpha))):
      return (d, a)
  grid = sorted(a for d, a in RHO if d == dataset)
  raise KeyError(f'no published rho for {dataset} alpha={alpha}; Table A.2 has alpha in {grid}')


def client_optimizer(dataset: str, alpha, method: str) -> dict:
  """Table A.2 -> the client fields for FedAvg / FedSAM / FedASAM: {'optimizer', 'rho', 'asam_eta'}."""
  if method not in METHODS:
    raise ValueError(f'method={method!r}; allowed: {METHODS}')
  sam_rho, asam_rho, asam_eta = RHO[_alpha_key(dataset, alpha)]
  if method == 'fedsam':
    return {'optimizer': 'sam', 'rho': sam_rho, 'asam_eta': 0.0}
  if method == 'fedasam':
    return {'optimizer': 'asam', 'rho': asam_rho, 'asam_eta': asam_eta}
  return {'optimizer': 'sgd', 'rho': 0.0, 'asam_eta': 0.0}


def published(dataset: str, alpha, method: str, clients_per_round: int = 5):
  """Table 4.3 accuracy (%) or None."""
  row = PUBLISHED.get(_alpha_key(dataset, alpha), {}).get(method)
  return None if row is None else row[{5: 0, 10: 1, 20: 2}[clients_per_round]]


def apply_training(c, dataset: str) -> None:
  t = TRAINING[dataset]
  c.rounds = t['rounds']
  c.client.lr = t['lr']
  c.client.batch_size = t['batch_size']
  c.client.weight_decay = t['weight_decay']
  c.client.local_epochs = t['local_epochs']
  c.client.momentum = t['momentum']


def apply_swa(c, dataset: str, enabled: bool = True) -> None:
  """Table A.3, with start_fraction = start / T (0.75 everywhere). enabled=False presets the fields only, so
  that `--config.swa.enabled=True` gives the paper's SWA."""
  s = SWA[dataset]
  c.swa.enabled = enabled
  c.swa.cycle = s['cycle']
  c.swa.lr1 = s['lr1']
  c.swa.lr2 = s['lr2']
  c.swa.start_fraction = s['start'] / c.rounds


def cifar_cnn_config(dataset: str, method: str, *, alpha: float = 0.0, clients_per_round: int = 5,
                     swa: bool = False) -> ml_collections.ConfigDict:
  """The FedSAM paper's CIFAR setting: CNN, 100 clients x 500 images, Dirichlet alpha, Tables A.1-A.3."""
  c = default_config()
  c.dataset = dataset
  c.data = data_section(data_dir='', num_clients=100, alpha=float(alpha), examples_per_client=500, seed=0)
  c.model = 'cifar_cnn'
  c.augment = 'cifar'
  c.normalize = dataset
  c.algorithm = 'fedavg'
  apply_training(c, dataset)
  c.clients_per_round = clients_per_round
  for k, v in client_optimizer(dataset, alpha, method).items():
    c.client[k] = v
  apply_swa(c, dataset, enabled=swa)
  c.eval_every = 100            # the papers' protocol: every 100 rounds, then every round of the last 100,
  c.eval_every_last = 100       # and the reported number is the mean test accuracy over those 100 rounds
  c.summary_last_k = 100
  return c


def landmarks_config() -> ml_collections.ConfigDict:
  """The FedSAM paper's Landmarks-User-160k setting (Table A.1), client optimizer left to the caller."""
  c = default_config()
  c.dataset = 'gld160k'
  c.data = data_section(data_dir='', train_augment=True, seed=0)
  c.model = 'mobilenet_v2_gn'
  c.augment = 'none'            # random-resized-crop + flip run in the data loader (data.train_augment)
  c.normalize = 'imagenet'
  apply_training(c, 'gld160k')
  c.clients_per_round = 10
  c.eval_every = 10
  c.eval_every_last = 100       # the papers: mean test accuracy over the last 100 rounds, each evaluated
  c.summary_last_k = 100
  return c


# Table 4.19 (FedGloSS paper): rounds and bits (units of B = the bits FedAvg sends in its T rounds) to reach
# FedAvg's final accuracy. Columns: (model, dataset, alpha); rows: client optimizer/method. None = never
# reached ("-"), 'X' = did not converge.
T419_COLUMNS = (('cnn', 'cifar10', 0.0), ('cnn', 'cifar10', 0.05), ('cnn', 'cifar100', 0.0),
                ('cnn', 'cifar100', 0.5), ('resnet18', 'cifar10', 0.05), ('resnet18', 'cifar100', 0.5),
                ('mobilenet', 'gld160k', None))
_N = None
T419 = {
    'sgd/fedavg': ((10000, 1), (10000, 1), (20000, 1), (20000, 1), (10000, 1), (10000, 1), (1300, 1)),
    'sgd/fedprox': ((7600, .8), (7900, .8), (18700, .9), (18600, .9), (8800, .9), (8300, .8), (_N, _N)),
    'sgd/feddyn': ((2000, .2), (1900, .2), 'X', 'X', (_N, _N), (3500, .4), (_N, _N)),
    'sgd/scaffold': ((_N, _N), (_N, _N), 'X', (_N, _N), (_N, _N), (8900, 1.8), 'X'),
    'sgd/fedgloss': ((3400, .3), (3800, .4), (5000, .3), (4700, .2), (2400, .2), (1900, .2), (_N, _N)),
    'sam/fedsam': ((6300, .6), (7800, .8), (18300, .9), (16300, .8), (9200, .9), (7800, .8), (1300, 1)),
    'sam/feddyn': ((3000, .3), (4200, .4), 'X', 'X', (4100, .4), (3500, .4), (_N, _N)),
    'sam/fedspeed': ((6300, 1.3), (6900, 1.4), (18300, 1.8), (15700, 1.6), (8300, .7), (8300, 1.7), (1300, 2)),
    'sam/fedgamma': ((_N, _N), (_N, _N), 'X', (_N, _N), (9300, 1.9), (8100, 1.6), 'X'),
    'sam/fedsmoo': ((1900, .4), (2200, .4), (4500, .5), (6500, .7), (2400, .5), (2300, .5), (200, .3)),
    'sam/fedgloss': ((2200, .2), (2200, .2), (6300, .3), (5200, .3), (2400, .2), (1900, .2), (200, .2)),
}
# The target of each column: FedAvg's final accuracy (%) in the matching accuracy table (4.15, 4.16, 4.18).
T419_TARGET = (59.9, 65.7, 28.6, 38.5, 72.6, 37.4, 56.3)


def comm_to_target(model: str, dataset: str, alpha, method: str) -> Tuple[str, dict]:
  """Table 4.19's entry for (model, dataset, alpha) and 'client/method' -> (note for the source, metrics for
  config.published: rounds_to_target, bits_to_target_B = bits in units of FedAvg's T-round bits,
  target_accuracy); ('', {}) when the table has no such entry."""
  col = next((i for i, (m, d, a) in enumerate(T419_COLUMNS) if m == model and d == dataset and
              (a is None or alpha is None or math.isclose(a, float(alpha)))), None)
  if col is None or method not in T419:
    return '', {}
  v = T419[method][col]
  target = {'target_accuracy': T419_TARGET[col]}
  if v == 'X':
    return '; Table 4.19: did not converge', target
  if v[0] is None:
    return '; Table 4.19: FedAvg\'s accuracy never reached', target
  return '; Table 4.19: rounds / bits to FedAvg\'s accuracy', {**target, 'rounds_to_target': v[0],
                                                                 'bits_to_target_B': v[1]}


# Table 4.13 (alpha = 0, last round, 5 clients/round): lambda_1 of each sampled client's local model on its own
# data (l) and on the whole training set (g); the clients are named by their single class. Rows: 'client/method'
# of Table 4.15; None = FedDyn did not converge (C100).
T413_CLASSES = {'cifar10': ('airplane', 'cat', 'bird', 'airplane', 'frog'),
                'cifar100': ('sea', 'snail', 'bear', 'skyscraper', 'possum')}
T413 = {   # (dataset, row) -> ((l, g) per client)
    ('cifar10', 'sgd/fedavg'): ((9.1, 239.1), (424.2, 273.6), (18.4, 237.0), (483.5, 269.5), (263.2, 259.6)),
    ('cifar10', 'sam/fedsam'): ((100.6, 36.4), (28.8, 16.5), (106.4, 35.7), (103.2, 30.6), (68.1, 32.9)),
    ('cifar10', 'sgd/feddyn'): ((752.5, 347.8), (59.9, 242.3), (894.0, 371.2), (761.6, 348.9), (528.9, 286.0)),
    ('cifar10', 'sam/feddyn'): ((199.6, 12.0), (122.0, 11.1), (200.2, 12.0), (206.9, 12.3), (155.6, 11.7)),
    ('cifar10', 'sam/fedsmoo'): ((122.1, 26.5), (82.4, 26.9), (134.2, 25.7), (122.8, 25.2), (79.3, 33.5)),
    ('cifar10', 'sam/fedgloss'): ((190.1, 4.3), (106.9, 3.9), (200.1, 4.1), (207.8, 4.0), (84.8, 4.1)),
    ('cifar100', 'sgd/fedavg'): ((251.0, 224.5), (91.2, 267.0), (108.4, 215.2), (613.3, 300.1), (37.9, 259.6)),
    ('cifar100', 'sam/fedsam'): ((0.1, 238.5), (0.2, 149.1), (6.7, 129.3), (1.3, 194.6), (15.3, 142.6)),
    ('cifar100', 'sam/fedsmoo'): ((33.2, 31.4), (331.2, 102.2), (428.6, 121.0), (143.5, 40.2), (455.5, 90.9)),
    ('cifar100', 'sam/fedgloss'): ((28.3, 19.6), (260.8, 40.7), (220.3, 49.6), (269.2, 22.2), (392.4, 39.0)),
}


def local_global_lambdas(dataset: str, alpha, method: str) -> Tuple[str, dict]:
  """Table 4.13's entry for a Table 4.15 cell -> (note for the source, {lambda_local_i, lambda_global_i} for the
  5 clients i = 1..5 of the last round, in the table's order); ('', {}) when the table has no such row. Measured
  with experiments/hessian.py --per_client on the run's last round (its per-client report)."""
  rows = T413.get((dataset, method))
  if rows is None or float(alpha) != 0.0:
    return '', {}
  out = {}
  for i, (lo, gl) in enumerate(rows, 1):
    out[f'lambda_local_{i}'], out[f'lambda_global_{i}'] = lo, gl
  return f'; Table 4.13: local / global lambda_1 of the last round\'s clients ({", ".join(T413_CLASSES[dataset])})', \
      out
