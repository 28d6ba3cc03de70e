r"""Every FL baseline on the embedded handwritten digits: configs/quickstart.py's setting (20 clients, digits CNN,
100 rounds, 5 clients per round, lr 0.05, batch 16, 1 local epoch) with the algorithm chosen by the argument.

  .venv/bin/python experiments/train.py --workdir=runs/digits_scaffold \
      --config=configs/baselines_digits.py:algo=scaffold --config.data.alpha=0.0

  algo = fedavg | fedavgm | fedadam | fedadagrad | fedyogi | fedprox | scaffold | feddyn | adabest | mime |
         mimelite | fedcm | fedacg | fedspeed | fedsmoo | fedgamma  (fedavgm..fedyogi: FedAvg with that server
         optimizer). config.algo holds all of the algorithm's hyperparameters (registry defaults), so
         --config.algo.mu=0.1 etc. work; FedSpeed / FedSMOO / FedGamma get a SAM client (rho 0.05); Mime and
         MimeLite train at lr 0.005 (their server momentum beta = 0.9 diverges at the quickstart's 0.05: 9.92 /
         9.97 %, chance, in README.baselines.md).
The table of all of them at alpha = 0 is benchmarks/studies/README.baselines.md (3 seeds:
configs/sweeps/baselines_digits.py).
CELLS lists one cell per algorithm. No published numbers: the digits are a small-scale stand-in, not a paper
setting (config.published stays empty; the sweep's `reference` holds the earlier measurement instead).
"""
import importlib.util
import os

from fedjax_flat.algorithms import registry
from fedjax_flat.config import families as config_strings

SERVER = {
    'fedavgm': dict(optimizer='sgd', lr=1.0, momentum=0.9),
    'fedadam': dict(optimizer='adam', lr=0.01, b1=0.9, b2=0.99, eps=1e-3),
    'fedadagrad': dict(optimizer='adagrad', lr=0.01, momentum=0.0, eps=1e-3),
    'fedyogi': dict(optimizer='yogi', lr=0.01, b1=0.9, b2=0.99, eps=1e-3),
}
SAM_METHODS = ('fedspeed', 'fedsmoo', 'fedgamma')
ALGOS = ('fedavg',) + tuple(SERVER) + ('fedprox', 'scaffold', 'feddyn', 'adabest', 'mime', 'mimelite', 'fedcm',
                                      'fedacg', 'fedspeed', 'fedsmoo', 'fedgamma')
FIELDS = {'algo': ('fedavg', ALGOS)}
CLIENT_LR = {'mime': 0.005, 'mimelite': 0.005}     # the lr that trains (configs/sweeps/baselines_digits.py)
CELLS = [f'algo={a}' for a in ALGOS]


def _quickstart():
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'quickstart.py')
  spec = importlib.util.spec_from_file_location('quickstart_config', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


def get_config(arg: str = ''):
  algo = config_strings.parse(arg, FIELDS, family='configs/baselines_digits.py')['algo']
  c = _quickstart()
  if algo in SERVER:
    c.algorithm = 'fedavg'
    for k, v in SERVER[algo].items():
      c.server[k] = v
    return c
  c.algorithm = algo
  for k, v in registry.default_hparams(algo).items():
    c.algo[k] = v
  if algo in SAM_METHODS:
    c.client.optimizer, c.client.rho = 'sam', 0.05
  if algo in CLIENT_LR:
    c.client.lr = CLIENT_LR[algo]
  return c
