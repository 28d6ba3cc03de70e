r"""FedAvg / FedSAM / FedASAM (+ server SWA) on CIFAR10/100 with the FedSAM paper's CNN: thesis Tables 4.3, 4.1,
4.5, 4.7, 4.11, 4.12 (and the CIFAR-C evaluation of Fig. 4.13).

One cell per command:
  .venv/bin/python experiments/train.py --workdir=runs/c100_fedasam_swa_a0.5 \
      --config=configs/fedsam_cifar.py:cifar100,fedasam,swa,alpha=0.5,clients=10

Grammar (comma-separated; defaults cifar10,fedavg,alpha=0,clients=5,epochs=1, no SWA, aug=none):
  cifar10 | cifar100;  fedavg | fedsam | fedasam;  swa (server SWA, Table A.3);
  alpha=0 | 0.05 | 100 (CIFAR10), 0 | 0.5 | 1000 (CIFAR100);  clients=5 | 10 | 20 (clients per round);
  epochs=1 | 2 (local epochs; the table's "E=2" rows: FedAvg without SWA only);
  mixup | cutout (Table 4.7's strong augmentations on top of crop + flip; augment=cifar_mixup: MixUp alpha 1,
    soft labels; augment=cifar_cutout: 16x16 holes on CIFAR10, 8x8 on CIFAR100 as the thesis text says [U: the
    release code uses 16 for both; --config.augment_kwargs are not a field, so 8 stays]; ASAM keeps Table A.2's
    eta 0.2 [U: Table A.2 sets eta 0 with MixUp for PAM only]);
  cycle=1 with swa (Table 4.11 "Avg, c = 1": averaging every round, constant client lr);
  noavg with swa (Table 4.11 "no Avg, c > 1": the cyclic client lr alone, no averaging: swa.average=False);
  start=<round> with fedavg,swa,clients=5 (Table 4.12: SWA start round; C10 500 | 2500 | 5000, C100 1000 |
    5000 | 10000; the table's last row, 7500 / 15000, is the default 0.75 T);
  table=4.1 (cifar100, alpha=0 | 1000, clients=5: Table 4.1's lambda_1 and lambda_1/lambda_5 of the global
    model in config.published.lambda_max / lambda_ratio_1_5, beside Table 4.3's accuracy; [U] the thesis does
    not state the clients per round of Table 4.1: 5, its reference setting, is assumed);
  cifarc (clients=20: CIFAR10-C / CIFAR100-C at severity 5 after training, Fig. 4.13's protocol:
    config.corruption_eval; pass --config.corruption_eval.data_dir=<CIFAR-10-C dir>; the thesis and both FedSAM
    seeds give Fig. 4.13 as a plot only (its text page is lost), so config.published holds the clean Table 4.3
    number and no corrupted-test number)
CELLS lists every published cell (Tables 4.3, 4.1, 4.7, 4.11, 4.12 and the Fig. 4.13 cells); each carries its
published number in config.published.

Setting (Table A.1): 100 clients x 500 images, Dirichlet alpha; lr 0.01, batch 64, weight decay 4e-4, no client
momentum; C10 10k rounds, C100 20k rounds; server FedAvg (SGD lr 1); random crop (pad 4) + flip, dataset
normalization. Radii (Table A.2, per dataset and alpha): SAM rho C10 0.1 / 0.1 / 0.02, C100 0.02 / 0.05 / 0.05;
ASAM rho 0.7 / 0.7 / 0.05 (C10), 0.5 (C100), eta 0.2. Server SWA (Table A.3): from 0.75 T, cycle c = 10 (C10) /
20 (C100), cyclic client lr 1e-2 -> 1e-4; the SWA model is the reported one. Evaluation every 100 rounds and
every round of the last 100; the reported number is the mean test accuracy over the last 100 rounds
(summary.json's last-K mean, K = 100), the papers' protocol.
Data: --config.data.data_dir=... (fedjax_flat/data/sources/cifar.py; experiments/download.py).

Published accuracy % (Table 4.3; mean of the last 100 rounds), at 5 / 10 / 20 clients per round:
                         alpha=0                 alpha=0.05 | 0.5        alpha=100 | 1000
  C10  FedAvg            65.00 65.54 68.52       69.24 72.50 73.07       84.46 84.50 84.59
  C10  FedAvg E=2        61.49 62.22 66.36       69.23 69.77 73.48       83.93 84.10 84.21
  C10  FedSAM            70.16 71.09 72.90       73.52 74.81 76.04       84.58 84.67 84.82
  C10  FedASAM           73.66 74.10 76.09       75.61 76.22 76.98       84.77 84.72 84.75
  C10  FedAvg+SWA        69.71 69.54 70.19       73.48 72.80 73.81       84.35 84.32 84.47
  C10  FedSAM+SWA        74.97 73.73 73.06       76.61 75.84 76.22       84.23 84.37 84.63
  C10  FedASAM+SWA       76.44 75.51 76.36       76.12 76.16 76.86       84.88 84.80 84.79
  C100 FedAvg            30.25 36.74 38.59       40.43 41.27 42.17       49.92 50.25 50.66
  C100 FedAvg E=2        24.94 31.81 35.18       38.21 39.59 40.94       48.72 48.64 48.45
  C100 FedSAM            31.04 36.93 38.56       44.73 44.84 46.05       54.01 53.39 53.97
  C100 FedASAM           36.04 39.76 40.81       45.61 46.58 47.78       54.81 54.97 54.50
  C100 FedAvg+SWA        39.34 39.74 39.85       43.90 44.02 42.09       50.98 50.87 50.92
  C100 FedSAM+SWA        39.30 39.51 39.24       47.96 46.76 46.47       53.90 53.67 54.36
  C100 FedASAM+SWA       42.01 42.64 41.62       49.17 48.72 48.27       53.86 54.79 54.10

Table 4.1 (C100, global model; table=4.1):   lambda_1 a0 / a1k     lambda_1/lambda_5 a0 / a1k
  FedAvg E=1                                 93.46 / 106.14        2.00 / 1.31
  FedAvg E=2                                 110.62 / 118.35       2.32 / 1.30
  FedSAM                                     70.29 / 51.28         1.79 / 1.48
  FedASAM                                    30.11 / 20.19         1.80 / 1.27
  FedAvg+SWA                                 97.24 / 120.02        1.49 / 1.39
  FedSAM+SWA                                 73.16 / 54.20         1.56 / 1.61
  FedASAM+SWA                                24.57 / 20.49         1.51 / 1.30

Table 4.5 (C100, 5 clients/round): its federated columns are the Table 4.3 / 4.7 cells above (SAM = FedSAM, SWA =
FedAvg+SWA, MixUp / Cutout = FedAvg with mixup / cutout); its centralized column goes in those cells'
config.published.centralized_accuracy:  SGD 52.20, SAM 55.22, ASAM 55.66, SWA 52.72, SAM+SWA 55.75,
ASAM+SWA 55.96, MixUp 58.01, Cutout 55.30. experiments/centralized.py trains each of them on the cell itself
(the client optimizer SGD / SAM / ASAM of the method, config.swa, --config.augment; SWA's cycle counts epochs
there: --config.swa.cycle=1).

Table 4.7 (strong augmentations; columns as Table 4.3):
  C100 FedAvg  MixUp         29.91 33.67 35.67       35.10 37.80 39.34       55.34 55.81 55.98
  C100 FedSAM  MixUp         30.46 34.10 35.89       38.76 40.31 42.03       54.21 54.94 55.24
  C100 FedASAM MixUp         34.04 36.82 36.97       40.71 42.24 44.45       49.75 49.87 49.68
  C100 FedAvg  +SWA MixUp    35.56 36.07 36.08       39.21 39.22 38.31       55.43 55.37 55.39
  C100 FedSAM  +SWA MixUp    35.62 36.25 35.66       42.13 41.95 42.03       52.9  53.14 53.48
  C100 FedASAM +SWA MixUp    40.08 38.74 37.47       44.53 43.97 44.22       46.97 47.24 46.93
  C100 FedAvg  Cutout        24.24 31.55 32.44       37.72 38.45 39.48       53.48 53.83 52.90
  C100 FedSAM  Cutout        23.51 30.92 33.12       40.33 40.31 42.58       54.27 54.75 54.76
  C100 FedASAM Cutout        30.05 33.62 34.51       41.86 41.84 43.33       51.88 51.78 53.03
  C100 FedAvg  +SWA Cutout   33.65 34.40 35.03       40.43 40.12 39.32       53.87 54.09 52.75
  C100 FedSAM  +SWA Cutout   34.00 34.08 34.26       43.09 42.81 42.85       53.78 54.28 53.93
  C100 FedASAM +SWA Cutout   39.30 37.46 36.27       44.76 43.48 43.95       50.00 49.65 50.81
  C10  FedAvg  MixUp         62.26 63.61 65.54       65.63 68.44 68.21       82.38 84.46 83.58
  C10  FedSAM  MixUp         67.35 69.32 69.78       70.34 72.98 72.54       81.88 82.24 82.25
  C10  FedASAM MixUp         70.61 71.31 71.62       72.19 72.84 72.72       82.36 82.75 83.08
  C10  FedAvg  +SWA MixUp    66.31 66.89 66.26       69.79 69.12 68.80       82.27 82.88 82.67
  C10  FedSAM  +SWA MixUp    72.42 70.65 69.75       73.36 72.29 72.44       81.04 81.18 81.15
  C10  FedASAM +SWA MixUp    72.37 72.40 71.89       72.54 72.36 72.32       81.86 81.70 81.92
  C10  FedAvg  Cutout        61.12 64.47 64.20       66.45 69.09 68.99       83.77 83.91 84.31
  C10  FedSAM  Cutout        63.69 66.30 67.25       67.66 71.39 70.67       83.03 83.84 83.49
  C10  FedASAM Cutout        68.50 69.26 69.75       69.23 71.91 71.28       83.73 84.10 84.00
  C10  FedAvg  +SWA Cutout   65.54 65.60 65.79       69.94 69.55 69.63       83.35 83.39 83.64
  C10  FedSAM  +SWA Cutout   69.40 68.45 67.36       71.36 71.56 70.99       82.61 82.75 82.52
  C10  FedASAM +SWA Cutout   71.30 71.12 70.91       72.79 71.76 71.09       83.06 83.31 83.11

Table 4.11 (SWA ablation; "Avg, c = 20|10" rows are Table 4.3's +SWA cells, "no Avg, c = 1" its plain cells):
  C100 FedAvg  Avg c=1       38.86 39.82 40.19       43.86 43.93 42.67       51.33 51.05 51.11   swa,cycle=1
  C100 FedSAM  Avg c=1       38.58 39.20 39.37       47.29 46.34 46.40       53.88 53.70 54.36
  C100 FedASAM Avg c=1       42.50 42.40 41.76       48.67 48.50 47.95       54.16 55.07 54.19
  C100 FedAvg  noAvg c=20    30.68 34.86 37.42       40.34 42.40 41.89       50.06 50.21 50.81   swa,noavg
  C100 FedSAM  noAvg c=20    31.51 35.87 37.81       44.08 45.80 46.43       53.76 53.46 54.28
  C100 FedASAM noAvg c=20    36.85 39.76 41.03       46.34 48.06 48.38       54.21 55.06 54.22
  C10  FedAvg  Avg c=1       69.88 69.83 70.72       73.91 73.12 73.07       84.90 84.47 84.67
  C10  FedSAM  Avg c=1       75.17 74.00 73.53       76.93 76.06 76.55       84.53 84.54 84.77
  C10  FedASAM Avg c=1       76.80 75.48 76.84       76.87 76.30 77.55       85.09 85.06 84.73
  C10  FedAvg  noAvg c=10    61.41 63.96 67.39       67.17 69.88 72.19       84.18 84.15 84.45
  C10  FedSAM  noAvg c=10    70.66 71.14 73.04       73.93 74.96 76.20       84.23 84.40 84.69
  C10  FedASAM noAvg c=10    75.07 74.87 76.37       75.37 76.17 77.14       84.68 84.72 84.71

Table 4.12 (FedAvg + SWA, 5 clients/round, SWA start round; the last row is Table 4.3's FedAvg+SWA):
  C100 c=20 start 1000       24.53   34.52   49.38      (alpha 0 / 0.5 / 1000)
  C100 c=20 start 5000       30.66   39.71   51.52
  C100 c=20 start 10000      36.21   42.55   51.01
  C100 c=20 start 15000      39.34   43.90   50.98
  C10  c=10 start 500        55.57   60.50   79.09      (alpha 0 / 0.05 / 100)
  C10  c=10 start 2500       60.34   65.72   81.49
  C10  c=10 start 5000       66.22   70.55   83.79
  C10  c=10 start 7500       69.71   73.48   84.35
"""
from fedjax_flat.config import families as config_strings, paper_hparams

