r"""Issue 51 item 5 (benchmarks/studies/README.security.md): FedAvg / FedSAM (/ FedASAM) x model-poisoning attacks x
robust aggregators on the embedded digits, as one sweep.

  python experiments/sweep.py --sweep=configs/sweeps/security_digits.py:part=main --sweep_dir=runs/security/main \
      --parallel=1 --batch_runs=auto
  parts: main (SGD and SAM clients x {none, sign_flip, alie, backdoor} x {mean, median, krum, centered_clipping},
  30% attackers), ten (SGD and SAM x {sign_flip, backdoor} x {mean, median}, 10% attackers), asam (ASAM clients x
  {none, sign_flip, alie, backdoor} x {mean, median}, 30%; run it without --batch_runs: its sign_flip / mean seed 1
  diverges, and under --batch_runs that ended the sweep). Keys: part, rounds (default 40), seeds (e.g. 0+1).

Setting: configs/quickstart.py (20 clients, Dirichlet 0.5, 5 a round, digits_cnn, client SGD lr 0.05), 40 rounds,
evaluation every 5 rounds, last-K = the last 2 evaluations (rounds 35, 40). SAM rho 0.1 and ASAM rho 0.7 eta 0.2
(configs/sweeps/flat_minima_digits.py). Attacks: sign_flip scale 3 (send -3 u), alie z = 1, backdoor boost 5 with
a 3x3 trigger at (1, 1) on half of each attacker's examples, target label 0. Defences: mean; coordinate-wise
median; Krum with f = 1 (the most clients_per_round = 5 admits: 5 > 2 f + 2); centered clipping tau 1, 1 iteration.
DP is not a defence cell: the library refuses DP with a model-poisoning attack (docs/security.md, Refusals).
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
}
PARTS = {
    'main': (('fedavg', 'fedsam'), ('none', 'sign_flip', 'alie', 'backdoor'), ('mean', 'median', 'krum', 'cc'), 0.3),
    'ten': (('fedavg', 'fedsam'), ('sign_flip', 'backdoor'), ('mean', 'median'), 0.1),
    'asam': (('fedasam',), ('none', 'sign_flip', 'alie', 'backdoor'), ('mean', 'median'), 0.3),
}


def get_sweep(arg: str = ''):
  opts = dict(item.partition('=')[::2] for item in filter(None, arg.split(',')))
  part = opts.pop('part', 'main')
  rounds = int(opts.pop('rounds', 40))
  seeds = [int(s) for s in opts.pop('seeds', '0+1').split('+')]
  if opts or part not in PARTS:
    raise ValueError(f'bad {arg!r}: keys part ({"|".join(PARTS)}), rounds, seeds')
  methods, attacks, defences, fraction = PARTS[part]
  grid = []
  for m in methods:
    for a in attacks:
      for d in defences:
        cell = dict(name=f'{m}-{a}-{d}' + ('' if a == 'none' else f'-f{fraction:g}'),
                    config='configs/quickstart.py', **METHODS[m], **ATTACKS[a], **DEFENCES[d])
        if a != 'none':
          cell['attack.fraction'] = fraction
        grid.append(cell)
  return dict(
      name=f'security_digits_{part}',
      description='Flatness x attacks x robust aggregators on the digits (README.security.md)',
      fixed={'rounds': rounds, 'eval_every': 5, 'summary_last_k': 2},
      grid=grid,
      seeds=seeds,
  )
