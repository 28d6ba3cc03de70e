"""The cost of flatness (issue 38's study): FedAvg, FedSAM, FedASAM, SAM every 2nd step and LookSAM on the digits
(Dirichlet alpha 0) on a virtual clock, (a) without heterogeneity and (b) log-normal speeds with a deadline, with
float32 or (--uploads) compressed uploads (configs/flat_cost.py's cells), over seeds: accuracy at a fixed virtual
time and at fixed bytes, lambda_max of the final global model (the Hessian tool), and how well each method's client
updates compress (benchmarks/studies/README.flat_cost.md).

  .venv/bin/python -m benchmarks.studies.flat_cost --out=benchmarks/studies/flat_cost.jsonl [--seeds=0,1,2]
      [--cells='fedavg,none;fedsam,deadline'] [--uploads=fp32,topk,qsgd] [--rounds=50] [--batch_runs=6]
  .venv/bin/python -m benchmarks.studies.flat_cost --common=benchmarks/studies/flat_cost_common.jsonl [--table]
      (every method's client deltas from FedAvg's final models of --workdir: only the client optimizer differs)
  .venv/bin/python -m benchmarks.studies.flat_cost --out=benchmarks/studies/flat_cost.jsonl --table \
      [--figures=benchmarks/studies/flat_cost]

Each run is configs/flat_cost.py:<cell> with config.seed = data.seed = the seed. Runs that differ only in values
(seed, split, the clock's deadline and spread) train as lanes of one runs program (training/batched.py; at most
--batch_runs a program), each writing its workdir under --workdir. Runs already in --out are skipped; a killed
study resumes its unfinished runs from their checkpoints.

Compressibility of the updates, measured on the client deltas Delta_k = w - w_k of one more round from each run's
final model (the clients of round `rounds`, their deadline's steps), without changing the run:
  topk_err@f  = ||Delta - topk_f(Delta)|| / ||Delta||, the relative error of keeping the largest f of coordinates
  qsgd_err@s  = sqrt(E ||Q_s(Delta) - Delta||^2) / ||Delta||, QSGD's unbiased stochastic rounding of |Delta_i| /
                ||Delta|| to s levels (exact: sum_i (||Delta|| / s)^2 p_i (1 - p_i), p_i the fractional part of
                s |Delta_i| / ||Delta||); s = 7 (3 magnitude bits and a sign), one norm for the whole vector (a
                measure of the update's shape, not the bucketed transform of config.upload)
  l1_ratio    = ||Delta||_1 / (sqrt(d) ||Delta||_2) (1: every coordinate equal; small: few carry the norm)
averaged over the round's reporting clients. A lower error at the same f / s = an update that compresses better.
"""
from __future__ import annotations

import json
import os
import time

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py): the runs axis of a
# batched program is sharded over them.
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.studies import study_util  # noqa: E402
from benchmarks.studies.study_util import mean_std as _fmt  # noqa: E402
from configs import flat_cost as fc_configs  # noqa: E402
from fedjax_flat.core import engine as engine_lib  # noqa: E402
from fedjax_flat.data import batching  # noqa: E402
from fedjax_flat.training import batched  # noqa: E402
from fedjax_flat.training import packing  # noqa: E402
from fedjax_flat.training import checkpoint as ckpt_lib  # noqa: E402
from fedjax_flat.training import trainers  # noqa: E402

DEFAULT_OUT = os.path.join('runs', 'flat_cost', 'study.jsonl')
DEFAULT_WORKDIR = os.path.join('runs', 'flat_cost', 'work')
TOPK = (0.01, 0.1)
DEFAULT_CELLS = tuple(c for c in fc_configs.CELLS if c.count(',') == 1)     # fp32; --uploads adds the others
QSGD_LEVELS = 7


def cells_for(cells: str, uploads: str) -> list:
  """The ';'-separated cells, each with every upload of ','-separated `uploads` (fp32: the cell as given)."""
  out = []
  for cell in filter(None, cells.split(';')):
    for u in filter(None, uploads.split(',')):
      out.append(cell if u == 'fp32' else f'{cell},{u}')
  return out


def config_of(cell: str, seed: int, rounds: int):
  c = fc_configs.get_config(cell)
  c.seed = seed
  c.data.seed = seed
  if rounds:
    c.rounds = rounds
  c.progress_every_s = 1e9
  return c


# ---- how well the updates compress

def topk_error(v: np.ndarray, f: float) -> float:
  k = max(1, int(round(f * v.size)))
  sq = np.sort(v * v)[::-1]
  return float(np.sqrt(max(sq[k:].sum(), 0.0) / max(sq.sum(), 1e-30)))


