r"""Issue 52 item 4, the workbench study, worst-group part (benchmarks/studies/README.workbench.md): FedAvg,
FedSAM, FedASAM, FedGloSS and FedLESAM on the coloured digits of configs/spurious.py (strong: rho_k ~ U[0.9, 1];
weak: rho_k = 0.5), 3 seeds; test_worst_group_acc in every evaluation record.

  python experiments/sweep.py --sweep=configs/sweeps/workbench_spurious.py --sweep_dir=runs/workbench/spurious

The method hyperparameters are the workbench's (configs/sweeps/workbench_digits.py: SAM rho 0.1, not the 0.05
of configs/spurious.py's own fedsam cell), so that the two parts of the study compare the same methods.
"""
from configs.sweeps.workbench_digits import ASAM, GLOSS_CELL, LESAM, SAM

METHODS = [
    ('fedavg', {}),
    ('fedsam', SAM),
    ('fedasam', ASAM),
    ('fedgloss', {'algorithm': 'fedgloss', **GLOSS_CELL}),
    ('fedlesam', LESAM),
]


def get_sweep(arg: str = ''):
  opts = dict(item.partition('=')[::2] for item in filter(None, arg.split(',')))
  rounds = int(opts.pop('rounds', 50))
  strengths = opts.pop('strengths', 'strong+weak').split('+')
  if opts:
    raise ValueError(f'unknown keys {sorted(opts)} in {arg!r}; the keys are rounds and strengths')
  grid = [dict(name=f'{m}_{s}', config=f'configs/spurious.py:fedavg,{s}', **o)
          for s in strengths for m, o in METHODS]
  return dict(
      name='workbench_spurious',
      description='Five methods on the coloured digits, strong and weak spurious colour (README.workbench.md)',
      fixed={'rounds': rounds, 'eval_every': 5, 'summary_last_k': 5},
      grid=grid,
      seeds=[0, 1, 2],
  )
