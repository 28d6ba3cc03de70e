"""Differential privacy (algorithms/wrappers/dp.py): `dp_epsilon` at `dp_delta` and the current clip `dp_clip` in
every evaluation record (metrics.jsonl, TensorBoard) and in summary.json, with a line in summary.md saying the
mechanism and the accounting. Epsilon is a function of the round count alone (privacy/accounting.py: the engine's
fixed-size cohort without replacement under replace-one adjacency, RDP), so a resumed run reports what the
uninterrupted one did. summary.json records the adjacency, sampling and sensitivity the epsilon is stated under.

Records written before the replace-one sensitivity was accounted (no 'dp_adjacency' in them) under-state epsilon
3x to 9x: a resumed run recomputes them, keeps the old figure as `dp_epsilon_reported_before_fix` and says so."""
from __future__ import annotations

import math

import jax
import numpy as np

from absl import logging

from fedjax_flat.algorithms.wrappers import dp as dp_lib
from fedjax_flat.privacy import mechanism as mech
from fedjax_flat.training.evals.registry import Evaluation, register


def _population(trainer) -> int:
  data = getattr(trainer, 'data', None)
  return int(getattr(data, 'num_clients', 0) or 0)


def _num_leaves(trainer) -> int:
  """The model's parameter arrays (per-tensor clipping's bound C sqrt(L))."""
  return len(jax.tree_util.tree_leaves(trainer.plan.param_shapes))


def _clip(trainer) -> float:
  state = trainer.server_state
  s = state.get(dp_lib.KEY) if isinstance(state, dict) else None
  if isinstance(s, dict) and 'clip' in s:
    return float(np.asarray(jax.device_get(s['clip'])))
  return float(trainer.config.dp.clip)


def _epsilon(trainer, rounds: int) -> float:
  return dp_lib.epsilon(trainer.config, int(rounds), _population(trainer), _num_leaves(trainer))


def _numbers(trainer) -> dict:
  cfg = trainer.config
  a = mech.accounting(cfg, _population(trainer), _num_leaves(trainer))
  return {'dp_epsilon': _epsilon(trainer, trainer.round), 'dp_delta': float(cfg.dp.delta), 'dp_clip': _clip(trainer),
          'dp_adjacency': a['adjacency']}


def _resumed(trainer, records) -> bool:
  """Records of a version that did not account the replace-one sensitivity: recomputed (module docstring)."""
  stale = [r for r in records if 'dp_epsilon' in r and 'dp_adjacency' not in r]
  if not stale:
    return False
  a = mech.accounting(trainer.config, _population(trainer), _num_leaves(trainer))
  for r in stale:
    old = r['dp_epsilon']
    r.update(dp_epsilon=_epsilon(trainer, r['round']), dp_epsilon_reported_before_fix=old,
             dp_adjacency=a['adjacency'])
  last = stale[-1]
  logging.warning('dp: the records of this run were written by a version that under-reported epsilon (the %s '
                  'sensitivity of %gC was accounted as %gC): epsilon at round %d is %.4g, not the %.4g reported '
                  'then; metrics.jsonl is rewritten, the old figures kept as dp_epsilon_reported_before_fix',
                  a['adjacency'], a['sensitivity'], a['norm_bound'], last['round'], last['dp_epsilon'],
                  last['dp_epsilon_reported_before_fix'])
  return True


def _final(trainer, summary, reported):
  del reported
  cfg = trainer.config
  out = _numbers(trainer)
  p, leaves = _population(trainer), _num_leaves(trainer)
  a = mech.accounting(cfg, p, leaves)
  z = float(dp_lib.noise_multiplier(cfg, p, leaves))
  out.update({'dp_mode': str(cfg.dp.mode), 'dp_noise_multiplier': z, 'dp_rounds': int(trainer.round),
              'dp_sampling': a['sampling'], 'dp_accountant': a['accountant'], 'dp_sampling_rate': a['q'],
              'dp_sensitivity': a['sensitivity'], 'dp_norm_bound': a['norm_bound']})
  summary.update(out)
  eps = 'inf' if math.isinf(out['dp_epsilon']) else f"{out['dp_epsilon']:.3g}"
  clip = (f'clip {out["dp_clip"]:.3g}{" (adaptive)" if cfg.dp.adaptive else ""}'
          f'{" per tensor" if cfg.dp.get("per_tensor", False) else ""}')
  rel = (f'{a["adjacency"].replace("_", "-")} adjacency, sensitivity {a["sensitivity"]:.3g}C, '
         f'{a["accountant"].upper()}')
  if cfg.dp.mode in ('central', 'distributed'):
    who = ('noise on the sum' if cfg.dp.mode == 'central' else
           'each client adds its share of the noise, a guarantee against a server that sees only the sum')
    how = (f'{cfg.dp.mode} DP ({who}): {clip}, noise multiplier {z:.4g} sized for {mech.noise_cohort(cfg)} '
           f'clients a round of a population of {a["num_clients"]} (fixed-size sampling without replacement, '
           f'{rel})')
  else:
    how = (f'local DP: every upload clipped ({clip}) and noised with multiplier {z:.4g} (no amplification by '
           f'sampling, {rel})')
  summary.setdefault('facts', {})['dp'] = (f'{how}: epsilon {eps} at delta {out["dp_delta"]:g} after '
                                           f'{out["dp_rounds"]} rounds')


register(Evaluation('dp', order=5, applies=lambda t: dp_lib.enabled(t.config),
                    periodic=_numbers, final=_final, resumed=_resumed))