def qsgd_error(v: np.ndarray, s: int) -> float:
  norm = float(np.linalg.norm(v))
  if norm == 0:
    return 0.0
  r = s * np.abs(v) / norm
  p = r - np.floor(r)
  return float(np.sqrt(np.sum((norm / s) ** 2 * p * (1 - p))) / norm)


def l1_ratio(v: np.ndarray) -> float:
  return float(np.sum(np.abs(v)) / (np.sqrt(v.size) * max(np.linalg.norm(v), 1e-30)))


def update_stats(t) -> dict:
  """The compressibility of the client deltas of one more round (round t.round) from the trainer's final model."""
  p, alg, r = t.plan, t.algorithm, int(t.round)
  ids = np.asarray(p.sample_round(r))
  rb = p.round_batches(r, ids, len(ids))
  batches = rb.as_dict()
  reports = np.ones(len(ids), bool)
  if p.clock is not None:
    fit, rep, _ = p.systems.round_limits(r, ids)
    fit, reports = fit[:len(ids)], rep[:len(ids)]
    batches = {**batches, 'mask': np.asarray(batching.step_limit(batches['mask'], fit))}
  runner = jax.jit(engine_lib.make_client_runner(alg, unroll=t.config.engine.unroll, augment_fn=p.train_transform))
  bcast = alg.broadcast(t.server_state, r)
  keys = p.client_keys(r, rb.client_ids)
  stats = []
  for i in np.flatnonzero(reports):
    out, _, _ = runner(bcast, jax.tree_util.tree_map(lambda a: a[i], batches), None, keys[i])
    v = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree_util.tree_leaves(
        out['weighted']['delta'])])
    if not np.any(v):
      continue
    stats.append({**{f'topk_err@{f:g}': topk_error(v, f) for f in TOPK},
                  f'qsgd_err@{QSGD_LEVELS}': qsgd_error(v, QSGD_LEVELS), 'l1_ratio': l1_ratio(v),
                  'delta_norm': float(np.linalg.norm(v))})
  return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]} if stats else {}


def record(cell, seed, t, summary, wall) -> dict:
  c = t.config
  steps = [int(t.plan.systems.round_schedule(r, t.plan.sample_round(r)).fit.sum()) for r in range(c.rounds)]
  params = t.algorithm.eval_models(t.server_state)['global'][0]
  return {'cell': cell, 'seed': seed, 'rounds': c.rounds, 'train_wall_s': wall,
          'final_test_accuracy': summary['final_test_accuracy'],
          'mean_last_k': summary.get(f'mean_last_{c.summary_last_k}_test_accuracy'),
          'virtual_time_s': summary['virtual_time_s'], 'bytes_down': summary['bytes_down'],
          'bytes_up': summary['bytes_up'], 'reports_per_round': summary['system_reports_per_round'],
          'local_steps_per_round': float(np.mean(steps)),
          'curve': [(r['round'], r['virtual_time_s'], r['bytes_up'] + r['bytes_down'], r['test_accuracy'])
                    for r in t.records],
          'lambda_max': study_util.lambda_max(t, params),
          # the raw deltas' shape: measured on float32 uploads (a compressed run's deltas are those it sends)
          **(update_stats(t) if t.config.upload.compress == 'none' else {})}


def run_study(out, cells, seeds, rounds, workdir, batch_runs):
  """Every (cell, seed) not in `out`, packed by program (training/batched.pack_groups), one record each."""
  done = set()
  if os.path.exists(out):
    done = {(r['cell'], r['seed']) for r in map(json.loads, open(out))}
  todo = [(cell, seed) for seed in map(int, seeds.split(',')) for cell in cells if (cell, seed) not in done]
  specs = [batched.RunSpec(f'{cell} s{seed}', config_of(cell, seed, rounds),
                           os.path.join(workdir, f'{cell.replace(",", "_")}_s{seed}')) for cell, seed in todo]
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  for pack in packing.pack_groups(specs, batch_runs):
    t0 = time.time()
    batch = batched.open_batch([specs[i] for i in pack])
    try:
      results = batch.train()
      wall = (time.time() - t0) / len(pack)
      for j, res in results.items():
        if res.status != 'done':
          print(json.dumps({'cell': todo[pack[j]][0], 'seed': todo[pack[j]][1], 'status': res.status,
                            'error': res.error}), flush=True)
      for j, trainer, *_ in batch.opened:
        res = results[j]
        cell, seed = todo[pack[j]]
        if res.status != 'done':
          continue
        rec = record(cell, seed, trainer, res.summary, wall)
        rec['lanes'] = res.lanes
        with open(out, 'a') as f:
          f.write(json.dumps(rec, default=float) + '\n')
        print(json.dumps({k: v for k, v in rec.items() if k != 'curve'}, default=float), flush=True)
    finally:
      batch.close()


