r"""FL baselines on CIFAR10/100 with the FedSAM paper's CNN: 100 clients x 500 images (Dirichlet alpha).

One config for every baseline of the thesis' comparison tables (4.2, 4.6, 4.8, 4.15); the string after ':'
picks the cell (key=value, or the bare value for dataset / algo / client / table):

  .venv/bin/python experiments/train.py --workdir=runs/c10_scaffold_asam_a0 \
      --config=configs/baselines_cifar_cnn.py:dataset=cifar10,algo=scaffold,client=asam,alpha=0,clients=5
  (the same: --config=configs/baselines_cifar_cnn.py:cifar10,scaffold,asam)

  keys: dataset = cifar10 | cifar100;  algo = fedavg | fedavgm | fedadam | fedadagrad | fedprox | scaffold |
        feddyn | adabest | mime | mimelite | fedcm | fedacg | fedspeed | fedsmoo | fedgamma;
        client = sgd | sam | asam (radius from Table A.2 for the alpha; FedSpeed/FedSMOO/FedGamma: SAM with the
        Table A.5 radius); alpha = 0 | 0.05 | 100 (C10), 0 | 0.5 | 1000 (C100); clients = 5 | 10 | 20;
        swa = 0 | 1 (server SWA, Table A.3); eta_g = server lr (FedAvgM / FedOpt / Mime);
        table = 4.2 | 4.6 | 4.8 | 4.15: which table's published number goes in config.published (the same
        training; the tables are separate run sets, e.g. C10 FedProx a0 5 clients is 62.72 in 4.8 and 59.8
        in 4.15). Default: the first of 4.8, 4.15, 4.6, 4.2 that has the cell.
  Defaults: dataset=cifar10, algo=fedavg, client=sgd, alpha=0, clients=5, swa=0.
CELLS lists every published cell of Tables 4.2, 4.6 (momentum column), 4.8 and 4.15 (each with its table=),
including the cells published as diverged (config.published has only a source saying so).

Setting (Table A.1): lr 0.01, batch 64, weight decay 4e-4, 1 local epoch, no client momentum; C10 10k rounds,
C100 20k rounds; random crop + flip, dataset normalization. Data: --config.data.data_dir=... (data/sources/cifar.py).
Algorithm hyperparameters: the reconstructed choices of Table A.5 (CNN) where it has them, otherwise the
middle of the Appendix A.3.2 grids (FedProx mu 0.01; FedDyn alpha 0.01, grad clip 30 as in FedSeq; AdaBest
mu 0.02, beta 0.9; FedCM alpha 0.1; FedACG beta 0.01, lambda 0.85; Mime/MimeLite beta 0.9, eta_g 1; FedSpeed
alpha 0.95, lambda 100; FedSMOO beta 10 (C10) / 100 (C100)); override with --config.algo.<name>=... (the
config holds every hyperparameter of the chosen algorithm, so each can be overridden by flag). FedSpeed runs
the paper's Algorithm 1, set explicitly (algo.dual_mean='active', as these configs always have; the registered
default is now the release code's 'population', stable at low participation where 'active' can collapse:
benchmarks/studies/README.baselines.md); which one produced Table 4.15 is not stated.
Reported accuracy: mean over the last 100 rounds, each evaluated (config.eval_every_last=100,
config.summary_last_k=100), as in the papers.

Published numbers (accuracy %, mean of the last 100 rounds; transcribed in PUBLISHED below):

Table 4.2 (C100, 20k rounds, 5 clients/round; server optimizer on FedAvg, torch form: Adam b=(0.9, 0.99)
eps 0.1, Adagrad eps 0.01):           eta_g    alpha=0   alpha=1000
  SGD                                 1        30.25     49.92         algo=fedavg,table=4.2
  SGD                                 0.1      14.09     40.43         algo=fedavg,eta_g=0.1,table=4.2
  SGD                                 0.01     2.67      11.35
  SGD                                 0.001    1.20      1.12
  Adam                                1        1.00      51.73
  Adam                                0.1      29.75     51.62         algo=fedadam,eta_g=0.1
  Adam                                0.01     13.72     40.12
  Adam                                0.001    2.60      11.31
  AdaGrad                             1        1.00      1.00
  AdaGrad                             0.1      1.77      46.74
  AdaGrad                             0.01     26.25     51.44         algo=fedadagrad,eta_g=0.01
  AdaGrad                             0.001    9.70      32.01

Table 4.6 (FedAvgM, beta 0.9, 20 clients/round; "no momentum -> momentum"; the "no momentum" numbers are
Table 4.3's, configs/fedsam_cifar.py):                                       algo=fedavgm,clients=20,table=4.6
  C10  FedAvg       a0 68.52 -> 10.00   a.05 73.07 -> 78.51   a100 84.59 -> 85.05
  C10  FedSAM       a0 72.90 -> 83.07   a.05 76.04 -> 83.57   a100 84.82 -> 86.20   ...,client=sam
  C10  FedASAM      a0 76.09 -> 84.89   a.05 76.98 -> 85.06   a100 84.75 -> 85.42   ...,client=asam
  C10  FedAvg+SWA   a0 70.19 -> 10.00   a.05 73.81 -> 84.00   a100 84.47 -> 85.73   ...,swa=1
  C10  FedSAM+SWA   a0 73.06 -> 85.65   a.05 76.22 -> 85.98   a100 84.63 -> 86.79
  C10  FedASAM+SWA  a0 76.36 -> 85.98   a.05 76.86 -> 86.03   a100 84.79 -> 86.00
  C100 FedAvg       a0 38.59 -> 40.64   a.5  42.17 -> 47.88   a1k  50.66 -> 50.77
  C100 FedSAM       a0 38.56 -> 41.96   a.5  46.05 -> 50.23   a1k  53.97 -> 52.29
  C100 FedASAM      a0 40.81 -> 39.61   a.5  47.78 -> 51.65   a1k  54.50 -> 53.74
  C100 FedAvg+SWA   a0 39.85 -> 53.50   a.5  42.09 -> 53.69   a1k  50.92 -> 51.78
  C100 FedSAM+SWA   a0 39.24 -> 54.63   a.5  46.47 -> 54.93   a1k  54.36 -> 53.27
  C100 FedASAM+SWA  a0 41.62 -> 51.58   a.5  48.27 -> 56.19   a1k  54.10 -> 54.72

Table 4.8 (SOTA, CNN; columns: w/o SWA a0 5cl, a0 20cl, a.05|.5 5cl, a.05|.5 20cl | w/ SWA the same four):
  C10  FedAvgM        10.00 10.00 10.00 78.51 | 10.00 10.00 10.00 84.00
  C10  FedProx        62.72 68.44 68.38 73.02 | 70.56 70.08 74.27 73.67
  C10  SCAFFOLD       32.25 15.56 54.46 44.76 | 11.98 10.00 33.25 24.11
  C10  FedDyn         67.69 73.81 71.36 75.20 | 77.00 74.00 77.99 75.12
  C10  AdaBest        66.77 72.29 69.84 75.89 | 78.94 76.12 80.35 79.35
  C10  FedAvgM+ASAM   77.30 84.89 77.06 84.92 | 80.88 85.98 78.29 86.03
  C10  FedProx+ASAM   73.74 75.76 75.32 77.03 | 76.89 75.92 76.65 76.95
  C10  SCAFFOLD+ASAM  77.78 77.93 77.59 77.80 | 75.66 75.30 75.32 75.29
  C10  FedDyn+SAM     77.38 81.00 79.18 81.70 | 83.81 86.07 83.18 85.57
  C10  AdaBest+ASAM   77.48 78.43 78.41 79.72 | 82.00 80.80 81.87 80.81
  C100 FedAvgM         1.00 40.64  4.60 47.88 |  1.00 53.50  4.60 53.69
  C100 FedProx        31.20 38.59 39.53 42.17 | 39.06 39.68 43.98 41.84
  C100 SCAFFOLD        1.00  1.00 33.26  1.00 |  1.00  1.00  5.76  1.00
  C100 FedDyn          1.00  1.40 22.03 24.75 |  1.00  1.40  8.27 35.15
  C100 AdaBest        29.90 39.11 36.93 43.25 | 44.48 44.21 48.20 44.51
  C100 FedAvgM+ASAM    1.00 39.61  4.60 51.65 |  1.00 51.58  4.60 56.19
  C100 FedProx+ASAM   36.10 40.91 44.81 48.17 | 43.90 42.06 48.66 48.19
  C100 SCAFFOLD+ASAM  43.65 42.61 46.50 46.76 | 40.63 39.07 44.87 44.28
  C100 FedDyn+ASAM    22.16 23.51 38.43 38.60 | 17.51 19.22 38.60 31.06
  C100 AdaBest+ASAM   39.75 45.00 45.25 49.56 | 51.75 47.42 51.89 51.47

Table 4.15 (FedGloSS paper, 5 clients/round, mean +- std over 3 seeds; a separate run set from Table 4.8;
lambda_1 of the global model goes in config.published.lambda_max; its FedGloSS rows: configs/fedgloss_cifar.py):
                     C10 a0      C10 a.05    C100 a0     C100 a.5
  SGD FedAvg         59.9+-0.4   65.7+-1.0   28.6+-0.7   38.5+-0.5
  SGD FedProx        59.8+-0.5   65.6+-1.0   28.8+-0.7   38.7+-0.4
  SGD FedDyn         65.5+-0.3   70.1+-1.2   diverged    diverged
  SGD SCAFFOLD       25.1+-3.7   54.0+-2.6   diverged    30.0+-1.1
  SAM FedSAM         70.2+-0.9   71.5+-1.08  28.7+-0.5   39.6+-0.5
  SAM FedDyn         79.3+-3.1   81.5+-0.6   diverged    diverged
  SAM FedSpeed       70.9+-0.4   72.3+-1.1   28.9+-0.5   39.7+-0.5
  SAM FedGamma       58.9+-1.8   61.9+-1.8   diverged    29.4+-1.4
  SAM FedSMOO        81.3+-0.5   82.8+-0.6   47.8+-0.5   51.7+-0.46

Table 4.19 (rounds (speed-up), bits in units of B = FedAvg's bits in T rounds, to reach FedAvg's Table 4.15
accuracy; in the table=4.15 cells' config.published as rounds_to_target, bits_to_target_B, target_accuracy;
experiments/report.py --target gives the measured ones; "-" never reached, X diverged):
                     C10 a0              C10 a.05            C100 a0              C100 a.5
  SGD FedAvg         10k (1x), 1B        10k (1x), 1B        20k (1x), 1B         20k (1x), 1B
  SGD FedProx        7.6k (1.3x), 0.8B   7.9k (1.3x), 0.8B   18.7k (1.1x), 0.9B   18.6k (1.1x), 0.9B
  SGD FedDyn         2k (5x), 0.2B       1.9k (5x), 0.2B     X                    X
  SGD SCAFFOLD       -, -                -, -                X                    -, -
  SAM FedSAM         6.3k (1.6x), 0.6B   7.8k (1.3x), 0.8B   18.3k (1.1x), 0.9B   16.3k (1.2x), 0.8B
  SAM FedDyn         3k (3.3x), 0.3B     4.2k (2.4x), 0.4B   X                    X
  SAM FedSpeed       6.3k (1.6x), 1.3B   6.9k (1.4x), 1.4B   18.3k (1.1x), 1.8B   15.7k (1.3x), 1.6B
  SAM FedGamma       -, -                -, -                X                    -, -
  SAM FedSMOO        1.9k (5.3x), 0.4B   2.2k (4.5x), 0.4B   4.5k (4.4x), 0.5B    6.5k (3.1x), 0.7B
  (FedGloSS rows: configs/fedgloss_cifar.py; ResNet18 / MobileNetV2 columns: configs/fedgloss_sota.py.)

Table 4.13 (alpha 0, the last round's 5 clients, each holding one class: lambda_1 of its local model on its own
data, l, and on the whole training set, g; in the table=4.15 alpha=0 cells' config.published as lambda_local_i /
lambda_global_i, i = 1..5; experiments/hessian.py --per_client measures them on a run):
  C10 clients airplane / cat / bird / airplane / frog:
    FedAvg      l 9.1 424.2 18.4 483.5 263.2       g 239.1 273.6 237.0 269.5 259.6
    FedSAM      l 100.6 28.8 106.4 103.2 68.1      g 36.4 16.5 35.7 30.6 32.9
    FedDyn      l 752.5 59.9 894.0 761.6 528.9     g 347.8 242.3 371.2 348.9 286.0
    FedDyn+SAM  l 199.6 122.0 200.2 206.9 155.6    g 12.0 11.1 12.0 12.3 11.7
    FedSMOO     l 122.1 82.4 134.2 122.8 79.3      g 26.5 26.9 25.7 25.2 33.5
  C100 clients sea / snail / bear / skyscraper / possum (FedDyn did not converge):
    FedAvg      l 251.0 91.2 108.4 613.3 37.9      g 224.5 267.0 215.2 300.1 259.6
    FedSAM      l 0.1 0.2 6.7 1.3 15.3             g 238.5 149.1 129.3 194.6 142.6
    FedSMOO     l 33.2 331.2 428.6 143.5 455.5     g 31.4 102.2 121.0 40.2 90.9
  (FedGloSS rows: configs/fedgloss_cifar.py.)

Table 4.22 (WiMA paper: ResNet20-GN, 10 clients/round, B=100, lr 0.1, wd 0, 10k rounds; NOT this CNN setting,
listed for Mime / FedCM / FedACG, which have no CNN numbers; no cells here, no published number attached;
configs/wima.py has that setting for FedAvg / SCAFFOLD):
               C10 a0   C10 a.05   C100 a0   C100 a.5
  MIME SGD     74.92    78.82      17.55     27.30
  MIME SGDM    74.58    78.39      25.78     38.42
  MimeLite     64.42    68.27      20.00     35.56
  FedCM        78.83    73.94      19.62     36.12
  FedACG       55.27    63.20      20.09     29.74
  SCAFFOLD     81.45    83.24      45.65     50.93
  AdaBest      66.05    71.54      24.92     37.45
Not cells: Table 4.7 (strong augmentations) and Table 4.3 (configs/fedsam_cifar.py).
"""
from fedjax_flat.algorithms import registry
from fedjax_flat.config import families as config_strings, paper_hparams

