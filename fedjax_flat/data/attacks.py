"""Attacks (config.attack): the malicious clients' roles. `attack.kind`:

  'label_flip'   data poisoning (below): attackers swap pairs of labels in their own training data.
  'sign_flip' | 'scale' | 'gaussian' | 'alie' | 'ipm' | 'backdoor'
                 model poisoning: a fraction `attack.fraction` of the population (floor(fraction N) clients, drawn
                 from config.seed: `malicious_clients`) rewrites its upload, a model delta, where the server sees
                 the cohort (algorithms/wrappers/attack.py has the formulas; `attack.scale` is the strength).
                 'backdoor' (Bagdasaryan et al. 2020) also poisons the malicious clients' data here: a fraction
                 `poison_fraction` of each one's examples carries the pixel-pattern trigger (`stamp_trigger`: a
                 trigger_size square at (trigger_row, trigger_col) set to the data's largest value) and the label
                 `target_label`; the evaluation (training/evals/attack.py) reports the attack success rate, the
                 accuracy toward target_label on the triggered test images whose label is not the target.

Label-flipping attack (thesis 5.2.4, Table 5.5; Tolpegin et al. [418]): attackers swap pairs of labels in
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

from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import INPUT, RESULT, VALUE, Choice, Field, Int, Num, Section, String, Test, is_number

MODEL_POISONING = ('sign_flip', 'scale', 'gaussian', 'alie', 'ipm', 'backdoor')   # rewrite a model delta
KINDS = ('none', 'label_flip') + MODEL_POISONING
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


def malicious_clients(num_clients: int, fraction: float, seed: int) -> np.ndarray:
  """The model-poisoning attackers: floor(fraction N) client ids (sorted), a function of the seed alone."""
  m = int(math.floor(float(fraction) * int(num_clients) + 1e-9))
  rng = np.random.default_rng([int(seed), ATTACK_STREAM, 2])
  return np.sort(rng.permutation(int(num_clients))[:m]).astype(np.int64)


def trigger_value(x: np.ndarray):
  """The trigger's pixel value: the largest the data holds (white), 255 for uint8 images."""
  x = np.asarray(x)
  return np.iinfo(x.dtype).max if np.issubdtype(x.dtype, np.integer) else float(np.max(x))


def stamp_trigger(x: np.ndarray, cfg, value) -> np.ndarray:
  """A copy of images x [N, H, W, C] with the trigger: the trigger_size square at (trigger_row, trigger_col)
  set to `value` in every channel."""
  r, c, s = int(cfg.trigger_row), int(cfg.trigger_col), int(cfg.trigger_size)
  out = np.array(x, copy=True)
  out[:, r:r + s, c:c + s, ...] = value
  return out


def triggered_test(x: np.ndarray, y: np.ndarray, cfg, value):
  """(triggered images, target labels) of the test images whose label is not the target: the backdoor's attack
  success rate is the accuracy on them."""
  keep = np.asarray(y).reshape(len(y), -1)[:, 0] != int(cfg.target_label)
  xt = stamp_trigger(np.asarray(x)[keep], cfg, value)
  return xt, np.full(int(keep.sum()), int(cfg.target_label), np.asarray(y).dtype)


def check_data(cfg, data) -> Optional[Tuple[str, object, str]]:
  """(field, value, why) of the first config.attack value the data cannot take, else None (one line, before
  anything compiles: config/validate.py)."""
  if cfg.kind == 'label_flip':
    why = check_classes(cfg.classes, data.num_classes)
    return ('attack.classes', cfg.classes, why) if why else None
  if cfg.kind == 'backdoor':
    if int(cfg.target_label) >= int(data.num_classes):
      return ('attack.target_label', cfg.target_label, f'must be a class of the data, in [0, {data.num_classes})')
    shape = tuple(np.asarray(data.x).shape[1:]) if getattr(data, 'store', None) is None else ()
    if len(shape) != 3:
      return ('attack.kind', cfg.kind, f'the pixel-pattern trigger needs images [H, W, C]; this data has examples '
              f'of shape {shape}')
    r, c, s = int(cfg.trigger_row), int(cfg.trigger_col), int(cfg.trigger_size)
    if r + s > shape[0] or c + s > shape[1]:
      return ('attack.trigger_size', s, f'the trigger at (trigger_row={r}, trigger_col={c}) of size {s} leaves the '
              f'{shape[0]}x{shape[1]} image: need trigger_row + trigger_size <= {shape[0]} and trigger_col + '
              f'trigger_size <= {shape[1]}')
  return None


