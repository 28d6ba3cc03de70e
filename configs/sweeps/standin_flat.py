r"""The CIFAR stand-in study (configs/cifar_standin.py: digits32, the FedSAM paper's CIFAR CNN): FedAvg, FedSAM,
FedASAM, FedGloSS and FedLESAM (issue 52's five) and the 2024-25 global-flatness methods (issue 50's: FedLESAM-S /
-D, FedNSAM, FedGF, FedSWA, FedMoSWA, FedWMSAM) at Dirichlet alpha 0 and 0.5, every client evaluated at the end
(benchmarks/studies/README.standin.md).

  python experiments/sweep.py --sweep=configs/sweeps/standin_flat.py --sweep_dir=runs/standin --parallel=1
  keys: rounds=<int> (default 80), seeds=<n> (default 2: seeds 0..n-1), cells=a+b (among METHODS; default the
  pilot's fedavg+fedsam+fedlesam), alphas=a+b (default 0+0.5)

Radii: Table A.2 of the FedSAM paper for CIFAR-100 at alpha 0.5 (fedjax_flat/config/paper_hparams.RHO): SAM rho
0.05, ASAM rho 0.5 and eta 0.2; FedLESAM the paper's direction and norm at SAM's rho; FedGloSS a SAM client (rho 0.05,
warmed up from 0.001 over 30 rounds) with the release dual variant and the registered server defaults (as the
digits workbench cell, configs/sweeps/workbench_digits.py). Issue 50's methods: their registered defaults, the
ascent radius 0.05 where they have one (SAM's); FedSWA / FedMoSWA with cycle_steps=5, the whole lr cycle within a
client's round (a stand-in client takes 4-5 steps of 16; the registered 0 means K = 50 steps).
"""

STANDIN = 'configs/cifar_standin.py'
SAM = {'client.optimizer': 'sam', 'client.rho': 0.05}
METHODS = {'fedavg': {}, 'fedsam': SAM,
           'fedlesam': {'algorithm': 'fedlesam', 'client.rho': 0.05},
           'fedasam': {'client.optimizer': 'asam', 'client.rho': 0.5, 'client.asam_eta': 0.2},
           'fedgloss': {'algorithm': 'fedgloss', 'client.rho0': 0.001, 'client.rho_warmup_rounds': 30,
                        'algo.dual_variant': 'release', **SAM},
           'fedlesam_s': {'algorithm': 'fedlesam_s', 'client.rho': 0.05},
           'fedlesam_d': {'algorithm': 'fedlesam_d', 'client.rho': 0.05},
           'fednsam': {'algorithm': 'fednsam', 'client.rho': 0.05},
           'fedgf': {'algorithm': 'fedgf', **SAM},
           'fedswa': {'algorithm': 'fedswa', 'algo.cycle_steps': 5},
           'fedmoswa': {'algorithm': 'fedmoswa', 'algo.cycle_steps': 5},
           'fedwmsam': {'algorithm': 'fedwmsam', 'client.rho': 0.05}}
PILOT = ('fedavg', 'fedsam', 'fedlesam')


def get_sweep(arg: str = ''):
  opts = dict(item.partition('=')[::2] for item in filter(None, arg.split(',')))
  rounds = int(opts.pop('rounds', 80))
  seeds = int(opts.pop('seeds', 2))
  cells = opts.pop('cells', '+'.join(PILOT)).split('+')
  alphas = [float(a) for a in opts.pop('alphas', '0+0.5').split('+')]
  if opts or not set(cells) <= set(METHODS):
    raise ValueError(f'bad {arg!r}: the keys are rounds, seeds, cells (among {"+".join(METHODS)}), alphas')
  grid = [dict(name=f'{m}_a{a:g}', config=f'{STANDIN}:alpha={a}', **METHODS[m])
          for a in alphas for m in cells]
  return dict(
      name='standin_flat',
      description='FedAvg / FedSAM / FedASAM / FedGloSS / FedLESAM on the CIFAR stand-in (digits32, cifar_cnn)',
      fixed={'rounds': rounds, 'eval_every': 10, 'summary_last_k': 3, 'client_eval.clients': 'all',
             'client_eval.every': rounds, 'checkpoint_every': rounds},
      grid=grid,
      seeds=list(range(seeds)),
  )