FAMILY = 'configs/fedsam_cifar.py'
FIELDS = {
    'dataset': ('cifar10', ('cifar10', 'cifar100')),
    'method': ('fedavg', paper_hparams.METHODS),
    'swa': (False, bool),
    'alpha': (0.0, float),
    'clients': (5, int),
    'epochs': (1, int),
    'aug': ('none', ('none', 'mixup', 'cutout')),
    'cycle': (0, int),           # 0 = Table A.3's c; 1 = Table 4.11's "c = 1"
    'noavg': (False, bool),      # Table 4.11's cyclic lr without averaging
    'start': (0, int),           # 0 = Table A.3's 0.75 T; else Table 4.12's SWA start round
    'table': ('4.3', ('4.3', '4.1')),
    'cifarc': (False, bool),     # CIFAR-C evaluation (Fig. 4.13: 20 clients, severity 5)
}
ALPHAS = {'cifar10': (0.0, 0.05, 100.0), 'cifar100': (0.0, 0.5, 1000.0)}
CLIENTS = (5, 10, 20)
_ROWS = ('fedavg', 'fedsam', 'fedasam')
# Table 4.3's "FedAvg E=2" rows (5 / 10 / 20 clients per round); the E=1 rows are paper_hparams.PUBLISHED.
PUBLISHED_E2 = {
    ('cifar10', 0.0): (61.49, 62.22, 66.36), ('cifar10', 0.05): (69.23, 69.77, 73.48),
    ('cifar10', 100.0): (83.93, 84.10, 84.21),
    ('cifar100', 0.0): (24.94, 31.81, 35.18), ('cifar100', 0.5): (38.21, 39.59, 40.94),
    ('cifar100', 1000.0): (48.72, 48.64, 48.45),
}
# Table 4.7: (dataset, aug, swa) -> method -> 9 numbers (alpha columns x 5 / 10 / 20 clients).
T47 = {
    ('cifar100', 'mixup', False): {
        'fedavg': (29.91, 33.67, 35.67, 35.10, 37.80, 39.34, 55.34, 55.81, 55.98),
        'fedsam': (30.46, 34.10, 35.89, 38.76, 40.31, 42.03, 54.21, 54.94, 55.24),
        'fedasam': (34.04, 36.82, 36.97, 40.71, 42.24, 44.45, 49.75, 49.87, 49.68)},
    ('cifar100', 'mixup', True): {
        'fedavg': (35.56, 36.07, 36.08, 39.21, 39.22, 38.31, 55.43, 55.37, 55.39),
        'fedsam': (35.62, 36.25, 35.66, 42.13, 41.95, 42.03, 52.9, 53.14, 53.48),
        'fedasam': (40.08, 38.74, 37.47, 44.53, 43.97, 44.22, 46.97, 47.24, 46.93)},
    ('cifar100', 'cutout', False): {
        'fedavg': (24.24, 31.55, 32.44, 37.72, 38.45, 39.48, 53.48, 53.83, 52.90),
        'fedsam': (23.51, 30.92, 33.12, 40.33, 40.31, 42.58, 54.27, 54.75, 54.76),
        'fedasam': (30.05, 33.62, 34.51, 41.86, 41.84, 43.33, 51.88, 51.78, 53.03)},
    ('cifar100', 'cutout', True): {
        'fedavg': (33.65, 34.40, 35.03, 40.43, 40.12, 39.32, 53.87, 54.09, 52.75),
        'fedsam': (34.00, 34.08, 34.26, 43.09, 42.81, 42.85, 53.78, 54.28, 53.93),
        'fedasam': (39.30, 37.46, 36.27, 44.76, 43.48, 43.95, 50.00, 49.65, 50.81)},
    ('cifar10', 'mixup', False): {
        'fedavg': (62.26, 63.61, 65.54, 65.63, 68.44, 68.21, 82.38, 84.46, 83.58),
        'fedsam': (67.35, 69.32, 69.78, 70.34, 72.98, 72.54, 81.88, 82.24, 82.25),
        'fedasam': (70.61, 71.31, 71.62, 72.19, 72.84, 72.72, 82.36, 82.75, 83.08)},
    ('cifar10', 'mixup', True): {
        'fedavg': (66.31, 66.89, 66.26, 69.79, 69.12, 68.80, 82.27, 82.88, 82.67),
        'fedsam': (72.42, 70.65, 69.75, 73.36, 72.29, 72.44, 81.04, 81.18, 81.15),
        'fedasam': (72.37, 72.40, 71.89, 72.54, 72.36, 72.32, 81.86, 81.70, 81.92)},
    ('cifar10', 'cutout', False): {
        'fedavg': (61.12, 64.47, 64.20, 66.45, 69.09, 68.99, 83.77, 83.91, 84.31),
        'fedsam': (63.69, 66.30, 67.25, 67.66, 71.39, 70.67, 83.03, 83.84, 83.49),
        'fedasam': (68.50, 69.26, 69.75, 69.23, 71.91, 71.28, 83.73, 84.10, 84.00)},
    ('cifar10', 'cutout', True): {
        'fedavg': (65.54, 65.60, 65.79, 69.94, 69.55, 69.63, 83.35, 83.39, 83.64),
        'fedsam': (69.40, 68.45, 67.36, 71.36, 71.56, 70.99, 82.61, 82.75, 82.52),
        'fedasam': (71.30, 71.12, 70.91, 72.79, 71.76, 71.09, 83.06, 83.31, 83.11)},
}
# Table 4.11's new rows: (dataset, 'avg_c1' | 'noavg') -> method -> 9 numbers.
T411 = {
    ('cifar100', 'avg_c1'): {'fedavg': (38.86, 39.82, 40.19, 43.86, 43.93, 42.67, 51.33, 51.05, 51.11),
                             'fedsam': (38.58, 39.20, 39.37, 47.29, 46.34, 46.40, 53.88, 53.70, 54.36),
                             'fedasam': (42.50, 42.40, 41.76, 48.67, 48.50, 47.95, 54.16, 55.07, 54.19)},
    ('cifar100', 'noavg'): {'fedavg': (30.68, 34.86, 37.42, 40.34, 42.40, 41.89, 50.06, 50.21, 50.81),
                            'fedsam': (31.51, 35.87, 37.81, 44.08, 45.80, 46.43, 53.76, 53.46, 54.28),
                            'fedasam': (36.85, 39.76, 41.03, 46.34, 48.06, 48.38, 54.21, 55.06, 54.22)},
    ('cifar10', 'avg_c1'): {'fedavg': (69.88, 69.83, 70.72, 73.91, 73.12, 73.07, 84.90, 84.47, 84.67),
                            'fedsam': (75.17, 74.00, 73.53, 76.93, 76.06, 76.55, 84.53, 84.54, 84.77),
                            'fedasam': (76.80, 75.48, 76.84, 76.87, 76.30, 77.55, 85.09, 85.06, 84.73)},
    ('cifar10', 'noavg'): {'fedavg': (61.41, 63.96, 67.39, 67.17, 69.88, 72.19, 84.18, 84.15, 84.45),
                           'fedsam': (70.66, 71.14, 73.04, 73.93, 74.96, 76.20, 84.23, 84.40, 84.69),
                           'fedasam': (75.07, 74.87, 76.37, 75.37, 76.17, 77.14, 84.68, 84.72, 84.71)},
}
# Table 4.12: dataset -> start round -> (alpha columns); the 0.75 T row is Table 4.3's FedAvg+SWA.
T412 = {'cifar100': {1000: (24.53, 34.52, 49.38), 5000: (30.66, 39.71, 51.52), 10000: (36.21, 42.55, 51.01)},
        'cifar10': {500: (55.57, 60.50, 79.09), 2500: (60.34, 65.72, 81.49), 5000: (66.22, 70.55, 83.79)}}
