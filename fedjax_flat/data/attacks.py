"""Label-flipping attack (thesis 5.2.4, Table 5.5; Tolpegin et al. [418]): attackers swap pairs of labels in
their own training data before training starts.

  FedSeq family: floor(L_S N_S) (at least 1) malicious superclients, drawn at random; inside each, a fraction
                 L of the clients that hold a swapped class (at least 1) are attackers.
  Other algorithms (FedAvg ...): the equivalent fraction L_S * L of the clients holding a swapped class.
  swap='fixed': every attacker uses the same pairing of `classes` (drawn once); 'random': each attacker draws
                its own pairing. A pairing pairs every class of the set once, honouring `constraints`
                (a class can only be paired inside its constraint group), as the reference code's
                `__createScramblePairs`.

Class sets (config.attack.classes): explicit ids '0,2' / '3,5' / '0,2,3,5' (the CIFAR-10 rows: airplane <->
bird, cat <-> dog, both), or the CIFAR-100 sets of Table 5.5, our choice (the thesis names examples only):
  intra_sc  20 classes, 4 from each of 5 superclasses, paired inside their superclass (dolphin <-> whale ...)
  extra_sc  20 classes, one per superclass, paired across superclasses (dolphin <-> rose ...)
CIFAR-100's superclasses are the official coarse labels (FINE_TO_COARSE).
Attackers, pairings and flip counts are a function of (config.seed, the superclients) and are written to
WORKDIR/attack.json. Departure from the reference code: its alpha = 0 branch (an example budget per swapped
class) is not reproduced; Table 5.5 is at alpha = 100. Its attacker pick among a superclient's "suitable"
clients indexes the wrong list (a bug); here attackers are drawn from the suitable clients, as intended.
"""
from __future__ import annotations

import copy
import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
from fedjax_flat.schema import RESULT, Choice, Field, Section, String, Test, is_number

KINDS = ('none', 'label_flip')
SWAPS = ('fixed', 'random')
ATTACK_STREAM = 0xA77

# Official CIFAR-100 fine label -> coarse label (superclass).
FINE_TO_COARSE = np.array([
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13], np.int64)

# intra_sc: aquatic mammals (dolphin, whale, otter, seal), fish (aquarium fish, flatfish, ray, shark), flowers
# (orchid, poppy, rose, sunflower), large carnivores (bear, leopard, lion, tiger), trees (maple, oak, palm, pine).
INTRA_SC = (30, 95, 55, 72, 1, 32, 67, 73, 54, 62, 70, 82, 3, 42, 43, 88, 47, 52, 56, 59)
# extra_sc: one class per superclass 0..19 (dolphin and rose for 0 and 2, else the lowest fine id).
EXTRA_SC = tuple(30 if c == 0 else 70 if c == 2 else int(np.flatnonzero(FINE_TO_COARSE == c)[0])
                 for c in range(20))
PRESETS = ('intra_sc', 'extra_sc')


def class_set(spec: str):
  """(classes, constraint groups) of a config.attack.classes string."""
  if spec == 'intra_sc':
    groups = {}
    for c in INTRA_SC:
      groups.setdefault(int(FINE_TO_COARSE[c]), []).append(c)
    return list(INTRA_SC), [tuple(g) for g in groups.values()]
  if spec == 'extra_sc':
    return list(EXTRA_SC), []
  classes = [int(t) for t in str(spec).split(',') if t.strip()]
  return classes, []


def check_classes(spec, num_classes: Optional[int] = None) -> Optional[str]:
  """None if the class-set string is usable, else why not (validation: one line, before any data)."""
  if spec in PRESETS:
    if num_classes is not None and num_classes != 100:
      return f'{spec} is a CIFAR-100 set (100 classes); this data has {num_classes}'
    return None
  try:
    classes = [int(t) for t in str(spec).split(',') if t.strip()]
  except ValueError:
    return f"expected comma-separated class ids (e.g. '0,2' or '0,2,3,5') or one of {list(PRESETS)}"
  if len(classes) < 2 or len(classes) % 2 or len(set(classes)) != len(classes):
    return 'an even number (>= 2) of distinct class ids: they are swapped in pairs'
  if min(classes) < 0 or (num_classes is not None and max(classes) >= num_classes):
    return f'class ids must be in [0, {num_classes if num_classes is not None else "num_classes"})'
  return None