def common_study(out, seeds, workdir):
  """The compressibility of each method's client deltas from ONE model: FedAvg's final model of the same seed and
  setting (its workdir's last checkpoint), so that only the client optimizer differs (the main study measures each
  method at its own final model). One record per (method, setting, seed)."""
  done = set()
  if os.path.exists(out):
    done = {(r['cell'], r['seed']) for r in map(json.loads, open(out))}
  for seed in map(int, seeds.split(',')):
    for setting in fc_configs.SETTINGS:
      base = os.path.join(workdir, f'fedavg_{setting}_s{seed}', 'checkpoints')
      if not os.path.isdir(base):
        print(json.dumps({'setting': setting, 'seed': seed, 'status': f'no FedAvg run in {base}: skipped'}))
        continue
      got = ckpt_lib.read_checkpoint(base)
      for method in fc_configs.METHODS:
        cell = f'{method},{setting}'
        if (cell, seed) in done:
          continue
        t = trainers.make_trainer(config_of(cell, seed, int(got['step'])))
        leaves, treedef = jax.tree_util.tree_flatten(t.server_state)
        assert len(leaves) == len(got['server_leaves']), cell
        t.server_state = jax.tree_util.tree_unflatten(treedef, [np.asarray(x) for x in got['server_leaves']])
        t.round = int(got['step'])
        rec = {'cell': cell, 'seed': seed, 'from': f'fedavg,{setting} round {t.round}', **update_stats(t)}
        with open(out, 'a') as f:
          f.write(json.dumps(rec, default=float) + '\n')
        print(json.dumps(rec, default=float), flush=True)


def common_table(path):
  recs = study_util.records(path)
  q = f'qsgd_err@{QSGD_LEVELS}'
  seeds = sorted({r['seed'] for r in recs})
  out = [f"From FedAvg's final model (same seed and setting); mean (std) over seeds {seeds}:\n",
         '| setting | method | top-1 % err | top-10 % err | QSGD err | l1 ratio | norm of Delta | seeds |',
         '|' + '---|' * 8]
  for setting in fc_configs.SETTINGS:
    for method in fc_configs.METHODS:
      rs = [r for r in recs if r['cell'] == f'{method},{setting}']
      if rs:
        out.append(f'| {setting} | {method} | {_fmt([r["topk_err@0.01"] for r in rs], 1, 3)} | '
                   f'{_fmt([r["topk_err@0.1"] for r in rs], 1, 3)} | {_fmt([r[q] for r in rs], 1, 3)} | '
                   f'{_fmt([r["l1_ratio"] for r in rs], 1, 3)} | {_fmt([r["delta_norm"] for r in rs], 1, 3)} | '
                   f'{len(rs)} |')
  return '\n'.join(out)


# ---- the table and the figures

def _parts(cell):
  m, s, *u = cell.split(',')
  return m, s, (u[0] if u else 'fp32')


def fixed_points(recs):
  """Per setting: the earliest final virtual time and the fewest final bytes of its runs (all reach them)."""
  t, b = {}, {}
  for r in recs:
    s = _parts(r['cell'])[1]
    t[s] = min(t.get(s, np.inf), r['virtual_time_s'])
    b[s] = min(b.get(s, np.inf), r['bytes_up'] + r['bytes_down'])
  return t, b


