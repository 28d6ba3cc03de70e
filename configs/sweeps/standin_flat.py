r"""A pilot on the CIFAR stand-in (configs/cifar_standin.py: digits32, the FedSAM paper's CIFAR CNN): FedAvg, FedSAM
and FedLESAM at Dirichlet alpha 0 and 0.5, two seeds, every client evaluated at the end
(benchmarks/studies/README.standin.md).

  python experiments/sweep.py --sweep=configs/sweeps/standin_flat.py --sweep_dir=runs/standin --parallel=1
  keys: rounds=<int> (default 80), seeds=<n> (default 2), cells=a+b (fedavg, fedsam, fedlesam)

SAM's rho 0.05 (the FedSAM paper's CIFAR value); FedLESAM the paper's direction and norm at SAM's rho.
"""

STANDIN = 'configs/cifar_standin.py'
METHODS = {'fedavg': {}, 'fedsam': {'client.optimizer': 'sam', 'client.rho': 0.05},
           'fedlesam': {'algorithm': 'fedlesam', 'client.rho': 0.05}}


def get_sweep(arg: str = ''):
  opts = dict(item.partition('=')[::2] for item in filter(None, arg.split(',')))
  rounds = int(opts.pop('rounds', 80))
  seeds = int(opts.pop('seeds', 2))
  cells = opts.pop('cells', '+'.join(METHODS)).split('+')
  if opts:
    raise ValueError(f'unknown keys {sorted(opts)} in {arg!r}; the keys are rounds, seeds, cells')
  grid = [dict(name=f'{m}_a{a:g}', config=f'{STANDIN}:alpha={a}', **METHODS[m])
          for a in (0.0, 0.5) for m in cells]
  return dict(
      name='standin_flat',
      description='FedAvg / FedSAM / FedLESAM on the CIFAR stand-in (digits32, cifar_cnn), alpha 0 and 0.5',
      fixed={'rounds': rounds, 'eval_every': 10, 'summary_last_k': 3, 'client_eval.clients': 'all',
             'client_eval.every': rounds, 'checkpoint_every': rounds},
      grid=grid,
      seeds=list(range(seeds)),
  )
