r"""Issue 51 item 5 (benchmarks/studies/README.security.md): FedAvg / FedSAM (/ FedASAM) x model-poisoning attacks x
robust aggregators on the embedded digits, as one sweep.

  python experiments/sweep.py --sweep=configs/sweeps/security_digits.py:part=main --sweep_dir=runs/security/main \
      --parallel=1 --batch_runs=auto
  parts: main (SGD and SAM clients x {none, sign_flip, alie, backdoor} x {mean, median, krum, centered_clipping,
  dp}, 30% attackers), ten (SGD and SAM x {sign_flip, alie, backdoor} x the five defences, 10% attackers), asam
  and asam_ten (ASAM clients, the same at 30% and 10%; sign_flip with the mean diverges on seeds 1-2: those runs
  are listed as failed and the sweep goes on), standin, standin_asam, standin_ten (the CIFAR stand-in below).
  Keys: part, rounds (default 40; 80 for the standin parts), seeds (e.g. 0+1), and methods= / attacks= /
  defences= (a+b) for a subset of the part's grid.

Setting: configs/quickstart.py (20 clients, Dirichlet 0.5, 5 a round, digits_cnn, client SGD lr 0.05), 40 rounds,
evaluation every 5 rounds, last-K = the last 2 evaluations (rounds 35, 40). SAM rho 0.1 and ASAM rho 0.7 eta 0.2
(configs/sweeps/flat_minima_digits.py). Attacks: sign_flip scale 3 (send -3 u), alie z = 1, backdoor boost 5 with
a 3x3 trigger at (1, 1) on half of each attacker's examples, target label 0. Defences: mean; coordinate-wise
median; Krum with f = 1 (the most clients_per_round = 5 admits: 5 > 2 f + 2); centered clipping tau 1, 1 iteration.
dp: central DP as the defence (the server clips every upload it receives, attackers' included, and adds the
noise; docs/security.md), configs/dp.py's digits setting at epsilon 8, uniform client weights.

part=standin: the same grid on the CIFAR stand-in (configs/cifar_standin.py: digits32 at 32x32x3, the paper's
CIFAR CNN, 20 clients at Dirichlet 0.5, 5 a round; benchmarks/studies/README.standin.md), 80 rounds (at 40 it has
barely left chance), evaluation every 10, last-K = rounds 70 and 80; SGD and SAM clients with the stand-in study's
rho 0.05; the four attacks x the five defences at 30% (the study ran sign flip with centered clipping and DP
only); the backdoor trigger 4x4 at (2, 2), one upsampled digit pixel. standin_asam: ASAM clients (the stand-in
study's rho 0.5, eta 0.2), the same grid; standin_ten: the three methods x {sign_flip, alie, backdoor} x the five
defences at 10% attackers.
"""