def table(path):
  recs = study_util.records(path)
  t_fix, b_fix = fixed_points(recs)
  q = f'qsgd_err@{QSGD_LEVELS}'
  out = [f'Mean (std) over seeds {sorted({r["seed"] for r in recs})}; accuracy in %, virtual time in hours, '
         'MB = 10^6 bytes up + down:\n',
         '| setting | method | upload | acc at T | T (h) | acc at B | B (MB) | final acc | time for the rounds (h) | '
         'MB | local steps / round | lambda_max | top-1 % err | top-10 % err | QSGD err | l1 ratio | seeds |',
         '|' + '---|' * 17]
  for setting in fc_configs.SETTINGS:
    for upload in fc_configs.UPLOADS:
      for method in fc_configs.METHODS:
        rs = [r for r in recs if _parts(r['cell']) == (method, setting, upload)]
        if not rs:
          continue
        t, b = t_fix[setting], b_fix[setting]
        at_t = [study_util.accuracy_at(r['curve'], t, 1) for r in rs]
        at_b = [study_util.accuracy_at(r['curve'], b, 2) for r in rs]
        out.append(f'| {setting} | {method} | {upload} | {_fmt(at_t, 100)} | '
                   f'{t / 3600:.3f} | {_fmt(at_b, 100)} | {b / 1e6:.1f} | '
                   f'{_fmt([r["final_test_accuracy"] for r in rs], 100)} | '
                   f'{_fmt([r["virtual_time_s"] for r in rs], 1 / 3600, 3)} | '
                   f'{_fmt([r["bytes_up"] + r["bytes_down"] for r in rs], 1e-6, 1)} | '
                   f'{_fmt([r["local_steps_per_round"] for r in rs], 1, 1)} | '
                   f'{_fmt([r["lambda_max"] for r in rs], 1, 1)} | '
                   f'{_fmt([r.get("topk_err@0.01") for r in rs], 1, 3)} | '
                   f'{_fmt([r.get("topk_err@0.1") for r in rs], 1, 3)} | {_fmt([r.get(q) for r in rs], 1, 3)} | '
                   f'{_fmt([r.get("l1_ratio") for r in rs], 1, 3)} | {len(rs)} |')
  return '\n'.join(out)


def figures(path, stem):
  """<stem>_<setting>_time.png and <stem>_<setting>_mb.png: accuracy against virtual time / megabytes, mean over
  seeds, one line per method (and upload)."""
  import matplotlib   # the figures only (not a dependency of the study's runs)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  recs = study_util.records(path)
  t_fix, b_fix = fixed_points(recs)
  written = []
  for setting in fc_configs.SETTINGS:
    for axis, what, scale, fixed in ((1, 'time', 1 / 3600, t_fix), (2, 'mb', 1e-6, b_fix)):
      fig, ax = plt.subplots(figsize=(5.5, 3.6))
      drawn = False
      for upload, ls in zip(fc_configs.UPLOADS, ('-', '--', ':')):
        for method in fc_configs.METHODS:
          rs = [r for r in recs if _parts(r['cell']) == (method, setting, upload)]
          if not rs:
            continue
          n = min(len(r['curve']) for r in rs)
          x = np.mean([[p[axis] for p in r['curve'][:n]] for r in rs], axis=0) * scale
          y = np.mean([[p[3] for p in r['curve'][:n]] for r in rs], axis=0) * 100
          ax.plot(x, y, ls=ls, marker='.', color=f'C{fc_configs.METHODS.index(method)}',    # a method's colour
                  label=method if upload == 'fp32' else f'{method} {upload}')
          drawn = True
      if not drawn:
        plt.close(fig)
        continue
      written.append(study_util.save_accuracy_figure(
          fig, ax, f'{stem}_{setting}_{what}.png', xlabel='virtual time (h)' if axis == 1 else 'MB sent (up + down)',
          title=f'setting: {setting}', mark=fixed[setting] * scale if setting in fixed else None, legend_size=6))
      plt.close(fig)
  return written


def main():
  ap = study_util.argument_parser('flat_cost', DEFAULT_OUT, DEFAULT_CELLS, '0 = the config (50)')
  ap.add_argument('--uploads', default='fp32,topk,qsgd', help="','-separated uploads of every cell: fp32, topk, qsgd "
                  '(configs/flat_cost.py)')
  ap.add_argument('--batch_runs', type=int, default=6, help='runs per batched program (1: each run alone)')
  ap.add_argument('--workdir', default=DEFAULT_WORKDIR, help='the runs\' workdirs (checkpoints: a rerun resumes)')
  ap.add_argument('--figures', default='', help='with --table: also write <this>_<setting>_{time,mb}.png')
  ap.add_argument('--common', default='', help='JSONL: measure every method\'s client deltas from FedAvg\'s final '
                  'model of each seed and setting (the FedAvg runs of --workdir); with --table: print its table')
  a = ap.parse_args()
  if a.common:
    if a.table:
      study_util.require_results(a.common)
      print(common_table(a.common))
    else:
      common_study(a.common, a.seeds, a.workdir)
    return
  if a.table:
    study_util.require_results(a.out)
    print(table(a.out))
    if a.figures:
      print('\n'.join(figures(a.out, a.figures)))
    return
  run_study(a.out, cells_for(a.cells, a.uploads), a.seeds, a.rounds, a.workdir, a.batch_runs)


if __name__ == '__main__':
  main()