# Table 4.1 (C100): row -> (lambda_1 a0, a1k, lambda_1/lambda_5 a0, a1k).
T41 = {'fedavg': (93.46, 106.14, 2.00, 1.31), 'fedavg_e2': (110.62, 118.35, 2.32, 1.30),
       'fedsam': (70.29, 51.28, 1.79, 1.48), 'fedasam': (30.11, 20.19, 1.80, 1.27),
       'fedavg+swa': (97.24, 120.02, 1.49, 1.39), 'fedsam+swa': (73.16, 54.20, 1.56, 1.61),
       'fedasam+swa': (24.57, 20.49, 1.51, 1.30)}
# Table 4.5's centralized column (C100): the centralized counterpart of each 5-client federated cell.
T45_CENTRALIZED = {('fedavg', False, 'none'): 52.20, ('fedsam', False, 'none'): 55.22,
                   ('fedasam', False, 'none'): 55.66, ('fedavg', True, 'none'): 52.72,
                   ('fedsam', True, 'none'): 55.75, ('fedasam', True, 'none'): 55.96,
                   ('fedavg', False, 'mixup'): 58.01, ('fedavg', False, 'cutout'): 55.30}
_AUGMENT = {'none': 'cifar', 'mixup': 'cifar_mixup', 'cutout': 'cifar_cutout'}


