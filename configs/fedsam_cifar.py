r"""FedAvg / FedSAM / FedASAM (+ server SWA) on CIFAR10/100 with the FedSAM paper's CNN: thesis Table 4.3.

One cell per command:
  .venv/bin/python experiments/train.py --workdir=runs/c100_fedasam_swa_a0.5 \
      --config=configs/fedsam_cifar.py:cifar100,fedasam,swa,alpha=0.5,clients=10

Grammar (comma-separated; defaults cifar10,fedavg,alpha=0,clients=5,epochs=1, no SWA):
  cifar10 | cifar100;  fedavg | fedsam | fedasam;  swa (server SWA, Table A.3);
  alpha=0 | 0.05 | 100 (CIFAR10), 0 | 0.5 | 1000 (CIFAR100);  clients=5 | 10 | 20 (clients per round);
  epochs=1 | 2 (local epochs; the table's "E=2" rows: FedAvg without SWA only)
CELLS lists all 126 cells; each carries its published number in config.published.

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
}
ALPHAS = {'cifar10': (0.0, 0.05, 100.0), 'cifar100': (0.0, 0.5, 1000.0)}
CLIENTS = (5, 10, 20)
# Table 4.3's "FedAvg E=2" rows (5 / 10 / 20 clients per round); the E=1 rows are paper_hparams.PUBLISHED.
PUBLISHED_E2 = {
    ('cifar10', 0.0): (61.49, 62.22, 66.36), ('cifar10', 0.05): (69.23, 69.77, 73.48),
    ('cifar10', 100.0): (83.93, 84.10, 84.21),
    ('cifar100', 0.0): (24.94, 31.81, 35.18), ('cifar100', 0.5): (38.21, 39.59, 40.94),
    ('cifar100', 1000.0): (48.72, 48.64, 48.45),
}

CELLS = [f'{ds},{m}{",swa" if swa else ""},alpha={a:g},clients={k}'
         for ds in ALPHAS for m in paper_hparams.METHODS for swa in (False, True) for a in ALPHAS[ds]
         for k in CLIENTS]
CELLS += [f'{ds},fedavg,alpha={a:g},clients={k},epochs=2' for ds in ALPHAS for a in ALPHAS[ds] for k in CLIENTS]


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  ds, method, swa, alpha, k, epochs = o['dataset'], o['method'], o['swa'], o['alpha'], o['clients'], o['epochs']
  config_strings.check(FAMILY, 'alpha', alpha, ALPHAS[ds], context=f'for {ds}')
  config_strings.check(FAMILY, 'clients', k, CLIENTS)
  config_strings.check(FAMILY, 'epochs', epochs, (1, 2) if (method == 'fedavg' and not swa) else (1,),
                       context=f'for {method}{"+swa" if swa else ""} (E=2 rows: FedAvg without SWA)')
  c = paper_hparams.cifar_cnn_config(ds, method, alpha=alpha, clients_per_round=k, swa=swa)
  c.client.local_epochs = epochs
  col = CLIENTS.index(k)
  if epochs == 2:
    acc = PUBLISHED_E2[(ds, alpha)][col]
  else:
    acc = paper_hparams.published(ds, alpha, method + ('+swa' if swa else ''), k)
  row = {'fedavg': 'FedAvg', 'fedsam': 'FedSAM', 'fedasam': 'FedASAM'}[method] + ('+SWA' if swa else '')
  row += ' E=2' if epochs == 2 else ''
  config_strings.set_published(
      c, f'thesis Table 4.3 (FedSAM paper, CNN), {"C10" if ds == "cifar10" else "C100"} {row}, '
         f'alpha={alpha:g}, {k} clients/round', acc)
  return c
