"""LADD's style clusters (grouping/style_clusters.py): summary.json `style_clusters` records what the run did with
its clients — k, the cluster of every client, the cluster sizes, the silhouette of every k tried — and, where the
data plant the styles (seg_synthetic_da's `client_style`), how well the clusters recover them (purity: the share
of clients in their cluster's majority planted style; 1.0 = every cluster is one style)."""
from __future__ import annotations

import numpy as np

from fedjax_flat.tasks.domains import purity
from fedjax_flat.training.evals.registry import Evaluation, register


def _final(trainer, summary, reported):
  del reported
  c = trainer.plan.style_clusters
  labels = np.asarray(c.labels, np.int64)
  out = {'k': int(c.k), 'client_cluster': labels.tolist(), 'sizes': c.sizes().tolist(),
         'silhouette': {str(k): float(v) for k, v in c.scores.items()}}
  planted = getattr(trainer.data, 'client_style', None)
  fact = f"LADD clustered the {len(labels)} clients by style into k = {out['k']} clusters of sizes {out['sizes']}"
  if planted is not None and len(planted) == len(labels):
    planted = np.asarray(planted, np.int64)
    out['planted_purity'] = purity(labels, planted, int(c.k), int(planted.max()) + 1)
    fact += f"; purity against the {int(planted.max()) + 1} planted styles {out['planted_purity']:.3f}"
  summary['style_clusters'] = out
  summary.setdefault('facts', {})['style_clusters'] = fact


register(Evaluation('style_clusters', order=15, applies=lambda p: p.style_clusters is not None,
                    final=_final))