def _a(a):
  return f'{a:g}'


CELLS = [f'{ds},{m}{",swa" if swa else ""},alpha={_a(a)},clients={k}'
         for ds in ALPHAS for m in _ROWS for swa in (False, True) for a in ALPHAS[ds] for k in CLIENTS]
CELLS += [f'{ds},fedavg,alpha={_a(a)},clients={k},epochs=2' for ds in ALPHAS for a in ALPHAS[ds] for k in CLIENTS]
CELLS += [f'{ds},{m}{",swa" if swa else ""},{aug},alpha={_a(a)},clients={k}'
          for (ds, aug, swa) in T47 for m in _ROWS for a in ALPHAS[ds] for k in CLIENTS]
CELLS += [f'{ds},{m},swa,{"cycle=1" if kind == "avg_c1" else "noavg"},alpha={_a(a)},clients={k}'
          for (ds, kind) in T411 for m in _ROWS for a in ALPHAS[ds] for k in CLIENTS]
CELLS += [f'{ds},fedavg,swa,start={s},alpha={_a(a)}' for ds in T412 for s in T412[ds] for a in ALPHAS[ds]]
CELLS += [f'cifar100,{m}{",swa" if swa else ""},alpha={_a(a)},table=4.1' for m in _ROWS for swa in (False, True)
          for a in (0.0, 1000.0)]