FAMILY = 'configs/baselines_cifar_cnn.py'

# Thesis tables (see the docstring). Keys: (table, dataset, algorithm[+client][+swa], alpha, clients/round).
PUBLISHED = {}
_T48 = {   # (w/o SWA a0 5, a0 20, a.05|.5 5, a.05|.5 20), (w/ SWA the same)
    'cifar10': {'fedavgm': ((10.00, 10.00, 10.00, 78.51), (10.00, 10.00, 10.00, 84.00)),
                'fedprox': ((62.72, 68.44, 68.38, 73.02), (70.56, 70.08, 74.27, 73.67)),
                'scaffold': ((32.25, 15.56, 54.46, 44.76), (11.98, 10.00, 33.25, 24.11)),
                'feddyn': ((67.69, 73.81, 71.36, 75.20), (77.00, 74.00, 77.99, 75.12)),
                'adabest': ((66.77, 72.29, 69.84, 75.89), (78.94, 76.12, 80.35, 79.35)),
                'fedavgm+asam': ((77.30, 84.89, 77.06, 84.92), (80.88, 85.98, 78.29, 86.03)),
                'fedprox+asam': ((73.74, 75.76, 75.32, 77.03), (76.89, 75.92, 76.65, 76.95)),
                'scaffold+asam': ((77.78, 77.93, 77.59, 77.80), (75.66, 75.30, 75.32, 75.29)),
                'feddyn+sam': ((77.38, 81.00, 79.18, 81.70), (83.81, 86.07, 83.18, 85.57)),
                'adabest+asam': ((77.48, 78.43, 78.41, 79.72), (82.00, 80.80, 81.87, 80.81))},
    'cifar100': {'fedavgm': ((1.00, 40.64, 4.60, 47.88), (1.00, 53.50, 4.60, 53.69)),
                 'fedprox': ((31.20, 38.59, 39.53, 42.17), (39.06, 39.68, 43.98, 41.84)),
                 'scaffold': ((1.00, 1.00, 33.26, 1.00), (1.00, 1.00, 5.76, 1.00)),
                 'feddyn': ((1.00, 1.40, 22.03, 24.75), (1.00, 1.40, 8.27, 35.15)),
                 'adabest': ((29.90, 39.11, 36.93, 43.25), (44.48, 44.21, 48.20, 44.51)),
                 'fedavgm+asam': ((1.00, 39.61, 4.60, 51.65), (1.00, 51.58, 4.60, 56.19)),
                 'fedprox+asam': ((36.10, 40.91, 44.81, 48.17), (43.90, 42.06, 48.66, 48.19)),
                 'scaffold+asam': ((43.65, 42.61, 46.50, 46.76), (40.63, 39.07, 44.87, 44.28)),
                 'feddyn+asam': ((22.16, 23.51, 38.43, 38.60), (17.51, 19.22, 38.60, 31.06)),
                 'adabest+asam': ((39.75, 45.00, 45.25, 49.56), (51.75, 47.42, 51.89, 51.47))},
}
_HET = {'cifar10': 0.05, 'cifar100': 0.5}
for _ds, _rows in _T48.items():
  for _name, (_plain, _swa) in _rows.items():
    for _vals, _suffix in ((_plain, ''), (_swa, '+swa')):
      for _v, (_a, _c) in zip(_vals, ((0.0, 5), (0.0, 20), (_HET[_ds], 5), (_HET[_ds], 20))):
        PUBLISHED[('4.8', _ds, _name + _suffix, _a, _c)] = _v
