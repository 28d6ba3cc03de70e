r"""FedSeq family (thesis ch. 5.2): FedSeq, FedAsyncSeq, FedSeq2Par, FedCyclic (and FedAvg, the fairness baseline)
on CIFAR10/100 with 500 clients x 100 images, LEAF's FEMNIST and Shakespeare and TFF's StackOverflow: thesis
Tables 5.1, 5.3, 5.4 and 5.5.

  .venv/bin/python experiments/train.py --workdir=runs/c10_fedseq2par_a0 \
      --config=configs/fedseq.py:cifar10,fedseq2par,alpha=0
  .venv/bin/python experiments/train.py --workdir=runs/c10_fedseq_clf_kmeans \
      --config=configs/fedseq.py:cifar10,fedseq,grouping=clf_kmeans,alpha=0.2,table=5.3
  .venv/bin/python experiments/train.py --workdir=runs/c100_fedseq_lfa \
      --config=configs/fedseq.py:cifar100,fedseq,attack=intra_sc,gamma=random,ls=0.3,l=0.5 \
      --config.attack.clean_workdir=runs/c100_fedseq_clean       # clean: ...:cifar100,fedseq,table=5.5
  .venv/bin/python experiments/train.py --workdir=runs/femnist_fedseq --config=configs/fedseq.py:femnist,fedseq \
      --config.data.data_dir=/path/to/leaf/data/femnist/data             # LEAF's JSON files (data/sources/leaf.py)

Grammar (comma-separated; defaults cifar10,fedseq,alpha=0,table=5.1):
  cifar10 | cifar100 | femnist | shakespeare | stackoverflow;  fedavg | fedseq | fedasyncseq | fedseq2par |
  fedcyclic | fedprox | scaffold | feddyn (the last three: Table 5.1's SOTA rows, FedAvg's setting with the
  algorithm's Appendix A.4.2 hyperparameters below);
  alpha=0 | 0.2 | 0.5 (CIFAR; | 100 with table=5.5);  split=niid | iid (FEMNIST, Shakespeare);
  table=5.1 | 5.3 | 5.4 | 5.5 (which table's number goes in config.published);
  grouping=random | clf_kmeans | clf_greedy | clf_icg | conf_kmeans | conf_greedy_kl | conf_greedy_gini |
  t2v_greedy | t2v_kmeans | t2v_icg (Table 5.3 rows; defaults per dataset below);
  attack=none | 0-2 | 3-5 | 0-2-3-5 | intra_sc | extra_sc (Table 5.5's swapped labels; implies table=5.5, alpha=100),
  gamma=fixed | random, ls=0.1 | 0.3 | 0.5 (L_S, malicious superclients), l=0.1 | 0.5 (L, attackers inside);
  fair=1 | 0 (the fairness switch, below; fair=0 is not a published setting).
CELLS lists every published cell.

Setting (Appendix A.4, Table A.6; digest 1.2): CIFAR CNN (conv 5x5 64 + pool, twice; FC 384, 192; the
FedSAM CNN), local SGD lr 0.01, batch 64, weight decay 4e-4, no momentum, E_k = 1 epoch, E_S = 1 pass, server
lr 1; 10k rounds (C10) / 20k (C100); random crop + flip, normalization. Superclients: |D_S|_min 1000,
K_S,max 11 (N_S = 50); FedSeq / FedAsyncSeq psi_t2v + greedy (normalized cosine), FedSeq2Par psi_t2v + ICG with
f_exp, alpha_gr 4.6e-4, beta_gr 5 (N_S 5 -> 495); FedAsyncSeq R = N_S; pre-training e = 10 epochs. The
fraction C is not stated in the thesis: C = 0.2 as the reference code's experiments (10 of 50 superclients,
100 of 500 clients per round). Task2Vec's probe was an ImageNet ResNet18: pass its weights with
--config.grouping.probe_model=... --config.grouping.probe_pretrained=... (fedjax_flat/grouping; without
them the probe is randomly initialized and says so).
Fairness (the thesis' protocol: the same number of model updates per round): every method trains C K = 100
clients x 1 epoch per round; FedAvg samples clients_per_round = C K = 100 clients with the same local epochs
(E_k E_S), FedCyclic chains C K clients, FedSeq runs C N_S chains of about K / N_S clients. summary.json's
fedseq.mean_local_steps_per_round shows the count (FedAvg: 100 clients x ceil(100 / 64) = 200 steps).
fair=0 switches FedAvg to the same parallelism instead: C N_S = 10 clients per round (10x fewer updates).
Reported accuracy: mean over the last 100 rounds (each evaluated), 3 seeds in the thesis.

Published accuracy % (Table 5.1, mean +- std):
                 C10 a=0      C10 a=0.2    C10 a=0.5    C100 a=0     C100 a=0.2   C100 a=0.5
  FedAvg         71.27+-0.29  76.32+-0.36  77.39+-0.43  42.68+-0.22  48.79+-0.55  49.51+-0.61
  FedCyclic      82.45+-0.18  82.61+-0.27  83.49+-0.08  47.46+-0.42  49.93+-0.16  50.47+-0.27
  FedSeq         81.89+-0.28  82.19+-0.26  82.77+-0.12  45.87+-0.45  49.26+-0.40  49.63+-0.42
  FedAsyncSeq    83.03+-0.31  83.17+-0.27  83.57+-0.22  50.23+-0.11  51.39+-0.18  51.27+-0.24
  FedSeq2Par     83.68+-0.14  84.21+-0.08  84.26+-0.06  51.46+-0.23  51.44+-0.02  51.72+-0.10
  FedProx        71.52+-0.08  76.21+-0.50  77.38+-0.57  42.83+-0.18  48.84+-0.65  49.44+-0.49
  SCAFFOLD       78.82+-0.05  78.02+-1.13  78.51+-0.24  42.17+-0.10  51.06+-0.03  51.02+-0.12
  FedDyn         83.31+-0.05  82.31+-0.41  82.97+-0.40  50.35+-0.27  53.50+-0.76  54.32+-0.63
  (Centralized 85.64 / 54.97: the centralized runner, not a cell here.)
  SOTA rows (Appendix A.4.2): FedAvg's setting (C K = 100 clients per round, 1 epoch) with FedProx mu 0.01 and
  FedDyn alpha 0.1 with the gradient clipped to 30 (CIFAR); FEMNIST mu 1e-3, alpha 1e-3, clip 30; Shakespeare
  mu 1e-3, alpha 1e-3 (no clipping stated); SCAFFOLD has no hyperparameter. StackOverflow: only SCAFFOLD is a
  cell (FedProx / FedDyn's StackOverflow values are not stated).

Table 5.3 (grouping criteria; table=5.3):  C10 a=0 / 0.2 / 0.5     C100 a=0 / 0.2 / 0.5
  FedSeq  random                           81.90 82.09 82.12       46.39 48.62 49.44     grouping=random
  FedSeq  clf  k-means  Euclidean          82.30 81.78 82.48       44.91 48.74 49.60     grouping=clf_kmeans
  FedSeq  clf  greedy   cosine             79.95 82.06 83.32       45.22 48.92 49.62     grouping=clf_greedy
  FedSeq  conf k-means  Euclidean          82.04 81.99 82.37       43.55 49.43 49.79     grouping=conf_kmeans
  FedSeq  conf greedy   KL                 82.21 82.20 82.22       45.97 49.56 49.82     grouping=conf_greedy_kl
  FedSeq  conf greedy   Gini               82.09 81.85 82.71       45.79 48.98 49.61     grouping=conf_greedy_gini
          (the extraction labels this row t2v; the text applies Gini to conf's probability vectors: conf here)
  FedSeq  t2v  greedy   norm-cosine        82.28 82.48 82.86       46.51 50.06 50.31     grouping=t2v_greedy
  FedAsyncSeq t2v greedy norm-cosine       83.40 83.37 83.85       50.38 51.64 51.58
  FedSeq2Par  t2v ICG   Euclidean          83.86 84.66 84.35       51.23 51.41 51.78
  (FEMNIST / Shakespeare columns: the LEAF section below.)

Table 5.4 (parallelism, alpha = 0; table=5.4; config.published also has num_superclients / mean_num_superclients,
compare with summary.json's fedseq.mean_num_superclients):
  C10   FedSeq N_S 50, acc 81.89    FedSeq2Par mean N_S 104 (2.09x), acc 83.68
  C100  FedSeq N_S 50, acc 45.87    FedSeq2Par mean N_S 113 (2.26x), acc 51.46
  (f_exp with alpha_gr 4.6e-4, beta_gr 5 averages N_S 104.5 over C10's 10k rounds, as printed, but 302 over
  C100's 20k: the C100 row's 113 is not what this growth gives over 20k rounds; kept as printed.)

Table 5.5 (label flipping after 1k rounds, alpha = 100; accuracy / drop against the clean run; "o" = negligible,
published without a number: no drop in config.published). Clean: C10 FedSeq 76.10, FedAvg 48.69; C100 FedSeq
39.70, FedAvg 12.85 (attack=none,table=5.5). The second row of each block lost its L label in the extraction
(L = 0.5, the other tested value); C10 blocks 7-12 swap 0<->2 and 3<->5 together (digest 3.5).
  C10   L_S  swap     gamma    L=0.1 FedSeq    FedAvg          L=0.5 FedSeq    FedAvg
        0.1  0-2      fixed    76.06 o         48.72 o         75.92 -0.20     47.55 -1.14
        0.3  0-2      fixed    76.25 -0.15     47.74 -0.95     74.75 -1.35     48.30 -0.39
        0.5  0-2      fixed    75.65 -0.45     47.55 -1.14     75.50 -0.60     47.44 -1.25
        0.1  3-5      fixed    76.05 o         47.92 -0.77     75.50 -0.60     47.93 -0.76
        0.3  3-5      fixed    75.75 -0.35     47.80 -0.89     75.28 -0.82     47.74 -0.95
        0.5  3-5      fixed    76.15 o         47.93 -0.76     75.09 -1.01     46.94 -1.75
        0.1  0-2-3-5  fixed    76.65 o         47.36 -1.33     76.01 o         48.12 -0.58
        0.3  0-2-3-5  fixed    75.79 -0.31     48.29 -0.40     75.19 -0.91     46.42 -2.27
        0.5  0-2-3-5  fixed    75.35 -0.75     48.12 -0.58     75.09 -1.01     46.94 -1.75
        0.1  0-2-3-5  random   76.52 o         48.65 o         75.71 -0.39     47.52 -1.17
        0.3  0-2-3-5  random   75.98 -0.12     47.01 -1.68     74.75 -1.35     46.70 -1.99
        0.5  0-2-3-5  random   75.93 -0.17     47.52 -1.17     73.46 -2.64     46.49 -2.20
  C100  0.1  intra_sc fixed    38.81 -0.89     12.57 -0.28     38.87 -0.83     12.35 -0.50
        0.3  intra_sc fixed    39.66 o         12.45 -0.40     39.04 -0.66     11.55 -1.30
        0.5  intra_sc fixed    39.23 -0.47     12.35 -0.50     38.40 -1.30     11.02 -1.83
        0.1  intra_sc random   39.36 -0.34     13.23 o         39.59 o         13.05 o
        0.3  intra_sc random   39.67 o         13.23 o         38.88 -0.82     12.47 -0.38
        0.5  intra_sc random   39.68 o         13.05 o         38.98 -0.72     11.27 -1.58
        0.1  extra_sc fixed    40.11 o         12.37 -0.48     40.03 o         12.20 -0.65
        0.3  extra_sc fixed    39.29 -0.41     13.08 o         38.73 -0.97     12.34 -0.51
        0.5  extra_sc fixed    38.95 -0.75     12.20 -0.65     38.46 -1.24     12.30 -0.55
        0.1  extra_sc random   39.17 -0.53     13.12 o         39.12 -0.58     12.83 o
        0.3  extra_sc random   39.54 o         13.06 o         37.90 -1.80     11.81 -1.04
        0.5  extra_sc random   39.03 -0.67     13.12 o         37.76 -1.94     11.94 -0.91
Attack cells train 1k rounds at alpha = 100 with the Table 5.1 setting of their method; FedAvg's attackers are
the equivalent L_S * L of the clients (data/attacks.py, where the CIFAR-100 class sets are defined). Set
--config.attack.clean_workdir to the clean run's workdir to get summary.json's attack.drop.

LEAF and StackOverflow cells (femnist | shakespeare | stackoverflow; Table A.6, digest 1.2 and 2.1). The model,
data and centralized reference of configs/quickstart_<dataset>.py (its docstring: files, formats), at the
thesis' size; E_k = E_S = 1, no momentum, server lr 1; C is not stated for these datasets: C = 0.1, the FedSeq
release's default (fedbase.yaml: K 3500, C 0.1, B 20); FedAvg samples C K clients (fairness as above).
  femnist      Reddi et al.'s CNN; every LEAF writer (fraction 1, min_samples 0; split=iid: LEAF's iid resampling into
               as many equal users); SGD lr 0.01, batch 20, no weight decay, 1,500 rounds; FedAvg 350 clients (C K, K =
               3,500); |D_S|_min 4120, K_S,max 21 (N_S 175); FedSeq / FedAsyncSeq psi_t2v + k-means (Euclidean),
               FedSeq2Par psi_t2v + ICG, f_exp, alpha_gr 3e-3, beta_gr 5 (Table A.6). Mean N_S over the run with these:
               95.8; Table 5.4's 383 is exactly what beta_gr = 20 gives (4 x 95.8), so that row was probably run with
               beta_gr 20 (--config.algo.growth_beta=20); the CIFAR (104.5 vs 104), Shakespeare (52.3 vs 52) and
               StackOverflow (5,959 vs 5,966) settings here reproduce theirs.
  shakespeare  the char-LSTM (embed 8, 2 x LSTM 100, 90 ids), 80 characters -> the next 80 (next_token);
               100 random roles of more than 2,222 windows, each cut to its first 2,223, split 90/10: 100
               clients x 2,000 training windows (appendix A.4 and the FedSeq release's shakespeare_niid, K =
               100, 200,000 samples; split=iid: LEAF's iid resampling into 1,129 equal users, then the same
               subset); SGD lr 1, batch 100, weight decay 0 (Table A.6; the text says 1e-4), 250 rounds;
               FedAvg 10 clients; |D_S|_min 8000, K_S,max 5: 25 superclients of 4 (Table 5.4's N_S).
               The thesis groups with psi_t2v and a character-level GPT probe; a
               next_token task labels every position, so psi_conf / psi_t2v do not apply (validate.py refuses
               them) and these cells use psi_clf (the output layer): FedSeq greedy (cosine), FedAsyncSeq
               k-means (Table 5.3's footnote), FedSeq2Par ICG, f_exp, alpha_gr 1.8e-2, beta_gr 5.
  stackoverflow  the word-LSTM (embed 96, LSTM 670, 10,000 + 4 ids), 40,000 users of <= 1,000 sentences,
               10,000 random test sentences; SGD lr 10^-1/2, batch 16, no weight decay; T is not stated: 1,500
               rounds (Reddi et al.'s StackOverflow NWP); FedAvg 4,000 clients (C K). The grouping is not stated:
               random (psi_clf would be the 10,004 x 96 output layer of each of 40,000 clients) with K_S,max 21
               and |D_S|_min 21,000 (21 clients x the 1,000-sentence cap), so that superclients close at 21
               clients: N_S = 1,905 (Table 5.4: 1,900); FedSeq2Par f_exp, beta_gr 50 (the smallest of its grid,
               "consistently best"), alpha_gr 4.469e-3 = (K / beta_gr)^(1 / (T - 1)) - 1 (fully parallel at the
               last round, the thesis' rule for alpha_gr).
Pre-training e = 10 epochs everywhere; without a pretrained probe psi_t2v uses a random one (it says so):
pass one with --config.grouping.probe_pretrained=... (the thesis: an ImageNet ResNet18).

Published accuracy % (Table 5.1, mean +- std):
                 FEMNIST NIID  FEMNIST IID   Shakesp. NIID  Shakesp. IID  StackOverflow
  FedAvg         81.55+-0.11   83.06+-0.12   48.68+-0.12    48.50+-0.07   24.68+-0.15
  FedCyclic      85.46+-0.05   87.47+-0.09   50.25+-0.05    50.68+-0.03   26.44+-1.68
  FedSeq         87.11+-0.03   87.48+-0.03   51.70+-0.13    51.82+-0.00   28.91+-0.21
  FedAsyncSeq    86.96+-0.07   87.20+-0.01   51.82+-0.13    51.88+-0.04   27.44+-0.35
  FedSeq2Par     87.58+-0.15   87.95+-0.05   52.75+-0.20    52.71+-0.05   29.79+-0.33
  FedProx        81.55+-0.05   83.07+-0.05   48.73+-0.12    48.51+-0.15   24.59+-0.19  (StackOverflow: no cell)
  SCAFFOLD       82.56+-0.07   82.70+-0.01   50.91+-0.19    50.91+-0.12   26.10+-0.15
  FedDyn         81.95+-0.42   82.00+-0.13   51.77+-0.03    51.94+-0.09   25.51+-0.02  (StackOverflow: no cell)
  (Centralized 87.52 / 52.00 / 28.50: config.centralized.accuracy, summary.json's rounds_to_<70|90>pct_centralized.)
Table 5.3 (table=5.3; FEMNIST NIID / IID, Shakespeare NIID / IID):
  FedSeq  random                           87.07 87.49 51.55 51.84     grouping=random
  FedSeq  clf  k-means  Euclidean          87.07 87.45 51.78 51.70     grouping=clf_kmeans
  FedSeq  clf  greedy   cosine             87.12 87.42 51.72 51.88     grouping=clf_greedy
  FedSeq  conf k-means  Euclidean          87.10 87.50 51.79 51.87     grouping=conf_kmeans (FEMNIST only)
  FedSeq  conf greedy   KL                 87.01 87.46 51.70 51.65     grouping=conf_greedy_kl (FEMNIST only)
  FedSeq  conf greedy   Gini               87.05 87.42 51.59 51.98     grouping=conf_greedy_gini (FEMNIST only)
  FedSeq  t2v  greedy   norm-cosine        87.11 87.48 51.65 51.82     grouping=t2v_greedy (FEMNIST only)
  FedAsyncSeq t2v k-means Euclidean        86.96 87.20 51.93 52.02     grouping=t2v_kmeans (FEMNIST only)
  FedSeq2Par  t2v ICG   Euclidean          87.58 87.96 52.84 52.54     grouping=t2v_icg (FEMNIST only)
  (Shakespeare: the psi_clf rows only, as above.)
Table 5.4 (table=5.4, NIID): FEMNIST FedSeq N_S 175, acc 87.11; FedSeq2Par mean N_S 383 (2.19x), acc 87.58.
  Shakespeare N_S 25, acc 51.70; mean N_S 52 (2.09x), acc 52.75.  StackOverflow N_S 1900, acc 28.91; mean N_S
  5966 (3.14x), acc 29.79.
"""
import os