CELLS += [f'cifar100,fedavg,alpha={_a(a)},epochs=2,table=4.1' for a in (0.0, 1000.0)]
CELLS += [f'{ds},{m}{",swa" if swa else ""},alpha={_a(a)},clients=20,cifarc'
          for ds in ALPHAS for m in _ROWS for swa in (False, True) for a in ALPHAS[ds]]


def _check(o):
  """The cell's table, after the grammar's cross-field rules (one ConfigStringError per bad combination)."""
  ds, method, swa, epochs = o['dataset'], o['method'], o['swa'], o['epochs']
  config_strings.check(FAMILY, 'alpha', o['alpha'], ALPHAS[ds], context=f'for {ds}')
  config_strings.check(FAMILY, 'clients', o['clients'], CLIENTS)
  config_strings.check(FAMILY, 'epochs', epochs, (1, 2) if (method == 'fedavg' and not swa) else (1,),
                       context=f'for {method}{"+swa" if swa else ""} (E=2 rows: FedAvg without SWA)')
  ablation = o['cycle'] or o['noavg'] or o['start']
  if ablation and not swa:
    raise config_strings.ConfigStringError(FAMILY, 'cycle/noavg/start', 'the SWA ablations (Tables 4.11, 4.12) '
                                           'need swa')
  if sum(map(bool, (o['cycle'], o['noavg'], o['start'], o['aug'] != 'none', epochs == 2))) > 1:
    raise config_strings.ConfigStringError(FAMILY, 'cycle/noavg/start/aug/epochs', 'no table combines these: '
                                           'one of cycle=1 | noavg | start= | mixup | cutout | epochs=2')
  if o['cycle']:
    config_strings.check(FAMILY, 'cycle', o['cycle'], (1,), context='(Table 4.11: c = 1 or the default c)')
  if o['start']:
    config_strings.check(FAMILY, 'method', method, ('fedavg',), context='with start= (Table 4.12: FedAvg)')
    config_strings.check(FAMILY, 'clients', o['clients'], (5,), context='with start= (Table 4.12)')
    config_strings.check(FAMILY, 'start', o['start'], tuple(T412[ds]), context=f'for {ds} (Table 4.12)')
  if o['table'] == '4.1':
    config_strings.check(FAMILY, 'dataset', ds, ('cifar100',), context='in Table 4.1')
    config_strings.check(FAMILY, 'alpha', o['alpha'], (0.0, 1000.0), context='in Table 4.1')
    config_strings.check(FAMILY, 'clients', o['clients'], (5,), context='in Table 4.1 ([U] assumed)')
    if ablation or o['aug'] != 'none' or o['cifarc']:
      raise config_strings.ConfigStringError(FAMILY, 'table=4.1', 'Table 4.1 has the plain / +SWA / E=2 rows only')
  if o['cifarc']:
    config_strings.check(FAMILY, 'clients', o['clients'], (20,), context='with cifarc (Fig. 4.13: 20 clients)')
    if ablation or o['aug'] != 'none' or epochs == 2:
      raise config_strings.ConfigStringError(FAMILY, 'cifarc', 'Fig. 4.13 has the plain and +SWA rows only')


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  _check(o)
  ds, method, swa, alpha, k, epochs = o['dataset'], o['method'], o['swa'], o['alpha'], o['clients'], o['epochs']
  c = paper_hparams.cifar_cnn_config(ds, method, alpha=alpha, clients_per_round=k, swa=swa)
  c.client.local_epochs = epochs
  c.augment = _AUGMENT[o['aug']]
  if o['cycle']:
    c.swa.cycle = o['cycle']
  if o['noavg']:
    c.swa.average = False
  if o['start']:
    c.swa.start_fraction = o['start'] / c.rounds
  if o['cifarc']:
    c.corruption_eval.name = f'{ds}_c'
    c.corruption_eval.severities = (5,)
  _publish(c, o)
  return c


