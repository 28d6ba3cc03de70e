r"""A CIFAR-10-shaped stand-in that runs here (no download): the `synthetic` source at 32x32x3, 10 classes, with
noise large enough that the paper's CIFAR CNN does not saturate, split over 50 clients by Dirichlet alpha.

  .venv/bin/python experiments/train.py --config=configs/cifar_standin.py --workdir=runs/cifar_standin
  .venv/bin/python experiments/train.py --config=configs/cifar_standin.py:alpha=0,rounds=60 ...

What it is and is not: images are a class mean plus isotropic Gaussian noise (`noise`, per pixel, against means of
unit variance), so the classes are separable by a linear function of the pixels and nothing in them is natural
image structure (no edges, no translation); the CNN's convolutions see noise. It has CIFAR's tensor shapes, model
(the FedSAM paper's CIFAR CNN, models/cnn.py `cifar_cnn`), client sizes of 100 and label skew, and a
generalisation gap that depends on the noise: at noise 25, 30 rounds (`benchmarks/studies/README.standin.md`,
calibration) training accuracy reaches ~1 while the test accuracy stays below it. Results on it say how the
methods behave on a CIFAR-shaped, label-skewed, high-dimensional problem with a generalisation gap; they do not
say how they behave on CIFAR.

Keys (after the colon, comma-separated): alpha (Dirichlet; 0 = one class per client; default 0.5), rounds
(default 40), noise (default 25), clients (default 50).
"""
from fedjax_flat.config.default_config import default_config
from fedjax_flat.config.schema import data_section


def get_config(arg: str = ''):
  opts = dict(item.partition('=')[::2] for item in filter(None, arg.split(',')))
  alpha = float(opts.pop('alpha', 0.5))
  rounds = int(opts.pop('rounds', 40))
  noise = float(opts.pop('noise', 0.1))
  clients = int(opts.pop('clients', 20))
  if opts:
    raise ValueError(f'unknown keys {sorted(opts)} in {arg!r}; the keys are alpha, rounds, noise, clients')
  c = default_config()
  c.dataset, c.model = 'digits32', 'cifar_cnn'
  c.data = data_section(num_clients=clients, alpha=alpha, noise=noise)
  c.rounds = rounds
  c.clients_per_round = 5
  c.client.lr = 0.05
  c.client.batch_size = 16
  c.client.local_epochs = 1
  c.client.weight_decay = 4e-4
  c.eval_every = 5
  c.summary_last_k = 4
  return c
