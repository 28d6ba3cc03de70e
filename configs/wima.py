r"""WiMA (server window model averaging) on CIFAR10/100 ResNet20-GN, CIFAR100-PAM, FEMNIST and Landmarks: thesis
Tables 4.22-4.25.

One cell per command:
  .venv/bin/python experiments/train.py --workdir=runs/c10_scaffold_wima_a0.05 \
      --config=configs/wima.py:cifar10,scaffold,alpha=0.05

Grammar (defaults cifar10,fedavg,alpha=0, WiMA on with W = 100 (CIFAR, PAM, FEMNIST) / 370 (Landmarks),
subset=all, batch=100 (CIFAR) / 20 (PAM) / 10 (FEMNIST) / 50 (Landmarks)):
  cifar10 | cifar100 | pam | femnist | landmarks;
  fedavg | scaffold | fedavgm | mime_sgd | mime_sgdm | mimelite | fedcm | fedacg | fedprox | feddyn | adabest
  (Table 4.22's rows; the ones after scaffold: CIFAR, PAM and FEMNIST only; FedDyn on C10 and FEMNIST is N/A
  in the table: it builds, without a number);
  nowima (the table's "without WiMA" column);
  alpha=0 | 0.05 (CIFAR10), 0 | 0.5 (CIFAR100) (PAM, FEMNIST, Landmarks: their own splits, no alpha);
  window=5 | 10 | 50 | 100 | 200 (Table 4.24, CIFAR alpha=0);
  subset=all | classifier | features with batch=20 (Table 4.25: WiMA on part of the network, FedAvg)
CIFAR cells buffer 200 models of every parameter (wima.buffer = Table 4.24's largest W, wima.buffer_all): the
averages are those of a buffer of W and of the subset only, and a window or subset grid is one batched program.
CELLS lists the 150 cells with a published number in config.published.

CIFAR setting (thesis A.3.1, Table 4.22): 100 clients x 500 images, Dirichlet alpha, 10 clients per round, 10k
rounds; client SGD lr 0.1, no momentum, no weight decay, batch 100, 1 local epoch; server lr 1, no momentum;
ResNet20-GN [U: GN groups not given, 2 used]; augmentation not stated [U], CIFAR crop + flip used.
Evaluation every 100 rounds and every round of the last 100; reported number = mean over the last 100 rounds.
With WiMA the WiMA model is the reported one (summary.json "reported_model": "wima"); the FedAvg chain is
logged beside it.
CIFAR100-PAM setting (A.3.1): 500 clients x 100 images (TFF Pachinko split), 10k rounds, "20% participation"
[U: read as 20% of the 500 clients = 100 clients per round]; client SGD lr 0.05, weight decay 4e-4, batch 20;
client momentum and local epochs not stated for WiMA [U: 0 and 1, as the CIFAR runs]. "Server momentum 0.9"
[U: taken as FedAvgM's beta (the FedAvgM row), not as every row's server: otherwise the FedAvg and FedAvgM
rows would be one run with two numbers]. The model is not stated for WiMA [U]: the FedSAM PAM model of
configs/fedsam_pam.py, ResNet18-GN with 2 groups, CIFAR100 normalization, no augmentation. W = 100 [U: the
table's W; not restated for PAM]. Data: 'cifar100_pam' (the TFF SQLite files; experiments/download.py).
FEMNIST setting (A.3.1): LEAF FEMNIST, all writers (fraction 1, niid; per-writer 90/10 train/test split as
configs/quickstart_femnist.py), 1,500 rounds, 10 clients per round, client SGD lr 0.1, no momentum, no weight
decay, batch 10, 1 local epoch; model "2-layer CNN following McMahan et al." = mcmahan_cnn (conv5x5-32 SAME,
pool, conv5x5-64 SAME, pool, fc512, fc62; 1,690,046 parameters). W is not stated for FEMNIST [U: W = 100, the
table's, i.e. the last 1/15 of the run]. Point --config.data.data_dir at LEAF's data/femnist/data.
PAM and FEMNIST are evaluated as the CIFAR runs (every 100 rounds and every round of the last 100, mean over
the last 100) [U: not restated].
Landmarks setting (Table 4.23): the FedSAM Landmarks setup (configs/fedsam_landmarks.py: SGD lr 0.1, weight
decay 4e-5, 5 local epochs, 10 clients per round, ImageNet-pretrained MobileNetV2-GN: pass
--config.init.pretrained=<file>) except batch 50 and 3k rounds; W = 370.

Published accuracy % (without -> with WiMA, W = 100):
Table 4.22 (ResNet20-GN)   C10 a0           C10 a0.05        C100 a0          C100 a0.5
  FedAvg                   64.37 -> 69.95   68.50 -> 72.69   23.00 -> 27.91   31.21 -> 34.45
  SCAFFOLD                 81.45 -> 83.96   83.24 -> 85.17   45.65 -> 49.77   50.93 -> 53.75
  FedAvgM                  73.32 -> 75.72   73.10 -> 75.30   24.27 -> 28.77   31.78 -> 33.97
  MIME SGD                 74.92 -> 80.65   78.82 -> 82.81   17.55 -> 29.05   27.30 -> 40.37
  MIME SGDM                74.58 -> 76.20   78.39 -> 80.38   25.78 -> 30.11   38.42 -> 43.08
  MimeLite                 64.42 -> 67.78   68.27 -> 71.21   20.00 -> 24.69   35.56 -> 39.15
  FedCM                    78.83 -> 81.73   73.94 -> 80.28   19.62 -> 25.29   36.12 -> 40.10
  FedACG                   55.27 -> 60.09   63.20 -> 66.35   20.09 -> 23.55   29.74 -> 32.46
  FedProx                  64.25 -> 69.90   67.82 -> 71.90   22.59 -> 27.58   30.70 -> 33.68
  FedDyn                   N/A              N/A              5.88 -> 8.48     20.88 -> 24.54
  AdaBest                  66.05 -> 73.95   71.54 -> 77.42   24.92 -> 31.41   37.45 -> 43.81
  Hyperparameters of the rows after SCAFFOLD [U: Appendix A.3.2 gives their grids, not the chosen values; the
  middle of each grid, as configs/baselines_cifar_cnn.py]: FedAvgM server momentum 0.9, lr 1 (grid {0.1, 1});
  MIME SGD beta 0 / MIME SGDM beta 0.9, server lr 1; MimeLite beta 0.9, server lr 1; FedCM alpha 0.1 ({0.05,
  0.1, 0.5}); FedACG beta 0.01, lambda 0.85; FedProx mu 0.01; FedDyn alpha 0.01 ({0.01, 0.001}); AdaBest mu 0.02,
  beta 0.9. Override with --config.algo.<name>=... / --config.server.*.
Table 4.22 (continued)     PAM              FEMNIST
  FedAvg 47.41 -> 48.53   83.59 -> 85.06   SCAFFOLD 56.09 -> 57.64   85.87 -> 86.61
  FedAvgM 55.96 -> 61.63  85.00 -> 85.26   MIME SGD 54.33 -> 57.44   85.37 -> 86.40
  MIME SGDM 54.62 -> 57.28  86.67 -> 87.40   MimeLite 53.97 -> 60.34  86.82 -> 87.51
  FedCM 53.16 -> 54.12    83.88 -> 84.90   FedACG 58.88 -> 61.38     85.73 -> 86.14
  FedProx 55.91 -> 62.25  84.50 -> 85.21   FedDyn 57.42 -> 63.00     N/A
  AdaBest 54.98 -> 57.57  84.95 -> 86.02
Table 4.23 (Landmarks, W = 370):  FedAvg 58.17 -> 63.05   SCAFFOLD 62.32 -> 68.30
Table 4.24 (FedAvg + WiMA, alpha=0; W = 5 / 10 / 50 / 100 / 200):
  CIFAR10   67.25 / 69.12 / 69.79 / 69.94 / 68.74      CIFAR100  22.71 / 25.70 / 22.75 / 27.91 / 27.72
  (the W = 100 cell is Table 4.22's: 69.95 there, 69.94 here)
Table 4.25 (FedAvg + WiMA, batch 20; classifier only / feature extractor only / all):
  C10 a0 47.76 / 59.03 / 59.53   C10 a0.05 71.01 / 76.72 / 78.87
  C100 a0 25.13 / 27.10 / 27.91  C100 a0.5 36.12 / 36.29 / 37.88   ([U] C100 a0 "all" equals Table 4.22's
  value at batch 100)
Not cells: Table 4.22's C10 and FEMNIST FedDyn cells (N/A). Any registered algorithm runs under WiMA
with --config.algorithm=<name>, without a published number attached.
"""
from fedjax_flat.algorithms import registry
from fedjax_flat.config import families as config_strings, paper_hparams
from fedjax_flat.config.default_config import data_section, default_config

