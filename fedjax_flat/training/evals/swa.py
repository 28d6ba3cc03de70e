"""SWA (algorithms/wrappers/swa.py): summary.json `swa_averages` says how many models it averaged. 0 (a run too
short, warned before it started): the SWA model is a single stale copy, so it is not reported as the run's result;
the global model is, with `reported_model_reason` and a line in summary.md saying why."""
from __future__ import annotations

from absl import logging
import jax
import numpy as np

from fedjax_flat.training import writers
from fedjax_flat.training.evals.registry import Evaluation, register


def _final(trainer, summary, reported):
  state = trainer.server_state
  swa_state = state.get('swa') if isinstance(state, dict) else None
  if isinstance(swa_state, dict) and 'n' in swa_state:
    summary['swa_averages'] = int(np.asarray(jax.device_get(swa_state['n'])))
    if summary['swa_averages'] == 0 and trainer.round >= trainer.config.rounds:   # said before the run (validate)
      logging.warning('swa: the SWA model was never averaged in %d rounds (summary.json swa_averages=0); its '
                      'numbers are those of a single earlier model', trainer.round)
      summary.setdefault('facts', {})['swa'] = (f'SWA never averaged a model in {trainer.round} rounds (it starts '
                                                'later): its numbers are those of a single earlier model')
      if reported == 'swa' and 'global' in summary.get('models', {}):   # not a result: report the global model
        writers.report(summary, 'global', trainer.config.summary_last_k,
                       reason='the SWA model was never averaged (swa_averages=0)')
        summary['facts']['swa'] += '; the global model is reported instead'


register(Evaluation('swa', order=40, applies=lambda p: bool(p.config.swa.enabled), final=_final, models=('swa',)))
