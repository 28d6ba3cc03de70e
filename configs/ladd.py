r"""LADD / FFREEDA (thesis section 5.3; Shenaj et al., WACV 2023): thesis Tables 5.6 (GTA5 -> Cityscapes), 5.7
(GTA5 -> CrossCity) and 5.8 (GTA5 -> Mapillary), hyperparameters of Table A.7 (where the authors' release
code departs from them, the fields below say so).

The pipeline (data: GTA5's zips extracted into D/gta5, `python experiments/download.py --dataset=ladd_splits
--data_dir=D` for the released splits, the target in D/<target>):

  1. the FDA pre-trained source model (GTA5 streamed, every image restyled with a target client's style):
  .venv/bin/python experiments/pretrain_source.py --workdir=runs/gta5_fda_cityscapes \
      --config=configs/ladd.py:cityscapes,source_fda --config.data.data_dir=D --config.source_pretrain.data.data_dir=D
  2. the federated runs start from it (w_0, the teachers' start and the KD target; a LADD cell without
     --config.init.pretrained stops with one line naming step 1, unless --config.algo.random_init=True):
  .venv/bin/python experiments/train.py --workdir=runs/ladd_cityscapes_cls \
      --config=configs/ladd.py:cityscapes,ladd_cls --config.data.data_dir=D \
      --config.init.pretrained=runs/gta5_fda_cityscapes/source_model.npz
  .venv/bin/python experiments/train.py --workdir=runs/ladd_crosscity_fedavg_st \
      --config=configs/ladd.py:crosscity,fedavg_st --config.data.data_dir=D \
      --config.init.pretrained=runs/gta5_fda_crosscity/source_model.npz
  source only (its result is the evaluation pretrain_source.py writes, summary.json's final_test_miou), then the
  centralized FTDA from it:
  .venv/bin/python experiments/pretrain_source.py --workdir=runs/gta5_only_cityscapes \
      --config=configs/ladd.py:cityscapes,source_only --config.data.data_dir=D --config.source_pretrain.data.data_dir=D
  .venv/bin/python experiments/centralized.py --workdir=runs/ladd_cityscapes_central_ftda \
      --config=configs/ladd.py:cityscapes,central_ftda --config.data.data_dir=D \
      --config.init.pretrained=runs/gta5_only_cityscapes/source_model.npz
  .venv/bin/python experiments/centralized.py --workdir=runs/ladd_mapillary_central \
      --config=configs/ladd.py:mapillary,central_oracle --config.data.data_dir=D
  .venv/bin/python experiments/pretrain_source.py --workdir=runs/synthetic_fda \
      --config=configs/ladd.py:synthetic,source_fda
  .venv/bin/python experiments/train.py --workdir=runs/ladd_synthetic --config=configs/ladd.py:synthetic,ladd_all \
      --config.init.pretrained=runs/synthetic_fda/source_model.npz

The whole table as one sweep (stage 'source': every target's source_fda model and the source_only cells;
stage 'federated': the cells from their target's source_fda/seed=<s>/source_model.npz; a rerun skips what finished;
the centralized cells are named, not swept), then its report:
  .venv/bin/python experiments/sweep.py --sweep=configs/sweeps/paper_table.py:ladd,only=cityscapes,data_dir=D \
      --sweep_dir=runs/t56
  .venv/bin/python experiments/report.py --sweep_dir=runs/t56 --out_dir=runs/t56/report

Grammar (comma-separated; defaults cityscapes,ladd_cls):
  cityscapes | crosscity | mapillary | synthetic;
  ladd_cls | ladd_all | fedavg_st | fed_oracle | ftda | central_oracle | source_only | source_fda | central_ftda
CELLS lists every published cell (18). `source_fda` is the pre-training every LADD / FedAvg + ST / ftda cell
starts from: a setting, not a cell (the thesis gives no number for it). `synthetic` is the stand-in that runs in
minutes here, not a cell (no published number): `seg_synthetic_da` (4 planted styles x 4 unlabelled clients x 12
images of 32 x 32; the target labels only for its oracles), `seg_cnn` width 8 (BatchNorm), 30 rounds of 4
clients, 1 epoch of batch 8, client SGD momentum 0.9 lr 0.01, lambda_KD 20, omega 1, no SWA teacher, k by the
silhouette over 2..19 (the setting of benchmarks/studies/ladd_synthetic.py); its source_fda / source_only
pre-train on the set's in-memory source as the study does (300 steps of 16, lr 0.05, a random flip; its
central_ftda: 20 epochs, lr 0.01 poly); w_0 is config.init's, a random init without it.

Published mIoU % (mean +- std, the thesis' tables = the release's paper):
  Table 5.6, Cityscapes (heterogeneous):
    centralized oracle 66.64 +- 0.33        central_oracle  (experiments/centralized.py)
    source only        24.05 +- 1.14        source_only     (experiments/pretrain_source.py)
    centralized FTDA   65.74 +- 0.48        central_ftda    (experiments/centralized.py from source_only's model)
    federated oracle   58.16 +- 1.02        fed_oracle
    federated FTDA     59.35 +- 0.61        ftda
    FedAvg + ST        35.10 +- 0.73        fedavg_st
    LADD (cls)         36.49 +- 0.13        ladd_cls
    LADD (all)         36.49 +- 0.14        ladd_all
  Table 5.7, CrossCity (no target labels for training: no oracle, no FTDA):
    source only        26.49 +- 1.46        source_only     (experiments/pretrain_source.py)
    FedAvg + ST        33.59 +- 1.25        fedavg_st
    LADD (cls)         39.87 +- 0.14        ladd_cls
    LADD (all)         40.09 +- 0.19        ladd_all
  Table 5.8, Mapillary:
    centralized oracle 61.46 +- 0.21        central_oracle  (experiments/centralized.py)
    source only        32.40 +- 0.71        source_only     (experiments/pretrain_source.py)
    federated oracle   49.91 +- 0.49        fed_oracle
    FedAvg + ST        38.97 +- 0.21        fedavg_st
    LADD (cls)         40.16 +- 1.02        ladd_cls
    LADD (all)         38.78 +- 1.82        ladd_all
  Not cells: MCD and DAFormer (not built).

Setting (Table A.7; T rounds, K' clients per round, eta client lr, lambda_KD, omega = teacher_step, t_start =
swa_teacher_start):
  CrossCity   T 1000, K' 4, eta 1e-2, lambda_KD 20, omega 1, t_start 400
  Cityscapes  T 300,  K' 5, eta 5e-5, lambda_KD 10, omega 5, t_start 200  (the release's config: lambda_kd 20 and
              1,500 rounds; the thesis' table is followed)
  Mapillary   the thesis' row is garbled ("100 | 1e-2 | 6 | 5 | 50": a column is missing); taken from the release's
              configs/mapillary_LADD_*.txt: T 1500, K' 6, eta 1e-2, lambda_KD 10, omega 5, t_start 50
  Common (the release): DeepLabV3-MobileNetV2 (`deeplabv3_mobilenetv2`; ImageNet weights via init.pretrained for
  the oracles), 1 local epoch, batch 16, client SGD momentum 0.9, no weight decay; normalization mean = std = 0.5
  ('feddrive' = the same); random scale 0.7-2, crop 512 x 1024, flip, colour jitter 0.5, images loaded at width
  1024 (Cityscapes / CrossCity 512 x 1024; Mapillary 768 x 1024: its aspect varies, 4:3 assumed); styles from a
  3 x 3 window (fda_b 1), k by the silhouette over k = 4..19 (k_max capped at K - 1), pseudo-labels kept at max
  prob > 0.9 or in the top 66% of their class per image, KD alpha 0.5.
  The LADD / FedAvg + ST cells use the release's rules where it departs from the thesis (algorithms/ladd.py; the
  published numbers come from it): algo.unsampled_clusters='global', teacher_sharing='release',
  swa_teacher_model='release' (the synthetic stand-in keeps the thesis' rules).
  LADD(cls) is the release's cluster_layers=decoder (every convolution of DeepLabV3's head, not its BatchNorms);
  LADD(all) everything; FedAvg + ST is LADD with one cluster (force_k=1). The LADD cells start from the FDA
  pre-trained source model: pass it as init.pretrained (a training/source_pretrain.save_source_model file); w_0
  is the teachers' start and the KD target.
  Oracles: target labels (data.labelled_train=True), OHEM on the top 25% of pixels (the release's hnm); the
  federated ones (fed_oracle, ftda) run FedAvg for 1,500 rounds with K' clients, client lr 0.05 (Cityscapes, the
  release's fed_ftda config) / 5e-3 (Mapillary, its oracle config) with a poly 0.9 decay over the rounds; ftda
  starts from the source checkpoint (init.pretrained, its classifier kept: init.reinit_classifier='never');
  central_oracle: experiments/centralized.py, 100 epochs, batch 16, SGD momentum 0.9, lr 0.05 / 5e-3 (the
  release: poly 0.9 with Nesterov momentum; here poly 0.9 with plain momentum: no Nesterov option exists).
  Source runs (config.source_pretrain, training/source_pretrain.py; the release's configs/pretrain_<target>.txt
  and configs/cityscapes_centr_sourceonly.txt): GTA5's 23,905 training images loaded at 1052 x 1914 (the few of
  another size resized), labels mapped onto the target's classes, random scale 0.7-2 and a 512 x 1024 crop padded
  with the ignore label, no flip (the release's GTA5 transform has none), mean = std = 0.5, batch 16, SGD momentum
  0.9, no weight decay, poly 0.9, top-25% pixel CE. source_fda (fda_inv): 10 epochs at lr 5e-3, colour jitter 0.5,
  every image restyled with a random target-client style (the clients' mean FDA styles over their images, b = 1,
  the bank the LADD trainer clusters; the swap at the target's load size, the release's at 1024 x 512);
  source_only: 100 epochs at lr 0.05, no jitter, no style. An epoch = ceil(N / 16) steps, each step's batch drawn
  keyed by (seed, step). The release starts from ImageNet MobileNetV2 weights: pass them as init.pretrained.
  central_ftda: the release's centralized FTDA fine-tunes its source-only model on the labelled target (its
  mapillary_centr_ftda.txt: 50 epochs, lr 5e-3 poly 0.9; no Cityscapes file is released, the same used).
  The LADD loss (algorithms/ladd.py) is the release's selftrain_div loss: the self-training CE averaged over all
  pixels (the release's `hnm` flag, set in its LADD configs, does not reach it: its criterion takes an identity
  reduction; hard-negative mining applies to the labelled losses only: the oracles' and the source
  pre-training's top 25%). Not reproduced: its KD term multiplied by the batch's labels on Cityscapes and
  Mapillary (reads the target labels FFREEDA forbids; on CrossCity no labels are loaded and its KD is ours).
  Evaluation: mIoU on the target test set every 50 rounds and at the end; reported: the last evaluation
  (summary_last_k 1). Routed (per-cluster) test-time evaluation is evaluation/routed.py's; train.py evaluates the
  global model and every cluster model on the whole test set.
"""
from fedjax_flat.config import families as config_strings
from fedjax_flat.config import source_pretrain as source_section
from fedjax_flat.config.default_config import default_config, segmentation_data

