r"""FedAvg / FedSAM / FedASAM (+ server SWA) on CIFAR100-PAM with ResNet18-GN: thesis Table 4.4 (no augmentation).

One cell per command:
  .venv/bin/python experiments/train.py --workdir=runs/pam_fedsam_swa_20 \
      --config=configs/fedsam_pam.py:fedsam,swa,clients=20

Grammar (defaults fedavg,clients=10,epochs=1, no SWA):
  fedavg | fedsam | fedasam;  swa (server SWA);  clients=10 | 20;  epochs=1 | 2 (the table's "E=2" rows)
CELLS lists all 24 cells; each carries its published number (the @10k column, or "w/ SWA") in config.published.

Setting (Table A.1): 500 clients x 100 images (TFF Pachinko split), 10k rounds; client lr 0.01, batch 20,
weight decay 4e-4, client momentum 0.9; server FedAvg; ResNet18-GN with 2 groups per GroupNorm; CIFAR100
normalization, no augmentation. SAM rho 0.05; ASAM rho 0.5, eta 0.2 (Table A.2). SWA (Table A.3): c = 5,
lr 1e-2 -> 1e-4, start 7500 = 0.75 T (the table's 15000 exceeds T, digest [U]). Evaluation every 10 rounds and
every round of the last 100; reported number = mean over the last 100 rounds.
Data: dataset 'cifar100_pam' (the TFF SQLite files; experiments/download.py).

Published accuracy % (Table 4.4, no augmentation):
                 10 cl @5k  10 cl @10k  10 cl w/ SWA   20 cl @5k  20 cl @10k  20 cl w/ SWA
  FedAvg         46.60      47.03       52.70          46.51      45.83       50.28
  FedSAM         50.71      53.10       55.44          52.96      53.41       54.67
  FedASAM        49.31      51.10       54.25          47.21      53.50       54.29
  FedAvg E=2     44.58      43.90       51.10          43.31      42.88       47.95
  FedSAM E=2     52.36      52.04       55.23          51.41      51.35       53.41
  FedASAM E=2    49.03      49.33       53.01          53.88      52.94       54.18
The "@5k" column is round 5000 of the same 10k-round run (metrics.jsonl), not a separate cell.
Not cells: the table's MixUp and Cutout rows. Our presets (augment=cifar_mixup | cifar_cutout) add a random
crop + flip, and whether the PAM runs had them is not stated; the nearest command is e.g.
`--config.augment=cifar_mixup --config.client.asam_eta=0` (Table A.2: ASAM eta 0 with MixUp), without a
published number attached.
"""
from fedjax_flat.config import families as config_strings, paper_hparams
from fedjax_flat.config.default_config import data_section, default_config

FAMILY = 'configs/fedsam_pam.py'
FIELDS = {
    'method': ('fedavg', paper_hparams.METHODS),
    'swa': (False, bool),
    'clients': (10, int),
    'epochs': (1, int),
}
# (method, epochs) -> (10 cl @10k, 10 cl w/ SWA, 20 cl @10k, 20 cl w/ SWA), Table 4.4 "none" rows.
PUBLISHED = {
    ('fedavg', 1): (47.03, 52.70, 45.83, 50.28), ('fedsam', 1): (53.10, 55.44, 53.41, 54.67),
    ('fedasam', 1): (51.10, 54.25, 53.50, 54.29), ('fedavg', 2): (43.90, 51.10, 42.88, 47.95),
    ('fedsam', 2): (52.04, 55.23, 51.35, 53.41), ('fedasam', 2): (49.33, 53.01, 52.94, 54.18),
}
CELLS = [f'{m}{",swa" if swa else ""},clients={k},epochs={e}'
         for m in paper_hparams.METHODS for swa in (False, True) for k in (10, 20) for e in (1, 2)]


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  method, swa, k, epochs = o['method'], o['swa'], o['clients'], o['epochs']
  config_strings.check(FAMILY, 'clients', k, (10, 20))
  config_strings.check(FAMILY, 'epochs', epochs, (1, 2))
  c = default_config()
  c.dataset = 'cifar100_pam'
  c.data = data_section(data_dir='', source='sqlite', seed=0)
  c.model = 'resnet18_gn'
  c.augment = 'none'
  c.normalize = 'cifar100'
  paper_hparams.apply_training(c, 'cifar100_pam')
  c.client.local_epochs = epochs
  c.clients_per_round = k
  for key, v in paper_hparams.client_optimizer('cifar100_pam', 0.1, method).items():
    c.client[key] = v
  paper_hparams.apply_swa(c, 'cifar100_pam', enabled=swa)
  c.eval_every = 10
  c.eval_every_last = 100       # the papers: mean test accuracy over the last 100 rounds, each evaluated
  c.summary_last_k = 100
  row = {'fedavg': 'FedAvg', 'fedsam': 'FedSAM', 'fedasam': 'FedASAM'}[method] + (' E=2' if epochs == 2 else '')
  acc = PUBLISHED[(method, epochs)][(0 if k == 10 else 2) + (1 if swa else 0)]
  config_strings.set_published(
      c, f'thesis Table 4.4 (FedSAM paper, CIFAR100-PAM, no augmentation), {row}, {k} clients/round, '
         f'{"w/ SWA" if swa else "@10k rounds"}', acc)
  return c