import ml_collections

from fedjax_flat.algorithms import fedseq as fedseq_lib
from fedjax_flat.algorithms import registry
from fedjax_flat.config import families as config_strings, paper_hparams
from fedjax_flat.config.default_config import data_section, default_config

FAMILY = 'configs/fedseq.py'
METHODS = ('fedavg', 'fedseq', 'fedasyncseq', 'fedseq2par', 'fedcyclic')
BASELINES = ('fedprox', 'scaffold', 'feddyn')     # Table 5.1's SOTA rows: FedAvg's setting, their algorithm
# Appendix A.4.2: (algorithm hyperparameters, gradient clip or 0) per dataset; StackOverflow: SCAFFOLD only.
BASELINE_HP = {
    'cifar10': {'fedprox': ({'mu': 0.01}, 0.0), 'scaffold': ({}, 0.0), 'feddyn': ({'alpha': 0.1}, 30.0)},
    'cifar100': {'fedprox': ({'mu': 0.01}, 0.0), 'scaffold': ({}, 0.0), 'feddyn': ({'alpha': 0.1}, 30.0)},
    'femnist': {'fedprox': ({'mu': 1e-3}, 0.0), 'scaffold': ({}, 0.0), 'feddyn': ({'alpha': 1e-3}, 30.0)},
    'shakespeare': {'fedprox': ({'mu': 1e-3}, 0.0), 'scaffold': ({}, 0.0), 'feddyn': ({'alpha': 1e-3}, 0.0)},
    'stackoverflow': {'scaffold': ({}, 0.0)},
}
ALPHAS = (0.0, 0.2, 0.5)
ATTACK_ALPHA = 100.0
FRACTION = 0.2              # C (reference code experiments)
NUM_CLIENTS, EXAMPLES = 500, 100
# Table 5.3 rows: grouping name -> (estimator psi, method phi, distance tau).
GROUPINGS = {
    'random': ('clf', 'random', 'auto'),
    'clf_kmeans': ('clf', 'kmeans', 'euclidean'),
    'clf_greedy': ('clf', 'greedy', 'cosine'),
    'conf_kmeans': ('conf', 'kmeans', 'euclidean'),
    'conf_greedy_kl': ('conf', 'greedy', 'kl'),
    'conf_greedy_gini': ('conf', 'greedy', 'gini'),
    't2v_greedy': ('t2v', 'greedy', 'normalized_cosine'),
    't2v_icg': ('t2v', 'icg', 'euclidean'),
    't2v_kmeans': ('t2v', 'kmeans', 'euclidean'),     # FEMNIST (Table A.6; FedAsyncSeq on LEAF, Table 5.3)
    'clf_icg': ('clf', 'icg', 'euclidean'),           # Shakespeare's FedSeq2Par (psi_t2v does not apply)
}
CIFAR = ('cifar10', 'cifar100')
LEAF = ('femnist', 'shakespeare')
SPLITS = ('niid', 'iid')
LEAF_FRACTION = 0.1          # C on FEMNIST / Shakespeare / StackOverflow (the release's fedbase.yaml)
CENTRALIZED = {'cifar10': 85.64, 'cifar100': 54.97, 'femnist': 87.52, 'shakespeare': 52.00, 'stackoverflow': 28.50}
# dataset -> thesis setting: K, rounds, |D_S|_min, K_S,max, FedSeq2Par (alpha_gr, beta_gr), default groupings
# (FedSeq, FedAsyncSeq, FedSeq2Par), data fields (Table A.6, digest 1.2 / 2.1; module docstring).
SO_ROUNDS, SO_BETA = 1500, 50
LEAF_SETTING = {
    'femnist': dict(clients=3500, rounds=1500, min_examples=4120, max_clients=21, growth=(3e-3, 5),
                    groupings=('t2v_kmeans', 't2v_kmeans', 't2v_icg'), data=dict(fraction=1.0, min_samples=0)),
    'shakespeare': dict(clients=100, rounds=250, min_examples=8000, max_clients=5, growth=(1.8e-2, 5),
                        groupings=('clf_greedy', 'clf_kmeans', 'clf_icg'),
                        data=dict(fraction=1.0, min_samples=2222, num_clients=100, max_samples=2223)),
    'stackoverflow': dict(clients=40000, rounds=SO_ROUNDS, min_examples=21000, max_clients=21,
                          growth=(round((40000 / SO_BETA) ** (1 / (SO_ROUNDS - 1)) - 1, 6), SO_BETA),
                          groupings=('random', 'random', 'random'),
                          data=dict(num_clients=40000, test_examples=10000)),
}
# Groupings that need one label per example (psi_conf, psi_t2v): not for Shakespeare's next_token task.
PER_EXAMPLE_GROUPINGS = tuple(g for g, (est, meth, _) in GROUPINGS.items() if est != 'clf' and meth != 'random')
ATTACKS = {'none': None, '0-2': '0,2', '3-5': '3,5', '0-2-3-5': '0,2,3,5', 'intra_sc': 'intra_sc',
           'extra_sc': 'extra_sc'}