# Table 4.15: (C10 a0, C10 a.05, C100 a0, C100 a.5) of (accuracy, std, lambda_1, lambda_1 std); None = diverged.
_T415 = {
    'fedavg': ((59.9, 0.4, 66.23, 0.50), (65.7, 1.0, 71.14, 4.07), (28.6, 0.7, 66.30, 3.08), (38.5, 0.5, 68.77, 0.96)),
    'fedprox': ((59.8, 0.5, 66.19, 0.52), (65.6, 1.0, 71.41, 4.40), (28.8, 0.7, 66.34, 3.75),
                (38.7, 0.4, 68.63, 1.37)),
    'feddyn': ((65.5, 0.3, 63.94, 4.41), (70.1, 1.2, 71.44, 8.73), None, None),
    'scaffold': ((25.1, 3.7, 166.54, 6.93), (54.0, 2.6, 180.51, 30.08), None, (30.0, 1.1, 120.01, 0.76)),
    'fedavg+sam': ((70.2, 0.9, 10.35, 0.07), (71.5, 1.08, 9.43, 0.28), (28.7, 0.5, 58.38, 2.93),
                   (39.6, 0.5, 57.54, 1.21)),
    'feddyn+sam': ((79.3, 3.1, 10.04, 5.38), (81.5, 0.6, 6.58, 0.20), None, None),
    'fedspeed+sam': ((70.9, 0.4, 10.92, 0.17), (72.3, 1.1, 9.97, 0.12), (28.9, 0.5, 58.23, 3.18),
                     (39.7, 0.5, 58.00, 1.86)),
    'fedgamma+sam': ((58.9, 1.8, 4.79, 0.20), (61.9, 1.8, 4.55, 0.20), None, (29.4, 1.4, 99.86, 6.74)),
    'fedsmoo+sam': ((81.3, 0.5, 15.37, 1.67), (82.8, 0.6, 12.57, 0.56), (47.8, 0.5, 28.43, 1.97),
                    (51.7, 0.46, 29.23, 0.17))}
