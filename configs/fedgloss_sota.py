r"""FedGloSS against the state of the art with ResNet18-GN on CIFAR and MobileNetV2-GN on Landmarks: thesis
Tables 4.16 and 4.18, with Table 4.19's rounds / bits to FedAvg's accuracy (the CNN columns of Tables 4.15 and
4.19 are configs/baselines_cifar_cnn.py and configs/fedgloss_cifar.py cells).

One cell per command:
  .venv/bin/python experiments/train.py --workdir=runs/r18_c100_fedgloss_sam \
      --config=configs/fedgloss_sota.py:cifar100,fedgloss,sam

Grammar (defaults cifar10,fedavg,sgd):
  cifar10 | cifar100 | landmarks (CIFAR10 alpha 0.05 / CIFAR100 alpha 0.5 with ResNet18-GN; Landmarks-User-160k
    with MobileNetV2-GN);
  fedavg | fedprox | feddyn | scaffold | fedspeed | fedgamma | fedsmoo | fedgloss;  sgd | sam (client optimizer;
    fedavg + sam = FedSAM; FedSpeed / FedGamma / FedSMOO are SAM methods: client=sam)
CELLS lists the 31 published cells (config.published: accuracy, std, and Table 4.19's rounds_to_target,
bits_to_target_B = bits in units of FedAvg's T-round bits, target_accuracy = FedAvg's final accuracy; a cell
published as diverged has only a source saying so). experiments/report.py --target=<target_accuracy / 100>
gives the measured rounds and bits to the target.

ResNet18-GN setting (Table A.4's "ResNet18GN" row, which is the CIFAR setting [U: the table labels it
LANDMARKS]; section 4.4.5): 100 clients x 500 images, Dirichlet alpha (C10 0.05, C100 0.5), 10 clients per
round, 10k rounds, 1 local epoch, client SGD lr 0.01, momentum 0.7, weight decay 1e-5, batch 64; server lr 1, no
momentum; random crop + flip, dataset normalization; ResNet18 with GroupNorm (2 groups, models/resnet.py).
Table A.5, ResNet18 columns: SAM radius 0.01 for every SAM method (FedSAM, FedDyn+SAM, FedSpeed, FedGamma,
FedSMOO); FedProx mu 0.01 (C10; C100 [U] the same); FedDyn alpha 0.01; FedSpeed alpha 0.95, lambda 100 [U: the
grid's bold marks are lost]; FedSMOO beta 10 (C100; C10 [U] the same); FedGloSS rho_s 0.01, client rho 0.01,
T_s = 0 (no warm-up: the server radius is constant, rho_server_schedule='constant'), beta 10 [U: not recovered
for ResNet18]; dual_variant='release' as in configs/fedgloss_cifar.py.
Landmarks setting (Table A.4, MobileNetv2 row): 1,262 clients, 50 clients per round, 1.3k rounds, 5 local
epochs, client SGD lr 0.1, weight decay 4e-5, no momentum, batch 64, ImageNet-pretrained MobileNetV2-GN (pass
--config.init.pretrained=<file>, as configs/fedsam_landmarks.py). Table A.5, Landmarks: SAM radius 0.05
(FedSAM, FedDyn+SAM, FedSpeed, FedGamma); FedDyn alpha 0.001; FedSpeed alpha 0.95, lambda 100 [U]; FedSMOO rho
0.1, beta 50; FedGloSS rho_s 0.005, beta 50, client rho 0.05 [U: the bold mark is lost], T_s = 0.
Not stated for either model, so the registered defaults: gradient clipping off, FedProx mu on Landmarks 0.01 [U].
Reported number: mean test accuracy over the last 100 rounds (each evaluated), 3 seeds in the thesis.

Published accuracy % (mean +- std over 3 seeds):
Table 4.16 (ResNet18-GN, 10% participation, 10k rounds):   C100 alpha 0.5    C10 alpha 0.05
  SGD  FedAvg                                                37.4+-0.2         72.6+-0.1
  SGD  FedProx                                               37.6+-0.1         72.2+-0.2
  SGD  FedDyn                                                38.8+-0.6         70.2+-0.6
  SGD  SCAFFOLD (2x comm)                                    38.6+-0.1         70.8+-0.6
  SGD  FedGloSS                                              46.7+-0.6         79.1+-0.5
  SAM  FedSAM                                                38.5+-0.1         72.8+-0.1
  SAM  FedDyn                                                39.6+-0.8         72.6+-0.2
  SAM  FedSpeed                                              38.7+-0.6         72.6+-0.1
  SAM  FedGamma (2x comm)                                    38.8+-0.3         72.2+-0.1
  SAM  FedSMOO (2x comm)                                     44.8+-0.5         75.3+-0.6
  SAM  FedGloSS                                              47.2+-0.2         80.0+-0.3
Table 4.18 (Landmarks-User-160k, MobileNetV2-GN, 50 clients/round, 1.3k rounds):
  SGD FedAvg 56.3+-0.2   SGD FedProx 55.0+-0.2   SGD FedDyn 55.2+-0.6   SGD SCAFFOLD diverged (X)
  SAM FedSAM 56.7+-0.1   SAM FedDyn 56.0+-1.3    SAM FedGamma diverged (X)   SAM FedSMOO 59.5+-0.1
  SAM FedGloSS 59.7+-1.2
Table 4.19 (rounds (speed-up), bits in units of B = FedAvg's bits in T rounds; "-" never reached, X diverged):
                   R18 C10 a.05         R18 C100 a.5         MNv2 Landmarks
  SGD FedAvg       10k (1x), 1B         10k (1x), 1B         1.3k (1x), 1B
  SGD FedProx      8.8k (1.1x), 0.9B    8.3k (1.2x), 0.8B    -, -
  SGD FedDyn       -, -                 3.5k (2.9x), 0.4B    -, -
  SGD SCAFFOLD     -, -                 8.9k (1.1x), 1.8B    -, X
  SGD FedGloSS     2.4k (4.2x), 0.2B    1.9k (5.3x), 0.2B    -, -
  SAM FedSAM       9.2k (1.1x), 0.9B    7.8k (1.3x), 0.8B    1.3k (1x), 1B
  SAM FedDyn       4.1k (2.4x), 0.4B    3.5k (2.9x), 0.4B    -, -
  SAM FedSpeed     8.3k (1.2x), 0.7B    8.3k (1.2x), 1.7B    1.3k (1x), 2B
  SAM FedGamma     9.3k (1.1x), 1.9B    8.1k (1.2x), 1.6B    -, X
  SAM FedSMOO      2.4k (4.2x), 0.5B    2.3k (4.3x), 0.5B    200 (6.5x), 0.3B
  SAM FedGloSS     2.4k (4.2x), 0.2B    1.9k (5.3x), 0.2B    200 (6.5x), 0.2B
Not cells: the rows Table 4.18 does not have (FedSpeed on Landmarks has Table 4.19 numbers only: it builds,
with nothing published); the loss landscapes and norms of Figs. 4.23 / 4.27 (experiments/hessian.py on these
cells' runs).
"""
from fedjax_flat.algorithms import registry
from fedjax_flat.config import families as config_strings, paper_hparams