def draw_pairs(classes: Sequence[int], constraints: Sequence[Sequence[int]], rng: np.random.Generator
               ) -> List[Tuple[int, int]]:
  """A random pairing of `classes` (each once) where a constrained class pairs inside its group."""
  pairs, used = [], set()
  for c in classes:
    if c in used:
      continue
    bucket = [d for d in classes if d != c and d not in used]
    groups = [set(g) for g in constraints if c in g]
    if groups:
      bucket = [d for d in bucket if any(d in g for g in groups)]
    if not bucket:
      raise ValueError(f'no partner left for class {c} under constraints {constraints}')
    d = int(bucket[rng.integers(len(bucket))])
    pairs.append((int(c), d))
    used.update((c, d))
  return pairs


def swap_labels(y: np.ndarray, pairs: Sequence[Tuple[int, int]]) -> Tuple[np.ndarray, List[int]]:
  """y with a <-> b for every pair (a simultaneous swap); also the number of flipped labels per pair."""
  out = np.array(y, copy=True)
  flips = []
  for a, b in pairs:
    ia, ib = y == a, y == b
    out[ia], out[ib] = b, a
    flips.append(int(ia.sum() + ib.sum()))
  return out, flips


def _suitable(data, clients, classes) -> List[int]:
  """Clients holding at least one example of a swapped class (only they can flip anything)."""
  cs = np.asarray(classes)
  return [int(k) for k in clients if np.isin(data.client_labels(int(k)), cs).any()]


def _count(fraction: float, n: int) -> int:
  return max(1, int(math.floor(float(fraction) * n + 1e-9)))


def choose_attackers(data, cfg, seed: int, superclients: Optional[Sequence[np.ndarray]] = None):
  """(attacker ids, malicious superclient indices) following the module docstring."""
  classes, _ = class_set(cfg.classes)
  rng = np.random.default_rng([int(seed), ATTACK_STREAM, 0])
  if superclients is None:
    suitable = _suitable(data, range(data.num_clients), classes)
    frac = float(cfg.malicious_superclients) * float(cfg.attackers)
    if not suitable:
      return [], []
    pick = rng.choice(len(suitable), _count(frac, len(suitable)), replace=False)
    return sorted(suitable[i] for i in pick), []
  n_mal = _count(cfg.malicious_superclients, len(superclients))
  malicious = sorted(int(i) for i in rng.choice(len(superclients), n_mal, replace=False))
  attackers = []
  for i in malicious:
    suitable = _suitable(data, superclients[i], classes)
    if suitable:
      pick = rng.choice(len(suitable), _count(cfg.attackers, len(suitable)), replace=False)
      attackers += [suitable[j] for j in pick]
  return sorted(attackers), malicious


