"""The virtual clock (config.system, systems/clock.py): `virtual_time_s`, `bytes_down`, `bytes_up` (cumulative,
the uploads of clients that did not report not counted) in every evaluation record and in summary.json, a line
in summary.md, and system.png (accuracy against virtual time and against bytes). The totals are the recorder's
(`system_total`, checkpointed with its state), so a resumed run reports what the uninterrupted one did."""
from __future__ import annotations

import os

from fedjax_flat.systems import clock as clock_lib
from fedjax_flat.training import writers
from fedjax_flat.training.evals.registry import Evaluation, register


def _numbers(trainer) -> dict:
  t = trainer.recorder.system_total
  return {'virtual_time_s': float(t['virtual_time_s']), 'bytes_down': float(t['bytes_down']),
          'bytes_up': float(t['bytes_up'])}


def _final(trainer, summary, reported):
  del reported
  out = _numbers(trainer)
  s, t = trainer.config.system, trainer.recorder.system_total
  rounds = max(int(trainer.round), 1)
  out['system_reports_per_round'] = float(t['reports']) / rounds
  summary.update(out)
  how = [f"speed {s.speed}" + (f" (median {s.speed_median:g} examples/s, sigma {s.speed_sigma:g})"
                               if s.speed == 'lognormal' else ''),
         f'availability {s.availability}']
  if float(s.deadline_s) > 0:
    how.append(f'deadline {s.deadline_s:g} s (min {s.min_steps} steps)')
  if float(s.dropout) > 0:
    how.append(f'dropout {s.dropout:g}')
  summary.setdefault('facts', {})['system'] = (
      f"virtual clock ({', '.join(how)}; {s.down_mbps:g} / {s.up_mbps:g} Mbps down / up): "
      f"{out['virtual_time_s'] / 3600:.3g} h after {trainer.round} rounds, "
      f"{out['system_reports_per_round']:.3g} reporting clients a round")   # its bytes: summary.md's bytes sent
  if trainer.workdir and trainer.recorder.writer:
    writers.plot_system(trainer.records, os.path.join(trainer.workdir, 'system.png'),
                        title=f'{trainer.algorithm.label} on {trainer.plan.dataset_name}: virtual clock',
                        accuracy_name=trainer.recorder.metric_names['accuracy'])


register(Evaluation('system', order=6, applies=lambda plan: clock_lib.enabled(plan.config), periodic=_numbers,
                    final=_final))
