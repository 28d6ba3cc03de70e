r"""The 2024-2025 global-flatness methods in their own published settings: FedLESAM (Fan et al., ICML 2024), FedGF
(Lee & Yoon, ICML 2024), FedSWA / FedMoSWA (Liu et al., ICML 2025), FedNSAM (Liu et al.) and FedWMSAM (Huang et
al., NeurIPS 2025), each beside the baselines its release compares with.

One cell per command:
  .venv/bin/python experiments/train.py --workdir=runs/lesam_c10_fedlesam \
      --config=configs/flat2024.py:lesam,cifar10,fedlesam --config.data.data_dir=<CIFAR dir>

Grammar (comma-separated; defaults lesam,cifar10,fedavg):
  lesam | swa | gf | wmsam (the setting: whose release the hyperparameters are read from);
  cifar10 | cifar100;  fedavg | fedsam | scaffold | fedlesam | fedlesam_s | fedlesam_d | fednsam | fedswa |
  fedmoswa | fedgf | fedwmsam (fedsam = FedAvg with the SAM client);
  alpha=<float>, clients=<int> (gf only: the FedSAM CNN grid, C10 alpha 0 | 0.05 | 100, C100 0 | 0.5 | 1000;
  clients 5 | 10 | 20 = the script's sample_ratio 0.05 | 0.1 | 0.2).
CELLS lists the published settings below; the whole table is one sweep
(`experiments/sweep.py --sweep=configs/sweeps/paper_table.py:flat2024`) and `experiments/report.py` compares it.
Data: CIFAR10/100 from --config.data.data_dir (fedjax_flat/data/sources/cifar.py; experiments/download.py); the
CPU-sized stand-ins of these methods are configs/cross_device.py's digits cells.

Published numbers: NONE in these cells (config.published is empty). The papers' result tables could not be read
here (only the abstracts and the first page of each paper were reachable; the release READMEs and scripts, read in
full, give commands and no accuracies), and no number is transcribed from a secondary source. Fill a cell's
published number with its table and row once the paper is at hand.

Settings (each value from the release named; [U] where the release does not say and this library chooses):
  lesam (MediaBrain-SJTU/FedLESAM README command and train.py defaults): CIFAR10/100, ResNet18 with GroupNorm
    (2 groups; models.py: torchvision's ResNet18 stem, stem='imagenet'), 100 clients, 10% a round, Dirichlet 0.6,
    batch 50, 5 local epochs, 800 rounds, local lr 0.1, weight decay 1e-3, global lr 1, gradient clip 10 (the
    clients' clip_grad_norm_(10)); rho 0.05 for every SAM-type method (issue 50's setting; the README's command
    passes rho 0.5 for FedLESAM-S and train.py's default is 0.1: "you might need to tune rho"). Not expressible:
    the per-round lr decay 0.998 (the lr is constant here) [U]. Images per client: 500 (50,000 / 100) [U: the
    release's Dirichlet split sizes are its own]. FedLESAM's estimate: direction='server', norm='layers' (the
    release's rule; fedlesam.py); FedLESAM-S lamb 0.1, FedLESAM-D alpha 0.1 (train.py's --lamb default).
    Methods: fedavg, fedsam, scaffold, fedlesam, fedlesam_s, fedlesam_d.
  swa (junkangLiu0/FedSWA README "Full Command Zoo", the same commands in junkangLiu0/FedNSAM's README):
    CIFAR100, ResNet18 (the README runs --normalization BN and says GN "also works, converges slower": GroupNorm
    here, resnet18_gn with the CIFAR stem [U], since this library averages BatchNorm statistics only for FedAvg-type
    algorithms and refuses SCAFFOLD / FedSWA / FedNSAM with a BN model), 100 clients, 10% a round, Dirichlet 0.1,
    5 local epochs capped at K = 50 steps (client.max_local_steps=50), batch 50, 301 rounds, lr 0.1 (FedSWA 0.2:
    "FedSWA's lr is twice FedAvg's"), weight decay 1e-3 and clip 10 (main_FedSWA.py's SGD clients), rho 0.01 (the
    README's --rho: FedSWA's lr_ratio and the SAM radius), FedNSAM gamma 0.85, FedMoSWA beta 0.4 (fedswa.py).
    Not expressible: the cosine lr decay over rounds (--lr_decay 2) [U: constant].
    Methods: fedavg, fedsam, scaffold, fedswa, fedmoswa, fednsam.
  gf (hwan-sig/Official-FedGF tools/experiments/cifar.sh): the FedSAM paper's CNN setting (configs/fedsam_cifar.py:
    100 clients x 500 images, batch 64, 1 local epoch, lr 0.01, weight decay 4e-4, C10 10k / C100 20k rounds),
    W = 30; the script sweeps rho over 0.02 | 0.05 | 0.1 and names no winner: the FedSAM paper's radius for the
    (dataset, alpha) is used (Table A.2) [U]; T_D: the script's --c_o values are no parser argument, threshold
    keeps its default [U]. FedAvg / FedSAM in this setting are configs/fedsam_cifar.py's cells. Method: fedgf.
  wmsam (Huang-Yongzhi/NeurlPS_FedWMSAM README and train.py defaults): CIFAR10, ResNet18-GN (FL-Simulator's
    models.py, stem='imagenet'), 100 clients, 10% a round, Dirichlet 0.1, 500 rounds, 5 local epochs, batch 50,
    lr 0.1, weight decay 1e-3, clip 10, rho 0.1 (train.py's default), alpha 0.1, norm='layers' (the release's).
    Not expressible: lr decay 0.998 [U]. Methods: fedavg, fedsam, scaffold, fedwmsam.
"""
from fedjax_flat.algorithms import registry
from fedjax_flat.config import families as config_strings, paper_hparams
from fedjax_flat.config.default_config import default_config
from fedjax_flat.config.schema import data_section