DETAIL = {}   # (table, ...) -> (accuracy, std, lambda_1, lambda_1 std) where a table gives more than the mean
for _name, _vals in _T415.items():
  for _v, (_ds, _a) in zip(_vals, (('cifar10', 0.0), ('cifar10', 0.05), ('cifar100', 0.0), ('cifar100', 0.5))):
    PUBLISHED[('4.15', _ds, _name, _a, 5)] = None if _v is None else _v[0]
    if _v is not None:
      DETAIL[('4.15', _ds, _name, _a, 5)] = _v
# Table 4.6, the "with momentum" column (FedAvgM, 20 clients/round): (a0, a.05|.5, a100|1k).
_T46 = {
    'cifar10': {'fedavgm': (10.00, 78.51, 85.05), 'fedavgm+sam': (83.07, 83.57, 86.20),
                'fedavgm+asam': (84.89, 85.06, 85.42), 'fedavgm+swa': (10.00, 84.00, 85.73),
                'fedavgm+sam+swa': (85.65, 85.98, 86.79), 'fedavgm+asam+swa': (85.98, 86.03, 86.00)},
    'cifar100': {'fedavgm': (40.64, 47.88, 50.77), 'fedavgm+sam': (41.96, 50.23, 52.29),
                 'fedavgm+asam': (39.61, 51.65, 53.74), 'fedavgm+swa': (53.50, 53.69, 51.78),
                 'fedavgm+sam+swa': (54.63, 54.93, 53.27), 'fedavgm+asam+swa': (51.58, 56.19, 54.72)},
}
_ALPHAS = {'cifar10': (0.0, 0.05, 100.0), 'cifar100': (0.0, 0.5, 1000.0)}
for _ds, _rows in _T46.items():
  for _name, _vals in _rows.items():
    for _a, _v in zip(_ALPHAS[_ds], _vals):
      PUBLISHED[('4.6', _ds, _name, _a, 20)] = _v
