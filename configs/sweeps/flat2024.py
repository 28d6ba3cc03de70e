r"""The 2024 flat-minima methods beside FedAvg and FedSAM on the digits, in the usual and the cross-device protocols,
on a homogeneous virtual clock (issue 50 item 5; benchmarks/studies/README.flat2024.md).

  python experiments/sweep.py --sweep=configs/sweeps/flat2024.py:protocol=usual --sweep_dir=runs/flat2024/usual \
      --batch_runs=3
  python experiments/sweep.py --sweep=configs/sweeps/flat2024.py:protocol=xdev --sweep_dir=runs/flat2024/xdev \
      --batch_runs=3
  keys: protocol=usual|xdev, rounds=<int> (usual only; default 100), cells=a+b+... (a subset; or the EXTRA cells below)

usual: configs/quickstart.py at alpha = 0 (one class per client), 20 clients, 5 a round, digits CNN, client lr 0.05,
  batch 16, one local epoch (5 steps), weight decay 4e-4 (the flat-minima table's setting,
  configs/sweeps/flat_minima_digits.py); SAM-type ascent radius rho 0.1 for every method that has one (FedSAM's
  flat-minima value).
xdev: configs/cross_device.py:digits,<algo> (400 clients of 3-4 digits, Dirichlet 0.5, 10 a round, 60 rounds: a
  client takes part 1.5 times on average; batch 4, 2 local steps, rho 0.05). Cells the family does not list
  (fedlesam_s, fedlesam_d, fedmoswa, fedwmsam) are its fedavg cell with `algorithm` overridden (config.algo filled
  with the registered defaults) and the family's choices applied: rho 0.05, LESAM's stateless server direction.
Both: the virtual clock of configs/system.py's 'none' setting (every device at 20 examples/s, 10 / 1 Mbps down /
up), so summary.json carries virtual_time_s; every other hyperparameter is the registered default.
"""

CLOCK = {'system.speed': 'lognormal', 'system.speed_median': 20.0, 'system.speed_sigma': 0.0,
         'system.up_mbps': 1.0, 'system.down_mbps': 10.0}
METHODS = ('fedavg', 'fedsam', 'fedlesam', 'fedlesam_s', 'fedlesam_d', 'fednsam', 'fedgf', 'fedswa', 'fedmoswa',
           'fedwmsam')
# Not in the default grid (cells=fedgf_t0 only): FedGF with its divergence threshold T_D = 0, so that c ramps to 1
# over the window and the global ascent point is used (at the default T_D = 1.0 the divergence never exceeds it
# here, c stays 0 and FedGF is FedSAM step for step).
# fedswa_c5 / fedmoswa_c5 (usual only): the registered cycle_steps=0 in the quickstart's epochs mode decays the lr
# over K = 50 steps while a client takes 5 (the builder warns); cycle_steps=5 is the full in-round cycle.
# scaffold / feddyn / fedavgm (usual only): the corrections and the server momentum the newer methods build on,
# alone (configs/baselines_digits.py:algo=<name>), as controls.
CONTROLS = ('scaffold', 'feddyn', 'fedavgm')
EXTRA = ('fedgf_t0', 'fedswa_c5', 'fedmoswa_c5') + CONTROLS
XDEV_LISTED = ('fedavg', 'fedsam', 'fedlesam', 'fednsam', 'fedgf', 'fedswa')   # cells of configs/cross_device.py


def usual_cell(m, rho=0.1):
  """(config, overrides) of method m in the usual protocol."""
  if m == 'fedgf_t0':
    config, o = usual_cell('fedgf', rho)
    return config, {**o, 'algo.threshold': 0.0}
  if m in CONTROLS:
    return f'configs/baselines_digits.py:algo={m}', {}
  if m in ('fedswa_c5', 'fedmoswa_c5'):
    return f'configs/quickstart.py:{m[:-3]}', {'algo.cycle_steps': 5}
  sam = {'client.optimizer': 'sam', 'client.rho': rho}
  if m == 'fedavg':
    return 'configs/quickstart.py', {}
  if m == 'fedsam':
    return 'configs/quickstart.py', sam
  if m == 'fedgf':
    return 'configs/quickstart.py:fedgf', sam
  if m in ('fedlesam', 'fedlesam_s', 'fedlesam_d', 'fedwmsam'):
    return f'configs/quickstart.py:{m}', {'client.rho': rho}
  return f'configs/quickstart.py:{m}', {}


def xdev_cell(m, rho=0.05):
  if m == 'fedgf_t0':
    return 'configs/cross_device.py:digits,fedgf', {'algo.threshold': 0.0}
  if m.endswith('_c5') or m in CONTROLS:
    raise ValueError(f'{m}: a usual-protocol cell (the cross-device cycle is already the 2 local steps)')
  if m in XDEV_LISTED:
    return f'configs/cross_device.py:digits,{m}', {}
  o = {'algorithm': m, 'client.rho': rho}
  if m.startswith('fedlesam'):
    o['algo.direction'] = 'server'
  return 'configs/cross_device.py:digits,fedavg', o


def get_sweep(arg: str = ''):
  opts = dict(item.partition('=')[::2] for item in filter(None, arg.split(',')))
  protocol = opts.pop('protocol', 'usual')
  rounds = int(opts.pop('rounds', 100))
  cells = opts.pop('cells', '+'.join(METHODS)).split('+')
  if opts or protocol not in ('usual', 'xdev') or set(cells) - set(METHODS + EXTRA):
    raise ValueError(f'{arg!r}: keys protocol=usual|xdev, rounds=<int>, cells=<{"+".join(METHODS)}>')
  grid = []
  for m in METHODS + EXTRA:
    if m not in cells:
      continue
    config, o = usual_cell(m) if protocol == 'usual' else xdev_cell(m)
    grid.append(dict(name=m, config=config, **o))
  fixed = dict(CLOCK)
  if protocol == 'usual':
    fixed.update({'data.alpha': 0.0, 'rounds': rounds, 'eval_every': 5, 'summary_last_k': 5})
  else:
    fixed.update({'summary_last_k': 3})     # evaluations every 6 rounds: last-K = rounds 48-60
  return dict(
      name=f'flat2024_{protocol}',
      description=f'2024 flat-minima methods vs FedAvg / FedSAM on the digits, {protocol} protocol',
      fixed=fixed, grid=grid, seeds=[0, 1, 2])
