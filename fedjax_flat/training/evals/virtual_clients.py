"""FedVC's virtual clients (data/virtual_clients.py): summary.json `virtual_clients` records what the run trained
on — the virtual client size, how many virtual clients each real client became — since every client-level number
of such a run (client ids in metrics, participation) is about the virtual ones."""
from __future__ import annotations

import numpy as np

from fedjax_flat.training.evals.registry import Evaluation, register


def _applies(plan) -> bool:
  fc = plan.config.get('fedvc')
  data = plan.data
  return fc is not None and bool(fc.virtual_size) and getattr(data, 'virtual_of', None) is not None


def _final(trainer, summary, reported):
  del reported
  owner = np.asarray(trainer.data.virtual_of, np.int64)
  per_real = np.bincount(owner)
  out = {'virtual_size': int(trainer.config.fedvc.virtual_size), 'virtual_clients': int(len(owner)),
         'real_clients': int(len(per_real)), 'per_real_client': per_real.tolist()}
  summary['virtual_clients'] = out
  summary.setdefault('facts', {})['virtual_clients'] = (
      f"FedVC: the {out['real_clients']} clients were cut into {out['virtual_clients']} virtual clients of "
      f"{out['virtual_size']} examples (1 to {int(per_real.max())} per client); client ids are virtual")


register(Evaluation('virtual_clients', order=16, applies=_applies, final=_final))