FAMILY = 'configs/ladd.py'
TARGETS = ('cityscapes', 'crosscity', 'mapillary', 'synthetic')
METHODS = ('ladd_cls', 'ladd_all', 'fedavg_st', 'fed_oracle', 'ftda', 'central_oracle', 'source_only', 'source_fda',
           'central_ftda')
FIELDS = {'target': ('cityscapes', TARGETS), 'method': ('ladd_cls', METHODS)}

# Table A.7 (Mapillary from the release): rounds, clients per round, client lr, lambda_KD, omega, t_start.
A7 = {'crosscity': (1000, 4, 1e-2, 20.0, 1, 400),
      'cityscapes': (300, 5, 5e-5, 10.0, 5, 200),
      'mapillary': (1500, 6, 1e-2, 10.0, 5, 50)}
ORACLE_LR = {'cityscapes': 0.05, 'mapillary': 5e-3}
IMAGE_SIZE = {'cityscapes': (512, 1024), 'crosscity': (512, 1024), 'mapillary': (768, 1024)}
TABLE = {'cityscapes': '5.6', 'crosscity': '5.7', 'mapillary': '5.8'}
PUBLISHED = {
    ('cityscapes', 'central_oracle'): (66.64, 0.33), ('cityscapes', 'fed_oracle'): (58.16, 1.02),
    ('cityscapes', 'ftda'): (59.35, 0.61), ('cityscapes', 'fedavg_st'): (35.10, 0.73),
    ('cityscapes', 'ladd_cls'): (36.49, 0.13), ('cityscapes', 'ladd_all'): (36.49, 0.14),
    ('crosscity', 'fedavg_st'): (33.59, 1.25), ('crosscity', 'ladd_cls'): (39.87, 0.14),
    ('crosscity', 'ladd_all'): (40.09, 0.19),
    ('mapillary', 'central_oracle'): (61.46, 0.21), ('mapillary', 'fed_oracle'): (49.91, 0.49),
    ('mapillary', 'fedavg_st'): (38.97, 0.21), ('mapillary', 'ladd_cls'): (40.16, 1.02),
    ('mapillary', 'ladd_all'): (38.78, 1.82),
    ('cityscapes', 'source_only'): (24.05, 1.14), ('crosscity', 'source_only'): (26.49, 1.46),
    ('mapillary', 'source_only'): (32.40, 0.71), ('cityscapes', 'central_ftda'): (65.74, 0.48),
}
CELLS = [f'{t},{m}' for t, m in PUBLISHED]
# Cells another binary runs (experiments/sweep.py launches train.py: configs/sweeps/paper_table.py leaves these out and
# names their commands).
ENTRY_POINTS = {c: ('experiments/pretrain_source.py' if c.endswith('source_only') else 'experiments/centralized.py')
                for c in CELLS if c.split(',')[1] in ('source_only', 'central_oracle', 'central_ftda')}