FIELDS = {
    'dataset': ('cifar10', CIFAR + LEAF + ('stackoverflow',)),
    'method': ('fedseq', METHODS + BASELINES),
    'alpha': (0.0, float),
    'split': ('niid', SPLITS),
    'table': ('5.1', ('5.1', '5.3', '5.4', '5.5')),
    'grouping': ('default', ('default',) + tuple(GROUPINGS)),
    'attack': ('none', tuple(ATTACKS)),
    'gamma': ('fixed', ('fixed', 'random')),
    'ls': (0.1, float),
    'l': (0.1, float),
    'fair': (True, bool),
}

# Table 5.1: method -> (C10 a0, a.2, a.5, C100 a0, a.2, a.5) of (accuracy, std).
T51 = {
    'fedavg': ((71.27, .29), (76.32, .36), (77.39, .43), (42.68, .22), (48.79, .55), (49.51, .61)),
    'fedcyclic': ((82.45, .18), (82.61, .27), (83.49, .08), (47.46, .42), (49.93, .16), (50.47, .27)),
    'fedseq': ((81.89, .28), (82.19, .26), (82.77, .12), (45.87, .45), (49.26, .40), (49.63, .42)),
    'fedasyncseq': ((83.03, .31), (83.17, .27), (83.57, .22), (50.23, .11), (51.39, .18), (51.27, .24)),
    'fedseq2par': ((83.68, .14), (84.21, .08), (84.26, .06), (51.46, .23), (51.44, .02), (51.72, .10)),
    'fedprox': ((71.52, .08), (76.21, .50), (77.38, .57), (42.83, .18), (48.84, .65), (49.44, .49)),
    'scaffold': ((78.82, .05), (78.02, 1.13), (78.51, .24), (42.17, .10), (51.06, .03), (51.02, .12)),
    'feddyn': ((83.31, .05), (82.31, .41), (82.97, .40), (50.35, .27), (53.50, .76), (54.32, .63)),
}
# Table 5.3: (method, grouping) -> the same six columns.
T53 = {
    ('fedseq', 'random'): (81.90, 82.09, 82.12, 46.39, 48.62, 49.44),
    ('fedseq', 'clf_kmeans'): (82.30, 81.78, 82.48, 44.91, 48.74, 49.60),
    ('fedseq', 'clf_greedy'): (79.95, 82.06, 83.32, 45.22, 48.92, 49.62),
    ('fedseq', 'conf_kmeans'): (82.04, 81.99, 82.37, 43.55, 49.43, 49.79),
    ('fedseq', 'conf_greedy_kl'): (82.21, 82.20, 82.22, 45.97, 49.56, 49.82),
    ('fedseq', 'conf_greedy_gini'): (82.09, 81.85, 82.71, 45.79, 48.98, 49.61),
    ('fedseq', 't2v_greedy'): (82.28, 82.48, 82.86, 46.51, 50.06, 50.31),
    ('fedasyncseq', 't2v_greedy'): (83.40, 83.37, 83.85, 50.38, 51.64, 51.58),
    ('fedseq2par', 't2v_icg'): (83.86, 84.66, 84.35, 51.23, 51.41, 51.78),
}
# Table 5.1, LEAF / StackOverflow: method -> (FEMNIST niid, iid, Shakespeare niid, iid, StackOverflow).
T51_LEAF = {
    'fedavg': ((81.55, .11), (83.06, .12), (48.68, .12), (48.50, .07), (24.68, .15)),
    'fedcyclic': ((85.46, .05), (87.47, .09), (50.25, .05), (50.68, .03), (26.44, 1.68)),
    'fedseq': ((87.11, .03), (87.48, .03), (51.70, .13), (51.82, .00), (28.91, .21)),
    'fedasyncseq': ((86.96, .07), (87.20, .01), (51.82, .13), (51.88, .04), (27.44, .35)),
    'fedseq2par': ((87.58, .15), (87.95, .05), (52.75, .20), (52.71, .05), (29.79, .33)),
    'fedprox': ((81.55, .05), (83.07, .05), (48.73, .12), (48.51, .15), (24.59, .19)),
    'scaffold': ((82.56, .07), (82.70, .01), (50.91, .19), (50.91, .12), (26.10, .15)),
    'feddyn': ((81.95, .42), (82.00, .13), (51.77, .03), (51.94, .09), (25.51, .02)),
}
# Table 5.3, LEAF columns: (method, grouping) -> (FEMNIST niid, iid, Shakespeare niid, iid).
T53_LEAF = {
    ('fedseq', 'random'): (87.07, 87.49, 51.55, 51.84),
    ('fedseq', 'clf_kmeans'): (87.07, 87.45, 51.78, 51.70),
    ('fedseq', 'clf_greedy'): (87.12, 87.42, 51.72, 51.88),
    ('fedseq', 'conf_kmeans'): (87.10, 87.50, 51.79, 51.87),
    ('fedseq', 'conf_greedy_kl'): (87.01, 87.46, 51.70, 51.65),
    ('fedseq', 'conf_greedy_gini'): (87.05, 87.42, 51.59, 51.98),
    ('fedseq', 't2v_greedy'): (87.11, 87.48, 51.65, 51.82),
    ('fedasyncseq', 't2v_kmeans'): (86.96, 87.20, 51.93, 52.02),
    ('fedseq2par', 't2v_icg'): (87.58, 87.96, 52.84, 52.54),
}
# Table 5.4: dataset -> (FedSeq N_S, acc; FedSeq2Par mean N_S, acc, parallelism as printed).
T54 = {'cifar10': ((50, 81.89), (104, 83.68, 2.09)), 'cifar100': ((50, 45.87), (113, 51.46, 2.26)),
       'femnist': ((175, 87.11), (383, 87.58, 2.19)), 'shakespeare': ((25, 51.70), (52, 52.75, 2.09)),
       'stackoverflow': ((1900, 28.91), (5966, 29.79, 3.14))}
