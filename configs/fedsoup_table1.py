r"""FedSoup's Table 1 (Chen et al., "FedSoup: Improving Generalization and Personalization in Federated
Learning via Selective Model Interpolation", MICCAI 2023):
the eight methods on Camelyon17 (pathology, 5 hospitals) and the retinal fundus set (4 institutions), local and
global accuracy / AUC of the personalized models, leave-one-client-out folds.

Commands (one cell; 3 seeds per fold with --config.seed=0|1|2):
  .venv/bin/python experiments/train.py --config=configs/fedsoup_table1.py:camelyon17,fedsoup,leave_out=0 \
      --workdir=runs/t1_c17_fedsoup_f0
  .venv/bin/python experiments/train.py --config=configs/fedsoup_table1.py:retina,fedbabu,leave_out=2 \
      --workdir=runs/t1_ret_fedbabu_f2
Grammar: camelyon17 | retina (default camelyon17);  fedavg | fedprox | moon | fedbn | fedfomo | fedrep | fedbabu |
fedsoup (default fedsoup);  leave_out=-1 | 0..K-1 (the held-out client: it never trains, its data are the
unseen-domain test, summary 'personalized' -> 'unseen'; -1 = every client trains, the paper's appendix
setting). CELLS: 8 methods x (Camelyon17 folds 0..4, retina folds 0..3) = 72 cells. Table 1's protocol is
five-fold leave-one-client-out with 3 seeds per fold [P]; the retina set has 4 institutions, so its folds are 4
([U] in the digest: five folds do not fit 4 clients).

Data: `camelyon17` (data/sources/camelyon17.py: WILDS layout, hospitals = WILDS' `center`; the release's
tiny class-balanced subset, 320 + 320 training and 140 + 140 test patches per client, patient-level split, 96 x
96) and `retina_fundus` (the release's preprocessed files, 128 x 128). data.client_by='node' groups Camelyon17
as the release's generation script does; the cell option `camelyon17_release` (e.g.
`--config=configs/fedsoup_table1.py:camelyon17_release,fedsoup,leave_out=0`) reads the release's own preprocessed
tiny Camelyon17 (dataset 'camelyon17_release', its own split) and is compared with the same Camelyon17 numbers.

Setting (digest A6): Adam lr 1e-3 (torch betas 0.9 / 0.999), batch 16, 1 local epoch, 1,000 rounds, every
client every round, FedAvg server, evaluation every 100 rounds; personalized evaluation at the end with the
release's micro-AUC on raw logits (personalized.auc_scores='logits'), then 15 fine-tuning epochs at batch 128
(Fig. 2b reads iterations 1, 7 and 15). Hyperparameters the paper does not give ([C] release CLI defaults, in
brackets where they differ): FedProx mu 0.01 [0, which is FedAvg]; MOON mu 1, tau 0.5 (MOON's) [mu 0, tau 1.0];
FedFomo M = 5 (capped at the other clients), epsilon 0.3 decaying by 0.05 per round; FedRep 1 head epoch
(PFLlib's plocal_epochs); FedSoup from 75% of training, `>=`. Validation-based selection (FedSoup, FedFomo) uses
each client's local test split, as the release does (algo.val_source='local_test'; 'val' with data.val_fraction
> 0 for a leak-free variant). FedFomo's affinities follow the release (its clientfomo.py adds each received model's
raw loss gain, negatives included: algo.affinity='release'; 'paper' the clipped, normalised weights).

Differences from the paper: ResNet-18 with GroupNorm (resnet18_gn, ImageNet stem: conv7x7/2 + maxpool as
torchvision's) instead of torchvision's BatchNorm ResNet-18: FedBN keeps the GroupNorm affine params local. The
head of FedRep / FedBABU / MOON's representation is the model's declared head ('classifier', the last fc).

Published numbers (Table 1 [P], mean (std) over folds x seeds; in config.published: accuracy = Global Acc,
the personalized models on the held-out global test set (for FedAvg / FedProx / MOON the global model, so
summary.json's accuracy); local_acc, local_auc, global_auc with their stds; published.model = 'personalized' makes
experiments/report.py compare them with summary.json's `personalized` protocol results):
                 Pathology (Camelyon17)                         Retina
                 Local Acc    Local AUC    Glob Acc     Glob AUC     Local Acc    Local AUC    Glob Acc     Glob AUC
  FedAvg         82.41 (0.61) 90.44 (0.42) 70.18 (1.25) 78.74 (1.31) 89.81 (1.17) 95.24 (0.73) 73.27 (3.97) 81.02 (4.57)
  FedProx        86.34 (0.52) 92.78 (0.36) 67.42 (1.32) 77.18 (1.32) 90.14 (0.20) 95.47 (0.63) 70.46 (2.36) 76.84 (2.93)
  MOON           85.71 (0.42) 91.98 (0.34) 70.61 (1.54) 79.27 (1.43) 89.14 (0.77) 94.91 (0.98) 77.49 (3.15) 84.89 (2.70)
  FedBN          82.32 (0.87) 90.07 (0.77) 65.16 (0.69) 71.61 (0.97) 89.70 (1.45) 95.49 (0.56) 75.11 (0.52) 82.70 (1.01)
  FedFomo        80.99 (1.07) 86.51 (0.99) 61.00 (0.59) 61.69 (0.78) 89.70 (0.00) 94.88 (0.45) 59.90 (2.00) 63.82 (1.14)
  FedRep         82.50 (0.53) 89.77 (0.43) 66.87 (0.60) 72.34 (0.75) 89.38 (0.89) 95.16 (0.83) 71.81 (1.79) 79.09 (2.44)
  FedBABU        85.18 (0.33) 92.39 (0.29) 69.56 (1.40) 77.26 (1.48) 90.25 (1.39) 95.10 (0.33) 77.65 (0.24) 85.09 (0.21)
  FedSoup        85.71 (0.37) 92.47 (0.31) 72.87 (1.35) 81.45 (1.40) 90.92 (0.50) 96.00 (0.43) 78.64 (0.90) 86.24 (0.86)
Not cells: Fig. 2a (sharpness: experiments/hessian.py --per_client), Fig. 2b (the fine-tuning curve is in every
cell's summary 'personalized' -> 'finetune'), Fig. 2c (unseen-domain AUC: the same runs' 'unseen' protocol).
"""
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import data_section, default_config