ORACLES = ('fed_oracle', 'ftda', 'central_oracle', 'central_ftda')
FROM_SOURCE_FDA = ('ladd_cls', 'ladd_all', 'fedavg_st', 'ftda')     # cells that start from the source_fda model
PRETRAIN = ('source_only', 'source_fda')
GTA5_SIZE = (1052, 1914)     # GTA5's image size (H, W); the few images of another size are resized at load
# The release's source runs: configs/pretrain_<target>.txt (fda_inv: 10 source epochs, lr 5e-3, colour jitter) and
# configs/cityscapes_centr_sourceonly.txt (100 source epochs, lr 0.05, no jitter); both poly 0.9, batch 16, hnm.
SOURCE_RUN = {'source_fda': dict(style='fda', epochs=10, lr=5e-3, jitter=0.5),
              'source_only': dict(style='none', epochs=100, lr=0.05, jitter=0.0)}


def pipeline(cells):
  """The cells as one sweep's stages (configs/sweeps/paper_table.py; fedjax_flat/sweeps/sweep.py): 'source' runs
  experiments/pretrain_source.py for the source_fda model of every target a cell starts from and for the
  source_only cells; 'federated' runs the train.py cells, LADD / FedAvg + ST / ftda with init.pretrained = their
  target's source_fda/seed=<s>/source_model.npz. The centralized cells (experiments/centralized.py) are no stage."""
  fed = [c for c in cells if c not in ENTRY_POINTS and not c.endswith(PRETRAIN)]
  method = {c: c.split(',')[1] for c in cells}
  sources = list(dict.fromkeys(f"{c.split(',')[0]},source_fda" for c in fed if method[c] in FROM_SOURCE_FDA))
  sources += [c for c in cells if method[c] in PRETRAIN and c not in sources]
  stages = []
  if sources:
    stages.append(dict(name='source', binary='experiments/pretrain_source.py',
                       grid=[{'config': f'{FAMILY}:{c}', 'name': c} for c in sources]))
  if fed:
    stages.append(dict(name='federated', grid=[
        {'config': f'{FAMILY}:{c}', 'name': c,
         **({'init.pretrained': {'output_of': f"source/{c.split(',')[0]},source_fda", 'file': 'source_model.npz'}}
            if method[c] in FROM_SOURCE_FDA else {})} for c in fed]))
  return stages


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  target, method = o['target'], o['method']
  if method in ORACLES and target == 'crosscity':
    raise config_strings.ConfigStringError(FAMILY, f'crosscity,{method}', 'CrossCity has no target labels for '
                                           'training: its cells are ladd_cls, ladd_all, fedavg_st')
  if method in ('ftda', 'central_ftda') and target not in ('cityscapes', 'synthetic'):
    raise config_strings.ConfigStringError(FAMILY, f'{target},{method}', 'FTDA is published for Cityscapes only')
  oracle = method in ORACLES
  if target == 'synthetic':
    return _synthetic(method, oracle)
  c = default_config()
  c.dataset = f'{target}_ladd'
  c.data = segmentation_data(c.dataset, image_size=IMAGE_SIZE[target], crop=(512, 1024), scale=(0.7, 2.0),
                             flip=True, jitter=0.5, labelled_train=oracle)
  c.augment, c.normalize = 'segmentation', 'feddrive'
  c.model = 'deeplabv3_mobilenetv2'
  c.model_kwargs = {'conv_impl': 'auto'}
  rounds, clients, lr, lambda_kd, omega, t_start = A7[target]
  c.rounds, c.clients_per_round = rounds, clients
  c.client.batch_size, c.client.local_epochs = 16, 1
  c.client.lr, c.client.momentum, c.client.weight_decay = lr, 0.9, 0.0
  c.segmentation.ohem, c.segmentation.ohem_fraction = 'topk', 0.25
  c.segmentation.eval_mode = 'full'
  c.eval_batch_size = 1
  c.eval_every, c.eval_every_last, c.summary_last_k = 50, 50, 1
  if oracle:
    c.algorithm = 'fedavg'
    c.rounds = 1500
    c.client.lr = ORACLE_LR[target]
    c.client.lr_schedule, c.client.lr_power, c.client.lr_poly_max = 'poly_round', 0.9, 1500
    if method in ('ftda', 'central_ftda'):
      c.init.reinit_classifier = 'never'
    if method == 'central_oracle':
      c.centralized.epochs, c.centralized.lr, c.centralized.momentum = 100, ORACLE_LR[target], 0.9
      c.centralized.weight_decay, c.centralized.batch_size, c.centralized.schedule = 0.0, 16, 'poly'
    if method == 'central_ftda':      # the release's centralized FTDA phase 2 (configs/mapillary_centr_ftda.txt)
      c.centralized.epochs, c.centralized.lr, c.centralized.momentum = 50, 5e-3, 0.9
      c.centralized.weight_decay, c.centralized.batch_size, c.centralized.schedule = 0.0, 16, 'poly'
  elif method in PRETRAIN:
    c.algorithm = 'fedavg'           # not a federated run: experiments/pretrain_source.py reads source_pretrain
    run = SOURCE_RUN[method]
    c.source_pretrain = source_section.section(
        dataset='gta5', style=run['style'], epochs=run['epochs'], lr=run['lr'], batch_size=16, prefetch=8,
        data=segmentation_data('gta5', target=target, image_size=GTA5_SIZE, crop=(512, 1024), scale=(0.7, 2.0),
                               flip=False, jitter=run['jitter']))
  else:
    c.algorithm = 'ladd'
    c.algo = {'cluster_layers': {'ladd_cls': 'decoder', 'ladd_all': 'all', 'fedavg_st': 'none'}[method],
              'force_k': 1 if method == 'fedavg_st' else 0, 'k_min': 4, 'k_max': 19, 'fda_b': 1,
              'conf_th': 0.9, 'fraction': 0.66, 'lambda_kd': lambda_kd, 'alpha_kd': 0.5,
              'teacher_step': omega, 'swa_teacher_start': t_start,
              # the release's rules, as the published runs (algorithms/ladd.py): an unsampled cluster takes the
              # previous global leaves, one teacher for every client, the SWA teacher of the global model
              'unsampled_clusters': 'global', 'teacher_sharing': 'release', 'swa_teacher_model': 'release'}
  mean, std = PUBLISHED.get((target, method), (None, None))
  if mean is not None:
    c.published.source = f'thesis Table {TABLE[target]} (GTA5 -> {target}, mIoU, mean +- std), {method}'
    c.published.miou, c.published.miou_std = mean, std
  return c


