"""Statistics of a grouping: sizes, classes and label entropy per superclient, constraint violations."""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
from fedjax_flat.tasks import base as tasks_lib


def label_histograms(data) -> np.ndarray:
  """[K, C] label counts of every client (in-memory data, or the client_examples protocol). Per-position
  tasks (tokens, pixels) count every position's label except the task's ignore_index."""
  ignore = getattr(tasks_lib.task_of(data), 'ignore_index', None)
  k, c = data.num_clients, data.num_classes
  out = np.zeros((k, c), np.int64)
  for i in range(k):
    y = data.client_labels(i) if hasattr(data, 'client_labels') else data.client_examples(i)[1]
    y = np.asarray(y, np.int64).ravel()
    y = y[(y >= 0) & (y < c) & (y != (-1 if ignore is None else ignore))]
    out[i] = np.bincount(y, minlength=c)
  return out


def entropy_bits(counts) -> np.ndarray:
  """Shannon entropy (bits) of the label distribution of each row of counts [..., C] (0 for empty rows)."""
  counts = np.asarray(counts, np.float64)
  tot = counts.sum(axis=-1, keepdims=True)
  p = counts / np.where(tot > 0, tot, 1.0)
  return -np.sum(np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def grouping_stats(groups: Sequence[np.ndarray], hist: np.ndarray, *, sizes=None, min_examples: int = 0,
                   max_clients: int = 0) -> Dict:
  """Per-superclient rows and a summary; `hist` = label_histograms(data), `sizes` = the clients' example
  counts (default: the histogram's row sums, which differ for per-position labels)."""
  hist = np.asarray(hist)
  sizes = hist.sum(axis=1) if sizes is None else np.asarray(sizes)
  rows: List[Dict] = []
  for i, g in enumerate(groups):
    h = hist[np.asarray(g, np.int64)].sum(axis=0)
    rows.append({'superclient': i, 'clients': int(len(g)), 'examples': int(sizes[np.asarray(g, np.int64)].sum()),
                 'classes': int(np.count_nonzero(h)), 'entropy_bits': float(entropy_bits(h))})
  col = lambda name: np.array([r[name] for r in rows], np.float64)
  ids = np.concatenate([np.asarray(g, np.int64) for g in groups]) if len(groups) else np.zeros(0, np.int64)
  summary = {
      'num_superclients': len(rows),
      'num_clients': int(len(ids)),
      'each_client_once': bool(len(ids) == len(hist) and len(np.unique(ids)) == len(hist)),
      'global_entropy_bits': float(entropy_bits(hist.sum(axis=0))),
      'below_min_examples': int(np.sum(col('examples') < min_examples)) if rows else 0,
      'above_max_clients': int(np.sum(col('clients') > max_clients)) if (rows and max_clients) else 0,
  }
  for name in ('clients', 'examples', 'classes', 'entropy_bits'):
    v = col(name)
    summary[name] = ({'mean': float(v.mean()), 'min': float(v.min()), 'max': float(v.max())} if len(v)
                     else {'mean': 0.0, 'min': 0.0, 'max': 0.0})
  return {'summary': summary, 'superclients': rows}