FAMILY = 'configs/wima.py'
FIELDS = {
    'dataset': ('cifar10', ('cifar10', 'cifar100', 'pam', 'femnist', 'landmarks')),
    'algorithm': ('fedavg', ('fedavg', 'scaffold', 'fedavgm', 'mime_sgd', 'mime_sgdm', 'mimelite', 'fedcm', 'fedacg',
                             'fedprox', 'feddyn', 'adabest')),
    'nowima': (False, bool),
    'alpha': (0.0, float),
    'window': (0, int),        # 0 = the table's default (100 CIFAR / PAM / FEMNIST, 370 Landmarks)
    'subset': ('all', ('all', 'classifier', 'features')),
    'batch': (0, int),         # 0 = the table's default (100 CIFAR, 20 PAM, 10 FEMNIST, 50 Landmarks)
}
HET = {'cifar10': 0.05, 'cifar100': 0.5}
T422 = {  # (dataset, alpha, algorithm) -> (without, with WiMA)
    ('cifar10', 0.0, 'fedavg'): (64.37, 69.95), ('cifar10', 0.05, 'fedavg'): (68.50, 72.69),
    ('cifar100', 0.0, 'fedavg'): (23.00, 27.91), ('cifar100', 0.5, 'fedavg'): (31.21, 34.45),
    ('cifar10', 0.0, 'scaffold'): (81.45, 83.96), ('cifar10', 0.05, 'scaffold'): (83.24, 85.17),
    ('cifar100', 0.0, 'scaffold'): (45.65, 49.77), ('cifar100', 0.5, 'scaffold'): (50.93, 53.75),
}
# The other rows: algorithm -> (C10 a0, C10 a.05, C100 a0, C100 a.5) of (without, with); None = N/A.
_T422_ROWS = {
    'fedavgm': ((73.32, 75.72), (73.10, 75.30), (24.27, 28.77), (31.78, 33.97)),
    'mime_sgd': ((74.92, 80.65), (78.82, 82.81), (17.55, 29.05), (27.30, 40.37)),
    'mime_sgdm': ((74.58, 76.20), (78.39, 80.38), (25.78, 30.11), (38.42, 43.08)),
    'mimelite': ((64.42, 67.78), (68.27, 71.21), (20.00, 24.69), (35.56, 39.15)),
    'fedcm': ((78.83, 81.73), (73.94, 80.28), (19.62, 25.29), (36.12, 40.10)),
    'fedacg': ((55.27, 60.09), (63.20, 66.35), (20.09, 23.55), (29.74, 32.46)),
    'fedprox': ((64.25, 69.90), (67.82, 71.90), (22.59, 27.58), (30.70, 33.68)),
    'feddyn': (None, None, (5.88, 8.48), (20.88, 24.54)),
    'adabest': ((66.05, 73.95), (71.54, 77.42), (24.92, 31.41), (37.45, 43.81)),
}
for _a, _vals in _T422_ROWS.items():
  for _v, _k in zip(_vals, (('cifar10', 0.0), ('cifar10', 0.05), ('cifar100', 0.0), ('cifar100', 0.5))):
    if _v is not None:
      T422[_k + (_a,)] = _v
