"""Aggregated reports over runs: a sweep's manifest (sweep.json) or any set of workdirs -> Markdown, CSV, plots.

Per group of runs (seeds of one cell, or runs sharing the values of user-named config keys):
  last-K accuracy of the reported model (summary.json `mean_last_<K>_test_accuracy`) and final accuracy,
  mean +- std over the runs (population std, ddof = 0, as the earlier checked-in tables); rounds to a target
  accuracy (first evaluation of the reported model at or above it, metrics.jsonl) and the bits sent up to that
  evaluation (its cumulative `comm_bytes` x 8: thesis Table 4.19's "bits to reach FedAvg's accuracy", also in
  that table's unit B, FedAvg's bits in the run's T rounds with the same model and cohort); the target is --target,
  or else each cell's own published target_accuracy, with the published rounds and bits (B) beside;
  lambda_max and the Hessian trace when experiments/hessian.py ran (WORKDIR/hessian/hessian_<model>.json), beside
  the published ones; what a run spent (DP epsilon / delta, virtual time, MB up); communication (summary.json
  comm_total_bytes); config.json's `published` (paper number, percent) and the sweep cell's `reference` (an
  earlier measurement, percent) beside the measured number with the difference.
Each task's headline metrics beyond accuracy (`METRICS`: mIoU pooled / seen / unseen, Recall@5 / @10, the
personalized models' local accuracy and AUCs) get their own columns whenever a run reports them, each beside the
published field of the same name; `published.model = 'personalized'` says that the published accuracy is the
personal models' (FedSoup's "Global Acc"), compared with summary.json's `personalized` protocol results.

Nothing is dropped or invented silently: an unreadable (torn) line of a metrics.jsonl is skipped and reported
(run, count, line numbers) while the lines after it are read; a run whose accuracy is NaN / inf is shown as
non-finite and left out of the means, with the count of runs averaged saying so; a target is reached only by
a finite accuracy. A sweep.json of the wrong shape is a ReportError naming what is wrong.
"""
from __future__ import annotations

import csv
import glob
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_flat.config import data_fields
from fedjax_flat.config import schema as config_schema
from fedjax_flat.errors import BadInputError
from fedjax_flat.schema import EXECUTION, RESULT, tagged


class ReportError(BadInputError):
  """Bad report input (a sweep.json of the wrong shape, no runs): the message names it and the fix."""


def _finite(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v) -> Optional[float]:
  """v as a float if it is a number (NaN / inf included), else None (absent, or a value of another type)."""
  return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _load_json(path: str) -> Optional[Dict]:
  """A JSON object from path, or None when it is absent, unreadable or not an object."""
  try:
    with open(path, 'rb') as f:
      d = json.loads(f.read())
  except (OSError, ValueError, RecursionError):
    return None
  return d if isinstance(d, dict) else None


def read_records(path: str) -> Tuple[List[Dict], List[int]]:
  """(records, line numbers of unreadable lines) of a metrics.jsonl. A torn line (a killed writer, a damaged
  file) is skipped, never the lines after it; records without an integer `round` count as unreadable."""
  out, bad = [], []
  try:
    with open(path, 'rb') as f:
      lines = f.read().split(b'\n')
  except OSError:
    return out, bad
  for i, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
    except (ValueError, RecursionError):
      bad.append(i)
      continue
    if not isinstance(rec, dict) or not isinstance(rec.get('round'), int) or isinstance(rec.get('round'), bool):
      bad.append(i)
      continue
    out.append(rec)
  return out, bad


def _records(path: str) -> List[Dict]:
  return read_records(path)[0]


def _manifest_runs(sd: str, man: Dict) -> List[Dict]:
  """The runs of a sweep.json, checked: ReportError naming the first thing of the wrong shape."""
  path = os.path.join(sd, 'sweep.json')
  runs = man.get('runs')
  if not isinstance(runs, list):
    raise ReportError(f'{path}: "runs" must be a list of runs (got {type(runs).__name__}); the file is not '
                      'a manifest written by experiments/sweep.py')
  for i, r in enumerate(runs):
    if not isinstance(r, dict) or not isinstance(r.get('workdir'), str) or not r['workdir']:
      raise ReportError(f'{path}: run {i} has no "workdir" string; the file is not a manifest written by '
                        'experiments/sweep.py (rerun the sweep, or give the runs as --workdirs)')
    if os.path.isabs(r['workdir']) or '..' in r['workdir'].replace('\\', '/').split('/'):
      raise ReportError(f'{path}: run {i} has workdir {r["workdir"]!r}: manifests hold paths inside the sweep '
                        'directory')
    if not isinstance(r.get('cell', ''), str) or (r.get('seed') is not None and not isinstance(r['seed'], int)):
      raise ReportError(f'{path}: run {i}: "cell" must be a string and "seed" an integer')
    for k in ('reference',):
      if r.get(k) is not None and not isinstance(r[k], dict):
        raise ReportError(f'{path}: run {i}: "{k}" must be an object ({{"source", "accuracy"}})')
  if not isinstance(man.get('name', ''), (str, type(None))) or \
      not isinstance(man.get('description', ''), (str, type(None))):
    raise ReportError(f'{path}: "name" and "description" must be strings')
  return runs


