"""config.lab: the landscape lab (analysis/lab.py) every `lab.every` rounds (at evaluation rounds): its scalar
fields in the evaluation records (`drift_norm_mean`, `drift_cos_mean`, `update_sparsity_mean`,
`align_topk_client_mean`, `align_topk_global`, `feature_rank/act<i>`, `profile_loss_gradnorm_corr`, `barrier_mean`,
...), every
call's details (per-client norms, cosines, sparsity and alignment, eigenvalues, the binned loss profile) in
WORKDIR/lab.jsonl, and summary.json `lab` (the measures, the last values, seconds per lab call). Reads the run's
state only: the run's training is bit-identical with the lab on or off."""
from __future__ import annotations

import json
import os

import numpy as np

from fedjax_flat.analysis import lab as lab_lib
from fedjax_flat.training import writers
from fedjax_flat.training.evals.registry import Evaluation, register

FILE = 'lab.jsonl'


def _applies(plan) -> bool:
  return lab_lib.enabled(plan.config)


def _check(plan) -> None:
  lab_lib.check(plan.algorithm, lab_lib.parse_measures(plan.config.lab.measures))


def _path(trainer):
  return os.path.join(trainer.workdir, FILE) if (trainer.workdir and trainer.recorder.writer) else None


def _periodic(trainer) -> dict:
  if trainer.round % int(trainer.config.lab.every):
    return {}
  st = trainer.recorder.plugin_state
  if 'lab' not in st:      # built once per run: its examples and its compiled local-training program
    st['lab'], st['lab_times'] = lab_lib.Lab.from_config(trainer, trainer.config.lab), []
  params = trainer.plan.algorithm.eval_models(trainer.server_state)['global'][0]
  rec, det = st['lab'](trainer, params)
  st['lab_times'].append(det['seconds'])
  path = _path(trainer)
  if path:
    with open(path, 'a') as f:
      f.write(json.dumps(det) + '\n')
  return rec


def _resumed(trainer, records) -> bool:
  """Rows of rounds after the restored checkpoint are dropped: the resumed run writes them again."""
  path = _path(trainer)
  if path:
    writers.keep_rounds_through(path, trainer.round)
  return False


def _final(trainer, summary, reported):
  del reported
  st = trainer.recorder.plugin_state
  if 'lab' not in st:
    return
  lab = st['lab']
  names = ('drift_', 'update_sparsity_', 'align_', 'feature_rank/', 'profile_', 'barrier_')
  last = next((r for r in reversed(trainer.recorder.records) if any(k.startswith(names) for k in r)), {})
  times = st['lab_times']
  summary['lab'] = {'measures': list(lab.measures), 'every': int(trainer.config.lab.every),
                    'examples': int(len(lab.x)), 'round': last.get('round'),
                    'seconds_per_call_median': float(np.median(times)) if times else None,
                    **{k: v for k, v in last.items() if k.startswith(names)}}


register(Evaluation('lab', order=23, applies=_applies, periodic=_periodic, final=_final, resumed=_resumed,
                    models=('global',), check=_check))