# Row -> (registered algorithm, its hyperparameters, server fields) [U: grid middles, see the docstring].
ROWS = {
    'fedavg': ('fedavg', {}, {}), 'scaffold': ('scaffold', {}, {}),
    'fedavgm': ('fedavg', {}, {'momentum': 0.9, 'lr': 1.0}),
    'mime_sgd': ('mime', {'beta': 0.0}, {'lr': 1.0}), 'mime_sgdm': ('mime', {'beta': 0.9}, {'lr': 1.0}),
    'mimelite': ('mimelite', {'beta': 0.9}, {'lr': 1.0}), 'fedcm': ('fedcm', {'alpha': 0.1}, {}),
    'fedacg': ('fedacg', {'beta': 0.01, 'lam': 0.85}, {}), 'fedprox': ('fedprox', {'mu': 0.01}, {}),
    'feddyn': ('feddyn', {'alpha': 0.01}, {}), 'adabest': ('adabest', {'mu': 0.02, 'beta': 0.9}, {}),
}
# Table 4.22's PAM and FEMNIST columns: algorithm -> (PAM, FEMNIST) of (without, with); None = N/A.
T422_OWN_SPLIT = {
    'fedavg': ((47.41, 48.53), (83.59, 85.06)), 'scaffold': ((56.09, 57.64), (85.87, 86.61)),
    'fedavgm': ((55.96, 61.63), (85.00, 85.26)), 'mime_sgd': ((54.33, 57.44), (85.37, 86.40)),
    'mime_sgdm': ((54.62, 57.28), (86.67, 87.40)), 'mimelite': ((53.97, 60.34), (86.82, 87.51)),
    'fedcm': ((53.16, 54.12), (83.88, 84.90)), 'fedacg': ((58.88, 61.38), (85.73, 86.14)),
    'fedprox': ((55.91, 62.25), (84.50, 85.21)), 'feddyn': ((57.42, 63.00), None),
    'adabest': ((54.98, 57.57), (84.95, 86.02)),
}
for _a, _vals in T422_OWN_SPLIT.items():
  for _v, _ds in zip(_vals, ('pam', 'femnist')):
    if _v is not None:
      T422[(_ds, 0.0, _a)] = _v