def _get(d: Optional[Dict], dotted: str, default=None):
  for part in dotted.split('.'):
    if not isinstance(d, dict) or part not in d:
      return default
    d = d[part]
  return d


def _default_cell(workdir: str) -> str:
  base = os.path.basename(os.path.normpath(workdir))
  return os.path.basename(os.path.dirname(os.path.normpath(workdir))) if base.startswith('seed=') else base


def as_round_summary(s: Optional[Dict]) -> Optional[Dict]:
  """A source pre-training's summary.json (training/source_pretrain.py, a pipeline's first stage: its source_only
  runs are published cells) read as a federated run's: one evaluation of the model it saved, at the end
  (last-K = 1), so its mIoU / pixel accuracy fill the same columns. Any other summary unchanged."""
  if not isinstance(s, dict) or s.get('experiment') != 'source pre-training':
    return s
  final = {k[len('final_'):]: v for k, v in s.items() if k.startswith('final_test_') and _finite(v)}
  return {**s, 'summary_last_k': 1, 'reported_model': 'global',
          **{f'mean_last_1_{k}': v for k, v in final.items()},
          'models': {'global': {**{f'mean_last_1_{k}': v for k, v in final.items()},
                                **{f'final_{k}': v for k, v in final.items()}}}}


def collect(sweep_dirs: Sequence[str] = (), workdirs: Sequence[str] = ()) -> List[Dict[str, Any]]:
  """One dict per run: workdir, cell, seed, sweep, reference, config, summary, records, hessian."""
  runs = []
  for sd in sweep_dirs:
    man = _load_json(os.path.join(sd, 'sweep.json'))
    if man is None:
      raise ReportError(f'--sweep_dir={sd!r} has no readable sweep.json (absent, truncated, or not a JSON '
                        'object); give a directory written by experiments/sweep.py, or the runs as --workdirs')
    for r in _manifest_runs(sd, man):
      runs.append(dict(workdir=os.path.join(sd, r['workdir']), cell=r.get('cell') or r['workdir'],
                       seed=r.get('seed'), sweep=man.get('name') or os.path.basename(os.path.normpath(sd)),
                       reference=r.get('reference'), description=man.get('description') or ''))
  for pattern in workdirs:
    hits = sorted(glob.glob(pattern)) or ([pattern] if os.path.isdir(pattern) else [])
    hits = [h for h in hits if os.path.isfile(os.path.join(h, 'config.json'))]
    if not hits:
      raise ReportError(f'--workdirs={pattern!r} matches no run directory (one holding config.json)')
    for h in hits:
      runs.append(dict(workdir=h, cell=_default_cell(h), seed=None, sweep='runs', reference=None,
                       description=''))
  for r in runs:
    wd = r['workdir']
    r['config'] = _load_json(os.path.join(wd, 'config.json'))
    r['summary'] = as_round_summary(_load_json(os.path.join(wd, 'summary.json')))
    r['records'], r['torn_lines'] = read_records(os.path.join(wd, 'metrics.jsonl'))
    if r['seed'] is None:
      r['seed'] = _get(r['config'], 'seed')
    s, c = r['summary'], r['config'] or {}
    done, planned = _num((s or {}).get('rounds_completed')), _num(c.get('rounds'))
    r['finished'] = bool(s) and done is not None and planned is not None and done >= planned and \
        not s.get('stopped_by_signal')
    if s and s.get('experiment') == 'source pre-training':     # written once, at its end
      r['finished'] = True
    model = (s or {}).get('reported_model', 'global')
    model = model if isinstance(model, str) else 'global'
    r['model'] = model
    r['acc_key'] = 'test_accuracy' if model == 'global' else f'{model}/test_accuracy'
    r['acc_name'], headline, r['headline_label'] = metric_names(s, model)
    r['headline_key'] = headline if model == 'global' else f'{model}/{headline}'
    r['hessian'] = None
    for name in (model, 'global'):
      h = _load_json(os.path.join(wd, 'hessian', f'hessian_{name}.json'))
      if h and 'lambda_max' in h:
        r['hessian'] = h
        break
  return runs


