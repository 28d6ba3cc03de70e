r"""FedAvg vs FedSeq (random / greedy grouping) vs FedAsyncSeq vs FedSeq2Par vs FedCyclic on the embedded digits at
alpha = 0, the same number of model updates per round (configs/fedseq_digits.py), several seeds.

Per run: the mean test accuracy of the last 50 rounds (evaluated every round), the final accuracy, the rounds
to reach 70% / 90% of the centralized accuracy (summary.json's rounds_to_<70|90>pct_centralized with
config.centralized.window = 5: the first round whose mean over the last 5 evaluations reaches it, the reference
code's rule), local steps and chains per round, communication (S2C / C2S / C2C messages).
Reference: the centralized upper bound (training/centralized.py: the union of the clients' data, SGD momentum
0.9, cosine lr from the clients' 0.05, batch 16, --centralized_epochs epochs), one run per seed, their mean
final test accuracy; --reference=<accuracy> replaces it.

Superclients: grouping/superclients.build_superclients with each cell's grouping (random; psi_clf + greedy with
the cosine distance for fedseq_greedy; ICG on psi_clf for FedSeq2Par's regroupings).

  python -m benchmarks.studies.fedseq_digits [--seeds=0,1,2] [--rounds=200] [--methods=...] [--json=PATH] [--md=PATH]

--attack=<classes>: instead, the label-flipping comparison (Table 5.5's protocol on digits): FedAvg and FedSeq,
clean and attacked (L_S = --ls, L = --l, --swap), alpha = --alpha; the drop = attacked - clean per seed.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from benchmarks.paths import REPO

from absl import app, flags
import numpy as np

from fedjax_flat.data import registry as data_registry
from fedjax_flat.training import centralized, trainers
from fedjax_flat.config import families as config_strings

_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'training seeds')
_ROUNDS = flags.DEFINE_integer('rounds', 200, 'rounds per run')
_METHODS = flags.DEFINE_list('methods', ['fedavg', 'fedseq', 'fedseq_greedy', 'fedasyncseq', 'fedseq2par',
                                         'fedcyclic'], 'rows (fedseq_greedy: FedSeq with psi_clf + greedy)')
_REFERENCE = flags.DEFINE_float('reference', 0.0, 'reference accuracy for rounds-to-70/90% (0 = centralized)')
_CENTRAL_EPOCHS = flags.DEFINE_integer('centralized_epochs', 40, 'epochs of the centralized reference runs')
_JSON = flags.DEFINE_string('json', os.path.join(REPO, 'benchmarks', 'fedseq_digits.json'),
                            'results JSON (with --attack the default is benchmarks/studies/fedseq_digits_attack.json)')
_MD = flags.DEFINE_string('md', None, 'also write the Markdown table here')
_ATTACK = flags.DEFINE_string('attack', '', "label-flipping comparison with these classes (e.g. '0,2,3,5')")
_LS = flags.DEFINE_float('ls', 0.5, 'L_S: fraction of malicious superclients')
_L = flags.DEFINE_float('l', 0.5, 'L: fraction of attackers inside a malicious superclient')
_SWAP = flags.DEFINE_string('swap', 'fixed', "'fixed' | 'random'")
_ALPHA = flags.DEFINE_float('alpha', 100.0, 'Dirichlet alpha of the attack comparison (Table 5.5: 100)')
LAST = 50


def cell(method):
  return {'fedseq_greedy': 'fedseq,grouping=greedy'}.get(method, method)


def centralized_reference(data, seeds, workdir):
  """Per seed: the centralized upper bound of the digits config (training/centralized.py) -> final accuracy."""
  out = {}
  for seed in seeds:
    c = config_strings.load_config(os.path.join(REPO, 'configs', 'fedseq_digits.py:fedavg'))
    c.seed = seed
    c.centralized.epochs = _CENTRAL_EPOCHS.value
    res = centralized.train(c, os.path.join(workdir, f'centralized_{seed}'), data=data)
    out[seed] = float(res['final_test_accuracy'])
    print(f"centralized seed {seed}: {_CENTRAL_EPOCHS.value} epochs, final {out[seed]:.4f} "
          f"(best {res['best_test_accuracy']:.4f})", flush=True)
  return out


def run_one(method, seed, data, workdir, attack=None, reference=None):
  c = config_strings.load_config(os.path.join(REPO, 'configs', f'fedseq_digits.py:{cell(method)}'))
  c.seed = seed
  c.data.alpha = float(data.alpha) if hasattr(data, 'alpha') else c.data.alpha
  if attack:
    c.attack.update(attack)
  c.rounds = _ROUNDS.value
  c.eval_every = 1
  c.summary_last_k = LAST
  c.progress_every_s = 1e9
  if reference:
    c.centralized.accuracy, c.centralized.window = float(reference), 5
  t0 = time.time()
  t = trainers.make_trainer(c, workdir, data=data)
  s = t.train()
  row = {'method': method, 'seed': seed, 'last': s[f'mean_last_{LAST}_test_accuracy'], 'attack': s.get('attack'),
         'final': s['final_test_accuracy'], 'wall_s': time.time() - t0,
         'rounds_to_70': s.get('rounds_to_70pct_centralized'), 'rounds_to_90': s.get('rounds_to_90pct_centralized'),
         'accuracy_curve': [[r['round'], r['test_accuracy']] for r in t.records]}
  if 'fedseq' in s:
    f = s['fedseq']
    row.update({'local_steps_per_round': f['mean_local_steps_per_round'],
                'clients_per_round': f['mean_clients_per_round'], 'chains_per_round': f['mean_chains_per_round'],
                'mean_num_superclients': f['mean_num_superclients'], 'comm': f['comm_messages_per_round']})
  else:
    steps = np.ceil(data.client_sizes() / c.client.batch_size) * c.client.local_epochs
    n = c.clients_per_round
    row.update({'local_steps_per_round': float(steps.mean() * n), 'clients_per_round': n,
                'chains_per_round': n, 'mean_num_superclients': None,
                'comm': {'s2c': n, 'c2s': n, 'c2c': 0}})
  return row


def attack_main():
  """FedAvg and FedSeq, clean and attacked, per seed; the drop is attacked - clean (same seed)."""
  c0 = config_strings.load_config(os.path.join(REPO, 'configs', 'fedseq_digits.py:fedavg'))
  c0.data.alpha = _ALPHA.value
  data = data_registry.get_dataset(c0.dataset, **c0.data.to_dict())
  data.alpha = _ALPHA.value
  attack = {'kind': 'label_flip', 'classes': _ATTACK.value, 'swap': _SWAP.value,
            'malicious_superclients': _LS.value, 'attackers': _L.value}
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for seed in map(int, _SEEDS.value):
      for m in ('fedavg', 'fedseq'):
        clean = run_one(m, seed, data, os.path.join(tmp, f'{m}_{seed}_clean'))
        att = run_one(m, seed, data, os.path.join(tmp, f'{m}_{seed}_att'), attack)
        rows.append({'method': m, 'seed': seed, 'clean': clean['last'], 'attacked': att['last'],
                     'drop': att['last'] - clean['last'], 'attack': att['attack']})
        print(f"{m} seed {seed}: clean {clean['last']:.4f} attacked {att['last']:.4f} "
              f"drop {att['last'] - clean['last']:+.4f} ({att['attack']['num_attackers']} attackers, "
              f"{att['attack']['flipped_examples']} labels)", flush=True)
  lines = [f"digits alpha={_ALPHA.value:g}, 100 clients, {_ROUNDS.value} rounds, seeds {','.join(_SEEDS.value)}; "
           f"label flipping classes {_ATTACK.value} ({_SWAP.value}), L_S={_LS.value:g}, L={_L.value:g} "
           f"(FedAvg: {_LS.value * _L.value:g} of the clients holding a swapped class)", '',
           '| method | clean last-50 | attacked last-50 | drop (mean ± std) | drops per seed | attackers | '
           'flipped labels |', '|---|---|---|---|---|---|---|']
  for m in ('fedavg', 'fedseq'):
    rs = [r for r in rows if r['method'] == m]
    d = [r['drop'] for r in rs]
    ms = lambda k: f"{np.mean([r[k] for r in rs]):.4f} ± {np.std([r[k] for r in rs]):.4f}"   # noqa: E731
    lines.append(f"| {m} | {ms('clean')} | {ms('attacked')} | {np.mean(d):+.4f} ± {np.std(d):.4f} | "
                 f"{' / '.join(f'{x:+.4f}' for x in d)} | "
                 f"{' / '.join(str(r['attack']['num_attackers']) for r in rs)} | "
                 f"{' / '.join(str(r['attack']['flipped_examples']) for r in rs)} |")
  table = '\n'.join(lines)
  print(table)
  path = _JSON.value if flags.FLAGS['json'].present else os.path.join(REPO, 'benchmarks', 'fedseq_digits_attack.json')
  if path:
    with open(path, 'w') as f:
      json.dump({'rows': rows, 'table': table, 'uptime': os.popen('uptime').read()}, f, indent=1)
  if _MD.value:
    with open(_MD.value, 'w') as f:
      f.write(table + '\n')


def main(argv):
  del argv
  if _ATTACK.value:
    return attack_main()
  methods = _METHODS.value
  seeds = [int(s) for s in _SEEDS.value]
  c0 = config_strings.load_config(os.path.join(REPO, 'configs', 'fedseq_digits.py:fedavg'))
  data = data_registry.get_dataset(c0.dataset, **c0.data.to_dict())
  rows, central = [], {}
  with tempfile.TemporaryDirectory() as tmp:
    if _REFERENCE.value:
      ref, ref_note = _REFERENCE.value, 'given (--reference)'
    else:
      central = centralized_reference(data, seeds, tmp)
      ref = float(np.mean(list(central.values())))
      ref_note = (f'centralized, mean final test accuracy of {len(seeds)} seeds ({_CENTRAL_EPOCHS.value} epochs, '
                  f'SGD momentum 0.9, cosine lr 0.05, batch 16; std {np.std(list(central.values())):.4f})')
    for seed in seeds:
      for m in methods:
        row = run_one(m, seed, data, os.path.join(tmp, f'{m}_{seed}'), reference=ref)
        rows.append(row)
        print(f"{m:14s} seed {seed}: last-{LAST} {row['last']:.4f} final {row['final']:.4f} "
              f"steps/round {row['local_steps_per_round']:.1f} rounds to 70/90% {row['rounds_to_70']}/"
              f"{row['rounds_to_90']} ({row['wall_s']:.0f} s)", flush=True)
  lines = [f'digits alpha=0, 100 clients, C=0.2, {_ROUNDS.value} rounds, seeds {",".join(_SEEDS.value)}; '
           f'reference {ref:.4f} = {ref_note}',
           '', '| method | last-50 acc (mean ± std) | final acc | rounds to 70% | rounds to 90% | local steps / round '
           '| chains / round | mean N_S | S2C / C2S / C2C per round |', '|---|---|---|---|---|---|---|---|---|']
  for m in methods:
    rs = [r for r in rows if r['method'] == m]
    fmt_r = lambda k: ' / '.join('-' if r[k] is None else str(r[k]) for r in rs)   # noqa: E731
    comm = rs[0]['comm']
    ns = rs[0]['mean_num_superclients']
    lines.append(f"| {m} | {np.mean([r['last'] for r in rs]):.4f} ± {np.std([r['last'] for r in rs]):.4f} | "
                 f"{np.mean([r['final'] for r in rs]):.4f} | {fmt_r('rounds_to_70')} | {fmt_r('rounds_to_90')} | "
                 f"{np.mean([r['local_steps_per_round'] for r in rs]):.1f} | "
                 f"{np.mean([r['chains_per_round'] for r in rs]):.2f} | {'-' if ns is None else f'{ns:.1f}'} | "
                 f"{comm['s2c']:.1f} / {comm['c2s']:.1f} / {comm['c2c']:.1f} |")
  table = '\n'.join(lines)
  print(table)
  doc = {'reference': ref, 'reference_note': ref_note, 'centralized': central, 'uptime': os.popen('uptime').read(),
         'rows': rows, 'table': table}
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(doc, f, indent=1)
  if _MD.value:
    with open(_MD.value, 'w') as f:
      f.write(table + '\n')


if __name__ == '__main__':
  app.run(main)