FAMILY = 'configs/flat2024.py'
SETTINGS = {
    'lesam': (('cifar10', 'cifar100'), ('fedavg', 'fedsam', 'scaffold', 'fedlesam', 'fedlesam_s', 'fedlesam_d')),
    'swa': (('cifar100',), ('fedavg', 'fedsam', 'scaffold', 'fedswa', 'fedmoswa', 'fednsam')),
    'gf': (('cifar10', 'cifar100'), ('fedgf',)),
    'wmsam': (('cifar10',), ('fedavg', 'fedsam', 'scaffold', 'fedwmsam')),
}
ALGOS = ('fedavg', 'fedsam', 'scaffold', 'fedlesam', 'fedlesam_s', 'fedlesam_d', 'fednsam', 'fedswa', 'fedmoswa',
         'fedgf', 'fedwmsam')
FIELDS = {
    'setting': ('lesam', tuple(SETTINGS)),
    'dataset': ('cifar10', ('cifar10', 'cifar100')),
    'algo': ('fedavg', ALGOS),
    'alpha': (-1.0, float),      # gf only (-1: not given)
    'clients': (0, int),         # gf only (0: not given)
}
GF_ALPHAS = {'cifar10': (0.0, 0.05, 100.0), 'cifar100': (0.0, 0.5, 1000.0)}
GF_CLIENTS = (5, 10, 20)
# (setting) -> the release's common training values (see the docstring for each one's source).
TRAIN = {
    'lesam': dict(alpha=0.6, rounds=800, lr=0.1, batch=50, epochs=5, wd=1e-3, clip=10.0, rho=0.05,
                  model='resnet18_gn', stem='imagenet'),
    'swa': dict(alpha=0.1, rounds=301, lr=0.1, batch=50, epochs=5, wd=1e-3, clip=10.0, rho=0.01,
                model='resnet18_gn', stem=None),
    'wmsam': dict(alpha=0.1, rounds=500, lr=0.1, batch=50, epochs=5, wd=1e-3, clip=10.0, rho=0.1,
                  model='resnet18_gn', stem='imagenet'),
}
ALGO = {
    'lesam': {'fedlesam': {'direction': 'server', 'norm': 'layers'},
              'fedlesam_s': {'direction': 'server', 'norm': 'layers', 'lamb': 0.1},
              'fedlesam_d': {'direction': 'server', 'norm': 'layers', 'alpha': 0.1}},
    'swa': {'fedswa': {'lr_ratio': 0.01, 'cycle_steps': 50}, 'fedmoswa': {'lr_ratio': 0.01, 'cycle_steps': 50},
            'fednsam': {'gamma': 0.85}},
    'wmsam': {'fedwmsam': {'alpha': 0.1, 'norm': 'layers'}},
}
SWA_LR = {'fedswa': 0.2}      # "FedSWA's lr is twice FedAvg's" (FedSWA README)