# Table 5.5: clean references and attacked rows (dataset, swap, gamma, L_S) ->
#   (L=0.1 FedSeq (acc, drop), FedAvg (acc, drop), L=0.5 FedSeq, FedAvg); drop None = "o".
T55_CLEAN = {('cifar10', 'fedseq'): 76.10, ('cifar10', 'fedavg'): 48.69,
             ('cifar100', 'fedseq'): 39.70, ('cifar100', 'fedavg'): 12.85}
_o = None
T55 = {
    ('cifar10', '0-2', 'fixed', 0.1): ((76.06, _o), (48.72, _o), (75.92, -0.20), (47.55, -1.14)),
    ('cifar10', '0-2', 'fixed', 0.3): ((76.25, -0.15), (47.74, -0.95), (74.75, -1.35), (48.30, -0.39)),
    ('cifar10', '0-2', 'fixed', 0.5): ((75.65, -0.45), (47.55, -1.14), (75.50, -0.60), (47.44, -1.25)),
    ('cifar10', '3-5', 'fixed', 0.1): ((76.05, _o), (47.92, -0.77), (75.50, -0.60), (47.93, -0.76)),
    ('cifar10', '3-5', 'fixed', 0.3): ((75.75, -0.35), (47.80, -0.89), (75.28, -0.82), (47.74, -0.95)),
    ('cifar10', '3-5', 'fixed', 0.5): ((76.15, _o), (47.93, -0.76), (75.09, -1.01), (46.94, -1.75)),
    ('cifar10', '0-2-3-5', 'fixed', 0.1): ((76.65, _o), (47.36, -1.33), (76.01, _o), (48.12, -0.58)),
    ('cifar10', '0-2-3-5', 'fixed', 0.3): ((75.79, -0.31), (48.29, -0.40), (75.19, -0.91), (46.42, -2.27)),
    ('cifar10', '0-2-3-5', 'fixed', 0.5): ((75.35, -0.75), (48.12, -0.58), (75.09, -1.01), (46.94, -1.75)),
    ('cifar10', '0-2-3-5', 'random', 0.1): ((76.52, _o), (48.65, _o), (75.71, -0.39), (47.52, -1.17)),
    ('cifar10', '0-2-3-5', 'random', 0.3): ((75.98, -0.12), (47.01, -1.68), (74.75, -1.35), (46.70, -1.99)),
    ('cifar10', '0-2-3-5', 'random', 0.5): ((75.93, -0.17), (47.52, -1.17), (73.46, -2.64), (46.49, -2.20)),
    ('cifar100', 'intra_sc', 'fixed', 0.1): ((38.81, -0.89), (12.57, -0.28), (38.87, -0.83), (12.35, -0.50)),
    ('cifar100', 'intra_sc', 'fixed', 0.3): ((39.66, _o), (12.45, -0.40), (39.04, -0.66), (11.55, -1.30)),
    ('cifar100', 'intra_sc', 'fixed', 0.5): ((39.23, -0.47), (12.35, -0.50), (38.40, -1.30), (11.02, -1.83)),
    ('cifar100', 'intra_sc', 'random', 0.1): ((39.36, -0.34), (13.23, _o), (39.59, _o), (13.05, _o)),
    ('cifar100', 'intra_sc', 'random', 0.3): ((39.67, _o), (13.23, _o), (38.88, -0.82), (12.47, -0.38)),
    ('cifar100', 'intra_sc', 'random', 0.5): ((39.68, _o), (13.05, _o), (38.98, -0.72), (11.27, -1.58)),
    ('cifar100', 'extra_sc', 'fixed', 0.1): ((40.11, _o), (12.37, -0.48), (40.03, _o), (12.20, -0.65)),
    ('cifar100', 'extra_sc', 'fixed', 0.3): ((39.29, -0.41), (13.08, _o), (38.73, -0.97), (12.34, -0.51)),
    ('cifar100', 'extra_sc', 'fixed', 0.5): ((38.95, -0.75), (12.20, -0.65), (38.46, -1.24), (12.30, -0.55)),
    ('cifar100', 'extra_sc', 'random', 0.1): ((39.17, -0.53), (13.12, _o), (39.12, -0.58), (12.83, _o)),
    ('cifar100', 'extra_sc', 'random', 0.3): ((39.54, _o), (13.06, _o), (37.90, -1.80), (11.81, -1.04)),
    ('cifar100', 'extra_sc', 'random', 0.5): ((39.03, -0.67), (13.12, _o), (37.76, -1.94), (11.94, -0.91)),
}
NAMES = {'fedavg': 'FedAvg', 'fedseq': 'FedSeq', 'fedasyncseq': 'FedAsyncSeq', 'fedseq2par': 'FedSeq2Par',
         'fedcyclic': 'FedCyclic', 'fedprox': 'FedProx', 'scaffold': 'SCAFFOLD', 'feddyn': 'FedDyn'}