# config.published.<field> (percent) -> the run's number it is compared with (a fraction in summary.json): the
# reported model's last-K mean of a task metric ('model', metric), or a personalized protocol's client mean
# ('personalized', protocol, statistic: evaluation/personalized.py). Label as the paper's tables write it.
METRICS = (
    ('miou', 'mIoU', ('model', 'test_miou')),
    ('miou_seen', 'mIoU seen', ('model', 'test_seen_miou')),
    ('miou_unseen', 'mIoU unseen', ('model', 'test_unseen_miou')),
    ('recall@5', 'R@5', ('model', 'test_recall@5')),
    ('recall@10', 'R@10', ('model', 'test_recall@10')),
    ('local_acc', 'local acc', ('personalized', 'local', 'acc_client_mean')),
    ('local_auc', 'local AUC', ('personalized', 'local', 'auc_client_mean')),
    ('global_auc', 'global AUC', ('personalized', 'global', 'auc_client_mean')),
)
PERSONAL_ACCURACY = ('personalized', 'global', 'acc_client_mean')   # FedSoup Table 1's "Global Acc"
# What a run spent, from summary.json, shown when any run of the report has it (a privacy table's epsilon, a
# systems table's virtual time and bytes): (row field, summary key, scale, column label).
SPENT = (
    ('dp_epsilon', 'dp_epsilon', 1.0, 'DP epsilon'),
    ('dp_delta', 'dp_delta', 1.0, 'DP delta'),
    ('virtual_h', 'virtual_time_s', 1 / 3600, 'virtual time (h)'),
    ('mb_up', 'bytes_up', 1e-6, 'MB up (clock)'),
)
# The landscape lab's last values (summary.json `lab`, training/evals/lab.py), shown when any run has them: the
# loss barrier between the global model and its clients' models and between the clients' models (analysis/lab.py
# 'barrier'). (row field, key of
# summary['lab'], column label: the record field's own name).
LANDSCAPE = (
    ('barrier_mean', 'barrier_mean', 'barrier_mean'),
    ('barrier_max', 'barrier_max', 'barrier_max'),
    ('barrier_pair_mean', 'barrier_pair_mean', 'barrier_pair_mean'),
)
# config.published.<field> -> the key of experiments/hessian.py's hessian_<model>.json it is compared with (the
# same units: eigenvalue, Hutchinson trace). A run without that file shows the published number alone.
HESSIAN = (
    ('lambda_max', 'lambda_max', 'lambda_max'),
    ('hessian_trace', 'trace', 'Hessian trace'),
)


def metric_value(r: Dict, where: Tuple[str, ...]) -> Optional[float]:
  """A finished run's metric in percent (None when the run does not report it; NaN / inf kept as such)."""
  s = r['summary'] or {}
  if where[0] == 'model':
    m = _get(s, f"models.{r['model']}") or {}
    v = _num(m.get(f"mean_last_{s.get('summary_last_k')}_{where[1]}"))
  else:
    v = _num(_get(s.get(where[0]), '.'.join(where[1:])))
  return None if v is None else 100 * v


def metric_names(summary: Optional[Dict], model: str = 'global') -> Tuple[str, str, str]:
  """(what the run's accuracy is, the record key of its headline metric, the headline's label), as the run's task
  declared them (summary.json `metric_names`: tasks/base.metric_names); for a summary written before runs said
  so, from the reported model's metrics: Recall@1 for retrieval, mIoU (pixel accuracy) for segmentation."""
  s = summary or {}
  names = s.get('metric_names')
  if isinstance(names, dict) and all(isinstance(names.get(k), str) for k in ('accuracy', 'headline',
                                                                                 'headline_label')):
    return names['accuracy'], names['headline'], names['headline_label']
  m = _get(s, f'models.{model}') or {}
  if 'final_test_recall@1' in m:
    return 'R@1', 'test_accuracy', 'R@1'
  if 'final_test_miou' in m:
    return 'pixel accuracy', 'test_miou', 'mIoU'
  return 'accuracy', 'test_accuracy', 'accuracy'


_SHORT = {'accuracy': 'acc', 'pixel accuracy': 'pixel acc'}     # table headers are narrow


def accuracy_label(runs: List[Dict]) -> str:
  """What the reported accuracy of the table's runs is (the tasks' own names: R@1, pixel acc), 'acc' when they
  differ or there are none."""
  names = {r.get('acc_name') or metric_names(r['summary'], r['model'])[0] for r in runs if r['summary']}
  return _SHORT.get(next(iter(names)), next(iter(names))) if len(names) == 1 else 'acc'


def _group_value(run: Dict, key: str) -> str:
  if key == 'cell':
    return run['cell']
  v = _get(run['config'], key, '<unset>')
  return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def _mean_std(xs: List[float]):
  """Mean and population std of the finite values (callers leave non-finite runs out first, and say so)."""
  xs = [x for x in xs if _finite(x)]
  if not xs:
    return None, None
  return float(np.mean(xs)), float(np.std(xs))


def rounds_to_target(records: List[Dict], key: str, target: float) -> Optional[int]:
  """The first round whose `key` is a finite value >= target (NaN / inf never reach it)."""
  for rec in records:
    if _finite(rec.get(key)) and rec[key] >= target:
      return int(rec['round'])
  return None


def bits_to_target(records: List[Dict], key: str, target: float) -> Optional[float]:
  """Bits exchanged (down + up, cumulative `comm_bytes` x 8 of metrics.jsonl) up to the first record whose `key`
  is a finite value >= target; None when the target is never reached or that record has no finite comm_bytes."""
  for rec in records:
    if _finite(rec.get(key)) and rec[key] >= target:
      return 8.0 * rec['comm_bytes'] if _finite(rec.get('comm_bytes')) else None
  return None


def fedavg_run_bits(r: Dict) -> Optional[float]:
  """Thesis Table 4.19's unit B: the bits FedAvg sends in the run's T rounds with the same model and cohort,
  T x K x 2 (down + up) x d x 32 (float32)."""
  t, k = _num(_get(r['config'], 'rounds')), _num(_get(r['config'], 'clients_per_round'))
  d = _num((r['summary'] or {}).get('num_params'))
  return None if None in (t, k, d) or not t * k * d else 64.0 * t * k * d


def _accuracies(r: Dict) -> Tuple[Optional[float], Optional[float]]:
  """(last-K, final) test accuracy of a finished run in percent (None: absent; NaN / inf kept as such)."""
  s = r['summary']
  k = s.get('summary_last_k')
  lastk, final = _num(s.get(f'mean_last_{k}_test_accuracy')), _num(s.get('final_test_accuracy'))
  return (None if lastk is None else 100 * lastk), (None if final is None else 100 * final)