_T42 = {('fedavg', 1.0): (30.25, 49.92), ('fedavg', 0.1): (14.09, 40.43), ('fedavg', 0.01): (2.67, 11.35),
        ('fedavg', 0.001): (1.20, 1.12), ('fedadam', 1.0): (1.00, 51.73), ('fedadam', 0.1): (29.75, 51.62),
        ('fedadam', 0.01): (13.72, 40.12), ('fedadam', 0.001): (2.60, 11.31), ('fedadagrad', 1.0): (1.00, 1.00),
        ('fedadagrad', 0.1): (1.77, 46.74), ('fedadagrad', 0.01): (26.25, 51.44),
        ('fedadagrad', 0.001): (9.70, 32.01)}
for (_name, _lr), (_a0, _a1k) in _T42.items():
  PUBLISHED[('4.2', 'cifar100', f'{_name}@{_lr}', 0.0, 5)] = _a0
  PUBLISHED[('4.2', 'cifar100', f'{_name}@{_lr}', 1000.0, 5)] = _a1k
TABLES = ('4.8', '4.15', '4.6', '4.2')
# Table 4.15's rows -> Table 4.19's (paper_hparams.T419: rounds / bits to FedAvg's accuracy, in config.published).
_T419_ROW = {'fedavg': 'sgd/fedavg', 'fedprox': 'sgd/fedprox', 'feddyn': 'sgd/feddyn', 'scaffold': 'sgd/scaffold',
             'fedavg+sam': 'sam/fedsam', 'feddyn+sam': 'sam/feddyn', 'fedspeed+sam': 'sam/fedspeed',
             'fedgamma+sam': 'sam/fedgamma', 'fedsmoo+sam': 'sam/fedsmoo'}   # the default lookup order of table=

