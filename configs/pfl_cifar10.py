r"""pfl-research's CIFAR10 benchmark protocol (the small-batch regime): FedAvg, 1000 users x 50 images.

Source: apple/pfl-research, `benchmarks/image_classification/configs/baseline.yaml` (dataset cifar10_iid,
model simple_cnn, fedavg) with `benchmarks/dataset/cifar10/numpy.py` (users) and
`benchmarks/model/{tf2,pytorch}/cnn.py` (the CNN); the setting of the framework comparison in the pfl-research
paper (arXiv 2404.06430, NeurIPS 2024 Datasets & Benchmarks; `publications/pfl/*/cifar10`).

  protocol                          here
  1000 users x 50 images, IID       dataset cifar10, data.partition='random' (one seeded permutation of the
                                    50,000 training images cut into consecutive users of 50: random class counts)
  cohort 50 users per round         clients_per_round = 50
  local batch 10, 1 local epoch     client.batch_size = 10, client.local_epochs = 1 (5 steps)
  client SGD lr 0.1                 client.lr = 0.1, no momentum, no weight decay
  server SGD lr 1.0                 server.optimizer = 'sgd', server.lr = 1.0
  unweighted averaging              server.weighting = 'uniform' (pfl's WeightByUser; every user holds 50
                                    images, so it equals the example-weighted mean here)
  1500 central iterations           rounds = 1500
  evaluation every 10 rounds        eval_every = 10, on the 10,000 test images
  model simple_cnn                  model = 'pfl_cnn' (models/cnn.py PflCNN: conv3x3-32, conv3x3-64, maxpool 2,
                                    dropout 0.25, fc128, dropout 0.5, fc10; VALID convs, 1,626,442 params,
                                    Glorot-uniform kernels, zero biases)
  per-channel standardisation       normalize = 'cifar10' (the usual CIFAR10 channel mean / std; pfl computes
                                    them from its training pickle), no augmentation

Differences, on purpose: evaluation batches of 1000 instead of pfl's 10,000 (the same metrics; less memory on
a CPU); each user's 50 images are reshuffled every epoch (data.shuffle; one epoch per round here). pfl's
preprocessing reshapes the raw rows [N, 3072] straight to [N, 32, 32, 3] (channel planes read as pixels);
our loader decodes the official layout (data/sources/cifar.py). No published accuracy: the protocol is a speed
benchmark (pfl reports wall-clock minutes per framework).

Run (data: `python experiments/download.py --dataset=cifar10`):
  .venv/bin/python experiments/train.py --config=configs/pfl_cifar10.py --workdir=runs/pfl_cifar10
Throughput of this protocol against the peers: `python benchmarks/pfl_cifar10.py` (benchmarks/README.md).
"""
from fedjax_flat.config.default_config import data_section, default_config


def get_config():
  c = default_config()
  c.dataset = 'cifar10'
  c.data = data_section(data_dir='', partition='random', num_clients=1000, examples_per_client=50, seed=0,
                        shuffle=True)
  c.model = 'pfl_cnn'
  c.normalize = 'cifar10'
  c.augment = 'none'
  c.rounds = 1500
  c.clients_per_round = 50
  c.client.optimizer = 'sgd'
  c.client.lr = 0.1
  c.client.momentum = 0.0
  c.client.weight_decay = 0.0
  c.client.batch_size = 10
  c.client.local_epochs = 1
  c.server.optimizer = 'sgd'
  c.server.lr = 1.0
  c.server.weighting = 'uniform'
  c.eval_every = 10
  c.eval_batch_size = 1000
  c.summary_last_k = 10
  return c