def _a(a):
  return f'{a:g}'


CELLS = [f'{s},{ds},{a}' for s in ('lesam', 'swa', 'wmsam') for ds in SETTINGS[s][0] for a in SETTINGS[s][1]]
CELLS += [f'gf,{ds},fedgf,alpha={_a(a)},clients={k}' for ds in GF_ALPHAS for a in GF_ALPHAS[ds] for k in GF_CLIENTS]


def _check(o):
  s, ds, algo = o['setting'], o['dataset'], o['algo']
  datasets, algos = SETTINGS[s]
  config_strings.check(FAMILY, 'dataset', ds, datasets, context=f'in the {s} setting')
  config_strings.check(FAMILY, 'algo', algo, algos, context=f'in the {s} setting')
  if s == 'gf':
    config_strings.check(FAMILY, 'alpha', o['alpha'], GF_ALPHAS[ds], context=f'for gf,{ds}')
    config_strings.check(FAMILY, 'clients', o['clients'], GF_CLIENTS, context='for gf')
  elif o['alpha'] != -1.0 or o['clients']:
    raise config_strings.ConfigStringError(FAMILY, 'alpha/clients', f'only the gf setting takes alpha= and '
                                           f'clients= (the {s} setting has one split and 10 clients a round)')


def _resnet_config(s, ds):
  t = TRAIN[s]
  c = default_config()
  c.dataset = ds
  c.data = data_section(data_dir='', num_clients=100, alpha=t['alpha'], examples_per_client=500, seed=0)
  c.model = t['model']
  if t['stem']:
    c.model_kwargs.stem = t['stem']
  c.augment = 'cifar'
  c.normalize = ds
  c.rounds = t['rounds']
  c.clients_per_round = 10
  c.client.lr, c.client.batch_size, c.client.local_epochs = t['lr'], t['batch'], t['epochs']
  c.client.weight_decay, c.client.grad_clip, c.client.momentum = t['wd'], t['clip'], 0.0
  if s == 'swa':
    c.client.max_local_steps = 50          # --K 50: at most 50 local steps a round
  c.eval_every = 10
  c.eval_every_last = 10
  c.summary_last_k = 10
  return c


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  _check(o)
  s, ds, algo = o['setting'], o['dataset'], o['algo']
  if s == 'gf':
    c = paper_hparams.cifar_cnn_config(ds, 'fedsam', alpha=o['alpha'], clients_per_round=o['clients'])
    c.algorithm = 'fedgf'
    c.algo.update(registry.default_hparams('fedgf'))
    c.algo.window = 30
    return c
  c = _resnet_config(s, ds)
  c.algorithm = 'fedavg' if algo == 'fedsam' else algo
  if c.algorithm != 'fedavg':
    c.algo.update(registry.default_hparams(c.algorithm))
    c.algo.update(ALGO.get(s, {}).get(algo, {}))
  if algo == 'fedsam':
    c.client.optimizer, c.client.rho = 'sam', TRAIN[s]['rho']
  elif algo in ('fedlesam', 'fedlesam_s', 'fedlesam_d', 'fedwmsam'):
    c.client.rho = TRAIN[s]['rho']          # the ascent radius of the SGD client's estimated perturbation
  c.client.lr = SWA_LR.get(algo, c.client.lr) if s == 'swa' else c.client.lr
  return c