FAMILY = 'configs/fedgloss_sota.py'
ALGOS = ('fedavg', 'fedprox', 'feddyn', 'scaffold', 'fedspeed', 'fedgamma', 'fedsmoo', 'fedgloss')
FIELDS = {
    'dataset': ('cifar10', ('cifar10', 'cifar100', 'landmarks')),
    'algo': ('fedavg', ALGOS),
    'client': ('sgd', ('sgd', 'sam')),
}
ALPHA = {'cifar10': 0.05, 'cifar100': 0.5}
_SAM_ONLY = ('fedspeed', 'fedgamma', 'fedsmoo')
# (client/method) -> (C100 a.5, C10 a.05) of (accuracy, std): Table 4.16.
T416 = {
    'sgd/fedavg': ((37.4, 0.2), (72.6, 0.1)), 'sgd/fedprox': ((37.6, 0.1), (72.2, 0.2)),
    'sgd/feddyn': ((38.8, 0.6), (70.2, 0.6)), 'sgd/scaffold': ((38.6, 0.1), (70.8, 0.6)),
    'sgd/fedgloss': ((46.7, 0.6), (79.1, 0.5)), 'sam/fedsam': ((38.5, 0.1), (72.8, 0.1)),
    'sam/feddyn': ((39.6, 0.8), (72.6, 0.2)), 'sam/fedspeed': ((38.7, 0.6), (72.6, 0.1)),
    'sam/fedgamma': ((38.8, 0.3), (72.2, 0.1)), 'sam/fedsmoo': ((44.8, 0.5), (75.3, 0.6)),
    'sam/fedgloss': ((47.2, 0.2), (80.0, 0.3)),
}
# Table 4.18: (client/method) -> (accuracy, std) or None (diverged, "X").
T418 = {'sgd/fedavg': (56.3, 0.2), 'sgd/fedprox': (55.0, 0.2), 'sgd/feddyn': (55.2, 0.6), 'sgd/scaffold': None,
        'sam/fedsam': (56.7, 0.1), 'sam/feddyn': (56.0, 1.3), 'sam/fedgamma': None, 'sam/fedsmoo': (59.5, 0.1),
        'sam/fedgloss': (59.7, 1.2)}
