r"""Systems realism on the digits (config.system, systems/clock.py): FedAvg, FedProx, FedNova, FedSAM and FedASAM
on a virtual clock of homogeneous devices, of log-normal speeds under a deadline, and of diurnal availability.

  .venv/bin/python experiments/train.py --workdir=runs/sys_fedsam_deadline --config=configs/system.py:fedsam,deadline
  .venv/bin/python -m benchmarks.studies.system_digits     # every cell x 3 seeds -> README.system.md

Grammar (comma-separated; default fedavg,none):
  fedavg | fedprox (mu 0.01) | fednova | fedsam (SAM rho 0.05) | fedasam (ASAM rho 0.7, eta 0.2);
  none (every device at the median speed, always available: the clock without heterogeneity) |
  deadline (log-normal speeds, sigma 1, and a deadline of 8 s: each client runs the local steps that fit) |
  diurnal (median speeds; each client available 8 h a day in its own time zone, rounds every 30 min) |
  speeds (log-normal speeds, sigma 1, no deadline: a synchronous round waits for its slowest client);
  fedbuff | fedbuff_sam (FedBuff, SGD / SAM clients: 5 clients training at once, a server step every 3 arrivals,
  staleness 1 / sqrt(1 + tau), at most 8; settings 'speeds' and 'none' only);
  fedasync (FedAsync, Xie et al. 2019: 5 clients training at once, a server step on every arrival mixing the
  client's model in with weight 0.6 / sqrt(1 + tau), staleness at most 8; settings 'speeds' and 'none' only);
  rounds=<int> (0, the default: 50; FedBuff 83 server steps, FedAsync 250: the client updates of 50 rounds of 5)
CELLS: the five synchronous methods x none, deadline, diurnal; fedavg, fedsam, fedbuff, fedbuff_sam, fedasync x
speeds.

The setting: configs/quickstart.py (20 clients of 71 digits, Dirichlet 0.5, 5 a round, digits_cnn of 76,522
params, client lr 0.05, batch 16, one epoch = 5 local steps) on a clock of median 20 examples/s, 10 Mbps down and
1 Mbps up (a 306 KB float32 model: 0.24 s down, 2.45 s up). A SGD step of 16 examples takes 0.8 s at the median,
a SAM / ASAM step 1.6 s (two forward+backward passes): under the 8 s deadline (5.3 s of compute after the
transfers) a median SGD client runs its 5 steps, a median SAM client 3. No published number applies: this is the
question of the FedSAM thesis' future work (7.2.1, the cost of SAM on constrained devices), not a paper table.
"""
import os

from fedjax_flat.config import families as config_strings

HERE = os.path.dirname(os.path.abspath(__file__))   # the twin: configs/quickstart.py

FAMILY = 'configs/system.py'
METHODS = ('fedavg', 'fedprox', 'fednova', 'fedsam', 'fedasam', 'fedbuff', 'fedbuff_sam', 'fedasync')
SETTINGS = ('none', 'deadline', 'diurnal', 'speeds')
ASYNC = ('fedbuff', 'fedbuff_sam', 'fedasync')
FIELDS = {
    'method': ('fedavg', METHODS),
    'setting': ('none', SETTINGS),
    'rounds': (0, int),
}
CELLS = ([f'{m},{s}' for s in SETTINGS[:3] for m in METHODS[:5]]
         + [f'{m},speeds' for m in ('fedavg', 'fedsam') + ASYNC])
CLIENT = {'fedsam': {'optimizer': 'sam', 'rho': 0.05}, 'fedbuff_sam': {'optimizer': 'sam', 'rho': 0.05},
          'fedasam': {'optimizer': 'asam', 'rho': 0.7, 'asam_eta': 0.2}}
ALGORITHM = {'fedprox': ('fedprox', {'mu': 0.01}), 'fednova': ('fednova', {}),
             'fedbuff': ('fedbuff', {'buffer': 3, 'concurrency': 5, 'max_staleness': 8}),
             'fedbuff_sam': ('fedbuff', {'buffer': 3, 'concurrency': 5, 'max_staleness': 8}),
             'fedasync': ('fedasync', {'alpha': 0.6, 'concurrency': 5, 'max_staleness': 8})}
# Server steps: FedBuff's of 3 arrivals, FedAsync's of one: the client updates of 50 rounds of 5 either way.
ROUNDS = {'fedbuff': 83, 'fedbuff_sam': 83, 'fedasync': 250}
CLOCK = {'speed': 'lognormal', 'speed_median': 20.0, 'speed_sigma': 0.0, 'up_mbps': 1.0, 'down_mbps': 10.0}
SETTING = {'none': {},
           'deadline': {'speed_sigma': 1.0, 'deadline_s': 8.0, 'min_steps': 1},
           'diurnal': {'availability': 'diurnal', 'window_start_h': 0.0, 'window_h': 8.0,
                       'round_duration_s': 1800.0},
           'speeds': {'speed_sigma': 1.0}}


def get_config(arg: str = ''):
  o = config_strings.parse(arg, FIELDS, family=FAMILY)
  if o['rounds'] < 0:
    raise config_strings.ConfigStringError(FAMILY, f'rounds={o["rounds"]}', 'rounds must be >= 1 (0: the default)')
  if o['method'] in ASYNC and o['setting'] not in ('none', 'speeds'):
    raise config_strings.ConfigStringError(FAMILY, o['setting'], f'{o["method"]} takes server steps on arrivals: no '
                                           "deadline nor availability; use setting 'speeds' or 'none'")
  algorithm, hp = ALGORITHM.get(o['method'], ('', {}))
  c = config_strings.load_module(os.path.join(HERE, 'quickstart.py')).get_config(algorithm)
  c.algo.update(hp)
  for k, v in CLIENT.get(o['method'], {}).items():
    c.client[k] = v
  c.rounds = o['rounds'] or ROUNDS.get(o['method'], 50)
  for k, v in {**CLOCK, **SETTING[o['setting']]}.items():
    c.system[k] = v
  return c
