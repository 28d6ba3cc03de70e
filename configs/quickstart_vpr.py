r"""Quickstart for federated visual place recognition (FedVPR, thesis 6.3) on the synthetic stand-in.

Command (from the repo root; no download, the data are generated in a few seconds):
  .venv/bin/python experiments/train.py --config=configs/quickstart_vpr.py --workdir=runs/vpr_proximity
  .venv/bin/python experiments/train.py --config=configs/quickstart_vpr.py:random --workdir=runs/vpr_random

Grammar: one split token, proximity (default: Table 6.5's proximity split, radius 100 m on 300 m cities) |
random (queries of all cities per client, with the sequences of their positives).

The set (fedjax_flat/data/sources/vpr_synthetic.py): 4 training cities (30 database sequences of 8 frames and 80
queries each, 32 x 32 images of a textured map seen with viewpoint and illumination changes), a fifth city on the
server for testing (80 queries, 240 database images). Model `vpr_resnet18` (models/vpr.py: ResNet18 up to its
third stage + GeM + L2) at base width 16 (a 64-d descriptor), GroupNorm. Clients train on their query tuples:
triplet loss, margin 0.1, the 3 hardest of 10 negative candidates (drawn afresh each round from the query's pool
of far frames of the client's database) and the nearest of 2 positive candidates, mined at every step from a
gradient-free pass (tasks/retrieval.py). FedAvg, 5 clients per round, 1 local epoch of batch 4, client SGD
lr 0.05 momentum 0.9. Reported: Recall@1/5/10 on the test city (test_accuracy = R@1, test_recall@5, ...).
"""
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import default_config, segmentation_data

FAMILY = 'configs/quickstart_vpr.py'
SPLITS = ('proximity', 'random')
FIELDS = {'split': ('proximity', SPLITS)}


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  c = default_config()
  c.dataset = 'vpr_synthetic'
  c.data = segmentation_data('vpr_synthetic', split=o['split'])
  c.augment, c.normalize = 'none', 'imagenet'
  c.model = 'vpr_resnet18'
  c.model_kwargs = {'norm': 'gn', 'base_width': 16, 'gn_groups': 2, 'conv_impl': 'auto'}
  c.rounds = 30
  c.clients_per_round = 5
  c.client.batch_size, c.client.local_epochs = 4, 1
  c.client.lr, c.client.momentum, c.client.weight_decay = 0.05, 0.9, 0.0
  c.retrieval.margin, c.retrieval.num_negatives, c.retrieval.threshold = 0.1, 3, 25.0
  c.eval_batch_size = 64
  c.eval_every, c.summary_last_k = 5, 1
  return c
