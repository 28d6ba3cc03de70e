r"""Issue 52 item 4, the workbench study (benchmarks/studies/README.workbench.md): FedAvg, FedSAM, FedASAM,
FedGloSS and FedLESAM on the embedded digits at Dirichlet alpha 0 and 0.5, 3 seeds, with every client evaluated
(config.client_eval) and the landscape lab (drift, rank, profile) on.

  python experiments/sweep.py --sweep=configs/sweeps/workbench_digits.py --sweep_dir=runs/workbench/digits
  python experiments/sweep.py --sweep=configs/sweeps/workbench_digits.py:rounds=100,lab_every=25 ...

Setting: the quickstart (20 clients, 5 a round, digits CNN, client SGD lr 0.05, batch 16, 1 local epoch); the
SAM-family hyperparameters of configs/sweeps/flat_minima_digits.py (SAM rho 0.1; ASAM rho 0.7, eta 0.2; FedGloSS
the release dual variant with a SAM client and the rho warm-up); FedLESAM (the paper's direction and norm) with
rho 0.1, SAM's.
"""

SAM = {'client.optimizer': 'sam', 'client.rho': 0.1}
ASAM = {'client.optimizer': 'asam', 'client.rho': 0.7, 'client.asam_eta': 0.2}
QS = 'configs/quickstart.py'
GLOSS = 'configs/quickstart_fedgloss.py'
GLOSS_CELL = {'client.rho0': 0.001, 'client.rho_warmup_rounds': 30, 'algo.dual_variant': 'release', **SAM}
LESAM = {'algorithm': 'fedlesam', 'client.rho': 0.1}

METHODS = [
    ('fedavg', QS, {}),
    ('fedsam', QS, SAM),
    ('fedasam', QS, ASAM),
    ('fedgloss', GLOSS, GLOSS_CELL),
    ('fedlesam', QS, LESAM),
]


def get_sweep(arg: str = ''):
  opts = dict(item.partition('=')[::2] for item in filter(None, arg.split(',')))
  rounds = int(opts.pop('rounds', 60))
  lab_every = int(opts.pop('lab_every', 20))
  alphas = [float(a) for a in opts.pop('alphas', '0+0.5').split('+')]
  cells = opts.pop('cells', '+'.join(m[0] for m in METHODS)).split('+')
  if opts:
    raise ValueError(f'unknown keys {sorted(opts)} in {arg!r}; the keys are rounds, lab_every, alphas, cells')
  grid = []
  for alpha in alphas:
    for name, config, overrides in METHODS:
      if name in cells:
        grid.append(dict(name=f'{name}_a{alpha:g}', config=config, **{'data.alpha': alpha}, **overrides))
  return dict(
      name='workbench_digits',
      description=('FedAvg / FedSAM / FedASAM / FedGloSS / FedLESAM on the digits, alpha 0 and 0.5 '
                   '(README.workbench.md)'),
      fixed={'rounds': rounds, 'eval_every': 5, 'summary_last_k': 4, 'client_eval.clients': 'all',
             'client_eval.every': 2, 'lab.every': lab_every, 'lab.measures': 'drift,rank,profile',
             'checkpoint_every': rounds},
      grid=grid,
      seeds=[0, 1, 2],
  )
