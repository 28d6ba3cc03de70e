"""Label-flipping attack (data/attacks.py): exactly the intended labels of exactly the intended clients."""
import json
import os

import ml_collections
import numpy as np
import pytest

from tests.fixtures.configs import small_config
from fedjax_flat.data import attacks
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.training import trainers


def dataset(num_clients=20, per_client=12, num_classes=10, seed=0):
  """Client k holds classes k % C and (k + 3) % C (6 examples each)."""
  rng = np.random.default_rng(seed)
  ys, groups, start = [], [], 0
  for k in range(num_clients):
    y = np.repeat([k % num_classes, (k + 3) % num_classes], per_client // 2)
    ys.append(y)
    groups.append(np.arange(start, start + len(y)))
    start += len(y)
  y = np.concatenate(ys).astype(np.int32)
  x = rng.normal(size=(len(y), 4, 4, 1)).astype(np.float32)
  return FederatedDataset.from_client_indices(x, y, groups, x[:20], y[:20], num_classes)


def attack_cfg(**kw):
  a = ml_collections.ConfigDict({'kind': 'label_flip', 'malicious_superclients': 0.5, 'attackers': 0.5,
                                 'classes': '0,2', 'swap': 'fixed', 'clean_workdir': ''})
  a.update(kw)
  return a


SUPER = [np.arange(0, 5), np.arange(5, 10), np.arange(10, 15), np.arange(15, 20)]


def check_flips(data, poisoned, report):
  attackers = {r['client']: r['pairs'] for r in report['attackers']}
  for k in range(data.num_clients):
    idx = data.client_indices(k)
    y, z = data.y[idx], poisoned.y[idx]
    if k not in attackers:
      np.testing.assert_array_equal(y, z)            # nobody else is touched
      continue
    expect = y.copy()
    for a, b in attackers[k]:
      expect[y == a], expect[y == b] = b, a
    np.testing.assert_array_equal(z, expect)          # exactly the swaps, both ways
  assert report['flipped_examples'] == int((data.y != poisoned.y).sum())
  assert np.array_equal(data.x, poisoned.x)


def test_superclient_attack_picks_and_swaps_exactly():
  data = dataset()
  poisoned, rep = attacks.apply(data, attack_cfg(), seed=3, superclients=SUPER)
  assert len(rep['malicious_superclients']) == 2                      # floor(0.5 * 4)
  for s in rep['malicious_superclients']:
    suitable = [k for k in SUPER[s] if np.isin(data.client_labels(k), [0, 2]).any()]
    mine = [r['client'] for r in rep['attackers'] if r['client'] in SUPER[s]]
    assert len(mine) == max(1, int(np.floor(0.5 * len(suitable)))) and set(mine) <= set(suitable)
  malicious = set(np.concatenate([SUPER[s] for s in rep['malicious_superclients']]))
  assert {r['client'] for r in rep['attackers']} <= malicious
  assert all(r['pairs'] == [[0, 2]] for r in rep['attackers'])
  check_flips(data, poisoned, rep)
  again, rep2 = attacks.apply(data, attack_cfg(), seed=3, superclients=SUPER)
  assert rep2 == rep and np.array_equal(again.y, poisoned.y)           # a function of (seed, superclients)
  assert np.array_equal(data.y, dataset().y)                           # the input is never modified


def test_random_swaps_pair_each_class_once_per_attacker():
  data = dataset(num_clients=40)
  groups = np.array_split(np.arange(40), 4)
  poisoned, rep = attacks.apply(data, attack_cfg(classes='0,2,3,5', swap='random', malicious_superclients=1.0,
                                                 attackers=1.0), seed=0, superclients=groups)
  pairings = set()
  for r in rep['attackers']:
    flat = sorted(c for p in r['pairs'] for c in p)
    assert flat == [0, 2, 3, 5]
    pairings.add(tuple(sorted(tuple(sorted(p)) for p in r['pairs'])))
  assert len(pairings) > 1                                               # attackers chose differently
  check_flips(data, poisoned, rep)
  _, fixed = attacks.apply(data, attack_cfg(classes='0,2,3,5', swap='fixed', malicious_superclients=1.0,
                                            attackers=1.0), seed=0, superclients=groups)
  assert len({json.dumps(r['pairs']) for r in fixed['attackers']}) == 1  # one pairing for all


def test_fedavg_equivalent_fraction():
  data = dataset(num_clients=40)
  poisoned, rep = attacks.apply(data, attack_cfg(malicious_superclients=0.3, attackers=0.5), seed=1)
  suitable = [k for k in range(40) if np.isin(data.client_labels(k), [0, 2]).any()]
  assert rep['num_attackers'] == max(1, int(np.floor(0.15 * len(suitable))))
  assert set(r['client'] for r in rep['attackers']) <= set(suitable) and rep['malicious_superclients'] == []
  check_flips(data, poisoned, rep)


def test_cifar100_superclass_sets():
  intra, groups = attacks.class_set('intra_sc')
  extra, none = attacks.class_set('extra_sc')
  assert len(intra) == len(set(intra)) == 20 and len(extra) == len(set(extra)) == 20 and none == []
  assert sorted(attacks.FINE_TO_COARSE[extra].tolist()) == list(range(20))         # one per superclass
  assert {30, 95} <= set(intra) and {30, 70} <= set(extra)                          # dolphin, whale, rose
  rng = np.random.default_rng(0)
  for _ in range(20):
    for a, b in attacks.draw_pairs(intra, groups, rng):
      assert attacks.FINE_TO_COARSE[a] == attacks.FINE_TO_COARSE[b]                  # INTRA_SC
    for a, b in attacks.draw_pairs(extra, [], rng):
      assert attacks.FINE_TO_COARSE[a] != attacks.FINE_TO_COARSE[b]                  # EXTRA_SC
  assert np.bincount(attacks.FINE_TO_COARSE, minlength=20).tolist() == [5] * 20


def test_class_set_checks():
  assert attacks.check_classes('0,2') is None and attacks.check_classes('intra_sc', 100) is None
  assert 'CIFAR-100' in attacks.check_classes('intra_sc', 10)
  assert attacks.check_classes('0,1,2')
  assert attacks.check_classes('0,0')
  assert 'in [0, 10)' in attacks.check_classes('0,12', 10)
  assert attacks.check_classes('a,b')


def test_trainer_attacks_and_reports_the_drop(tmp_path):
  data = dataset(num_clients=20)
  os.makedirs(tmp_path / 'clean')           # the clean run's summary.json (what its run writes): a known accuracy
  with open(tmp_path / 'clean' / 'summary.json', 'w') as f:
    json.dump({'mean_last_10_test_accuracy': 0.25}, f)
  c = small_config(rounds=2, clients_per_round=4, **{'attack.kind': 'label_flip', 'attack.malicious_superclients': 0.5,
                                                     'attack.attackers': 0.5,
                                                     'attack.clean_workdir': str(tmp_path / 'clean')})
  t = trainers.make_trainer(c, str(tmp_path / 'att'), data=data, write_files=False)    # attack.json only (no plots)
  assert int((t.data.y != data.y).sum()) == t.plan.attack_report['flipped_examples'] > 0
  s = t.train()
  assert s['attack']['num_attackers'] == t.plan.attack_report['num_attackers']
  assert s['attack']['clean_accuracy'] == 0.25
  assert s['attack']['drop'] == pytest.approx(s['mean_last_10_test_accuracy'] - 0.25)
  assert json.load(open(os.path.join(tmp_path, 'att', 'attack.json')))['attackers']


def test_chain_trainer_attacks_inside_malicious_superclients():
  data = dataset(num_clients=20)
  c = small_config(algorithm='fedseq', rounds=1, **{'attack.kind': 'label_flip', 'attack.malicious_superclients': 0.25,
                                                    'attack.attackers': 1.0, 'algo.fraction': 0.5})
  t = trainers.make_trainer(c, data=data, superclients=SUPER)
  (mal,) = t.plan.attack_report['malicious_superclients']
  suitable = [k for k in SUPER[mal] if np.isin(data.client_labels(k), [0, 2]).any()]
  assert sorted(r['client'] for r in t.plan.attack_report['attackers']) == sorted(suitable)
  s = t.train()
  assert s['fedseq']['num_superclients_initial'] == 4 and s['attack']['num_attackers'] == len(suitable)


# ---- model poisoning: roles and the backdoor's data -------------------------------------------------------------


def poison_cfg(**kw):
  a = {'kind': 'backdoor', 'fraction': 0.25, 'scale': 1.0, 'target_label': 7, 'trigger_size': 2, 'trigger_row': 1,
       'trigger_col': 2, 'poison_fraction': 0.5}
  a.update(kw)
  return ml_collections.ConfigDict(a)


def test_stamp_trigger_sets_exactly_the_square_in_every_channel():
  x = np.zeros((2, 5, 6, 3), np.float32)
  out = attacks.stamp_trigger(x, poison_cfg(), 9.0)
  assert np.all(out[:, 1:3, 2:4, :] == 9.0)
  out[:, 1:3, 2:4, :] = 0
  assert np.all(out == 0) and np.all(x == 0)                    # nothing else, and the input is not modified
  assert attacks.trigger_value(np.zeros((1, 2), np.uint8)) == 255


def test_backdoor_poisons_a_fraction_of_the_attackers_examples_only():
  data = dataset()
  cfg = poison_cfg()
  poisoned, report = attacks.apply(data, cfg, seed=3)
  attackers = attacks.malicious_clients(data.num_clients, 0.25, 3)
  assert [r['client'] for r in report['attackers']] == attackers.tolist() and len(attackers) == 5
  value = attacks.trigger_value(data.x)
  changed = np.flatnonzero(np.any(poisoned.x != data.x, axis=(1, 2, 3)) | (poisoned.y != data.y))
  allowed = np.concatenate([data.client_indices(int(k)) for k in attackers])
  assert set(changed) <= set(allowed)
  for k in attackers:
    idx = data.client_indices(int(k))
    hit = idx[poisoned.y[idx] == 7]
    hit = hit[np.all(poisoned.x[hit][:, 1:3, 2:4] == value, axis=(1, 2, 3))]
    assert len(hit) == len(idx) // 2                             # poison_fraction of its examples
  assert report['poisoned_examples'] == 5 * 6 and data.y is not poisoned.y


def test_sign_flip_only_names_its_attackers_and_keeps_the_data():
  data = dataset()
  same, report = attacks.apply(data, poison_cfg(kind='sign_flip'), seed=3)
  assert same is data and report['num_attackers'] == 5 and report['kind'] == 'sign_flip'


def test_triggered_test_set_leaves_out_the_target_class():
  x = np.zeros((4, 4, 4, 1), np.float32)
  y = np.array([7, 1, 2, 7])
  xt, yt = attacks.triggered_test(x, y, poison_cfg(), 1.0)
  assert xt.shape[0] == 2 and np.all(yt == 7) and np.all(xt[:, 1:3, 2:4] == 1.0)
