r"""The FL-baselines table's digits stand-in (benchmarks/studies/README.baselines.md), 3 seeds, as one sweep.

  python experiments/sweep.py --sweep=configs/sweeps/baselines_digits.py --sweep_dir=runs/repro/baselines

Setting: configs/baselines_digits.py:algo=<name> at alpha = 0, 100 rounds, evaluation every 5 rounds, last-K =
last 5 evaluations (the README's "acc last 25"). `reference` is the earlier measurement of the same cell
(README.baselines.md, seed 0 only, percent): a check against the checked-in table, not a paper number.
"""

SOURCE = 'benchmarks/studies/README.baselines.md (earlier run, seed 0)'
CFG = 'configs/baselines_digits.py:algo='

# (row name, algo, extra overrides, reference acc last 25 in percent)
CELLS = [
    ('fedavg', 'fedavg', {}, 84.74),
    ('fedavg_sam', 'fedavg', {'client.optimizer': 'sam', 'client.rho': 0.05}, 86.41),
    ('fedavgm', 'fedavgm', {}, 95.82),
    ('fedadam', 'fedadam', {}, 93.09),
    ('fedadagrad', 'fedadagrad', {}, 90.70),
    ('fedyogi', 'fedyogi', {}, 92.81),
    ('fedprox', 'fedprox', {}, 84.51),
    ('scaffold', 'scaffold', {}, 89.03),
    ('feddyn', 'feddyn', {}, 96.16),
    ('adabest', 'adabest', {}, 97.10),
    ('mime_lr0.005', 'mime', {'client.lr': 0.005}, 93.82),     # the family's lr for Mime / MimeLite
    ('mime_sgd', 'mime', {'algo.beta': 0.0, 'client.lr': 0.05}, 93.65),
    ('mimelite_lr0.005', 'mimelite', {'client.lr': 0.005}, 93.26),
    ('fedcm', 'fedcm', {}, 90.75),
    ('fedacg', 'fedacg', {}, 95.43),
    ('fedspeed_active', 'fedspeed', {'algo.dual_mean': 'active'}, 24.62),
    ('fedspeed_population', 'fedspeed', {'algo.dual_mean': 'population'}, 96.32),
    ('fedsmoo', 'fedsmoo', {}, 96.77),
    ('fedgamma', 'fedgamma', {}, 94.54),
    # Diverged at the quickstart lr in the earlier table (chance accuracy); last, as the least informative.
    ('mime_lr0.05', 'mime', {'client.lr': 0.05}, 9.92),
    ('mimelite_lr0.05', 'mimelite', {'client.lr': 0.05}, 9.97),
]


def get_sweep(arg: str = ''):
  if arg:
    raise ValueError(f'{arg!r}: this sweep takes no argument')
  return dict(
      name='baselines_digits',
      description='FL baselines on the embedded digits at alpha = 0 (README.baselines.md)',
      fixed={'data.alpha': 0.0, 'rounds': 100, 'eval_every': 5, 'summary_last_k': 5},
      grid=[dict(name=n, config=CFG + algo, reference={'source': SOURCE, 'accuracy': ref}, **o)
            for n, algo, o, ref in CELLS],
      seeds=[0, 1, 2],
  )