def _synthetic(method, oracle):
  """The stand-in on seg_synthetic_da (see the docstring)."""
  c = default_config()
  c.dataset = 'seg_synthetic_da'
  c.data = segmentation_data('seg_synthetic_da')
  c.augment, c.normalize = 'segmentation', 'feddrive'
  c.model = 'seg_cnn'
  c.model_kwargs = {'norm': 'bn', 'width': 8, 'aux': False, 'conv_impl': 'auto'}
  c.rounds, c.clients_per_round = 30, 4
  c.client.batch_size, c.client.local_epochs = 8, 1
  c.client.lr, c.client.momentum, c.client.weight_decay = 0.01, 0.9, 0.0
  c.segmentation.ohem, c.segmentation.ohem_fraction = 'topk', 0.25
  c.eval_batch_size = 16
  c.eval_every, c.eval_every_last, c.summary_last_k = 10, 10, 1
  if oracle:
    c.algorithm = 'fedavg'
    if method in ('ftda', 'central_ftda'):
      c.init.reinit_classifier = 'never'
    if method == 'central_oracle':
      c.centralized.epochs, c.centralized.lr, c.centralized.batch_size = 50, 0.05, 16
    if method == 'central_ftda':
      c.centralized.epochs, c.centralized.lr, c.centralized.batch_size, c.centralized.schedule = 20, 0.01, 16, 'poly'
  elif method in PRETRAIN:
    c.algorithm = 'fedavg'
    # benchmarks/studies/ladd_synthetic.py's pre-training: the in-memory source, 300 steps of 16, lr 0.05, a flip
    c.source_pretrain = source_section.section(dataset='', style='fda' if method == 'source_fda' else 'none',
                                               epochs=0, steps=300, lr=0.05, batch_size=16, checkpoint_every=100,
                                               log_every=50, prefetch=2)
  else:
    c.algorithm = 'ladd'
    c.algo = {'cluster_layers': {'ladd_cls': 'cls', 'ladd_all': 'all', 'fedavg_st': 'none'}[method],
              'force_k': 1 if method == 'fedavg_st' else 0, 'k_min': 2, 'k_max': 19, 'lambda_kd': 20.0,
              'teacher_step': 1, 'swa_teacher_start': -1}
  return c
