r"""The flat-minima table's digits stand-in (benchmarks/studies/README.flat_minima.md), 3 seeds, as one sweep.

  python experiments/sweep.py --sweep=configs/sweeps/flat_minima_digits.py --sweep_dir=runs/repro/flat_minima
  python experiments/sweep.py --sweep=configs/sweeps/flat_minima_digits.py:rounds=60 ...   (shorter)
  python experiments/sweep.py --sweep=configs/sweeps/flat_minima_digits.py:cells=fedavg+fedsam+fedasam ...
      (a subset of the cells: the FedAvg / FedSAM / FedASAM table)

Setting: the quickstart at alpha = 0 (one class per client), 150 rounds, evaluation every 5 rounds, last-K = the
last 6 evaluations (rounds 125-150); the papers' CIFAR10 alpha = 0 hyperparameters (see the README).
`reference` is the earlier measurement of the same cell (README.flat_minima.md, last-K mean +- std over seeds
0-2, percent): a check that the sweep reproduces the checked-in table, not a paper number.
"""

SAM = {'client.optimizer': 'sam', 'client.rho': 0.1}
ASAM = {'client.optimizer': 'asam', 'client.rho': 0.7, 'client.asam_eta': 0.2}
SWA = {'swa.enabled': True, 'swa.cycle': 5, 'swa.lr1': 0.05, 'swa.lr2': 0.0005}
WIMA = {'wima.enabled': True, 'wima.window': 10}
QS = 'configs/quickstart.py'
GLOSS = 'configs/quickstart_fedgloss.py'
GLOSS_WARMUP = {'client.rho0': 0.001, 'client.rho_warmup_rounds': 30}
RELEASE = {'algo.dual_variant': 'release'}
THESIS = {'algo.dual_variant': 'thesis'}   # Algorithm 5 as printed (explicit: the registered default may change)
SOURCE = 'benchmarks/studies/README.flat_minima.md (earlier run, 150 rounds, seeds 0-2)'

# (name, config, overrides, reference last-K mean, std)
CELLS = [
    ('fedavg', QS, {}, 89.35, 0.19),
    ('fedsam', QS, SAM, 92.25, 0.30),
    ('fedasam', QS, ASAM, 93.31, 0.37),
    ('fedavg_swa', QS, SWA, 92.06, 0.45),
    ('fedsam_swa', QS, {**SAM, **SWA}, 92.96, 0.87),
    ('fedasam_swa', QS, {**ASAM, **SWA}, 93.53, 0.22),
    ('fedgloss_sgd', GLOSS, {**GLOSS_WARMUP, **THESIS}, 78.47, 3.36),
    ('fedgloss_sam', GLOSS, {**GLOSS_WARMUP, **SAM, **THESIS}, 89.15, 0.68),
    ('fedgloss_sgd_release', GLOSS, {**GLOSS_WARMUP, **RELEASE}, 95.62, 0.17),
    ('fedgloss_sam_release', GLOSS, {**GLOSS_WARMUP, **SAM, **RELEASE}, 96.94, 0.36),
    ('naive_fedgloss_sam_release', GLOSS, {**GLOSS_WARMUP, **SAM, **RELEASE, 'algorithm': 'naive_fedgloss'},
     97.11, 0.11),
    ('fedgloss_sam_swa', GLOSS, {**GLOSS_WARMUP, **SAM, **THESIS, **SWA}, 80.64, 0.47),
    ('fedavg_wima', QS, WIMA, 92.37, 0.39),
    ('fedasam_wima', QS, {**ASAM, **WIMA}, 94.01, 0.26),
    ('fedavg_man', QS, {'man.zeta': 0.15}, 92.39, 0.29),
    ('fedasam_man', QS, {**ASAM, 'man.zeta': 0.15}, 93.76, 0.16),
]


def get_sweep(arg: str = ''):
  opts = dict(item.partition('=')[::2] for item in filter(None, arg.split(',')))
  rounds = int(opts.pop('rounds', 150))
  names = [c[0] for c in CELLS]
  cells = opts.pop('cells', '+'.join(names)).split('+')
  if opts:
    raise ValueError(f'unknown keys {sorted(opts)} in {arg!r}; the keys are rounds and cells')
  unknown = [c for c in cells if c not in names]
  if unknown:
    raise ValueError(f'cells {unknown} in {arg!r} are not cells of this sweep; allowed: {"+".join(names)}')
  grid = []
  for name, config, overrides, acc, std in CELLS:
    if name not in cells:
      continue
    ref = {'source': SOURCE, 'accuracy': acc, 'accuracy_std': std} if rounds == 150 else None
    grid.append(dict(name=name, config=config, reference=ref, **overrides))
  return dict(
      name='flat_minima_digits',
      description='Flat-minima methods on the embedded digits at alpha = 0 (README.flat_minima.md)',
      fixed={'data.alpha': 0.0, 'rounds': rounds, 'eval_every': 5, 'summary_last_k': 6},
      grid=grid,
      seeds=[0, 1, 2],
  )
