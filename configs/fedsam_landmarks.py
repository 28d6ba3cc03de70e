r"""FedAvg / FedSAM / FedASAM (+ server SWA) on Landmarks-User-160k with MobileNetV2-GN: thesis Table 4.9.

One cell per command:
  .venv/bin/python experiments/train.py --workdir=runs/lm_fedasam_swa \
      --config=configs/fedsam_landmarks.py:fedasam,swa --config.init.pretrained=/path/mobilenet_v2_gn.npz

Grammar (default fedavg, no SWA):  fedavg | fedsam | fedasam;  swa (server SWA from 75% of the rounds)
CELLS lists the 6 cells; each carries its published number in config.published.

Setting (Table A.1): 1,262 clients (GLDv2 user split), 10 clients per round, 5k rounds; client lr 0.1, batch
64, weight decay 4e-5, 5 local epochs, no momentum; server FedAvg; MobileNetV2 (width 1.0) with GroupNorm (8
groups), no bottleneck before the classifier. SAM rho 0.05; ASAM rho 0.5, eta 0.2 (Table A.2). SWA (Table A.3):
c = 5, lr 1e-1 -> 1e-3, start 3750 = 0.75 T. Train augmentation (random-resized-crop 224 + flip) runs in the
data loader (data.train_augment), so augment='none'; ImageNet normalization. Evaluation every 10 rounds and
every round of the last 100; reported number = mean over the last 100 rounds.
The paper starts from ImageNet-pretrained weights (about 68% top-1). None ship with the project: convert them
offline and pass --config.init.pretrained=<file> (training/init.py; the 1000-class classifier is
re-initialized for the 2,028 landmarks). Without it the run starts from scratch and will not reach the
published numbers.
Data: dataset 'gld160k' (experiments/download.py + experiments/prepare.py).

Published accuracy % (Table 4.9; centralized: 74.03):
             @5k rounds   w/ SWA from 75%   w/ SWA "from 100%"
  FedAvg     61.91        66.05             67.52
  FedSAM     63.72        67.11             68.12
  FedASAM    64.23        67.17             68.32
Not a cell: SWA "from 100%" (the thesis does not say what it means; presumably SWA started at round 5000 and
trained further, digest [U]).
"""
from fedjax_flat.config import families as config_strings, paper_hparams

FAMILY = 'configs/fedsam_landmarks.py'
FIELDS = {'method': ('fedavg', paper_hparams.METHODS), 'swa': (False, bool)}
PUBLISHED = {'fedavg': (61.91, 66.05), 'fedsam': (63.72, 67.11), 'fedasam': (64.23, 67.17)}
CELLS = [f'{m}{",swa" if swa else ""}' for m in paper_hparams.METHODS for swa in (False, True)]


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  c = paper_hparams.landmarks_config()
  for k, v in paper_hparams.client_optimizer('gld160k', None, o['method']).items():
    c.client[k] = v
  paper_hparams.apply_swa(c, 'gld160k', enabled=o['swa'])
  row = {'fedavg': 'FedAvg', 'fedsam': 'FedSAM', 'fedasam': 'FedASAM'}[o['method']]
  config_strings.set_published(
      c, f'thesis Table 4.9 (FedSAM paper, Landmarks-User-160k), {row}, '
         f'{"w/ SWA from 75%" if o["swa"] else "@5k rounds"}', PUBLISHED[o['method']][int(o['swa'])])
  return c
