"""MLflow back end of training/tracking.py: one MLflow run per training run, through `MlflowClient` (no global
active run, so a sweep's runs in one process each keep their own).

Tracking URI: `--tracking_uri`, else MLFLOW_TRACKING_URI, else MLflow's default. A local store (`sqlite:///x/y.db`
or a directory) keeps the artifacts beside it (`<its directory>/mlartifacts`); a server keeps its own. A sweep is a
parent run (tag `fedjax_flat.sweep_parent`) its cells' runs nest under (`mlflow.parentRunId`).
"""
from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, List, Optional

# A server that is gone must not hold the run for minutes: MLflow retries 7 times with a growing backoff and waits
# 120 s per request by default. Set before mlflow reads them; a user's own setting is kept.
os.environ.setdefault('MLFLOW_HTTP_REQUEST_MAX_RETRIES', '1')
os.environ.setdefault('MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR', '1')
os.environ.setdefault('MLFLOW_HTTP_REQUEST_TIMEOUT', '20')

import mlflow  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from mlflow.utils import validation  # noqa: E402

SWEEP_TAG = 'fedjax_flat.sweep'
PARENT_TAG = 'fedjax_flat.sweep_parent'
# Param values: MLflow 3 takes 6000 characters (older servers 500: the limit of the installed client is used).
MAX_VALUE = getattr(validation, 'MAX_PARAM_VAL_LENGTH', 500)
PARAMS_PER_BATCH = getattr(validation, 'MAX_PARAMS_TAGS_PER_BATCH', 100)
METRICS_PER_BATCH = getattr(validation, 'MAX_METRICS_PER_BATCH', 1000)


def key(name: str) -> str:
  """A metric or param name MLflow accepts (letters, digits, _ - . / space :): 'val_recall@5' -> 'val_recall_5'."""
  return re.sub(r'[^\w\-./ :]', '_', name)[:250]


def tracking_uri(spec) -> str:
  return spec.uri or mlflow.get_tracking_uri()


def _local_path(uri: str) -> Optional[str]:
  """The file of a sqlite URI or the directory of a file store; None for a server or another database."""
  p = urllib.parse.urlparse(uri)
  if p.scheme == 'sqlite':
    return uri[len('sqlite:///'):] if uri.startswith('sqlite:///') else None
  if p.scheme in ('', 'file'):
    return p.path if p.scheme == 'file' else uri
  return None


def unreachable(spec) -> Optional[str]:
  """Why the tracking URI cannot be used (one line), or None: a server must answer /health within 5 s; a local
  store's directory must exist and be writable."""
  uri = tracking_uri(spec)
  scheme = urllib.parse.urlparse(uri).scheme
  where = '--tracking_uri' if spec.uri else 'MLFLOW_TRACKING_URI' if os.environ.get('MLFLOW_TRACKING_URI') else \
      "MLflow's default tracking URI"
  if scheme in ('http', 'https'):
    try:
      with urllib.request.urlopen(uri.rstrip('/') + '/health', timeout=5) as r:
        r.read()
      return None
    except (urllib.error.URLError, OSError, ValueError) as e:
      reason = getattr(e, 'reason', e)
      return (f'{where}={uri}: the MLflow tracking server does not answer ({reason}); start it (mlflow server '
              '--backend-store-uri sqlite:///mlflow.db --port 5000) or give a reachable --tracking_uri')
  path = _local_path(uri)
  if path is None:
    return None                      # another database or service: its client says what is wrong at start
  parent = os.path.dirname(os.path.abspath(path)) if scheme == 'sqlite' else os.path.abspath(path)
  probe = parent
  while not os.path.exists(probe):   # a file store is created on first use, like a workdir
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe) or not os.access(probe, os.W_OK):
    return (f'{where}={uri}: {probe} is not a writable directory; give a --tracking_uri in a directory you can '
            'write (e.g. sqlite:///$PWD/mlflow.db)')
  if scheme == 'sqlite' and probe != parent:
    return f'{where}={uri}: no directory {parent}; create it or give another sqlite:///<path>.db'
  return None