def nonfinite(r: Dict) -> bool:
  """A finished run whose reported accuracy is NaN / inf (a diverged model, a damaged summary.json)."""
  return any(v is not None and not math.isfinite(v) for v in _accuracies(r))


def _run_name(r: Dict) -> str:
  return f"{r['cell']}/seed={r['seed']}"


# Config keys that say how a run was executed or recorded, not what was run (the sections' tag EXECUTION, and
# the data fields': config/data_fields.py), plus the seed (the replicate axis) and `host_devices` (recorded in
# config.json by the binary, not a config field): runs that differ only in these (and in the grouping keys) are
# seeds of one experiment. Every other key splits a group (see `split_group`).
EXECUTION_KEYS = ('seed', 'host_devices') + tagged(config_schema.SCHEMA, EXECUTION) + data_fields.tagged(EXECUTION)
# Keys under EXECUTION_KEYS that change the result (tag RESULT), with the value a config.json written before the
# key existed ran with (its default): runs differing in them are never pooled as seeds.
RESULT_KEYS = {s.path(f): f.rule.default for s in config_schema.SCHEMA for f in s.fields
               if RESULT in f.tags and any(s.path(f).startswith(k + '.') for k in EXECUTION_KEYS)}


def _flatten(d: Dict, prefix: str = '') -> Dict[str, str]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict) and v:
      out.update(_flatten(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = json.dumps(v, sort_keys=True)
  return out


def _under(key: str, prefixes: Sequence[str]) -> bool:
  return any(key == p or key.startswith(p + '.') for p in prefixes)


def split_group(rs: List[Dict], group_by: Sequence[str]) -> List[Tuple[str, List[Dict]]]:
  """Splits one group's runs by their configs minus the seed, the grouping keys and EXECUTION_KEYS.

  Grouping by `algorithm,server.optimizer` must not pool FedAvg with FedAvgM as "2/2 seeds" of one cell:
  runs whose configs differ in any other key become separate rows, each labelled by the differing keys'
  values ('' when the group is one experiment). Runs without a readable config.json (a failed start) stay
  with the first sub-group, where they are counted as unfinished."""
  flat = [None if r['config'] is None else
          {k: v for k, v in {**{k: json.dumps(d) for k, d in RESULT_KEYS.items()}, **_flatten(r['config'])}.items()
           if (not _under(k, EXECUTION_KEYS) or _under(k, RESULT_KEYS))
           and not _under(k, [g for g in group_by if g != 'cell'])} for r in rs]
  known = [f for f in flat if f is not None]
  keys = sorted({k for f in known for k in f})
  differing = [k for k in keys if len({f.get(k, '<unset>') for f in known}) > 1]
  if not differing:
    return [('', rs)]
  parts: Dict[str, List[Dict]] = {}
  for r, f in zip(rs, flat):
    if f is None:
      continue
    label = ', '.join(f"{k}={json.loads(f[k]) if k in f else '<unset>'}" for k in differing)
    parts.setdefault(label, []).append(r)
  first = next(iter(parts))
  parts[first] += [r for r, f in zip(rs, flat) if f is None]
  return list(parts.items())


def aggregate(runs: List[Dict], group_by: Sequence[str], target: Optional[float] = None) -> List[Dict]:
  """Rows in first-seen group order. Accuracies in percent. A group whose runs differ in a config key other
  than the seed and the grouping keys is split (`split_group`), the row's `differs` naming the values."""
  groups: Dict[tuple, List[Dict]] = {}
  for r in runs:
    groups.setdefault((r['sweep'],) + tuple(_group_value(r, k) for k in group_by), []).append(r)
  parts = [(gkey, label, sub) for gkey, rs in groups.items() for label, sub in split_group(rs, group_by)]
  rows = []
  for gkey, label, rs in parts:
    finished = [r for r in rs if r['finished']]
    bad = [r for r in finished if nonfinite(r)]
    done = [r for r in finished if not nonfinite(r)]      # what the means are over
    row = {'sweep': gkey[0], **dict(zip(group_by, gkey[1:])), 'differs': label, 'runs': len(rs),
           'finished': len(done),
           'seeds': ' '.join(str(r['seed']) for r in done), 'nonfinite': len(bad),
           'nonfinite_runs': ' '.join(_run_name(r) for r in bad),
           'torn_lines': sum(len(r['torn_lines']) for r in rs),
           'torn': '; '.join(f"{_run_name(r)} metrics.jsonl line(s) {', '.join(map(str, r['torn_lines'][:5]))}"
                             + (' ...' if len(r['torn_lines']) > 5 else '') for r in rs if r['torn_lines'])}
    models = {r['model'] for r in done}
    row['model'] = ','.join(sorted(models)) if models else ''
    row['last_k'] = ','.join(sorted({str(r['summary'].get('summary_last_k')) for r in done}))
    row['acc_lastk_mean'], row['acc_lastk_std'] = _mean_std([_accuracies(r)[0] for r in done])
    row['acc_final_mean'], row['acc_final_std'] = _mean_std([_accuracies(r)[1] for r in done])
    published = _first([x for x in (_get(r['config'], 'published') for r in rs) if isinstance(x, dict)]) or {}
    # Rounds to a target: --target for every row, or else the row's own published target (thesis Table 4.19 /
    # MAN's rounds to 50 %: the accuracy each cell's paper counted rounds to), beside the published rounds.
    row_target = target if target is not None else (
        _num(published.get('target_accuracy')) / 100 if _finite(published.get('target_accuracy')) else None)
    if row_target is not None:
      hits = [rounds_to_target(r['records'], r['acc_key'], row_target) for r in done]
      reached = [h for h in hits if h is not None]
      row['target'] = row_target
      row['published_rounds_to_target'] = (_num(published.get('rounds_to_target'))
                                           if _finite(published.get('rounds_to_target')) else None)
      row['rounds_to_target_mean'] = float(np.mean(reached)) if reached else None
      row['reached_target'] = f'{len(reached)}/{len(done)}'
      per_run = [(bits_to_target(r['records'], r['acc_key'], row_target), fedavg_run_bits(r)) for r in done]
      bits = [b for b, _ in per_run if b is not None]
      row['bits_to_target_mean'] = float(np.mean(bits)) if bits else None
      row['bits_to_target_runs'] = len(bits)
      in_b = [b / u for b, u in per_run if b is not None and u]
      row['bits_to_target_B_mean'] = float(np.mean(in_b)) if in_b else None
      row['published_bits_to_target_B'] = (_num(published.get('bits_to_target_B'))
                                           if _finite(published.get('bits_to_target_B')) else None)
    # rounds to X% of the centralized accuracy (training/centralized.py), mean over the runs that got there
    for key in sorted({k for r in done for k in r['summary'] if k.startswith('rounds_to_') and
                       k.endswith('pct_centralized')}):
      got = [r['summary'][key] for r in done if _finite(r['summary'].get(key))]
      row[f'{key}_mean'] = float(np.mean(got)) if got else None
      row[f'reached_{key[len("rounds_to_"):]}'] = f'{len(got)}/{len(done)}'
    lam = [r['hessian']['lambda_max'] for r in done if r['hessian'] and _finite(r['hessian']['lambda_max'])]
    row['lambda_max_mean'], row['lambda_max_std'] = _mean_std(lam)
    row['lambda_max_runs'] = len(lam)
    for field, key, _ in HESSIAN:     # the paper's curvature numbers beside experiments/hessian.py's (no unit change)
      if field != 'lambda_max':
        vals = [_num(r['hessian'].get(key)) for r in done if r['hessian'] and _finite(r['hessian'].get(key))]
        row[f'{field}_mean'], row[f'{field}_std'] = _mean_std(vals)
        row[f'{field}_runs'] = len(vals)
      p = _num(published.get(field)) if _finite(published.get(field)) else None
      row[f'published_{field}'] = p
      row[f'published_{field}_std'] = (_num(published.get(f'{field}_std'))
                                       if _finite(published.get(f'{field}_std')) else None)
      row[f'diff_{field}'] = None if p is None or row[f'{field}_mean'] is None else row[f'{field}_mean'] - p
    row['comm_mb_mean'], _ = _mean_std([_num(r['summary'].get('comm_total_bytes')) / 1e6
                                         if _num(r['summary'].get('comm_total_bytes')) is not None else None
                                         for r in done])
    for field, key, scale, _ in SPENT:
      got = [_num(r['summary'].get(key)) * scale for r in done if _finite(r['summary'].get(key))]
      if got:
        row[f'{field}_mean'], row[f'{field}_std'] = _mean_std(got)
    for field, key, _ in LANDSCAPE:
      got = [_num(r['summary']['lab'][key]) for r in done
             if isinstance(r['summary'].get('lab'), dict) and _finite(r['summary']['lab'].get(key))]
      if got:
        row[f'{field}_mean'], row[f'{field}_std'] = _mean_std(got)
    wall = [_num(r['summary'].get('wall_time_total_s', r['summary'].get('wall_time_s'))) for r in done]
    row['wall_s_mean'], _ = _mean_std(wall)
    row['published_model'] = 'personalized' if published.get('model') == 'personalized' else ''
    if row['published_model']:     # the published accuracy is the personal models': compare with theirs
      row['acc_personal_mean'], row['acc_personal_std'] = _mean_std([metric_value(r, PERSONAL_ACCURACY)
                                                                     for r in done])
    for name, d in (('published', published),
                    ('reference', _first([x for x in (r['reference'] for r in rs) if isinstance(x, dict)]) or {})):
      row[f'{name}_source'] = str(d.get('source') or '')
      row[f'{name}_acc'] = a = _num(d.get('accuracy')) if _finite(d.get('accuracy')) else None
      row[f'{name}_std'] = _num(d.get('accuracy_std')) if _finite(d.get('accuracy_std')) else None
      m = row['acc_personal_mean'] if name == 'published' and row['published_model'] else row['acc_lastk_mean']
      row[f'diff_{name}'] = None if a is None or m is None else m - a
    for field, _, where in METRICS:    # each task metric the runs report, beside its published number
      vals = [metric_value(r, where) for r in done]
      p = _num(published.get(field)) if _finite(published.get(field)) else None
      if all(v is None for v in vals) and p is None:
        continue
      row[f'{field}_mean'], row[f'{field}_std'] = _mean_std(vals)
      row[f'published_{field}'] = p
      row[f'published_{field}_std'] = (_num(published.get(f'{field}_std'))
                                       if _finite(published.get(f'{field}_std')) else None)
      row[f'diff_{field}'] = None if p is None or row[f'{field}_mean'] is None else row[f'{field}_mean'] - p
    row['failed'] = ' '.join(_run_name(r) for r in rs if not r['finished'])
    row['_runs'] = done
    rows.append(row)
  return rows


def _first(xs):
  for x in xs:
    if x:
      return x
  return None


# --------------------------------------------------------------------------------------------- writers

CSV_FIELDS = ['differs', 'acc_lastk_mean', 'acc_lastk_std', 'acc_final_mean', 'acc_final_std', 'last_k', 'model',
              'runs', 'finished', 'seeds', 'target', 'rounds_to_target_mean', 'reached_target',
              'bits_to_target_mean', 'bits_to_target_runs', 'published_rounds_to_target',
              'bits_to_target_B_mean', 'published_bits_to_target_B',
              'rounds_to_70pct_centralized_mean', 'reached_70pct_centralized', 'rounds_to_90pct_centralized_mean',
              'reached_90pct_centralized', 'lambda_max_mean',
              'lambda_max_std', 'lambda_max_runs', 'published_lambda_max', 'published_lambda_max_std',
              'diff_lambda_max', 'hessian_trace_mean', 'hessian_trace_std', 'hessian_trace_runs',
              'published_hessian_trace', 'published_hessian_trace_std', 'diff_hessian_trace', 'comm_mb_mean',
              'dp_epsilon_mean', 'dp_epsilon_std', 'dp_delta_mean', 'virtual_h_mean', 'virtual_h_std', 'mb_up_mean',
              'mb_up_std', 'wall_s_mean', 'published_acc',
              'published_std', 'diff_published', 'published_source', 'reference_acc', 'reference_std',
              'diff_reference', 'reference_source', 'failed', 'nonfinite', 'nonfinite_runs', 'torn_lines', 'torn']
CSV_FIELDS[CSV_FIELDS.index('published_acc'):CSV_FIELDS.index('published_acc')] = [
    'published_model', 'acc_personal_mean', 'acc_personal_std']
for _field, _, _ in METRICS:
  CSV_FIELDS += [f'{_field}_mean', f'{_field}_std', f'published_{_field}', f'published_{_field}_std', f'diff_{_field}']
for _field, _, _ in LANDSCAPE:
  CSV_FIELDS += [f'{_field}_mean', f'{_field}_std']


def _r(v, nd=2):
  return '' if v is None else (round(v, nd + 2) if isinstance(v, float) else v)


def write_csv(rows: List[Dict], group_by: Sequence[str], path: str) -> None:
  fields = ['sweep'] + list(group_by) + [f for f in CSV_FIELDS if any(f in r for r in rows)]
  with open(path, 'w', newline='') as f:
    w = csv.DictWriter(f, fieldnames=fields, extrasaction='ignore')
    w.writeheader()
    for row in rows:
      w.writerow({k: _r(row.get(k)) for k in fields})


def _pm(m, s, nd=2):
  if m is None:
    return ''
  return f'{m:.{nd}f}' + (f' ± {s:.{nd}f}' if s is not None else '')


def _diff(d) -> str:
  return '' if d is None else f'{0.0 if abs(d) < 0.005 else d:+.2f}'   # no "-0.00"


def markdown_table(rows: List[Dict], group_by: Sequence[str], target: Optional[float]) -> List[str]:
  has = lambda k: any(r.get(k) is not None and r.get(k) != '' for r in rows)   # noqa: E731
  split = any(r.get('differs') for r in rows)
  acc = accuracy_label([run for r in rows for run in r.get('_runs', [])])
  head = list(group_by) + (['differs in'] if split else []) + ['model', f'last-K {acc} (%)', f'final {acc} (%)',
                                                                'seeds']
  per_row = target is None and has('target')       # each row's published target (aggregate)
  if target is not None:
    head += [f'rounds to {target:g}', f'bits to {target:g}']
  elif per_row:
    head += ['target acc (%)', 'rounds to target', 'bits to target']
  if has('published_rounds_to_target'):
    head += ['published rounds to target']
  if has('published_bits_to_target_B'):
    head += ['bits to target (B)', 'published bits (B)']
  curvature = [(f, label) for f, _, label in HESSIAN if has(f'{f}_mean') or has(f'published_{f}')]
  for f, label in curvature:
    head += [label] + ([f'published {label}', 'diff'] if has(f'published_{f}') else [])
  head += ['comm (MB)']
  spent = [(f, label) for f, _, _, label in SPENT if has(f'{f}_mean')]
  head += [label for _, label in spent]
  landscape = [(f, label) for f, _, label in LANDSCAPE if has(f'{f}_mean')]
  head += [label for _, label in landscape]
  personal = has('acc_personal_mean')
  if personal:
    head += ['personal models acc (%)']
  if has('published_acc'):
    head += ['published (%)', 'diff']
  if has('reference_acc'):
    head += ['reference (%)', 'diff']
  metrics = [(f, label) for f, label, _ in METRICS if any(f'{f}_mean' in r for r in rows)]
  for f, label in metrics:
    head += [f'last-K {label} (%)'] + ([f'published {label} (%)', 'diff'] if has(f'published_{f}') else [])
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in rows:
    cells = [str(r[k]) for k in group_by] + ([r.get('differs', '')] if split else []) + [
        r['model'], _pm(r['acc_lastk_mean'], r['acc_lastk_std']), _pm(r['acc_final_mean'], r['acc_final_std']),
        f"{r['finished']}/{r['runs']}" + (f" ({r['nonfinite']} non-finite, not averaged)" if r['nonfinite'] else '')]
    if target is not None or per_row:
      if per_row:
        cells.append('' if r.get('target') is None else f"{100 * r['target']:.2f}")
      cells.append('' if r.get('target') is None or (r['rounds_to_target_mean'] is None and r['finished'] == 0) else
                   (f"{r['rounds_to_target_mean']:.1f} ({r['reached_target']})" if r['rounds_to_target_mean']
                    is not None else f"not reached (0/{r['finished']})"))
      cells.append('' if r.get('bits_to_target_mean') is None else
                   f"{r['bits_to_target_mean']:.3g} ({r['bits_to_target_runs']}/{r['finished']})")
    if has('published_rounds_to_target'):
      p = r.get('published_rounds_to_target')
      cells.append('' if p is None else f'{p:g}')
    if has('published_bits_to_target_B'):
      b, p = r.get('bits_to_target_B_mean'), r.get('published_bits_to_target_B')
      cells += ['' if b is None else f'{b:.3g}', '' if p is None else f'{p:g}']
    for f, _ in curvature:
      cells.append(_pm(r.get(f'{f}_mean'), r.get(f'{f}_std')))
      if has(f'published_{f}'):
        p = r.get(f'published_{f}')
        cells += ['' if p is None else _pm(p, r.get(f'published_{f}_std')), _diff(r.get(f'diff_{f}'))]
    cells.append('' if r['comm_mb_mean'] is None else f"{r['comm_mb_mean']:.0f}")
    for f, _ in spent:
      if f == 'dp_delta':
        cells.append('' if r.get(f'{f}_mean') is None else f"{r[f'{f}_mean']:.0e}")
      else:
        cells.append(_pm(r.get(f'{f}_mean'), r.get(f'{f}_std'), nd=3 if f in ('dp_epsilon', 'virtual_h') else 2))
    for f, _ in landscape:
      cells.append(_pm(r.get(f'{f}_mean'), r.get(f'{f}_std'), nd=4))
    if personal:
      cells.append(_pm(r.get('acc_personal_mean'), r.get('acc_personal_std')))
    for name in ('published', 'reference'):
      if has(f'{name}_acc'):
        a = r[f'{name}_acc']
        cells.append('' if a is None else _pm(float(a), r[f'{name}_std']))
        cells.append(_diff(r[f'diff_{name}']))
    for f, _ in metrics:
      cells.append(_pm(r.get(f'{f}_mean'), r.get(f'{f}_std')))
      if has(f'published_{f}'):
        p = r.get(f'published_{f}')
        cells += ['' if p is None else _pm(p, r.get(f'published_{f}_std')), _diff(r.get(f'diff_{f}'))]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return lines


# The x axes of the accuracy curves: rounds, and with a virtual clock (config.system) its seconds and bytes.
CURVE_AXES = (('round', 'round', '_curves.png', 1.0),
              ('virtual_time_s', 'virtual time (h)', '_time.png', 1 / 3600.0),
              ('bytes', 'MiB sent (down + up)', '_bytes.png', 1 / 2**20))


def _x(rec: Dict, key: str) -> Optional[float]:
  if key == 'bytes':
    return (rec['bytes_down'] + rec['bytes_up']) if 'bytes_up' in rec else None
  return rec.get(key)


def _headline_bar(row: Dict) -> Tuple[str, Optional[float], Optional[float], Optional[float], bool]:
  """(label, last-K mean, std, the published number of that metric, whether it is the accuracy) of a row's
  headline metric: accuracy, or the task metric its runs declare as headline (segmentation: the mIoU, beside
  published.miou)."""
  runs = row.get('_runs') or []
  keys = {run.get('headline_key', run.get('acc_key', 'test_accuracy')).split('/')[-1] for run in runs}
  labels = {run.get('headline_label', 'accuracy') for run in runs}
  if len(keys) == 1 and keys != {'test_accuracy'}:
    (key,) = keys
    for field, _, where in METRICS:
      if where == ('model', key):
        return (next(iter(labels)), row.get(f'{field}_mean'), row.get(f'{field}_std'),
                row.get(f'published_{field}'), False)
  published = None if row.get('published_model') else row.get('published_acc')
  return ((next(iter(labels)) if len(labels) == 1 else 'accuracy'), row.get('acc_lastk_mean'),
          row.get('acc_lastk_std'), published, True)


def plot(rows: List[Dict], group_by: Sequence[str], prefix: str, notes: Optional[List[str]] = None) -> List[str]:
  """<prefix>_curves.png (the reported model's headline metric vs round: accuracy, or what the task declares,
  the mIoU of segmentation, R@1 of retrieval; mean and min-max band over seeds), with a virtual clock also
  <prefix>_time.png and <prefix>_bytes.png (the same against virtual time and bytes sent, x the mean over seeds
  at each evaluation round; the runs without a clock left out, each named in `notes`), and <prefix>_bars.png
  (last-K headline metric, mean +- std, with the personal models' accuracy as a second bar where the paper
  publishes theirs; reference / published markers over the bar of the metric they report)."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  label = lambda r: ', '.join([str(r[k]) for k in group_by] + ([r['differs']] if r.get('differs') else []))  # noqa: E731
  rows = [r for r in rows if r['_runs']]
  if not rows:
    return []
  key_of = lambda run: run.get('headline_key', run['acc_key'])     # noqa: E731
  labels = {run.get('headline_label', 'accuracy') for r in rows for run in r['_runs']}
  ylabel = next(iter(labels)) if len(labels) == 1 else 'headline metric'
  out = []
  for key, xlabel, suffix, scale in CURVE_AXES:
    def has_axis(run):
      return all(_x(rec, key) is not None for rec in run['records'] if _finite(rec.get(key_of(run))))
    # Draw the runs that have this axis; the others are named in the report, never dropped silently.
    kept = [(r, [run for run in r['_runs'] if key == 'round' or has_axis(run)]) for r in rows]
    if not any(runs for _, runs in kept):
      continue
    left_out = [_run_name(run) for r in rows for run in r['_runs'] if key != 'round' and not has_axis(run)]
    if left_out and notes is not None:
      notes.append(f'{os.path.basename(prefix + suffix)} leaves out the runs without a virtual clock '
                   f'(config.system): {" ".join(left_out)}')
    fig, ax = plt.subplots(figsize=(9, 5.5))
    # tab20 pairs neighbouring hues (blue, light blue, ...); ten distinct colours x line styles stay apart.
    colours, styles = plt.get_cmap('tab10'), ('-', '--', ':', '-.')
    for i, (r, runs) in enumerate(kept):
      colour, style = colours(i % 10), styles[(i // 10) % len(styles)]
      curves, xs = {}, {}
      for run in runs:
        for rec in run['records']:
          if _finite(rec.get(key_of(run))):
            curves.setdefault(rec['round'], []).append(100 * rec[key_of(run)])
            xs.setdefault(rec['round'], []).append(rec['round'] if key == 'round' else scale * _x(rec, key))
      rounds = sorted(x for x, v in curves.items() if len(v) == len(runs))
      if not rounds:
        continue
      ys = np.array([curves[x] for x in rounds])
      xv = [float(np.mean(xs[x])) for x in rounds]
      ax.plot(xv, ys.mean(1), color=colour, ls=style, label=label(r), lw=1.4)
      ax.fill_between(xv, ys.min(1), ys.max(1), color=colour, alpha=0.12, lw=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f'test {ylabel} (%), reported model')
    ax.set_title('mean over seeds; band = min..max')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc='lower right')
    fig.tight_layout()
    out.append(prefix + suffix)
    fig.savefig(out[-1], dpi=110)
    plt.close(fig)

  # One bar per row (its headline metric), and beside it the personal models' accuracy where the paper
  # publishes that (FedSoup's "Global Acc"): each published marker sits over the bar of the metric it reports.
  bars = []      # (x, value, std, published, colour, legend)
  ticks = []
  x = 0.0
  for r in rows:
    name, m, sd, pub, is_acc = _headline_bar(r)
    group = [(m, sd, pub, 'tab:blue', f'measured {name} (mean ± std)')]
    if r.get('published_model') == 'personalized':
      group.append((r.get('acc_personal_mean'), r.get('acc_personal_std'), r.get('published_acc'), 'tab:orange',
                    'personal models acc (mean ± std)'))
    width = 0.8 / len(group)
    for j, (m, sd, pub, colour, legend) in enumerate(group):
      # the sweep's reference is an earlier measured accuracy: over the accuracy bar only
      bars.append((x + (j - (len(group) - 1) / 2) * width, width, m, sd, pub, colour, legend,
                   r.get('reference_acc') if j == 0 and is_acc else None))
    ticks.append(x)
    x += 1.0
  fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(rows) + 2), 5))
  seen = set()
  for bx, w, m, sd, _, colour, legend, _ in bars:
    ax.bar(bx, m or 0, w, yerr=sd or 0, capsize=3, color=colour, alpha=0.8,
           label=None if legend in seen else legend)
    seen.add(legend)
  for idx, name, marker, color in ((7, 'reference', '_', 'black'), (4, 'published', 'x', 'tab:red')):
    pts = [(b[0], float(b[idx])) for b in bars if b[idx] is not None]
    if pts:
      ax.scatter(*zip(*pts), marker=marker, s=200, color=color, zorder=3, label=name, linewidths=2)
  ax.set_xticks(ticks)
  ax.set_xticklabels([label(r) for r in rows], rotation=60, ha='right', fontsize=8)
  names = {_headline_bar(r)[0] for r in rows}
  ax.set_ylabel(f'last-K test {next(iter(names)) if len(names) == 1 else "headline metric"} (%)')
  ax.set_ylim(0, 100)       # from zero: a cut axis makes small differences look large
  ax.grid(axis='y', alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  out.append(prefix + '_bars.png')
  fig.savefig(out[-1], dpi=110)
  plt.close(fig)
  return out
