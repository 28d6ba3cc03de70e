r"""Quickstart for federated semantic segmentation: a small BatchNorm segmentation net on the synthetic
domain-shift set (seg_synthetic), FedAvg / FedSAM / FedASAM / SiloBN / FedBN.

Command (from the repo root; no download, the data are generated in a second):
  .venv/bin/python experiments/train.py --config=configs/quickstart_seg.py:fedasam --workdir=runs/seg_fedasam

Grammar: one method token, fedavg (default) | fedsam | fedasam | silobn | fedbn.

The set (fedjax_flat/data/sources/seg_synthetic.py): 48 x 48 images of shapes (rectangle, disc, triangle) on textured
backgrounds, 4 classes with the shapes' inner borders void (255); 6 appearance domains (colour cast +
illumination curve + class frequencies), 4 of them seen by 3 clients each (12 clients, 24 images, one domain
per client: FedDrive's heterogeneous split), 2 never trained on. Test clients: 'seen' (6 held-out images of
every training client, 72) and 'unseen' (24 images of each unseen domain, 48): the run reports
`test_seen_miou` and `test_unseen_miou` (and their last-10 means in summary.json), per-class IoU and
predictions.png, as the FedDrive configs do.

Setting: the FedDrive recipe scaled down. Model `seg_cnn` (models/seg_cnn.py: a U-Net-like ConvBNReLU
network at 3 scales, width 8, 26k parameters, BatchNorm, an auxiliary head in training);
`--config.model=bisenetv2 --config.model_kwargs='{...}'` swaps in the FedDrive network (minutes per round on
CPU). OHEM on the hardest 25% of each image's pixels with the heads' losses summed, 40 rounds, 4 clients per
round, 1 local epoch of batch 8 (3 steps), client SGD momentum 0.9, lr 0.05, weight decay 5e-4 (thesis Table
A.1, Cityscapes), FedDrive's poly lr over each round's local steps; random scale 0.75-1.5 + crop 48 x 48,
flip. SAM rho 0.01, ASAM rho 0.1 / eta 0.2 (thesis Table A.2, Cityscapes). SiloBN keeps BN statistics local,
FedBN statistics and BN affine parameters; unseen test clients are normalized with each test batch's own
statistics for SiloBN / FedBN (bn.test_policy auto = FedDrive's protocol), with the averaged running statistics
for FedAvg / FedSAM / FedASAM. Reported: the mean over the last 10 rounds (evaluated every round).

Expected: 2-5 minutes per run on 2 shared CPU cores. Measured mean +- std over 3 seeds of the five methods,
seen and unseen mIoU: benchmarks/studies/README.segmentation.md (benchmarks/studies/seg_synthetic_compare.py runs them
all).
"""
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import default_config, segmentation_data

FAMILY = 'configs/quickstart_seg.py'
METHODS = ('fedavg', 'fedsam', 'fedasam', 'silobn', 'fedbn')
FIELDS = {'method': ('fedavg', METHODS)}


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  c = default_config()
  c.dataset = 'seg_synthetic'
  c.data = segmentation_data('seg_synthetic', image_size=(48, 48), crop=(48, 48))
  c.augment, c.normalize = 'segmentation', 'feddrive'
  c.model = 'seg_cnn'
  c.model_kwargs = {'norm': 'bn', 'width': 8, 'aux': True, 'conv_impl': 'auto'}
  c.rounds = 40
  c.clients_per_round = 4
  c.client.batch_size, c.client.local_epochs = 8, 1
  c.client.lr, c.client.momentum, c.client.weight_decay = 0.05, 0.9, 5e-4
  c.client.lr_schedule, c.client.lr_power, c.client.lr_poly_max = 'poly_step', 0.9, 10000
  method = o['method']
  c.algorithm = method if method in ('silobn', 'fedbn') else 'fedavg'
  if method == 'fedsam':
    c.client.optimizer, c.client.rho = 'sam', 0.01
  elif method == 'fedasam':
    c.client.optimizer, c.client.rho, c.client.asam_eta = 'asam', 0.1, 0.2
  c.segmentation.ohem, c.segmentation.ohem_fraction, c.segmentation.aux_weight = 'topk', 0.25, 1.0
  c.segmentation.eval_mode, c.segmentation.by_test_client = 'full', True
  c.bn.test_policy, c.bn.test_batch_size = 'auto', 8
  c.eval_batch_size = 8
  c.eval_every, c.eval_every_last, c.summary_last_k = 10, 10, 10   # reported: mean over the last 10 rounds
  return c
