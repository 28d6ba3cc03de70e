"""Human-readable results: metrics.jsonl + metrics.csv, TensorBoard events, a PNG plot, summary.json/.md.

Files are replaced atomically through `<name>.<pid>.tmp` (unique per process). A write that fails (disk
full, permissions) raises `ResultsWriteError` naming the file: one line from train.py, exit 1; the rerun
resumes from the last checkpoint and rewrites metrics.jsonl from it.
Array-valued metrics (a segmentation run's per-class IoU `test_iou`) are kept whole in metrics.jsonl (NaN ->
null), left out of metrics.csv and TensorBoard (scalars only), and summary.json reports their final value
per model; every scalar test metric beyond accuracy/loss (test_miou, test_unseen_miou, ...) gets a final and
a last-K mean there, and metrics.png a panel of the mIoU curves.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import time
from typing import Dict, List

import numpy as np

from fedjax_flat import errors
from fedjax_flat.systems import clock as clock_lib


class ResultsWriteError(errors.OperationError):
  """A result file could not be written."""


@contextlib.contextmanager
def _writing(path: str):
  """Turns an OSError while writing `path` into one ResultsWriteError naming it."""
  try:
    yield
  except OSError as e:
    raise ResultsWriteError(f'could not write {path}: {e.strerror or e}. Free disk space or fix permissions, then '
                            'rerun the same command: it resumes from the last checkpoint') from None


def atomic_write(path: str, write_fn, mode: str = 'w', **open_kw) -> None:
  """write_fn(f) into `<path>.<pid>.tmp`, then renamed over `path`; the temporary file never stays behind."""
  tmp = f'{path}.{os.getpid()}.tmp'
  with _writing(path):
    try:
      with open(tmp, mode, **open_kw) as f:
        write_fn(f)
      os.replace(tmp, path)
    finally:
      if os.path.lexists(tmp):
        os.remove(tmp)


def keep_rounds_through(path: str, last_round: int) -> None:
  """A per-round JSON-lines file (each row has 'round') cut back to the rows of rounds <= last_round, in place: a
  run resumed from that round writes the later rows again (an interrupted run had evaluated past it)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    kept = [line for line in f if line.strip() and json.loads(line)['round'] <= last_round]
  atomic_write(path, lambda f: f.write(''.join(kept)))


class MetricsWriter:
  """Appends one JSON object per evaluation to metrics.jsonl (and a CSV, and TensorBoard scalars)."""

  def __init__(self, workdir: str, tensorboard: bool = True):
    self.workdir = workdir
    os.makedirs(workdir, exist_ok=True)
    self.jsonl_path = os.path.join(workdir, 'metrics.jsonl')
    self.csv_path = os.path.join(workdir, 'metrics.csv')
    self.records: List[Dict] = []
    self._tensorboard = tensorboard
    self._tb = None
    self._purge_step = None

  def _tb_writer(self):
    """Opened on first use, so that a resume can first say which steps to purge."""
    if self._tb is None and self._tensorboard:
      try:
        from tensorboardX import SummaryWriter
      except ImportError:  # optional: results still go to JSONL/CSV
        self._tensorboard = False
        return None
      # purge_step: TensorBoard drops events at steps >= it from earlier event files, so rounds that ran
      # after the last checkpoint and are re-run after a resume are not shown twice.
      # The suffix keeps a resumed run's file distinct from (and sorted after) the earlier one even within the
      # same second: TensorBoard reads event files in name order, and the default name has 1 s resolution.
      self._tb = SummaryWriter(os.path.join(self.workdir, 'tensorboard'), purge_step=self._purge_step,
                               filename_suffix=f'.{time.time_ns():020d}')
    return self._tb

  def load_existing(self, upto_round: int):
    """On resume: keep records up to `upto_round`, drop any written after the checkpoint (also in TensorBoard)."""
    self.records = []
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    self._purge_step = int(upto_round) + 1
    if os.path.exists(self.jsonl_path):
      with open(self.jsonl_path) as f:
        for line in f:
          line = line.strip()
          if not line:
            continue
          try:
            r = json.loads(line)
          except json.JSONDecodeError:
            break  # a torn last line from a crash
          if r['round'] <= upto_round:
            self.records.append(r)
    self._rewrite()

  def _rewrite(self):
    atomic_write(self.jsonl_path, lambda f: f.writelines(json.dumps(finite_json(r), allow_nan=False) + '\n'
                                                            for r in self.records))
    self._write_csv()

  def _write_csv(self):
    keys = []
    for r in self.records:
      keys += [k for k in r if k not in keys]
    keys = [k for k in keys if not any(isinstance(r.get(k), (list, tuple)) for r in self.records)]

    def write(f):
      w = csv.DictWriter(f, fieldnames=keys, extrasaction='ignore')   # array-valued metrics: jsonl only
      w.writeheader()
      for r in self.records:
        w.writerow(r)
    atomic_write(self.csv_path, write, newline='')

  def write(self, record: Dict):
    record = {k: _plain(v) for k, v in record.items()}
    self.records.append(record)
    with _writing(self.jsonl_path), open(self.jsonl_path, 'a') as f:
      f.write(json.dumps(finite_json(record), allow_nan=False) + '\n')
      f.flush()
    self._write_csv()
    tb = self._tb_writer()
    if tb is not None:
      for k, v in record.items():
        if k != 'round' and isinstance(v, (int, float)) and not isinstance(v, bool):
          tb.add_scalar(k, v, record['round'])
      tb.flush()

  def close(self):
    if self._tb is not None:
      self._tb.close()


