r"""Spurious correlations (thesis §7.2.3): FedAvg and FedSAM on the coloured digits (`spurious_digits`:
each class has a majority colour; client k's digits wear it with probability rho_k), tested on colour-balanced
digits (every test digit in every colour), so that a model that learnt the colour fails its minority groups.
Every evaluation record carries test_worst_group_acc, test_avg_group_acc and test_group_acc/<g> (20 groups:
class x colour agrees / not; training/evals/groups.py); summary.json `groups` names the worst group.

  .venv/bin/python experiments/train.py --workdir=runs/sp_fedavg_strong --config=configs/spurious.py:fedavg,strong
  .venv/bin/python experiments/train.py --workdir=runs/sp_fedsam_strong --config=configs/spurious.py:fedsam,strong
  .venv/bin/python experiments/train.py --workdir=runs/sp_fedavg_weak --config=configs/spurious.py:fedavg,weak
  .venv/bin/python experiments/train.py --workdir=runs/sp_fedsam_weak --config=configs/spurious.py:fedsam,weak

The Waterbirds-like variant (`background_digits`: landbirds 0-4 / waterbirds 5-9 drawn on land / water
backgrounds; client k's digits on their class's background with probability rho_k; a group-balanced test set):

  .venv/bin/python experiments/train.py --workdir=runs/sp_bg --config=configs/spurious.py:fedavg,strong,background

Grammar (comma-separated; default fedavg,strong,colour): fedavg | fedsam (client.optimizer='sam', rho 0.05);
strong (rho_k ~ U[0.9, 1.0] per client, drawn by the data seed) | weak (rho_k = 0.5 for every client; background:
0.7) | none (rho_k = 0.1: colour independent of the class, the control; background: 0.5); colour
(`spurious_digits`) | background (`background_digits`). CELLS: the 2 methods x the 3 strengths x the 2 features.

Setting: 20 clients with equal class shares (data.alpha = inf), 5 per round, 50 rounds; digits_cnn on the 8x8x3
coloured digits; client SGD lr 0.05, batch 16, 1 local epoch, weight decay 4e-4 (the quickstart's). The measured
numbers are in benchmarks/studies/README.spurious.md. No published number applies (config.published stays empty):
the thesis names the benchmark, not a table; Waterbirds / CelebA blond (`waterbirds`, `celeba_blond`) run from
their files with --config.dataset=... (docs/spurious.md).
"""
from fedjax_flat.config import families as config_strings
from fedjax_flat.config.default_config import data_section, default_config

FAMILY = 'configs/spurious.py'
FIELDS = {'method': ('fedavg', ('fedavg', 'fedsam')), 'strength': ('strong', ('strong', 'weak', 'none')),
          'feature': ('colour', ('colour', 'background'))}
# (strength, strength_max) of each setting; 0.1 = 1 / 10 colours and 0.5 = 1 / 2 backgrounds: no information.
STRENGTHS = {'strong': (0.9, 1.0), 'weak': (0.5, -1.0), 'none': (0.1, -1.0)}
BACKGROUND_STRENGTHS = {'strong': (0.9, 1.0), 'weak': (0.7, -1.0), 'none': (0.5, -1.0)}
DATASETS = {'colour': 'spurious_digits', 'background': 'background_digits'}
CELLS = [f'{m},{s}' + (',background' if f == 'background' else '') for f in ('colour', 'background')
         for m in ('fedavg', 'fedsam') for s in ('strong', 'weak', 'none')]
SAM_RHO = 0.05


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  c = default_config()
  c.dataset = DATASETS[o['feature']]
  if o['feature'] == 'background':
    lo, hi = BACKGROUND_STRENGTHS[o['strength']]
    c.data = data_section(num_clients=20, strength=lo, strength_max=hi, alpha=float('inf'), test_fraction=0.2,
                          seed=0)
  else:
    lo, hi = STRENGTHS[o['strength']]
    c.data = data_section(num_clients=20, strength=lo, strength_max=hi, test_strength=-1.0, alpha=float('inf'),
                          test_fraction=0.2, seed=0)
  c.model = 'digits_cnn'
  if o['method'] == 'fedsam':
    c.client.optimizer = 'sam'
    c.client.rho = SAM_RHO
  c.rounds = 50
  c.clients_per_round = 5
  c.client.lr = 0.05
  c.client.batch_size = 16
  c.client.local_epochs = 1
  c.client.weight_decay = 4e-4
  c.eval_every = 5
  c.summary_last_k = 5
  return c
