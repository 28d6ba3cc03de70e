"""Compressed uploads (config.upload, algorithms/wrappers/compress.py): in every evaluation record
`compress_error` (the last round's mean relative compression error ||C(p) - p|| / ||p|| over its clients) and
`compress_mb_up` (MiB the clients' compressed uploads sent so far: uploads x systems/compress.upload_bytes, the
recorder's comm_total['up_bytes'], which `comm_bytes` / `comm_total_bytes` count too); summary.json adds the mean
relative error over all rounds, the bytes of one upload and its ratio to the uncompressed float32 delta (so a study
can ask whose updates compress better), and summary.md the whole communication's ratio to float32's. The error
sums live in the server state (checkpointed), the bytes in the recorder's comm_total: a resumed run reports what
the uninterrupted one did. With the virtual clock, `bytes_up` (training/evals/system.py) counts the same compressed
bytes of the clients that report."""
from __future__ import annotations

import jax
import numpy as np

from fedjax_flat.algorithms.wrappers import compress as wrapper
from fedjax_flat.systems import compress as comp
from fedjax_flat.training.evals.registry import Evaluation, register


def _state(trainer) -> dict:
  s = trainer.server_state.get(wrapper.KEY) if isinstance(trainer.server_state, dict) else None
  return {k: float(np.asarray(jax.device_get(v))) for k, v in (s or {}).items()}


def _upload_bytes(trainer) -> float:
  return comp.upload_bytes(trainer.config.upload, trainer.plan.num_params)


def _numbers(trainer) -> dict:
  s = _state(trainer)
  return {'compress_error': s.get('err', float('nan')),
          'compress_mb_up': trainer.recorder.comm_total['up_bytes'] / 2**20}


def _final(trainer, summary, reported):
  del reported
  u, s = trainer.config.upload, _state(trainer)
  out = _numbers(trainer)
  one = _upload_bytes(trainer)
  full = comp.BYTES_PER_VALUE * trainer.plan.num_params
  rounds = s.get('rounds', 0.0)
  out.update({'compress': str(u.compress), 'compress_error_mean': s.get('err_sum', 0.0) / rounds if rounds else
              float('nan'), 'compress_upload_bytes': one, 'compress_ratio': one / full})
  summary.update(out)
  what = {'topk': f'top-k, fraction {u.fraction:g}', 'randk': f'rand-k, fraction {u.fraction:g}',
          'qsgd': f'QSGD, {u.bits} bits'}[u.compress]
  # the whole communication (down + up) against the same messages at float32 (the recorder's comm totals)
  total, total32 = summary['comm_total_bytes'], summary['comm_total_bytes_uncompressed']
  summary['comm_total_ratio'] = total / total32 if total32 else float('nan')
  summary.setdefault('facts', {})['compress'] = (
      f"uploads compressed ({what}{', error feedback' if u.error_feedback else ''}): {one:.0f} bytes each "
      f"({100 * one / full:.3g}% of float32), {out['compress_mb_up']:.4g} MiB up, mean relative error "
      f"{out['compress_error_mean']:.3g}; bytes sent (summary.md's line) "
      f"{100 * summary['comm_total_ratio']:.3g}% of float32's {total32 / 2**20:.4g} MiB")


register(Evaluation('compress', order=7, applies=lambda plan: comp.enabled(plan.config), periodic=_numbers,
                    final=_final))