_DS = {'cifar10': 'C10', 'cifar100': 'C100', 'femnist': 'FEMNIST', 'shakespeare': 'Shakespeare',
       'stackoverflow': 'StackOverflow'}

CELLS = [f'{ds},{m},alpha={a:g}' for ds in CIFAR for m in METHODS for a in ALPHAS]
CELLS += [f'{ds},{m},split={sp}' for ds in LEAF for m in METHODS for sp in SPLITS]
CELLS += [f'stackoverflow,{m}' for m in METHODS]
CELLS += [f'{ds},{m},alpha={a:g}' for ds in CIFAR for m in BASELINES for a in ALPHAS]
CELLS += [f'{ds},{m},split={sp}' for ds in LEAF for m in BASELINES for sp in SPLITS]
CELLS += ['stackoverflow,scaffold']
CELLS += [f'{ds},{m},grouping={g},alpha={a:g},table=5.3' for ds in CIFAR for (m, g) in T53 for a in ALPHAS]
CELLS += [f'{ds},{m},grouping={g},split={sp},table=5.3' for ds in LEAF for (m, g) in T53_LEAF for sp in SPLITS
          if ds == 'femnist' or g not in PER_EXAMPLE_GROUPINGS]
CELLS += [f'{ds},{m},table=5.4' for ds in T54 for m in ('fedseq', 'fedseq2par')]
CELLS += [f'{ds},{m},table=5.5' for (ds, m) in T55_CLEAN]
CELLS += [f'{ds},{m},attack={sw},gamma={g},ls={ls:g},l={l:g}' for (ds, sw, g, ls) in T55
          for m in ('fedseq', 'fedavg') for l in (0.1, 0.5)]