# Table A.5 per model: SAM radius; algorithm hyperparameters ([U] where the bold mark is lost: see docstring).
SAM_RHO = {'resnet18': 0.01, 'landmarks': 0.05}
ALGO = {
    'resnet18': {'fedprox': {'mu': 0.01}, 'feddyn': {'alpha': 0.01}, 'fedspeed': {'alpha': 0.95, 'lam': 100.0},
                 'fedsmoo': {'beta': 10.0},
                 'fedgloss': {'rho_server': 0.01, 'beta': 10.0, 'rho_server_schedule': 'constant',
                              'dual_variant': 'release'}},
    'landmarks': {'fedprox': {'mu': 0.01}, 'feddyn': {'alpha': 0.001}, 'fedspeed': {'alpha': 0.95, 'lam': 100.0},
                  'fedsmoo': {'beta': 50.0},
                  'fedgloss': {'rho_server': 0.005, 'beta': 50.0, 'rho_server_schedule': 'constant',
                               'dual_variant': 'release'}},
}
LANDMARKS_FEDSMOO_RHO = 0.1
NAMES = {'fedavg': 'FedAvg', 'fedprox': 'FedProx', 'feddyn': 'FedDyn', 'scaffold': 'SCAFFOLD',
         'fedspeed': 'FedSpeed', 'fedgamma': 'FedGamma', 'fedsmoo': 'FedSMOO', 'fedgloss': 'FedGloSS',
         'fedsam': 'FedSAM'}


def _key(algo, client):
  return f'{client}/{"fedsam" if (algo, client) == ("fedavg", "sam") else algo}'


def _cell(ds, key):
  client, name = key.split('/')
  return f'{ds},{"fedavg" if name == "fedsam" else name},{client}'


CELLS = [_cell(ds, k) for ds in ('cifar100', 'cifar10') for k in T416] + [_cell('landmarks', k) for k in T418]


def _resnet18_config(ds):
  c = paper_hparams.cifar_cnn_config(ds, 'fedavg', alpha=ALPHA[ds], clients_per_round=10)
  c.model = 'resnet18_gn'
  c.rounds = 10000
  c.client.lr, c.client.momentum, c.client.weight_decay, c.client.batch_size = 0.01, 0.7, 1e-5, 64
  c.client.local_epochs = 1
  return c


def _landmarks_config():
  c = paper_hparams.landmarks_config()
  c.rounds = 1300
  c.clients_per_round = 50
  c.client.lr, c.client.momentum, c.client.weight_decay, c.client.batch_size = 0.1, 0.0, 4e-5, 64
  c.client.local_epochs = 5
  return c


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  ds, algo, client = o['dataset'], o['algo'], o['client']
  if algo in _SAM_ONLY:
    config_strings.check(FAMILY, 'client', client, ('sam',), context=f'for {algo} (a SAM method)')
  setting = 'landmarks' if ds == 'landmarks' else 'resnet18'
  c = _landmarks_config() if ds == 'landmarks' else _resnet18_config(ds)
  c.algorithm = algo
  if algo != 'fedavg':
    c.algo.update(registry.default_hparams(algo))    # every hparam present: --config.algo.<k>=... works
    c.algo.update(ALGO[setting].get(algo, {}))
  c.client.optimizer, c.client.asam_eta = client, 0.0
  c.client.rho = SAM_RHO[setting] if client == 'sam' else 0.0
  if (setting, algo) == ('landmarks', 'fedsmoo'):
    c.client.rho = LANDMARKS_FEDSMOO_RHO
  if algo == 'fedgloss':
    c.client.rho = SAM_RHO[setting]          # rho_l (Table A.5); an SGD client ignores it
    c.client.rho_warmup_rounds = 0           # T_s = 0
  key = _key(algo, client)
  label = f'{NAMES[key.split("/")[1]]} ({client.upper()} client)'
  if ds == 'landmarks':
    note, metrics = paper_hparams.comm_to_target('mobilenet', 'gld160k', None, key)
    src = f'thesis Table 4.18 (FedGloSS vs SOTA, MobileNetV2-GN, Landmarks-User-160k), {label}'
    pub = T418.get(key, 'absent')
  else:
    note, metrics = paper_hparams.comm_to_target('resnet18', ds, ALPHA[ds], key)
    src = (f'thesis Table 4.16 (FedGloSS vs SOTA, ResNet18-GN), {label}, '
           f'{"C10" if ds == "cifar10" else "C100"} alpha={ALPHA[ds]:g}')
    pub = T416[key][0 if ds == 'cifar100' else 1] if key in T416 else 'absent'
  if pub is None:
    c.published.source = src + ' (published as diverged: no number)' + note
  elif pub != 'absent':
    config_strings.set_published(c, src + note, pub[0], pub[1], **metrics)
  return c