# Algorithm hyperparameters (Table A.5 CNN choices where reconstructed; else Appendix A.3.2 grid choices).
ALGO = {
    'fedprox': {'mu': 0.01},
    'scaffold': {},
    'feddyn': {'alpha': 0.01},
    'adabest': {'mu': 0.02, 'beta': 0.9},
    'mime': {'beta': 0.9},
    'mimelite': {'beta': 0.9},
    'fedcm': {'alpha': 0.1},
    'fedacg': {'beta': 0.01, 'lam': 0.85},
    'fedspeed': {'alpha': 0.95, 'lam': 100.0, 'dual_mean': 'active'},   # Alg. 1, explicit (see the docstring)
    'fedsmoo': {'beta': {'cifar10': 10.0, 'cifar100': 100.0}},
    'fedgamma': {},
}
# Table A.5 SAM radii of the SAM-based methods (CNN): C10, C100.
SAM_RHO = {'feddyn': (0.15, 0.01), 'fedspeed': (0.15, 0.01), 'fedsmoo': (0.15, 0.1), 'fedgamma': (0.15, 0.01)}
SERVER = {   # FedAvg variants that differ only in the server optimizer (Table 4.2 torch form; Table 4.6 FedAvgM)
    'fedavg': dict(optimizer='sgd', lr=1.0, momentum=0.0),
    'fedavgm': dict(optimizer='sgd', lr=1.0, momentum=0.9),
    'fedadam': dict(optimizer='adam', lr=0.1, b1=0.9, b2=0.99, eps=0.1, adaptive_form='torch'),
    'fedadagrad': dict(optimizer='adagrad', lr=0.01, momentum=0.0, eps=0.01, adaptive_form='torch'),
}


FIELDS = {
    'dataset': ('cifar10', ('cifar10', 'cifar100')),
    'algo': ('fedavg', tuple(SERVER) + tuple(ALGO)),
    'client': ('sgd', ('sgd', 'sam', 'asam')),
    'alpha': (0.0, float),
    'clients': (5, int),
    'swa': (False, bool),
    'eta_g': (0.0, float),      # 0 = the algorithm's server lr
    'table': ('', TABLES),      # '' = the first table of TABLES that has the cell
}
_SAM_ONLY = ('fedspeed', 'fedsmoo', 'fedgamma')