def apply_model_poisoning(data, cfg, seed: int):
  """(data, report) for the model-poisoning kinds: the attackers; 'backdoor' also poisons a poison_fraction of
  each attacker's examples (trigger + target label) in a copy of the data."""
  attackers = malicious_clients(data.num_clients, cfg.fraction, seed)
  report = {'kind': cfg.kind, 'fraction': float(cfg.fraction), 'scale': float(cfg.scale),
            'num_attackers': int(len(attackers)), 'attackers': [{'client': int(k)} for k in attackers],
            'fraction_clients': len(attackers) / max(data.num_clients, 1)}
  if cfg.kind != 'backdoor' or not len(attackers):
    return data, report
  bad = check_data(cfg, data)
  if bad:
    raise ConfigError(*bad)
  rng = np.random.default_rng([int(seed), ATTACK_STREAM, 3])
  value = trigger_value(data.x)
  x, y = np.array(data.x, copy=True), np.array(data.y, copy=True)
  poisoned_rows = 0
  for row in report['attackers']:
    idx = data.client_indices(row['client'])
    pick = np.sort(rng.choice(idx, int(math.floor(float(cfg.poison_fraction) * len(idx) + 1e-9)), replace=False))
    x[pick] = stamp_trigger(x[pick], cfg, value)
    y[pick] = int(cfg.target_label)
    row['poisoned'] = int(len(pick))
    poisoned_rows += len(pick)
  out = copy.copy(data)
  out.x, out.y = x, y
  report.update({'target_label': int(cfg.target_label), 'poisoned_examples': int(poisoned_rows),
                 'trigger': {'row': int(cfg.trigger_row), 'col': int(cfg.trigger_col), 'size': int(cfg.trigger_size),
                             'value': float(value)}})
  return out, report


def apply(data, cfg, seed: int, superclients: Optional[Sequence[np.ndarray]] = None):
  """(poisoned copy of `data`, report dict). `cfg` is config.attack; `data` is never modified."""
  if cfg.kind in MODEL_POISONING:
    return apply_model_poisoning(data, cfg, seed)
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


def _flipping(cfg) -> bool:
  return cfg.attack.kind == 'label_flip'


def _poisoning(cfg) -> bool:
  return cfg.attack.kind in MODEL_POISONING


def _backdoor(cfg) -> bool:
  return cfg.attack.kind == 'backdoor'


def _fraction(v) -> bool:
  return is_number(v) and 0 < v <= 1      # nan compares False


_FLIP = "attack.kind='label_flip'"
_POISON = 'attack.kind=' + ' | '.join(repr(k) for k in MODEL_POISONING)
_BACKDOOR = "attack.kind='backdoor'"


def _population_fraction(v) -> bool:
  return is_number(v) and 0 <= v < 1


SECTION = Section('attack', (
    Field('kind', Choice('none', KINDS), "'none' | 'label_flip' (data) | 'sign_flip' | 'scale' | 'gaussian' | 'alie' "
          "| 'ipm' | 'backdoor' (model poisoning: algorithms/wrappers/attack.py)"),
    Field('malicious_superclients', Test(0.1, ok=_fraction, message='must be a fraction in (0, 1]',
                                         what='fraction in (0, 1]'), 'label_flip: L_S', when=_flipping,
          needs=_FLIP, tags={INPUT}),
    Field('attackers', Test(0.1, ok=_fraction, message='must be a fraction in (0, 1]', what='fraction in (0, 1]'),
          'label_flip: L', when=_flipping, needs=_FLIP, tags={INPUT}),
    Field('classes', Test('0,2', why=check_classes, what="ids '0,2' | 'intra_sc' | 'extra_sc'"),
          "label_flip: swapped classes: ids '0,2' | '3,5' | '0,2,3,5' ... | 'intra_sc' | 'extra_sc'", when=_flipping,
          needs=_FLIP, tags={INPUT}),
    Field('swap', Choice('fixed', SWAPS), "label_flip: 'fixed' (one pairing for every attacker) | 'random'",
          when=_flipping, needs=_FLIP, tags={INPUT}),
    Field('fraction', Test(0.1, ok=_population_fraction, message='must be a fraction in [0, 1)',
                           what='fraction in [0, 1)'),
          'model poisoning: the fraction of the population that is malicious (floor(fraction N) clients, drawn '
          'from the seed)', when=_poisoning, needs=_POISON, tags={INPUT}),
    Field('scale', Num(1.0, lo=0, lo_open=True), "model poisoning: the strength: the multiplier of 'sign_flip' "
          "(-s u) / 'scale' (s u) / 'backdoor' (model replacement's boost gamma), the std of 'gaussian', z of "
          "'alie', epsilon of 'ipm'", when=_poisoning, needs=_POISON, tags={VALUE}),
    Field('target_label', Int(0, lo=0), "backdoor: the label the trigger maps to", when=_backdoor,
          needs=_BACKDOOR),
    Field('trigger_size', Int(3, lo=1), 'backdoor: the side of the square pixel-pattern trigger', when=_backdoor,
          needs=_BACKDOOR),
    Field('trigger_row', Int(1, lo=0), "backdoor: the trigger's top row", when=_backdoor,
          needs=_BACKDOOR),
    Field('trigger_col', Int(1, lo=0), "backdoor: the trigger's left column", when=_backdoor,
          needs=_BACKDOOR),
    Field('poison_fraction', Test(0.5, ok=_fraction, message='must be a fraction in (0, 1]',
                                  what='fraction in (0, 1]'),
          "backdoor: the fraction of each attacker's examples carrying the trigger and the target label",
          when=_backdoor, needs=_BACKDOOR),
    Field('clean_workdir', String('', "must be a string (a run directory; '' = none)"),
          "the clean run's workdir: summary.json reports the accuracy drop", when=_attack_on),
), tags={RESULT}, doc='attacks: label flipping (thesis Table 5.5) and model poisoning (data/attacks.py)')