def default_grouping(method: str, dataset: str = 'cifar10') -> str:
  if dataset in LEAF_SETTING:
    return LEAF_SETTING[dataset]['groupings'][('fedseq', 'fedasyncseq', 'fedseq2par').index(method)
                                              if method in ('fedseq', 'fedasyncseq', 'fedseq2par') else 0]
  return 't2v_icg' if method == 'fedseq2par' else 't2v_greedy'


def base_config(dataset: str, method: str, alpha: float, *, fraction: float = FRACTION) -> ml_collections.ConfigDict:
  """The Table 5.1 setting of `method` (digest 1.2, Table A.6); FedAvg with C K clients per round."""
  c = default_config()
  c.dataset = dataset
  c.data = data_section(data_dir='', num_clients=NUM_CLIENTS, alpha=float(alpha),
                               examples_per_client=EXAMPLES, seed=0)
  c.model = 'cifar_cnn'
  c.augment = 'cifar'
  c.normalize = dataset
  paper_hparams.apply_training(c, dataset)     # lr 0.01, batch 64, wd 4e-4, E 1, no momentum, 10k / 20k rounds
  c.algorithm = method
  c.clients_per_round = round(fraction * NUM_CLIENTS)    # FedAvg: C K (fairness); unused by chain algorithms
  for k, v in registry.default_hparams(method).items():
    c.algo[k] = v
  if method != 'fedavg':
    c.algo.fraction = fraction
  if method == 'fedseq2par':
    c.algo.growth, c.algo.growth_alpha, c.algo.growth_beta = 'exp', 4.6e-4, 5
  set_grouping(c, default_grouping(method))
  c.eval_every = 100
  c.eval_every_last = 100
  c.summary_last_k = 100
  c.centralized.accuracy = CENTRALIZED[dataset] / 100
  return c