def _row_name(algo, client, swa):
  """PUBLISHED's row key: algorithm[+client][+swa] (FedSpeed/FedSMOO/FedGamma always carry their SAM)."""
  if algo in _SAM_ONLY:
    client = 'sam'
  return algo + ('' if client == 'sgd' else '+' + client) + ('+swa' if swa else '')


def _cells():
  out = []
  for (table, ds, name, alpha, k) in PUBLISHED:
    if table == '4.2':
      algo, lr = name.split('@')
      out.append(f'dataset={ds},algo={algo},eta_g={float(lr):g},alpha={alpha:g},clients={k},table=4.2')
      continue
    parts = name.split('+')
    algo, swa = parts[0], 'swa' in parts
    client = next((p for p in parts[1:] if p in ('sam', 'asam')), 'sgd')
    out.append(f'dataset={ds},algo={algo},client={client},alpha={alpha:g},clients={k},swa={int(swa)},'
               f'table={table}')
  return out


def published(o, server_lr):
  """(table, key) of the cell's published number for the parsed options, or (None, None)."""
  name = _row_name(o['algo'], o['client'], o['swa'])
  keys = {t: (t, o['dataset'], name, o['alpha'], o['clients']) for t in TABLES}
  keys['4.2'] = ('4.2', o['dataset'], f"{o['algo']}@{server_lr}", o['alpha'], o['clients'])
  for t in ([o['table']] if o['table'] else TABLES):
    if keys[t] in PUBLISHED:
      return t, keys[t]
  return None, None


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  dataset, algo, client = o['dataset'], o['algo'], o['client']
  alpha, clients = o['alpha'], o['clients']
  config_strings.check(FAMILY, 'alpha', alpha, _ALPHAS[dataset], context=f'for {dataset}')
  config_strings.check(FAMILY, 'clients', clients, (5, 10, 20))
  method = {'sgd': 'fedavg', 'sam': 'fedsam', 'asam': 'fedasam'}[client]
  c = paper_hparams.cifar_cnn_config(dataset, method, alpha=alpha, clients_per_round=clients, swa=o['swa'])
  if algo in SERVER:
    c.algorithm = 'fedavg'
    for k, v in SERVER[algo].items():
      c.server[k] = v
  else:
    c.algorithm = algo
    for k, v in registry.default_hparams(algo).items():   # every hparam present: --config.algo.<k>=... works
      c.algo[k] = v
    for k, v in ALGO[algo].items():
      c.algo[k] = v[dataset] if isinstance(v, dict) else v
    if algo in SAM_RHO and (client == 'sam' or algo != 'feddyn'):
      c.client.optimizer, c.client.asam_eta = 'sam', 0.0        # FedSpeed/FedSMOO/FedGamma are SAM methods
      c.client.rho = SAM_RHO[algo][0 if dataset == 'cifar10' else 1]
    if algo == 'feddyn':
      c.client.grad_clip = 30.0
  if o['eta_g']:
    c.server.lr = o['eta_g']
  table, key = published(o, float(c.server.lr))
  if key is not None:
    t, ds, name, a, k = key
    source = (f'thesis Table {t}, {"C10" if ds == "cifar10" else "C100"} {name}, alpha={a:g}, '
              f'{k} clients/round')
    if PUBLISHED[key] is None:
      c.published.source = source + ' (published as diverged: no number)' + paper_hparams.comm_to_target(
          'cnn', ds, a, _T419_ROW.get(name, '') if t == '4.15' else '')[0]
    elif key in DETAIL:
      acc, std, lam, lam_std = DETAIL[key]
      note, comm = paper_hparams.comm_to_target('cnn', ds, a, _T419_ROW.get(name, ''))   # Table 4.19
      note413, lams = paper_hparams.local_global_lambdas(ds, a, _T419_ROW.get(name, ''))  # Table 4.13
      config_strings.set_published(c, source + note + note413, acc, std, lambda_max=lam, lambda_max_std=lam_std,
                                   **comm, **lams)
    else:
      config_strings.set_published(c, source, PUBLISHED[key])
  return c


CELLS = _cells()
