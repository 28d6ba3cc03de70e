"""Differential privacy (algorithms/wrappers/dp.py): `dp_epsilon` at `dp_delta` and the current clip `dp_clip` in
every evaluation record (metrics.jsonl, TensorBoard) and in summary.json, with a line in summary.md saying the
mechanism and the accounting. Epsilon is a function of the round count alone (privacy/accounting.py: the engine's
fixed-size cohort without replacement, RDP), so a resumed run reports what the uninterrupted one did."""
from __future__ import annotations

import math

import jax
import numpy as np

from fedjax_flat.algorithms.wrappers import dp as dp_lib
from fedjax_flat.privacy import mechanism as mech
from fedjax_flat.training.evals.registry import Evaluation, register


def _population(trainer) -> int:
  data = getattr(trainer, 'data', None)
  return int(getattr(data, 'num_clients', 0) or 0)


def _clip(trainer) -> float:
  state = trainer.server_state
  s = state.get(dp_lib.KEY) if isinstance(state, dict) else None
  if isinstance(s, dict) and 'clip' in s:
    return float(np.asarray(jax.device_get(s['clip'])))
  return float(trainer.config.dp.clip)


def _numbers(trainer) -> dict:
  cfg = trainer.config
  eps = dp_lib.epsilon(cfg, int(trainer.round), _population(trainer))
  return {'dp_epsilon': eps, 'dp_delta': float(cfg.dp.delta), 'dp_clip': _clip(trainer)}


def _final(trainer, summary, reported):
  del reported
  cfg = trainer.config
  out = _numbers(trainer)
  p = _population(trainer)
  a = mech.accounting(cfg, p)
  z = float(dp_lib.noise_multiplier(cfg, p))
  out.update({'dp_mode': str(cfg.dp.mode), 'dp_noise_multiplier': z, 'dp_rounds': int(trainer.round),
              'dp_sampling': a['sampling'], 'dp_accountant': a['accountant'], 'dp_sampling_rate': a['q']})
  summary.update(out)
  eps = 'inf' if math.isinf(out['dp_epsilon']) else f"{out['dp_epsilon']:.3g}"
  if cfg.dp.mode == 'central':
    how = (f'central DP: clip {out["dp_clip"]:.3g}{" (adaptive)" if cfg.dp.adaptive else ""}, noise multiplier '
           f'{z:.4g} sized for {mech.noise_cohort(cfg)} clients a round of a population of {a["num_clients"]} '
           f'(fixed-size sampling without replacement, {a["accountant"].upper()})')
  else:
    how = (f'local DP: every upload clipped to {out["dp_clip"]:.3g} and noised with multiplier {z:.4g} (no '
           f'amplification by sampling, {a["accountant"].upper()})')
  summary.setdefault('facts', {})['dp'] = (f'{how}: epsilon {eps} at delta {out["dp_delta"]:g} after '
                                           f'{out["dp_rounds"]} rounds')


register(Evaluation('dp', order=5, applies=lambda t: dp_lib.enabled(t.config),
                    periodic=_numbers, final=_final))
