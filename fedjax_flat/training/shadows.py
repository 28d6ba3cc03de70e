"""LiRA's shadow models as federated runs, trained as lanes of one runs program (training/batched.py).

Carlini et al. 2022's shadows imitate the target's training. `analysis/membership.train_shadows` trains them
centrally (cheaper, the usual approximation); here each shadow is a run of the target's own config (algorithm,
clients, rounds, augmentation, client optimizer) on its own random half of the candidates:

  candidates   the members (training examples of the target's clients) and non-members (test examples), raw
               (the run's own transforms apply); each has a home client (`home_clients`): a member its client in
               the target run, a non-member a client drawn from the seed, so a shadow's clients hold about half
               of what the target's held, with the same skew.
  shadow s     `shadow_datasets`: client k holds the candidates of its home k in masks[s] (membership.shadow_masks);
               the test set is the target's; config.seed = seed + s; evaluated once, at its last round.

The shadows differ only in per-run values and inputs (seed, partition, client sizes), so `train_shadow_runs` trains
them as one pack (`batched.open_batch`: one program, each lane a shadow; alone=True trains them one after another,
as train.py would) and returns their final global models stacked [S, ...]: `membership.lira_from_shadows` scores
with them as with the central shadows.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from typing import List, Optional, Sequence, Tuple

import jax
import numpy as np

from fedjax_flat.config.default_config import default_config
from fedjax_flat.data.federated import FederatedDataset
from fedjax_flat.errors import BadInputError
from fedjax_flat.training import batched

SHADOW_STREAM = 0x5AD0     # the non-members' home clients: independent of the run's other draws


def example_clients(data: FederatedDataset) -> np.ndarray:
  """[N]: the client holding each training example (-1: none)."""
  owner = np.full(len(data.y), -1, np.int64)
  for k in range(data.num_clients):
    owner[data.client_indices(k)] = k
  return owner


def home_clients(data: FederatedDataset, member_index, num_nonmembers: int, seed: int) -> np.ndarray:
  """[M + O]: the members' own clients (member_index: their rows of data.x), then a client for each non-member
  drawn uniformly from (seed, SHADOW_STREAM)."""
  rng = np.random.default_rng([int(seed), SHADOW_STREAM])
  members = example_clients(data)[np.asarray(member_index, np.int64)]
  return np.concatenate([members, rng.integers(0, data.num_clients, int(num_nonmembers))])


def shadow_datasets(data: FederatedDataset, x, y, home, masks) -> List[FederatedDataset]:
  """One dataset per row of masks [S, N]: the candidates (x [N, ...] raw, y [N]) in that row, each with its
  home client; every other field (test set, classes, task) the target's. x and y are the same arrays in every
  shadow, so a runs program passes them once and only the index arrays per lane."""
  if not isinstance(data, FederatedDataset) or data.store is not None:
    raise BadInputError(f'federated LiRA shadows need an in-memory dataset; {getattr(data, "name", data)!r} '
                        'is not one: use the central shadows')
  x, y, home = np.asarray(x), np.asarray(y), np.asarray(home)
  out = []
  for m in np.asarray(masks, bool):
    idx = [np.flatnonzero(m & (home == k)) for k in range(data.num_clients)]
    one = FederatedDataset.from_client_indices(x, y, idx, data.test_x, data.test_y, data.num_classes)
    out.append(dataclasses.replace(data, x=x, y=y, client_index=one.client_index, client_offsets=one.client_offsets,
                                   client_test_index=None, client_test_offsets=None))
  return out


# The target's measurements that change nothing it trains: a shadow skips them (their sections at the defaults).
MEASUREMENTS = ('lab', 'client_eval', 'corruption_eval', 'personalized', 'centralized')


def shadow_config(config, s: int, seed: int):
  """The target's config for shadow s: its own seed, one evaluation (at the end), one checkpoint, none of the
  target's measurements (`MEASUREMENTS`)."""
  c = copy.deepcopy(config)
  c.seed = int(seed) + int(s)
  c.eval_every = c.rounds
  c.checkpoint_every = c.rounds
  defaults = default_config()
  for name in MEASUREMENTS:
    if name in c and name in defaults:
      c[name] = copy.deepcopy(defaults[name])
  return c


def train_shadow_runs(config, datasets: Sequence[FederatedDataset], workdir: str, *, seed: int = 0,
                      lanes: Optional[int] = None, alone: bool = False) -> Tuple[object, list]:
  """(the shadows' final global params stacked [S, ...], their batched.RunResults): shadow s trains
  `shadow_config(config, s, seed)` on datasets[s] in WORKDIR/shadow_<s>, all as lanes of one runs program
  (alone=True: one after another). A shadow that fails is a RuntimeError naming it."""
  specs = [batched.RunSpec(f'shadow_{s}', shadow_config(config, s, seed), os.path.join(workdir, f'shadow_{s}'),
                           data=d) for s, d in enumerate(datasets)]
  batch = batched.open_batch(specs, fresh=True, lanes=lanes, alone=alone)
  try:
    results = batch.train()
  finally:
    batch.close()
  bad = [(i, r) for i, r in sorted(results.items()) if r.status != 'done']
  if bad:
    i, r = bad[0]
    raise RuntimeError(f'LiRA shadow {i} ({specs[i].workdir}) {r.status}: {r.error}')
  params = {}
  for i, t, *_ in batch.opened:
    p = t.plan
    view = (lambda a: a) if p.placement is None else p.placement.local_view
    params[i] = jax.device_get(view(p.algorithm.eval_models(t.server_state)['global'][0]))
  stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *[params[i] for i in range(len(specs))])
  return stacked, [results[i] for i in range(len(specs))]
