"""Every DP cell of configs/dp.py: the noise multiplier the accounting before issue 48's fix calibrated, the
epsilon it reported and the epsilon that multiplier truly gives, beside the multiplier calibrated now.

  .venv/bin/python -m benchmarks.studies.dp_epsilon_fix [--out=benchmarks/studies/dp_epsilon_fix.md]

Before the fix the Gaussian event of a round carried z itself, i.e. a sensitivity of C, where fixed-size sampling
under replace-one adjacency (and local DP's randomizer) moves the clipped sum by 2C: the old epsilon of z is the
correct epsilon of 2z. The old calibration is re-run here with that relation (its bisection as it was), so the
'before' column is what a run of the old version printed, without keeping the old code.
"""
from __future__ import annotations

import argparse
import importlib.util
import os

from fedjax_flat.models import base as model_base
from fedjax_flat.models import registry as models
from fedjax_flat.privacy import accounting
from fedjax_flat.privacy import mechanism as mech

CONFIG = os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'dp.py')


def _cells():
  spec = importlib.util.spec_from_file_location('dp_cells', CONFIG)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return [(cell, mod.get_config(cell)) for cell in mod.CELLS]


def _old_calibration(target, eps_of):
  """The bisection of the old accounting.calibrate ([0, hi], hi doubled from 1, relative tolerance 1e-4)."""
  hi = 1.0
  while eps_of(hi) > target:
    hi *= 2
  lo = 0.0
  while hi - lo > 1e-4 * hi:
    mid = 0.5 * (lo + hi)
    if eps_of(mid) <= target:
      hi = mid
    else:
      lo = mid
  return hi


def row(cell, c):
  p = mech.population(c, int(c.data.get('num_clients') or 0))
  leaves = 0
  if c.dp.get('per_tensor', False):
    leaves = model_base.num_param_arrays(models.get_model(c.model, 10, (8, 8, 1)))
  a = mech.accounting(c, p, leaves)
  rounds, delta = int(c.rounds), float(c.dp.delta)

  def eps(z, norm_bound=a['norm_bound']):
    return accounting.epsilon(a['q'], z, rounds, delta, a['sampling'], a['accountant'], a['num_clients'],
                              norm_bound)

  z_new = float(mech.noise_multiplier(c, p, leaves))
  # The old version had no per-tensor bound (norm 1) and a sensitivity of C: its epsilon of z is ours of 2z.
  z_old = _old_calibration(float(c.dp.target_epsilon), lambda z: eps(2 * z, 1.0))
  return {'cell': cell, 'mode': str(c.dp.mode), 'target': float(c.dp.target_epsilon), 'adjacency': a['adjacency'],
          'sensitivity': a['sensitivity'], 'z_before': z_old, 'reported_before': eps(2 * z_old, 1.0),
          'true_before': eps(z_old), 'z_now': z_new, 'epsilon_now': eps(z_new)}


def table(rows):
  out = ['| cell | mode | target epsilon | z before | epsilon reported before | true epsilon of that z | '
         'z now | epsilon now (adjacency, sensitivity) |', '|---|---|---|---|---|---|---|---|']
  for r in rows:
    out.append(f"| {r['cell']} | {r['mode']} | {r['target']:g} | {r['z_before']:.4g} | {r['reported_before']:.4g} | "
               f"{r['true_before']:.4g} | {r['z_now']:.4g} | {r['epsilon_now']:.4g} ({r['adjacency']}, "
               f"{r['sensitivity']:.3g}C) |")
  return '\n'.join(out) + '\n'


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--out', default='', help='write the Markdown table here too')
  a = ap.parse_args(argv)
  rows = [row(cell, c) for cell, c in _cells() if c.dp.mode != 'off']
  text = table(rows)
  print(text)
  if a.out:
    with open(a.out, 'w') as f:
      f.write(text)
  return rows


if __name__ == '__main__':
  main()