FAMILY = 'configs/fedsoup_table1.py'
DATASETS = ('camelyon17', 'retina')
RELEASE = 'camelyon17_release'      # Camelyon17 as the release preprocessed it (not a cell: the same table)
METHODS = ('fedavg', 'fedprox', 'moon', 'fedbn', 'fedfomo', 'fedrep', 'fedbabu', 'fedsoup')
CLIENTS = {'camelyon17': 5, 'retina': 4}
FIELDS = {'dataset': ('camelyon17', DATASETS + (RELEASE,)), 'method': ('fedsoup', METHODS), 'leave_out': (0, int)}
CELLS = [f'{d},{m},leave_out={f}' for d in DATASETS for m in METHODS for f in range(CLIENTS[d])]

# Table 1 [P]: method -> dataset -> (local acc, std, local auc, std, global acc, std, global auc, std)
PUBLISHED = {
    'fedavg': {'camelyon17': (82.41, 0.61, 90.44, 0.42, 70.18, 1.25, 78.74, 1.31),
               'retina': (89.81, 1.17, 95.24, 0.73, 73.27, 3.97, 81.02, 4.57)},
    'fedprox': {'camelyon17': (86.34, 0.52, 92.78, 0.36, 67.42, 1.32, 77.18, 1.32),
                'retina': (90.14, 0.20, 95.47, 0.63, 70.46, 2.36, 76.84, 2.93)},
    'moon': {'camelyon17': (85.71, 0.42, 91.98, 0.34, 70.61, 1.54, 79.27, 1.43),
             'retina': (89.14, 0.77, 94.91, 0.98, 77.49, 3.15, 84.89, 2.70)},
    'fedbn': {'camelyon17': (82.32, 0.87, 90.07, 0.77, 65.16, 0.69, 71.61, 0.97),
              'retina': (89.70, 1.45, 95.49, 0.56, 75.11, 0.52, 82.70, 1.01)},
    'fedfomo': {'camelyon17': (80.99, 1.07, 86.51, 0.99, 61.00, 0.59, 61.69, 0.78),
                'retina': (89.70, 0.00, 94.88, 0.45, 59.90, 2.00, 63.82, 1.14)},
    'fedrep': {'camelyon17': (82.50, 0.53, 89.77, 0.43, 66.87, 0.60, 72.34, 0.75),
               'retina': (89.38, 0.89, 95.16, 0.83, 71.81, 1.79, 79.09, 2.44)},
    'fedbabu': {'camelyon17': (85.18, 0.33, 92.39, 0.29, 69.56, 1.40, 77.26, 1.48),
                'retina': (90.25, 1.39, 95.10, 0.33, 77.65, 0.24, 85.09, 0.21)},
    'fedsoup': {'camelyon17': (85.71, 0.37, 92.47, 0.31, 72.87, 1.35, 81.45, 1.40),
                'retina': (90.92, 0.50, 96.00, 0.43, 78.64, 0.90, 86.24, 0.86)},
}


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  dataset, method, leave_out = o['dataset'], o['method'], o['leave_out']
  release = dataset == RELEASE
  dataset = 'camelyon17' if release else dataset
  k = CLIENTS[dataset]
  config_strings.check(FAMILY, 'leave_out', leave_out, tuple(range(-1, k)))
  c = default_config()
  if release:
    c.dataset = RELEASE
    c.data = data_section(num_clients=k, dataset_dir='tiny_camelyon17', seed=0, val_fraction=0.0,
                          global_fraction=0.0, leave_out=leave_out)
  elif dataset == 'camelyon17':
    c.dataset = 'camelyon17'
    c.data = data_section(num_clients=k, client_by='center', seed=0, test_patient_fraction=0.5, train_per_class=320,
                          test_per_class=140, image_size=96, val_fraction=0.0, global_fraction=0.0,
                          leave_out=leave_out)
  else:
    c.dataset = 'retina_fundus'
    c.data = data_section(num_clients=k, dataset_dir='retina', seed=0, val_fraction=0.0, global_fraction=0.0,
                          leave_out=leave_out)
  c.model = 'resnet18_gn'
  c.model_kwargs.stem = 'imagenet'
  c.model_kwargs.gn_groups = 2
  c.algorithm = method
  if method == 'fedprox':
    c.algo.mu = 0.01
  elif method == 'moon':
    c.algo.mu = 1.0
    c.algo.tau = 0.5
  elif method == 'fedfomo':
    c.algo.models = 5
    c.algo.epsilon = 0.3
    c.algo.epsilon_decay = 0.05
    c.algo.val_source = 'local_test'
    c.algo.affinity = 'release'     # the published run's code adds the raw loss gains (algorithms/fedfomo.py)
    c.algo.population = k - (leave_out >= 0)     # N: the training clients (the held-out one never trains)
  elif method == 'fedrep':
    c.algo.head_epochs = 1
  elif method == 'fedsoup':
    c.algo.start_fraction = 0.75
    c.algo.strict = False
    c.algo.val_source = 'local_test'
    c.algo.persist_opt_state = False
  c.rounds = 1000
  c.clients_per_round = k - (leave_out >= 0)
  c.client.base_optimizer = 'adam'
  c.client.lr = 1e-3
  c.client.adam_b1 = 0.9
  c.client.adam_b2 = 0.999
  c.client.weight_decay = 0.0
  c.client.batch_size = 16
  c.client.local_epochs = 1
  c.eval_every = 100
  c.summary_last_k = 1
  c.personalized.enabled = True
  c.personalized.auc_scores = 'logits'
  c.personalized.finetune_epochs = 15
  c.personalized.finetune_batch_size = 128
  c.personalized.per_client = True
  la, las, lu, lus, ga, gas, gu, gus = PUBLISHED[method][dataset]
  config_strings.set_published(c, f'FedSoup (MICCAI 2023), Table 1, {dataset} {method}', ga, gas, local_acc=la,
                               local_acc_std=las, local_auc=lu, local_auc_std=lus, global_auc=gu,
                               global_auc_std=gus)
  if c.published.get('accuracy') is not None:   # experiments/report.py: compare with the personal models' numbers
    c.published.model = 'personalized'
  return c
