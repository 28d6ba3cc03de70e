"""Weights & Biases back end of training/tracking.py: one W&B run per training run (`id=` its run id, kept in
WORKDIR/tracker.json, `resume='allow'`: a resumed training run logs to the same W&B run), `group=` the sweep.

Offline (`--wandb_mode=offline`, the default) writes WORKDIR/wandb/offline-run-*/ (WANDB_DIR, when set, instead
of the workdir); `wandb sync WORKDIR/wandb/offline-run-*` uploads them later, the resumed parts into the same run.
"""
from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from typing import Dict, List, Optional

import wandb


def unreachable(spec) -> Optional[str]:
  """Offline: nothing to reach. Online: the W&B server (WANDB_BASE_URL, default api.wandb.ai) must answer in 5 s."""
  if spec.wandb_mode != 'online':
    return None
  url = os.environ.get('WANDB_BASE_URL', 'https://api.wandb.ai')
  try:
    with urllib.request.urlopen(url, timeout=5):
      return None
  except urllib.error.HTTPError:     # it answered (an error status is still an answer)
    return None
  except (urllib.error.URLError, OSError, ValueError) as e:
    return (f'--wandb_mode=online: the W&B server {url} does not answer ({getattr(e, "reason", e)}); use '
            '--wandb_mode=offline and `wandb sync` later, or set WANDB_BASE_URL to a reachable server')


def open_group(spec) -> None:
  """W&B groups runs by name (group=): nothing to create."""


def close_group(spec, status: str) -> None:
  """Nothing to end: a W&B group is only a name."""


class Run:
  """One W&B run (`run_id`)."""

  def __init__(self, run, workdir: str):
    self.run, self.workdir = run, workdir
    self.run_id = run.id
    self.where = os.path.dirname(run.dir)

  def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
    self.run.log(metrics, step=step)

  def log_summary(self, numbers: Dict[str, float], texts: Dict[str, str]) -> None:
    self.run.summary.update({**numbers, **texts})

  def log_artifacts(self, paths: List[str]) -> None:
    # Copied into the run's files/ (what `wandb sync` uploads): a copy is the file as it was at the end of this
    # process, where W&B's own symlink would follow a later rewrite.
    for p in paths:
      dst = os.path.join(self.run.dir, os.path.basename(p))
      shutil.copyfile(p, dst)
      self.run.save(dst, base_path=self.run.dir, policy='now')

  def set_tags(self, tags: Dict[str, str]) -> None:
    self.run.summary.update(tags)

  def close(self, status: str) -> None:
    self.run.finish(exit_code=1 if status == 'FAILED' else 0)


def open_run(spec, workdir: str, *, run_id: Optional[str], params: Dict[str, object]) -> Run:
  """A new run (the flattened config as its config) or `run_id` continued (`resume='allow'`)."""
  run = wandb.init(project=spec.project, dir=os.environ.get('WANDB_DIR') or workdir, mode=spec.wandb_mode,
                   id=run_id, resume='allow', group=spec.group, name=spec.name,
                   config=None if run_id else params, reinit='create_new', save_code=False,
                   # console='off': the run's terminal output stays the run's; W&B does not capture it.
                   settings=wandb.Settings(silent=True, console='off'))
  return Run(run, workdir)