def apply(data, cfg, seed: int, superclients: Optional[Sequence[np.ndarray]] = None):
  """(poisoned copy of `data`, report dict). `cfg` is config.attack; `data` is never modified."""
  classes, constraints = class_set(cfg.classes)
  attackers, malicious = choose_attackers(data, cfg, seed, superclients)
  rng = np.random.default_rng([int(seed), ATTACK_STREAM, 1])
  fixed = draw_pairs(classes, constraints, rng) if cfg.swap == 'fixed' else None
  y = np.array(data.y, copy=True)
  rows = []
  for k in attackers:
    pairs = fixed if fixed is not None else draw_pairs(classes, constraints, rng)
    idx = data.client_indices(k)
    y[idx], flips = swap_labels(data.y[idx], pairs)
    rows.append({'client': int(k), 'pairs': [list(p) for p in pairs], 'flips': flips})
  poisoned = copy.copy(data)
  poisoned.y = y
  sizes = np.asarray(data.client_sizes())
  report = {'kind': 'label_flip', 'classes': classes, 'swap': cfg.swap,
            'malicious_superclients': malicious, 'attackers': rows, 'num_attackers': len(rows),
            'fraction_clients': len(rows) / max(data.num_clients, 1),
            'flipped_examples': int(sum(sum(r['flips']) for r in rows)),
            'attacker_examples': int(sizes[attackers].sum()) if attackers else 0,
            'L_S': float(cfg.malicious_superclients), 'L': float(cfg.attackers),
            'level': 'superclients' if superclients is not None else 'clients (FedAvg equivalent L_S * L)'}
  return poisoned, report


def accuracy_drop(attacked: float, clean: float) -> float:
  """Table 5.5's drop: attacked minus clean accuracy (negative = the attack hurt)."""
  return float(attacked) - float(clean)


def enabled(config) -> bool:
  a = config.get('attack')
  return a is not None and a.kind != 'none'


def write_report(workdir: str, report: dict) -> None:
  import json
  import os
  with open(os.path.join(workdir, 'attack.json'), 'w') as f:
    json.dump(report, f, indent=1)


def summarize(config, summary: dict, report: Optional[dict]) -> None:
  """summary['attack']: the report without the per-attacker rows (WORKDIR/attack.json has them), and the
  accuracy drop against config.attack.clean_workdir's summary.json when given (Table 5.5)."""
  import json
  import os
  if report is None:
    return
  out = {k: v for k, v in report.items() if k != 'attackers'}
  clean_dir = config.attack.get('clean_workdir', '')
  path = os.path.join(clean_dir, 'summary.json') if clean_dir else ''
  key = next((k for k in summary if k.startswith('mean_last_') and k.endswith('_test_accuracy')), None)
  if path and os.path.isfile(path) and key:
    with open(path) as f:
      clean = json.load(f)
    if key in clean:
      out.update({'clean_workdir': clean_dir, 'clean_accuracy': clean[key], 'attacked_accuracy': summary[key],
                  'drop': accuracy_drop(summary[key], clean[key])})
  elif path:
    out['clean_workdir'] = clean_dir
    out['drop'] = None          # the clean run has not finished (no summary.json with the same metric)
  summary['attack'] = out


# config.attack: declared with the code that reads it (config/schema.py collects it)
def _attack_on(cfg) -> bool:
  return cfg.attack.kind != 'none'


def _fraction(v) -> bool:
  return is_number(v) and 0 < v <= 1      # nan compares False


SECTION = Section('attack', (
    Field('kind', Choice('none', KINDS), "'none' | 'label_flip'"),
    Field('malicious_superclients', Test(0.1, ok=_fraction, message='must be a fraction in (0, 1]',
                                         what='fraction in (0, 1]'), 'L_S', when=_attack_on),
    Field('attackers', Test(0.1, ok=_fraction, message='must be a fraction in (0, 1]', what='fraction in (0, 1]'),
          'L', when=_attack_on),
    Field('classes', Test('0,2', why=check_classes, what="ids '0,2' | 'intra_sc' | 'extra_sc'"),
          "swapped classes: ids '0,2' | '3,5' | '0,2,3,5' ... | 'intra_sc' | 'extra_sc'", when=_attack_on),
    Field('swap', Choice('fixed', SWAPS), "'fixed' (one pairing for every attacker) | 'random'",
          when=_attack_on),
    Field('clean_workdir', String('', "must be a string (a run directory; '' = none)"),
          "the clean run's workdir: summary.json reports the accuracy drop", when=_attack_on),
), tags={RESULT}, doc='label-flipping attack (data/py; thesis Table 5.5)')