def _experiment(client, spec) -> str:
  exp = client.get_experiment_by_name(spec.project)
  if exp is not None:
    return exp.experiment_id
  uri = tracking_uri(spec)
  path = _local_path(uri) if urllib.parse.urlparse(uri).scheme == 'sqlite' else None
  # Without a server, MLflow would put a sqlite store's artifacts under the current directory: beside the db instead.
  loc = os.path.join(os.path.dirname(os.path.abspath(path)), 'mlartifacts') if path else None
  return client.create_experiment(spec.project, artifact_location=loc)


def _parent(client, exp_id: str, group: str):
  found = client.search_runs([exp_id], filter_string=f"tags.`{PARENT_TAG}` = '{group}'", max_results=1)
  return found[0] if found else None


def open_group(spec) -> None:
  """The sweep's parent run: found again on a rerun of the sweep (then running again), else created."""
  client = MlflowClient(tracking_uri(spec))
  exp_id = _experiment(client, spec)
  parent = _parent(client, exp_id, spec.group)
  if parent is None:
    client.create_run(exp_id, run_name=spec.group, tags={PARENT_TAG: spec.group, SWEEP_TAG: spec.group})
  else:
    client.update_run(parent.info.run_id, status='RUNNING')


def close_group(spec, status: str) -> None:
  client = MlflowClient(tracking_uri(spec))
  exp = client.get_experiment_by_name(spec.project)
  parent = _parent(client, exp.experiment_id, spec.group) if exp is not None else None
  if parent is not None:
    client.set_terminated(parent.info.run_id, status)


class Run:
  """One MLflow run (`run_id`), logged to through the client."""

  def __init__(self, client, run_id: str, where: str):
    self.client, self.run_id, self.where = client, run_id, where

  def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
    ts = int(time.time() * 1000)
    items = [Metric(key(k), v, ts, step) for k, v in metrics.items()]
    for i in range(0, len(items), METRICS_PER_BATCH):
      self.client.log_batch(self.run_id, metrics=items[i:i + METRICS_PER_BATCH])

  def log_summary(self, numbers: Dict[str, float], texts: Dict[str, str]) -> None:
    """summary.json's numbers as `summary.<key>` metrics (one value each, no step) and its strings as tags."""
    ts = int(time.time() * 1000)
    items = [Metric(key(f'summary.{k}'), v, ts, 0) for k, v in numbers.items()]
    for i in range(0, len(items), METRICS_PER_BATCH):
      self.client.log_batch(self.run_id, metrics=items[i:i + METRICS_PER_BATCH])
    self.set_tags({f'summary.{k}': v for k, v in texts.items()})

  def log_artifacts(self, paths: List[str]) -> None:
    for p in paths:
      self.client.log_artifact(self.run_id, p)

  def set_tags(self, tags: Dict[str, str]) -> None:
    items = [RunTag(key(k), str(v)[:MAX_VALUE]) for k, v in tags.items()]
    for i in range(0, len(items), PARAMS_PER_BATCH):
      self.client.log_batch(self.run_id, tags=items[i:i + PARAMS_PER_BATCH])

  def close(self, status: str) -> None:
    self.client.set_terminated(self.run_id, status)


def open_run(spec, workdir: str, *, run_id: Optional[str], params: Dict[str, object]) -> Run:
  """Continues `run_id` when the store has it (running again), else a new run with `params` (the flattened config,
  in batches of MLflow's limit, each value cut to its length limit)."""
  uri = tracking_uri(spec)
  client = MlflowClient(uri)
  if run_id is not None:
    try:
      client.get_run(run_id)
      client.update_run(run_id, status='RUNNING')
      return Run(client, run_id, uri)
    except mlflow.exceptions.MlflowException as e:
      if getattr(e, 'error_code', '') != 'RESOURCE_DOES_NOT_EXIST':
        raise
  exp_id = _experiment(client, spec)
  tags = {'fedjax_flat.workdir': os.path.abspath(workdir)}
  if spec.group:
    tags[SWEEP_TAG] = spec.group
    parent = _parent(client, exp_id, spec.group)
    if parent is not None:
      tags['mlflow.parentRunId'] = parent.info.run_id
  run = client.create_run(exp_id, run_name=spec.name, tags=tags)
  items = [Param(key(k), str(v)[:MAX_VALUE]) for k, v in params.items()]
  for i in range(0, len(items), PARAMS_PER_BATCH):
    client.log_batch(run.info.run_id, params=items[i:i + PARAMS_PER_BATCH])
  return Run(client, run.info.run_id, uri)
