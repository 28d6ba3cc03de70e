"""Experiment tracking (`--tracker=mlflow|wandb`): a run's flattened config, every metric record (its round the
step), the summary, the plots and the checkpoint path sent to MLflow or Weights & Biases, beside its own files.

Off by default: without a `Spec` nothing here runs and every file of the run stays bit-identical. The services'
packages are the `tracking` extra (`pip install 'fedjax_flat[tracking]'`); only the back end a run asks for is
imported (training/trackers/), so the core install never needs them.

- `check(spec)` before anything is built: a missing package or an unreachable tracking URI is one
  `TrackingError` line (exit 2), before data loading and compilation.
- `open_run(spec, workdir, config, records, fresh)` starts the tracked run, or continues the one named in
  WORKDIR/tracker.json (a resumed run is the SAME tracked run), and catches it up from the restored records.
- The `Tracker` it returns never stops a run: the first error of the service (server gone, disk full) is one
  warning, then tracking stops for this process; the run's own files are complete, and a resume catches the
  tracked run up from metrics.jsonl (tracker.json keeps the last round it received).
- Sweeps: `open_group(spec, sweep_dir)` once per sweep (MLflow: a parent run every cell's run nests under;
  W&B: the runs' group), then one tracked run per cell.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
from typing import Dict, List, Optional, Sequence

from absl import logging

from fedjax_flat import errors
from fedjax_flat.training import writers

KINDS = ('mlflow', 'wandb')
WANDB_MODES = ('offline', 'online')
PACKAGES = {'mlflow': 'mlflow', 'wandb': 'wandb'}
STATE_FILE = 'tracker.json'
DEFAULT_PROJECT = 'fedjax_flat'
# The files of a finished run sent as artifacts, those that exist (a run writes system.png etc. only when it has them).
ARTIFACTS = ('summary.json', 'summary.md', 'config.json', 'metrics.jsonl', 'metrics.png', 'system.png',
             'personalized.png', 'predictions.png')


class TrackingError(errors.BadInputError):
  """The tracker cannot start: its package is missing or its tracking URI is unreachable (one line, exit 2)."""


@dataclasses.dataclass(frozen=True)
class Spec:
  """What to track to. kind: 'mlflow' or 'wandb'. uri: MLflow's tracking URI (a directory, `sqlite:///...`,
  `http(s)://host:port`; None: MLFLOW_TRACKING_URI, else MLflow's default). project: the MLflow experiment / W&B
  project. group: the sweep (MLflow: the parent run's name; W&B: group=). name: the run's name (default: the
  workdir's base name). wandb_mode: 'offline' (files under WORKDIR/wandb, `wandb sync` uploads them) or 'online'."""
  kind: str
  uri: Optional[str] = None
  project: str = DEFAULT_PROJECT
  group: Optional[str] = None
  name: Optional[str] = None
  wandb_mode: str = 'offline'

  def argv(self) -> List[str]:
    """The train.py flags that give a child process this spec (sweeps' local and SLURM launchers)."""
    out = [f'--tracker={self.kind}', f'--tracking_project={self.project}', f'--wandb_mode={self.wandb_mode}']
    out += [f'--tracking_uri={self.uri}'] if self.uri else []
    return out + ([f'--tracking_group={self.group}'] if self.group else [])


def from_flags(tracker: str, uri: Optional[str] = None, project: Optional[str] = None,
               group: Optional[str] = None, name: Optional[str] = None,
               wandb_mode: str = 'offline') -> Optional[Spec]:
  """The Spec of the binaries' flags; None when --tracker is not set (then any other tracking flag is refused)."""
  if not tracker or tracker == 'none':
    given = [f for f, v in (('--tracking_uri', uri), ('--tracking_group', group)) if v]
    if given:
      raise TrackingError(f'{given[0]} is set but --tracker is not: add --tracker=mlflow (or wandb), or drop '
                          f'{given[0]}')
    return None
  if tracker not in KINDS:
    raise TrackingError(f'--tracker={tracker!r}: one of {", ".join(KINDS)}')
  if uri and tracker != 'mlflow':
    raise TrackingError(f'--tracking_uri={uri!r} is for --tracker=mlflow; W&B takes --wandb_mode (and WANDB_* '
                        'environment variables)')
  if wandb_mode not in WANDB_MODES:
    raise TrackingError(f'--wandb_mode={wandb_mode!r}: one of {", ".join(WANDB_MODES)}')
  return Spec(tracker, uri=uri or None, project=project or DEFAULT_PROJECT, group=group or None, name=name or None,
              wandb_mode=wandb_mode)


def backend(kind: str):
  """The back end module of `kind` (training/trackers/), imported only now; a missing package is one line."""
  try:
    importlib.import_module(PACKAGES[kind])
  except ImportError:
    raise TrackingError(f'--tracker={kind} needs the {PACKAGES[kind]} package: pip install '
                        f"'fedjax_flat[tracking]' (or pip install {PACKAGES[kind]})") from None
  return importlib.import_module(f'fedjax_flat.training.trackers.{kind}_tracker')


def check(spec: Optional[Spec]) -> None:
  """Before the run is built: the package imports and the tracking URI answers (cheap: one request or one
  file-system check); TrackingError otherwise."""
  if spec is None:
    return
  why = backend(spec.kind).unreachable(spec)
  if why:
    raise TrackingError(why)


def flatten(d, prefix: str = '') -> Dict[str, object]:
  """{'a': {'b': 1}} -> {'a.b': 1}: a config or summary as the flat keys trackers take."""
  out = {}
  for k, v in d.items():
    key = f'{prefix}{k}'
    if isinstance(v, dict):
      out.update(flatten(v, key + '.'))
    else:
      out[key] = v
  return out


def scalars(d: Dict) -> Dict[str, float]:
  """The finite numbers of a flat dict (bools and arrays left out: the services' metrics are scalars)."""
  return {k: float(v) for k, v in d.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


def _read_state(workdir: str) -> dict:
  path = os.path.join(workdir, STATE_FILE)
  try:
    with open(path) as f:
      state = json.load(f)
    return state if isinstance(state, dict) else {}
  except (OSError, ValueError):
    return {}


def open_group(spec: Optional[Spec], sweep_dir: str) -> Optional[Spec]:
  """Once per sweep, before its runs start: the spec its runs track to (the group named after the sweep; MLflow:
  the parent run is created, or found again on a rerun of the sweep)."""
  if spec is None:
    return None
  check(spec)
  spec = dataclasses.replace(spec, group=spec.group or os.path.basename(os.path.abspath(sweep_dir)))
  try:
    backend(spec.kind).open_group(spec)
  except TrackingError:
    raise
  except Exception as e:  # noqa: BLE001 -- the service's error at start: one line, exit 2
    raise TrackingError(f'--tracker={spec.kind}: could not start the sweep {spec.group!r}: {type(e).__name__}: '
                        f'{_one_line(e)}') from None
  return spec


def close_group(spec: Optional[Spec], status: str) -> None:
  """At the sweep's end (MLflow: the parent run ends with `status`); an error of the service is one warning."""
  if spec is None:
    return
  try:
    backend(spec.kind).close_group(spec, status)
  except Exception as e:  # noqa: BLE001 -- the sweep's results are written; tracking never fails it
    logging.warning('%s tracking: could not end the sweep %r: %s: %s', spec.kind, spec.group, type(e).__name__,
                    _one_line(e))


def _one_line(e: BaseException) -> str:
  return ' '.join(str(e).split())[:300]


class Tracker:
  """One tracked run, guarded: the first error of the service is one warning and tracking stops; the run goes on.

  `last_step` is the last round the service received (kept in WORKDIR/tracker.json with the run id), so a resumed
  run neither sends a round twice nor loses those it could not send."""

  def __init__(self, spec: Spec, workdir: str, run, last_step: int):
    self.spec, self.workdir, self.run = spec, workdir, run
    self.last_step = last_step
    self.broken = False
    self.closed = False

  def _guard(self, what: str, fn, *args) -> bool:
    if self.broken or self.closed:
      return False
    try:
      fn(*args)
      return True
    except Exception as e:  # noqa: BLE001 -- a tracker never stops or corrupts a run: one warning, then off
      self.broken = True
      logging.warning('%s tracking stopped (%s failed: %s: %s); the run goes on and writes its own files; rerun the '
                      'same command after it ends to send the rest to the same tracked run', self.spec.kind, what,
                      type(e).__name__, _one_line(e))
      return False

  def _save_state(self) -> None:
    state = {'kind': self.spec.kind, 'run_id': self.run.run_id, 'last_step': self.last_step,
             **({'uri': self.spec.uri} if self.spec.uri else {})}
    writers.atomic_write(os.path.join(self.workdir, STATE_FILE), lambda f: json.dump(state, f, indent=1))

  def log_record(self, record: Dict) -> None:
    """One evaluation record (metrics.jsonl's line): its scalars at step = its round."""
    step = int(record['round'])
    if step <= self.last_step:          # re-run after a resume: the service has it already
      return
    metrics = scalars({k: v for k, v in record.items() if k != 'round'})
    if self._guard('log_metrics', self.run.log_metrics, metrics, step):
      self.last_step = step
      self._guard('writing tracker.json', self._save_state)

  def catch_up(self, records: Sequence[Dict]) -> None:
    for r in records:
      self.log_record(r)

  def finish(self, summary: Dict, checkpoint: Optional[str], status: str = 'FINISHED') -> None:
    """The end of this process's share: the summary's numbers, the result files, the checkpoint path; then the
    tracked run ends with `status` (FINISHED, or KILLED when stopped by a signal: a resume continues it)."""
    flat = flatten(summary)
    self._guard('log_summary', self.run.log_summary, scalars(flat),
                {k: str(v) for k, v in flat.items() if isinstance(v, str)})
    files = [os.path.join(self.workdir, f) for f in ARTIFACTS if os.path.isfile(os.path.join(self.workdir, f))]
    self._guard('log_artifacts', self.run.log_artifacts, files)
    if checkpoint:
      self._guard('log_checkpoint', self.run.set_tags, {'checkpoint': os.path.abspath(checkpoint)})
    self.close(status)

  def close(self, status: str = 'FAILED') -> None:
    """Ends the tracked run (idempotent; FAILED when the run raised)."""
    if self.closed:
      return
    if not self.broken:
      self._guard('end_run', self.run.close, status)
    self.closed = True


def open_run(spec: Optional[Spec], workdir: str, config, records: Sequence[Dict], *, fresh: bool = False
             ) -> Optional[Tracker]:
  """The tracked run of `workdir`: the one tracker.json names (same kind and URI; not with `fresh`), else a new
  one with the flattened config as its parameters; then the records the service has not received yet."""
  if spec is None or not workdir:
    return None
  spec = spec if spec.name else dataclasses.replace(spec, name=os.path.basename(os.path.abspath(workdir)))
  state = {} if fresh else _read_state(workdir)
  same = state.get('kind') == spec.kind and state.get('uri') == spec.uri and state.get('run_id')
  params = {k: v for k, v in flatten(config.to_dict()).items()}
  try:
    run = backend(spec.kind).open_run(spec, workdir, run_id=state['run_id'] if same else None, params=params)
  except TrackingError:
    raise
  except Exception as e:  # noqa: BLE001 -- before training: the service's error is one line, exit 2
    raise TrackingError(f'--tracker={spec.kind}: could not start the tracked run: {type(e).__name__}: '
                        f'{_one_line(e)}') from None
  continued = same and run.run_id == state['run_id']
  tracker = Tracker(spec, workdir, run, int(state.get('last_step', 0)) if continued else 0)
  tracker._guard('writing tracker.json', tracker._save_state)  # pylint: disable=protected-access
  logging.info('%s tracking: %s run %s%s', spec.kind, 'continuing' if continued else 'new', run.run_id,
               f' ({run.where})' if getattr(run, 'where', '') else '')
  tracker.catch_up(records)
  return tracker
