r"""A CIFAR-10-shaped stand-in that runs here (no download): `digits32` (the embedded digits at 32x32x3, a light
stroke in a random hue on a dark background in a random hue, pixel noise 0.1; fedjax_flat/data/sources/digits32.py)
trained with the FedSAM paper's CIFAR CNN (`cifar_cnn`), split over 20 clients by Dirichlet alpha.

  .venv/bin/python experiments/train.py --config=configs/cifar_standin.py --workdir=runs/cifar_standin
  .venv/bin/python experiments/train.py --config=configs/cifar_standin.py:alpha=0,rounds=60 ...

What it is and is not: CIFAR's tensor shapes, model and cost per example (about 4x a quickstart round here), label
skew over clients, colour nuisances; ten stroke shapes and 1,438 training images, not CIFAR's content. Results on
it say how the methods behave on a CIFAR-shaped problem that generalises from little data; they do not say how
they behave on CIFAR.

Measured (2026-12-07, shared 2-core EPYC, load ~6): the defaults at 60 rounds reach 0.38 test accuracy (alpha 0.5;
0.32 at round 55, 0.11 at round 40), 0.6 rounds/s; the centralized bound (experiments/centralized.py) is above 0.9.
So a study on it wants a few hundred rounds (or more local epochs): minutes a run on an accelerator, tens of
minutes here.

Keys (after the colon, comma-separated): alpha (Dirichlet; 0 = one class per client; default 0.5), rounds
(default 40), noise (default 0.1), clients (default 20).
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