DEFAULT_BATCH = {'cifar10': 100, 'cifar100': 100, 'pam': 20, 'femnist': 10, 'landmarks': 50}
T423 = {'fedavg': (58.17, 63.05), 'scaffold': (62.32, 68.30)}
T424 = {'cifar10': {5: 67.25, 10: 69.12, 50: 69.79, 200: 68.74},
        'cifar100': {5: 22.71, 10: 25.70, 50: 22.75, 200: 27.72}}
T425 = {  # (dataset, alpha) -> classifier / features / all, batch 20
    ('cifar10', 0.0): (47.76, 59.03, 59.53), ('cifar10', 0.05): (71.01, 76.72, 78.87),
    ('cifar100', 0.0): (25.13, 27.10, 27.91), ('cifar100', 0.5): (36.12, 36.29, 37.88),
}
SUBSETS = ('classifier', 'features', 'all')

CELLS = [f'{ds},{a}{",nowima" if no else ""}' + (f',alpha={al:g}' if ds in HET else '')
         for (ds, al, a) in T422 for no in (True, False)]
CELLS += [f'landmarks,{a}{",nowima" if no else ""}' for a in T423 for no in (True, False)]
CELLS += [f'{ds},fedavg,alpha=0,window={w}' for ds in T424 for w in T424[ds]]
CELLS += [f'{ds},fedavg,alpha={al:g},subset={s},batch=20' for (ds, al) in T425 for s in SUBSETS]


def _published(ds, alpha, algo, wima, window, subset, batch):
  """(source, accuracy) of the cell, or (None, None)."""
  if ds == 'landmarks':
    if window == 370 and batch == 50 and subset == 'all':
      return f'thesis Table 4.23 (WiMA, Landmarks-User-160k), {algo}, {"w/" if wima else "w/o"} WiMA', \
          T423[algo][int(wima)]
    return None, None
  if ds in ('pam', 'femnist'):
    if batch == DEFAULT_BATCH[ds] and subset == 'all' and (window == 100 or not wima) and (ds, 0.0, algo) in T422:
      return f'thesis Table 4.22 (WiMA on SOTA), {algo}, {"w/" if wima else "w/o"} WiMA, ' \
          f'{"CIFAR100-PAM" if ds == "pam" else "FEMNIST"}', T422[(ds, 0.0, algo)][int(wima)]
    return None, None
  name = f'{"C10" if ds == "cifar10" else "C100"} alpha={alpha:g}'
  if batch == 100 and subset == 'all' and (window == 100 or not wima) and (ds, alpha, algo) in T422:
    return f'thesis Table 4.22 (WiMA on SOTA, ResNet20-GN), {algo}, {"w/" if wima else "w/o"} WiMA, {name}', \
        T422[(ds, alpha, algo)][int(wima)]
  if algo == 'fedavg' and wima and batch == 100 and subset == 'all' and alpha == 0 and window in T424[ds]:
    return f'thesis Table 4.24 (WiMA window), FedAvg, W={window}, {name}', T424[ds][window]
  if algo == 'fedavg' and wima and batch == 20 and window == 100:
    return f'thesis Table 4.25 (WiMA on part of the network, batch 20), FedAvg, subset={subset}, {name}', \
        T425[(ds, alpha)][SUBSETS.index(subset)]
  return None, None