def leaf_config(dataset: str, method: str, split: str, *, fraction: float = LEAF_FRACTION) -> ml_collections.ConfigDict:
  """The Table 5.1 setting of `method` on FEMNIST / Shakespeare / StackOverflow (module docstring): the
  quickstart's data, model and client hyperparameters (Table A.6) at the thesis' size."""
  st = LEAF_SETTING[dataset]
  c = config_strings.load_config(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              f'quickstart_{dataset}.py'))
  for k, v in st['data'].items():
    c.data[k] = v
  if dataset in LEAF:
    c.data.split = split          # iid: LEAF's resampling into as many equal users (then the subset, if any)
  c.rounds = st['rounds']
  c.algorithm = method
  c.clients_per_round = round(fraction * st['clients'])     # FedAvg: C K (fairness); unused by chain algorithms
  for k, v in registry.default_hparams(method).items():
    c.algo[k] = v
  if method != 'fedavg':
    c.algo.fraction = fraction
  if method == 'fedseq2par':
    c.algo.growth = 'exp'
    c.algo.growth_alpha, c.algo.growth_beta = st['growth']
  set_grouping(c, default_grouping(method, dataset), min_examples=st['min_examples'],
               max_clients=st['max_clients'])
  c.eval_every = 100
  c.eval_every_last = 100
  c.summary_last_k = 100
  c.centralized.accuracy = CENTRALIZED[dataset] / 100
  return c


def set_grouping(c, name: str, *, min_examples: int = 1000, max_clients: int = 11, pretrain_epochs: int = 10):
  """config.grouping (fedjax_flat/grouping): psi, phi, tau of a Table 5.3 row and the constraints (CIFAR's by
  default)."""
  estimator, method, distance = GROUPINGS[name]
  c.grouping.estimator, c.grouping.method, c.grouping.distance = estimator, method, distance
  c.grouping.min_examples, c.grouping.max_clients = min_examples, max_clients
  c.grouping.pretrain_epochs = pretrain_epochs


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  ds, m, table = o['dataset'], o['method'], o['table']
  attack = o['attack']
  if attack != 'none':
    table = '5.5'
    config_strings.check(FAMILY, 'method', m, ('fedseq', 'fedavg'), context='under attack (Table 5.5)')
    key = (ds, attack, o['gamma'], o['ls'])
    if key not in T55:
      raise config_strings.ConfigStringError(
          FAMILY, arg, f'Table 5.5 has no cell {ds} attack={attack} gamma={o["gamma"]} ls={o["ls"]:g}; its rows: '
          + '; '.join(f'{d},attack={s},gamma={g},ls={ls:g}' for d, s, g, ls in T55))
    config_strings.check(FAMILY, 'l', o['l'], (0.1, 0.5))
  if ds not in CIFAR:
    return get_leaf_config(arg, o)
  if o['split'] != 'niid':
    raise config_strings.ConfigStringError(FAMILY, f'split={o["split"]}', 'CIFAR cells are split by alpha=')
  if table == '5.5':
    config_strings.check(FAMILY, 'method', m, ('fedseq', 'fedavg'), context='in Table 5.5')
    alpha = ATTACK_ALPHA
  else:
    alpha = o['alpha']
    config_strings.check(FAMILY, 'alpha', alpha, ALPHAS)
  c = base_config(ds, 'fedavg' if m in BASELINES else m, alpha)
  if m in BASELINES:
    _set_baseline(c, ds, m, table)
  if not o['fair']:
    return _fair_off(c, m, ds, FRACTION, table)
  grouping = default_grouping(m) if o['grouping'] == 'default' else o['grouping']
  col = (0 if ds == 'cifar10' else 3) + (ALPHAS.index(alpha) if alpha in ALPHAS else 0)
  src = f'thesis Table {table} (FedSeq), {_DS[ds]} {NAMES[m]}'
  if table == '5.1':
    _set_t51(c, o, T51[m][col], f'{src}, alpha={alpha:g}')
  elif table == '5.3':
    _check_t53(T53, m, grouping)
    set_grouping(c, grouping)
    config_strings.set_published(c, f'{src}, grouping {grouping}, alpha={alpha:g}', T53[(m, grouping)][col])
  elif table == '5.4':
    config_strings.check(FAMILY, 'alpha', alpha, (0.0,), context='in Table 5.4')
    _set_t54(c, ds, m, f'{src}, alpha=0')
  else:                                       # Table 5.5: 1k rounds at alpha = 100
    c.rounds = 1000
    if attack == 'none':
      config_strings.set_published(c, f'{src}, clean reference, alpha=100, 1k rounds', T55_CLEAN[(ds, m)])
    else:
      c.attack.kind = 'label_flip'
      c.attack.classes = ATTACKS[attack]
      c.attack.swap = o['gamma']
      c.attack.malicious_superclients = o['ls']
      c.attack.attackers = o['l']
      row = T55[(ds, attack, o['gamma'], o['ls'])]
      acc, drop = row[(0 if m == 'fedseq' else 1) + (0 if o['l'] == 0.1 else 2)]
      config_strings.set_published(
          c, f'{src}, attack {attack} {o["gamma"]}, L_S={o["ls"]:g}, L={o["l"]:g}, alpha=100, 1k rounds'
          + ('' if drop is not None else ', drop "o" (negligible)'), acc, drop=drop)
  return c