METHODS = {
    'fedavg': {'client.optimizer': 'sgd'},
    'fedsam': {'client.optimizer': 'sam', 'client.rho': 0.1},
    'fedasam': {'client.optimizer': 'asam', 'client.rho': 0.7, 'client.asam_eta': 0.2},
}
ATTACKS = {
    'none': {},
    'sign_flip': {'attack.kind': 'sign_flip', 'attack.scale': 3.0},
    'alie': {'attack.kind': 'alie', 'attack.scale': 1.0},
    'backdoor': {'attack.kind': 'backdoor', 'attack.scale': 5.0, 'attack.target_label': 0, 'attack.trigger_size': 3,
                 'attack.trigger_row': 1, 'attack.trigger_col': 1, 'attack.poison_fraction': 0.5},
}
DEFENCES = {
    'mean': {'server.aggregator': 'mean'},
    'median': {'server.aggregator': 'median'},
    'krum': {'server.aggregator': 'krum', 'server.krum_f': 1},
    'cc': {'server.aggregator': 'centered_clipping', 'server.cc_tau': 1.0, 'server.cc_iters': 1},
    # Central DP as the defence (docs/security.md): the server clips every upload it receives to C and adds the
    # noise; configs/dp.py's digits setting at epsilon 8 (clip 0.5, delta 1e-5, noise sized for 100 clients a
    # round of 10,000), uniform client weights as DP requires.
    'dp': {'server.aggregator': 'mean', 'server.weighting': 'uniform', 'dp.mode': 'central', 'dp.clip': 0.5,
           'dp.delta': 1e-5, 'dp.noise_cohort': 100, 'dp.population': 10_000, 'dp.target_epsilon': 8.0},
}
_ALL = ('mean', 'median', 'krum', 'cc', 'dp')
PARTS = {
    'main': (('fedavg', 'fedsam'), ('none', 'sign_flip', 'alie', 'backdoor'), _ALL, 0.3),
    'ten': (('fedavg', 'fedsam'), ('sign_flip', 'alie', 'backdoor'), _ALL, 0.1),
    'asam': (('fedasam',), ('none', 'sign_flip', 'alie', 'backdoor'), _ALL, 0.3),
    'asam_ten': (('fedasam',), ('sign_flip', 'alie', 'backdoor'), _ALL, 0.1),
    'standin': (('fedavg', 'fedsam'), ('none', 'sign_flip', 'alie', 'backdoor'), _ALL, 0.3),
    'standin_asam': (('fedasam',), ('none', 'sign_flip', 'alie', 'backdoor'), _ALL, 0.3),
    'standin_ten': (('fedavg', 'fedsam', 'fedasam'), ('sign_flip', 'alie', 'backdoor'), _ALL, 0.1),
}
# Per part: base config, default rounds, evaluation period, and what the part changes in METHODS / ATTACKS.
_STANDIN = ('configs/cifar_standin.py', 80, 10,
            {'fedsam': {'client.rho': 0.05}, 'fedasam': {'client.rho': 0.5}},
            {'backdoor': {'attack.trigger_size': 4, 'attack.trigger_row': 2, 'attack.trigger_col': 2}})
BASES = {'standin': _STANDIN, 'standin_asam': _STANDIN, 'standin_ten': _STANDIN}
_DIGITS = ('configs/quickstart.py', 40, 5, {}, {})


def get_sweep(arg: str = ''):
  opts = dict(item.partition('=')[::2] for item in filter(None, arg.split(',')))
  part = opts.pop('part', 'main')
  config, default_rounds, eval_every, method_over, attack_over = BASES.get(part, _DIGITS)
  rounds = int(opts.pop('rounds', default_rounds))
  seeds = [int(s) for s in opts.pop('seeds', '0+1').split('+')]
  if part not in PARTS:
    raise ValueError(f'bad {arg!r}: keys part ({"|".join(PARTS)}), rounds, seeds, methods, attacks, defences')
  methods, attacks, defences, fraction = PARTS[part]
  # A subset of the part's grid (cells added to a part run on their own): methods=, attacks=, defences= (a+b).
  pick = {}
  for key, allowed in (('methods', methods), ('attacks', attacks), ('defences', defences)):
    got = tuple(opts.pop(key).split('+')) if key in opts else allowed
    if not set(got) <= set(allowed):
      raise ValueError(f'bad {key}={"+".join(got)} for part={part}: choose from {"+".join(allowed)}')
    pick[key] = got
  if opts:
    raise ValueError(f'bad {arg!r}: unknown keys {sorted(opts)}; keys part, rounds, seeds, methods, attacks, defences')
  methods, attacks, defences = pick['methods'], pick['attacks'], pick['defences']
  grid = []
  for m in methods:
    for a in attacks:
      for d in defences:
        cell = dict(name=f'{m}-{a}-{d}' + ('' if a == 'none' else f'-f{fraction:g}'), config=config,
                    **{**METHODS[m], **method_over.get(m, {})}, **{**ATTACKS[a], **attack_over.get(a, {})},
                    **DEFENCES[d])
        if a != 'none':
          cell['attack.fraction'] = fraction
        grid.append(cell)
  return dict(
      name=f'security_digits_{part}',
      description='Flatness x attacks x robust aggregators on the ' + (
          'CIFAR stand-in' if part.startswith('standin') else 'digits') + ' (README.security.md)',
      fixed={'rounds': rounds, 'eval_every': eval_every, 'summary_last_k': 2},
      grid=grid,
      seeds=seeds,
  )