def _publish(c, o):
  ds, method, swa, alpha, k, epochs = o['dataset'], o['method'], o['swa'], o['alpha'], o['clients'], o['epochs']
  col = ALPHAS[ds].index(alpha) * 3 + CLIENTS.index(k)
  name = {'fedavg': 'FedAvg', 'fedsam': 'FedSAM', 'fedasam': 'FedASAM'}[method] + ('+SWA' if swa else '')
  where = f'{"C10" if ds == "cifar10" else "C100"} {{row}}, alpha={alpha:g}, {k} clients/round'
  extra = {}
  if o['aug'] != 'none':
    table, acc = '4.7', T47[(ds, o['aug'], swa)][method][col]
    row = f'{name} {"MixUp" if o["aug"] == "mixup" else "Cutout"}'
  elif o['cycle'] or o['noavg']:
    kind = 'avg_c1' if o['cycle'] else 'noavg'
    table, acc = '4.11', T411[(ds, kind)][method][col]
    row = f'{name} ({"averaging, c = 1" if o["cycle"] else "cyclic lr only, no averaging"})'
  elif o['start']:
    table, acc = '4.12', T412[ds][o['start']][ALPHAS[ds].index(alpha)]
    row = f'FedAvg+SWA from round {o["start"]}'
  else:
    table = '4.3'
    acc = (PUBLISHED_E2[(ds, alpha)][CLIENTS.index(k)] if epochs == 2
           else paper_hparams.published(ds, alpha, method + ('+swa' if swa else ''), k))
    row = name + (' E=2' if epochs == 2 else '')
  if o['table'] == '4.1':
    key = 'fedavg_e2' if epochs == 2 else method + ('+swa' if swa else '')
    i = 0 if alpha == 0 else 1
    extra = {'lambda_max': T41[key][i], 'lambda_ratio_1_5': T41[key][2 + i]}
    table = '4.1 (lambda_1, lambda_1/lambda_5) with Table 4.3 (accuracy)'
  if ds == 'cifar100' and k == 5 and epochs == 1 and not (o['cycle'] or o['noavg'] or o['start']):
    extra['centralized_accuracy'] = T45_CENTRALIZED.get((method, swa, o['aug']))   # Table 4.5 (None: absent)
    if extra['centralized_accuracy'] is not None:
      table += ' / Table 4.5'
  suffix = (', evaluated on the CIFAR-C test set at severity 5 after training (Fig. 4.13: a plot, no number; '
            'the number here is the clean accuracy)') if o['cifarc'] else ''
  config_strings.set_published(c, f'thesis Table {table} (FedSAM paper, CNN), {where.format(row=row)}{suffix}',
                               acc, **extra)