def _set_baseline(c, ds, m, table):
  """Table 5.1's FedProx / SCAFFOLD / FedDyn: FedAvg's setting (C K clients per round) with the algorithm and
  its Appendix A.4.2 hyperparameters."""
  if m not in BASELINE_HP[ds]:
    raise config_strings.ConfigStringError(FAMILY, f'{ds},{m}', f'{NAMES[m]} on {ds}: its hyperparameters are not '
                                           f'stated (Table 5.1 cells: {", ".join(BASELINE_HP[ds])})')
  config_strings.check(FAMILY, 'table', table, ('5.1',), context=f'for {m} (a Table 5.1 SOTA row)')
  hp, clip = BASELINE_HP[ds][m]
  c.algorithm = m
  c.algo = ml_collections.ConfigDict(registry.default_hparams(m))   # every hparam present: --config.algo.<k>=...
  c.algo.update(hp)
  if clip:
    c.client.grad_clip = clip


def _fair_off(c, m, ds, fraction, table):
  """fair=0: FedAvg with FedSeq's parallelism, C N_S clients per round (Table 5.4's N_S); nothing published."""
  if m != 'fedavg' or table == '5.5':
    raise config_strings.ConfigStringError(FAMILY, 'fair=0', 'the fairness switch applies to FedAvg outside '
                                           'Table 5.5 (the chain methods define the number of updates)')
  c.clients_per_round = fedseq_lib.num_sampled(fraction, T54[ds][0][0])
  c.published = ml_collections.ConfigDict()
  return c


def _set_t51(c, o, acc_std, src):
  if o['grouping'] != 'default':
    raise config_strings.ConfigStringError(FAMILY, f'grouping={o["grouping"]}', 'Table 5.1 uses each method\'s '
                                           'default grouping; the grouping rows are table=5.3')
  config_strings.set_published(c, src, *acc_std)


def _check_t53(table, m, grouping):
  if (m, grouping) not in table:
    raise config_strings.ConfigStringError(
        FAMILY, f'{m},grouping={grouping}', 'Table 5.3 has: ' + '; '.join(f'{a},grouping={g}' for a, g in table))


def _set_t54(c, ds, m, src):
  config_strings.check(FAMILY, 'method', m, ('fedseq', 'fedseq2par'), context='in Table 5.4')
  (ns, acc_seq), (ns_bar, acc_par, ratio) = T54[ds]
  if m == 'fedseq':
    config_strings.set_published(c, f'{src}, N_S = {ns}', acc_seq, num_superclients=ns)
  else:
    config_strings.set_published(c, f'{src}, mean N_S = {ns_bar} ({ratio:.2f}x)', acc_par,
                                 mean_num_superclients=ns_bar)


def get_leaf_config(arg: str, o):
  """FEMNIST / Shakespeare / StackOverflow cells (Tables 5.1, 5.3, 5.4; module docstring)."""
  ds, m, table, split = o['dataset'], o['method'], o['table'], o['split']
  if o['attack'] != 'none' or table == '5.5':
    raise config_strings.ConfigStringError(FAMILY, arg, 'Table 5.5 (label flipping) is CIFAR only')
  if o['alpha'] != 0:
    raise config_strings.ConfigStringError(FAMILY, f'alpha={o["alpha"]:g}', f'{ds} has its natural split: use '
                                           'split=niid | iid (FEMNIST, Shakespeare)')
  if ds == 'stackoverflow':
    config_strings.check(FAMILY, 'split', split, ('niid',), context='for stackoverflow (its users)')
  c = leaf_config(ds, 'fedavg' if m in BASELINES else m, split)
  if m in BASELINES:
    _set_baseline(c, ds, m, table)
  st = LEAF_SETTING[ds]
  if not o['fair']:
    return _fair_off(c, m, ds, LEAF_FRACTION, table)
  col = ((0 if ds == 'femnist' else 2) + SPLITS.index(split)) if ds in LEAF else 4
  where = f'{_DS[ds]}' + (f' {split.upper()}' if ds in LEAF else '')
  src = f'thesis Table {table} (FedSeq), {where} {NAMES[m]}'
  if table == '5.1':
    _set_t51(c, o, T51_LEAF[m][col], src)
  elif table == '5.3':
    if ds == 'stackoverflow':
      raise config_strings.ConfigStringError(FAMILY, arg, 'Table 5.3 has no StackOverflow column')
    grouping = default_grouping(m, ds) if o['grouping'] == 'default' else o['grouping']
    _check_t53(T53_LEAF, m, grouping)
    if ds == 'shakespeare' and grouping in PER_EXAMPLE_GROUPINGS:
      raise config_strings.ConfigStringError(FAMILY, f'grouping={grouping}', 'Shakespeare\'s next_token task labels '
                                             'every position: psi_conf / psi_t2v do not apply (psi_clf rows only)')
    set_grouping(c, grouping, min_examples=st['min_examples'], max_clients=st['max_clients'])
    config_strings.set_published(c, f'{src}, grouping {grouping}', T53_LEAF[(m, grouping)][col])
  else:
    config_strings.check(FAMILY, 'split', split, ('niid',), context='in Table 5.4')
    _set_t54(c, ds, m, src)
  return c