def _plain(v):
  """numpy scalars -> float; arrays -> lists; NaN / +-inf -> None everywhere (strict JSON: metrics.jsonl never
  holds NaN or Infinity, which other JSON readers refuse)."""
  if isinstance(v, (np.floating, np.integer)):
    v = float(v)
  if isinstance(v, float):
    return v if math.isfinite(v) else None
  if isinstance(v, (list, tuple, np.ndarray)):
    return [None if (e is None or not np.isfinite(e)) else float(e) for e in np.asarray(v, np.float64).ravel()]
  return v


def _finite_float(o):
  """json's `default`: an object that is a number (a jax scalar) as a finite float or None."""
  return finite_json(float(o))


def finite_json(v):
  """`v` with every non-finite float (nested in dicts / lists too) as None, numpy scalars as numbers: what
  `json.dumps(..., allow_nan=False)` accepts."""
  if isinstance(v, dict):
    return {k: finite_json(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return [finite_json(x) for x in v]
  if isinstance(v, np.ndarray):
    return finite_json(v.tolist())
  if isinstance(v, np.integer):
    return int(v)
  if isinstance(v, (float, np.floating)):
    v = float(v)
    return v if math.isfinite(v) else None
  return v


def _save_figure(fig, path: str, title: str) -> None:
  """Titles, lays out and writes a figure atomically (a failed write is one ResultsWriteError), then frees it."""
  import matplotlib.pyplot as plt
  fig.suptitle(title)
  fig.tight_layout()
  try:
    with _writing(path):
      fig.savefig(path, dpi=110)
  finally:
    plt.close(fig)


def plot_metrics(records: List[Dict], path: str, title: str = '', accuracy_name: str = 'accuracy') -> None:
  """accuracy and loss vs round for every evaluated model (global, swa, wima...); `accuracy_name` is what the
  task calls its accuracy (tasks/base.metric_names: 'R@1', 'pixel accuracy')."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  if not records:
    return
  miou_keys = sorted({k for r in records for k in r if k.endswith('test_miou') or
                      (k.startswith('test_') and k.endswith('_miou'))})
  if miou_keys:   # segmentation: the mIoU curves (pooled and per test-client group) in a third panel
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4))
    for k in miou_keys:
      pts = [(r['round'], r[k]) for r in records if isinstance(r.get(k), (int, float))]
      ax3.plot([a for a, _ in pts], [b for _, b in pts], marker='.',
               label=k.replace('test_', '').replace('_miou', '') or 'all')
    ax3.set_xlabel('round'); ax3.set_ylabel('test mIoU'); ax3.grid(alpha=.3); ax3.legend()
  else:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  rounds = [r['round'] for r in records]
  prefixes = sorted({k[:-len('test_accuracy')] for r in records for k in r if k.endswith('test_accuracy')})
  for p in prefixes:
    pts = [(r['round'], r[p + 'test_accuracy'], r[p + 'test_loss']) for r in records if p + 'test_accuracy' in r]
    label = (p.rstrip('/') or 'global')
    # markers: a model evaluated once (an SWA / WiMA model that became active at the last evaluation) is a
    # single point, invisible as a line
    ax1.plot([a for a, _, _ in pts], [b for _, b, _ in pts], marker='.', label=label)
    ax2.plot([a for a, _, _ in pts], [c for _, _, c in pts], marker='.', label=f'{label} test')
  if any('train_loss' in r for r in records):
    ax2.plot(rounds, [r.get('train_loss', np.nan) for r in records], '--', label='train (clients)')
  ax1.set_xlabel('round'); ax1.set_ylabel(f'test {accuracy_name}'); ax1.grid(alpha=.3); ax1.legend()
  ax2.set_xlabel('round'); ax2.set_ylabel('loss'); ax2.grid(alpha=.3); ax2.legend()
  _save_figure(fig, path, title)


def plot_system(records: List[Dict], path: str, title: str = '', accuracy_name: str = 'accuracy') -> None:
  """system.png (config.system): test accuracy (the task's `accuracy_name`) of every evaluated model against the
  virtual clock's seconds and against the bytes sent (down + up), beside the round axis of metrics.png."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  recs = [r for r in records if 'virtual_time_s' in r]
  if not recs:
    return
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  prefixes = sorted({k[:-len('test_accuracy')] for r in recs for k in r if k.endswith('test_accuracy')})
  for p in prefixes:
    pts = [(r['virtual_time_s'] / 3600.0, (r['bytes_down'] + r['bytes_up']) / 2**20, r[p + 'test_accuracy'])
           for r in recs if p + 'test_accuracy' in r]
    label = p.rstrip('/') or 'global'
    ax1.plot([a for a, _, _ in pts], [c for _, _, c in pts], marker='.', label=label)
    ax2.plot([b for _, b, _ in pts], [c for _, _, c in pts], marker='.', label=label)
  ax1.set_xlabel('virtual time (h)'); ax1.set_ylabel(f'test {accuracy_name}'); ax1.grid(alpha=.3); ax1.legend()
  ax2.set_xlabel('MiB sent (down + up)'); ax2.set_ylabel(f'test {accuracy_name}'); ax2.grid(alpha=.3)
  ax2.legend()
  _save_figure(fig, path, title)


def plot_personalized(res: Dict, path: str, title: str = '') -> bool:
  """personalized.png from summary.json's `personalized` (training/personalized_eval.py): per client, the
  personal model's accuracy on its own test split, the global test set and the other clients' splits, with
  the server model's means as lines; the fine-tuning curve beside it when there is one. False: nothing to draw
  (no per-client rows: config.personalized.per_client=False)."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  series = [(k, name) for k, name in (('local', 'own test split'), ('global', 'global test set'),
                                      ('ood_other_clients', "other clients' splits"), ('unseen', 'unseen clients'))
            if isinstance(res.get(k), dict) and res[k].get('per_client')]
  if not series:
    return False
  curve = res.get('finetune') or []
  fig, axes = plt.subplots(1, 2 if curve else 1, figsize=(13 if curve else 8, 4.5), squeeze=False)
  ax = axes[0][0]
  n = max(len(res[k]['per_client']) for k, _ in series)
  width = 0.8 / len(series)
  for i, (k, name) in enumerate(series):
    rows = res[k]['per_client']
    ax.bar(np.array([r['client'] for r in rows]) + (i - (len(series) - 1) / 2) * width,
           [100 * r['acc'] for r in rows], width, label=f"{res.get('personal_model', 'personal')}: {name}")
  srv = res.get('server') or {}
  for key, label, style in (('local_acc_client_mean', 'server model: own splits (mean)', '--'),
                            ('global_acc', 'server model: global test set', ':')):
    if isinstance(srv.get(key), (int, float)):
      ax.axhline(100 * srv[key], color='black', ls=style, lw=1, label=label)
  ax.set_xticks(range(n))
  ax.set_xlabel('client'); ax.set_ylabel('test accuracy (%)'); ax.set_ylim(0, 100); ax.grid(axis='y', alpha=.3)
  ax.legend(fontsize=7)
  ax.set_title('personalized models, per client')
  if curve:
    ax = axes[0][1]
    keys = [k for k in ('local_acc_client_mean', 'global_acc_client_mean', 'ood_other_clients_acc_client_mean')
            if any(k in c for c in curve)]
    for k in keys:
      pts = [(c['epoch'], 100 * c[k]) for c in curve if isinstance(c.get(k), (int, float))]
      ax.plot([a for a, _ in pts], [b for _, b in pts], marker='o', label=k.replace('_acc_client_mean', ''))
    ax.set_xlabel('fine-tuning epochs'); ax.set_ylabel('accuracy (%, mean over clients)'); ax.grid(alpha=.3)
    ax.legend(fontsize=7)
    ax.set_title('local fine-tuning after FL')
  _save_figure(fig, path, title)
  return True


def plot_client_cdf(evaluations: List[Dict], path: str, title: str = '', accuracy_name: str = 'accuracy') -> bool:
  """clients_cdf.png (config.client_eval): the empirical CDF of the per-client accuracy at each client evaluation
  (`evaluations`: [{'round', 'acc': [per client]}, ...], later rounds darker); with fine-tuning
  ('ft_acc'), a second panel of the fine-tuned clients. False: nothing to draw."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  evs = [e for e in evaluations if len(e.get('acc', ()))]
  if not evs:
    return False
  panels = [('acc', 'global model')] + ([('ft_acc', 'after local fine-tuning')] if any(
      len(e.get('ft_acc', ())) for e in evs) else [])
  fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
  shades = plt.cm.viridis(np.linspace(0.9, 0.1, len(evs)))
  for ax, (key, name) in zip(axes[0], panels):
    for e, color in zip(evs, shades):
      a = np.sort(np.asarray(e.get(key, ()), np.float64))
      if len(a):
        ax.step(a, np.arange(1, len(a) + 1) / len(a), where='post', color=color, label=f"round {e['round']}")
    ax.set_xlabel(f'client {accuracy_name}'); ax.set_ylabel('fraction of clients'); ax.set_xlim(0, 1)
    ax.set_ylim(0, 1); ax.grid(alpha=.3); ax.set_title(name)
    if len(evs) <= 12:
      ax.legend(fontsize=7)
  _save_figure(fig, path, title)
  return True


def summarize(records: List[Dict], last_k: int, extra: Dict) -> Dict:
  """Final and last-K-mean metrics per evaluated model; says which model each number belongs to."""
  out = dict(extra)
  models = {}
  prefixes = sorted({k[:-len('test_accuracy')] for r in records for k in r if k.endswith('test_accuracy')})
  for p in prefixes:
    pts = [r for r in records if p + 'test_accuracy' in r]
    name = p.rstrip('/') or 'global'
    accs = [r[p + 'test_accuracy'] for r in pts]
    losses = [r[p + 'test_loss'] for r in pts]
    models[name] = {
        'final_test_accuracy': accs[-1], 'final_test_loss': losses[-1],
        f'mean_last_{last_k}_test_accuracy': float(np.mean(accs[-last_k:])),
        f'mean_last_{last_k}_test_loss': float(np.mean(losses[-last_k:])),
        'num_evaluations': len(accs), 'last_round': pts[-1]['round'],
    }
    # Task metrics beyond accuracy/loss (mIoU, per test-client group) and the validation clients' metrics
    # (val_*: retrieval): final and last-K mean; arrays (per-class IoU) final only.
    extra_keys = sorted({k for r in pts for k in r if k.startswith((p + 'test_', p + 'val_'))
                         and '/' not in k[len(p):] and k[len(p):] not in ('test_accuracy', 'test_loss', 'test_count')})
    for k in extra_keys:
      vals = [r[k] for r in pts if k in r]
      key = k[len(p):]
      if isinstance(vals[-1], (list, tuple)):
        models[name][f'final_{key}'] = list(vals[-1])
        continue
      models[name][f'final_{key}'] = vals[-1]
      models[name][f'mean_last_{last_k}_{key}'] = float(np.mean(vals[-last_k:]))
  out['models'] = models
  report(out, extra.get('reported_model', 'global'), last_k)
  return out


def report(summary: Dict, model: str, last_k: int, reason: str = '') -> None:
  """Makes `model` the summary's reported model: its final and last-K accuracy (and mIoU, pooled and per
  test-client group) become the summary's top-level numbers; `reason` says why when it is not the declared one."""
  summary['reported_model'] = model
  if reason:
    summary['reported_model_reason'] = reason
  m = summary['models'].get(model)
  if m is None:
    return
  summary['final_test_accuracy'] = m['final_test_accuracy']
  summary[f'mean_last_{last_k}_test_accuracy'] = m[f'mean_last_{last_k}_test_accuracy']
  for key in [k for k in summary if k.endswith('_miou')]:
    del summary[key]
  for key, v in m.items():
    if key.endswith('_miou'):
      summary[key] = v


# What the best validation round is chosen by: validation Recall@5. [U] The thesis does not say; the
# deep-visual-geo-localization benchmark, whose training defaults the FedVPR configs take, keeps the epoch whose
# validation R@5 is strictly the best so far (`is_best = recalls[1] > best_r5`): the earliest on ties, as here.
VALIDATION_METRIC = 'val_recall@5'


def select_by_validation(records: List[Dict], model: str = 'global', metric: str = VALIDATION_METRIC) -> Dict:
  """Model selection on the validation clients: the first evaluation round with the highest validation `metric`
  of `model`, with that round's validation and test metrics. {} when the run has no such metric (no validation
  clients)."""
  p = '' if model == 'global' else f'{model}/'
  key = p + metric
  pts = [r for r in records if isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
  if not pts:
    return {}
  best = max(pts, key=lambda r: (r[key], -r['round']))      # ties: the earliest round
  out = {'model': model, 'selected_by': metric, 'best_round': best['round']}
  for k, v in best.items():
    if k.startswith((p + 'val_', p + 'test_')) and '/' not in k[len(p):] and isinstance(v, (int, float)):
      out[k[len(p):]] = v
  return out


def accuracy_name(summary: Dict) -> str:
  """What the run's task calls its accuracy (summary.json `metric_names`, tasks/base.metric_names); a summary
  written before runs said so: 'pixel accuracy' when it has an mIoU, else 'accuracy'."""
  names = summary.get('metric_names')
  if isinstance(names, dict) and isinstance(names.get('accuracy'), str):
    return names['accuracy']
  return 'pixel accuracy' if 'final_test_miou' in summary else 'accuracy'


def final_line(summary: Dict) -> str:
  """The run's last result line: its headline metric (mIoU for segmentation, the task's accuracy otherwise,
  named as the task names it: R@1 for retrieval)."""
  head = f"done: {summary['rounds_completed']} rounds, "
  acc = accuracy_name(summary)
  if 'final_test_miou' in summary:        # segmentation: mIoU first, pixel accuracy beside it
    return head + (f"final test mIoU {100 * summary['final_test_miou']:.2f}% ({acc} "
                   f"{summary.get('final_test_accuracy', float('nan')):.4f}; {summary['reported_model']} model)")
  return head + (f"final test {acc} {summary.get('final_test_accuracy', float('nan')):.4f} "
                 f"({summary['reported_model']} model)")


def write_summary(workdir: str, summary: Dict) -> None:
  atomic_write(os.path.join(workdir, 'summary.json'),
               lambda f: json.dump(finite_json(summary), f, indent=2, default=_finite_float,
                                   allow_nan=False))
  acc = accuracy_name(summary)
  lines = [f'| model | final {acc} | mean last-K {acc} | final loss | evaluations |', '|---|---|---|---|---|']
  for name, m in summary.get('models', {}).items():
    k = [key for key in m if key.startswith('mean_last_') and key.endswith('accuracy')][0]
    lines.append(f"| {name} | {m['final_test_accuracy']:.4f} | {m[k]:.4f} | {m['final_test_loss']:.4f} | "
                 f"{m['num_evaluations']} |")
  miou = [(name, key, m[key]) for name, m in summary.get('models', {}).items() for key in m
          if key.startswith('mean_last_') and key.endswith('_miou')]
  if miou:   # segmentation
    lines += ['', '| model | mIoU (mean last-K) | test clients |', '|---|---|---|']
    for name, key, v in miou:
      group = key.split('_test_', 1)[1][:-len('miou')].rstrip('_') or 'all'
      lines.append(f'| {name} | {100 * v:.2f} | {group} |')
  head = [f"# {summary.get('experiment', 'run')}", '',
          f"algorithm `{summary.get('algorithm')}`, dataset `{summary.get('dataset')}`, "
          f"{summary.get('rounds_completed')} rounds, {summary.get('wall_time_s', 0):.1f} s, "
          f"{summary.get('rounds_per_s', 0):.2f} rounds/s; reported model: `{summary.get('reported_model')}`", '']
  if isinstance(summary.get('comm_total_bytes'), (int, float)):   # the run's one byte count (clock.COMM_BYTES)
    head += [f"bytes sent: {summary['comm_total_bytes'] / 2**20:.4g} MiB ({clock_lib.COMM_BYTES})", '']
  v = summary.get('validation')
  if v:   # retrieval with validation clients: the test numbers of the best validation round
    lines += ['', f"model selection ({v['model']} model, by {v['selected_by']} on the validation clients): round "
              f"{v['best_round']}, {v['selected_by']} {v.get(v['selected_by'], float('nan')):.4f}, test R@1 "
              f"{v.get('test_accuracy', float('nan')):.4f}"]
  lines += personalized_markdown(summary.get('personalized'))
  facts = summary.get('facts')
  if facts:   # what the run did that its numbers depend on (the evaluation plug-ins' one-line facts)
    lines += ['', '## What the run did', ''] + [f'- {v}' for v in facts.values()]
  atomic_write(os.path.join(workdir, 'summary.md'), lambda f: f.write('\n'.join(head + lines) + '\n'))


# summary.json 'personalized' keys (evaluation/personalized.evaluate_protocols) -> the row names of summary.md.
_PROTOCOLS = (('local', 'local: each client model on its own test split'),
              ('ood_other_clients', 'leave-one-out: each client model on the other clients\' test splits'),
              ('global', 'global: each client model on the global test set'),
              ('unseen', 'unseen: each client model on the unseen test clients'))


def _fmt(v):
  return '-' if v is None or isinstance(v, (dict, list)) else f'{float(v):.4f}'


def personalized_markdown(res) -> List[str]:
  """The personalized protocols (local / leave-one-out / global / unseen; accuracy and AUC) as Markdown
  lines; [] when summary.json has none."""
  if not res:
    return []
  out = ['', f"## Personalized evaluation (client models: `{res.get('personal_model', '?')}`)", '',
         '| protocol | acc (client mean) | acc (pooled) | AUC (client mean) | AUC (pooled) |', '|---|---|---|---|---|']
  for key, label in _PROTOCOLS:
    if key in res:
      r = res[key]
      out.append(f"| {label} | {_fmt(r.get('acc_client_mean'))} | {_fmt(r.get('acc_weighted'))} | "
                 f"{_fmt(r.get('auc_client_mean'))} | {_fmt(r.get('auc_pooled'))} |")
  srv = res.get('server')
  if srv:   # the global (server) model on the same sets, for comparison
    out.append(f"| server model, local splits | {_fmt(srv.get('local_acc_client_mean'))} | "
               f"{_fmt(srv.get('local_acc_weighted'))} | - | {_fmt(srv.get('local_auc_pooled'))} |")
    for key in ('global', 'unseen'):
      if f'{key}_acc' in srv:
        out.append(f"| server model, {key} test set | - | {_fmt(srv[f'{key}_acc'])} | - | "
                   f"{_fmt(srv.get(f'{key}_auc'))} |")
  curve = res.get('finetune')
  if curve:
    last = curve[-1]
    out += ['', f"Fine-tuned {last['epoch']} epoch(s): local acc (client mean) "
                f"{_fmt(last.get('local_acc_client_mean'))}, AUC (client mean) "
                f"{_fmt(last.get('local_auc_client_mean'))}."]
  return out