def _pam_config():
  """A.3.1's CIFAR100-PAM WiMA setting (see the docstring's [U]s)."""
  c = default_config()
  c.dataset = 'cifar100_pam'
  c.data = data_section(data_dir='', source='sqlite', seed=0)
  c.model = 'resnet18_gn'                     # [U] the FedSAM PAM model (configs/fedsam_pam.py)
  c.augment = 'none'
  c.normalize = 'cifar100'
  c.rounds = 10000
  c.clients_per_round = 100                   # [U] "20% participation" of 500 clients
  c.client.lr = 0.05
  c.client.momentum = 0.0
  c.client.weight_decay = 4e-4
  c.client.local_epochs = 1
  _eval_as_cifar(c)
  return c


def _femnist_config():
  """A.3.1's FEMNIST WiMA setting: all LEAF writers, McMahan et al.'s 2-layer CNN."""
  c = default_config()
  c.dataset = 'femnist'
  c.data = data_section(**{'data_dir': '', 'source': 'auto', 'split': 'niid', 'fraction': 1.0,
                             'min_samples': 0, 'train_split': 'sample', 'train_fraction': 0.9, 'seed': 0,
                             'shuffle': True})
  c.model = 'mcmahan_cnn'
  c.rounds = 1500
  c.clients_per_round = 10
  c.client.lr = 0.1
  c.client.momentum = 0.0
  c.client.weight_decay = 0.0
  c.client.local_epochs = 1
  _eval_as_cifar(c)
  return c


def _eval_as_cifar(c):
  c.eval_every = 100            # as the CIFAR runs [U]: every 100 rounds, then every round of the last 100,
  c.eval_every_last = 100       # the reported number is the mean over those 100
  c.summary_last_k = 100


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  ds, algo, wima, alpha = o['dataset'], o['algorithm'], not o['nowima'], o['alpha']
  if ds == 'landmarks':
    config_strings.check(FAMILY, 'alpha', alpha, (0.0,), context='for landmarks (its user split has no alpha)')
    config_strings.check(FAMILY, 'algorithm', algo, tuple(T423), context='for landmarks (Table 4.23)')
    c = paper_hparams.landmarks_config()
    c.rounds = 3000
    window = o['window'] or 370
  elif ds == 'pam':
    config_strings.check(FAMILY, 'alpha', alpha, (0.0,), context='for pam (its Pachinko split has no alpha)')
    c = _pam_config()
    window = o['window'] or 100
  elif ds == 'femnist':
    config_strings.check(FAMILY, 'alpha', alpha, (0.0,), context='for femnist (its writer split has no alpha)')
    c = _femnist_config()
    window = o['window'] or 100
  else:
    config_strings.check(FAMILY, 'alpha', alpha, (0.0, HET[ds]), context=f'for {ds}')
    c = paper_hparams.cifar_cnn_config(ds, 'fedavg', alpha=alpha, clients_per_round=10)
    c.model = 'resnet20_gn'
    c.rounds = 10000
    c.client.lr = 0.1
    c.client.momentum = 0.0
    c.client.weight_decay = 0.0
    window = o['window'] or 100
  batch = o['batch'] or DEFAULT_BATCH[ds]
  c.client.batch_size = batch
  name, hp, server = ROWS[algo]
  c.algorithm = name
  if name != 'fedavg':
    c.algo.update(registry.default_hparams(name))     # every hparam present: --config.algo.<k>=... works
    c.algo.update(hp)
  for k, v in server.items():
    c.server[k] = v
  c.wima.enabled = wima
  c.wima.window = window
  c.wima.subset = o['subset']
  if ds in HET:
    # One batched program for each table's grid (--batch_runs): the ring buffer holds Table 4.24's largest window
    # and every parameter, so the window and the subset are per-run values (same averages; W_max model copies).
    c.wima.buffer = max(T424[ds])
    c.wima.buffer_all = True
  source, acc = _published(ds, alpha, algo, wima, window, o['subset'], batch)
  if source:
    config_strings.set_published(c, source, acc)
  return c
