r"""Every client evaluated (config.client_eval) against training examples/s of the same model, in one invocation.

Issue 52's rule: the all-client evaluation runs at >= 2.5x the training example rate, as the global evaluation
does (benchmarks/speed/eval_rate.py: a forward pass costs about a third of a training step). The model and data
are a user's: the digits quickstart (configs/quickstart.py, 20 clients, the digits CNN), built and warmed up
first, then timed interleaved (round-robin, --repeats, median):

  train        `Trainer.train(num_rounds=K)` (evaluation left out): training examples/s
  clients      ClientEvalProgram(layout='clients'): the chunked layout (CHUNK clients vmapped, the model on
               chunk x B rows at once), the evaluation before the packed layout
  auto         ClientEvalProgram(layout='auto'), after its first call chose the layout (its check recorded)
  global       Evaluator(batch_size='auto') on the pooled test set: the global evaluation, for comparison

Reported: examples/s, the ratio to train, whether auto's per-client results equal the chunked layout's bit for
bit, auto's layout check, uptime and the fp32 GEMM rate before and after, the machine record.

  python -m benchmarks.speed.client_eval_rate [--out=benchmarks/speed/client_eval_rate_cpu] [--repeats=7]
      [--timed_rounds=5] [--smoke]

--smoke: 2 repeats, 2 timed rounds: a check of the script end to end.
"""
from __future__ import annotations

import os
import sys

# Before anything imports jax: one host CPU device per usable core (fedjax_flat/devices.py), as the binaries.
from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from absl import logging  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.paths import REPO  # noqa: E402
from benchmarks.speed import bench_util  # noqa: E402
from fedjax_flat.config import families as config_strings  # noqa: E402
from fedjax_flat.evaluation import evaluator as ev_lib  # noqa: E402
from fedjax_flat.evaluation.client_eval import ClientEvalProgram, select_clients  # noqa: E402
from fedjax_flat.training import trainers  # noqa: E402

CONFIG = os.path.join(REPO, 'configs', 'quickstart.py')


def _args(argv):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--out', default=None, help='PREFIX of PREFIX.json / PREFIX.md')
  ap.add_argument('--repeats', type=int, default=None, help='timed repetitions (default 7; smoke 2)')
  ap.add_argument('--timed_rounds', type=int, default=None, help='rounds per timed training call (default 5)')
  ap.add_argument('--smoke', action='store_true')
  a = ap.parse_args(argv)
  a.repeats = a.repeats or (2 if a.smoke else 7)
  a.timed_rounds = a.timed_rounds or (2 if a.smoke else 5)
  a.out = a.out or os.path.join(bench_util.SPEED, 'client_eval_rate_cpu' + ('_smoke' if a.smoke else ''))
  return a


def _timed(fn, units: int):
  def run():
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) / units
  return run


def variants(a) -> tuple:
  """name -> seconds per example (interleavable), and the facts."""
  c = config_strings.load_config(CONFIG)
  c.progress_every_s = 1e9
  c.rounds = max(c.rounds, 64 * a.timed_rounds)      # never the last round inside the timing
  t = trainers.make_trainer(c, None, write_files=False)
  t.evaluate = lambda: {}                              # training rounds only
  t.train(num_rounds=a.timed_rounds)                   # compiled, and a model worth evaluating
  p, data = t.plan, t.plan.data
  per_round = float(np.mean(data.client_sizes())) * c.clients_per_round * c.client.local_epochs   # (equal here)
  params = jax.device_get(t.algorithm.eval_models(t.server_state)['global'][0])
  ids = select_clients('all', data.num_clients, c.seed)
  kw = dict(seed=c.seed, batch_size=ev_lib.fixed_batch_size(c.eval_batch_size), preprocess=p.eval_transform,
            task=p.task)
  chunked = ClientEvalProgram(p.model, data, ids, layout='clients', **kw)
  auto = ClientEvalProgram(p.model, data, ids, layout='auto', **kw)
  tx, ty = data.test_examples()
  glob = ev_lib.Evaluator(p.model, tx, ty, 'auto', preprocess=p.eval_transform, task=p.task)
  ref, first = chunked(params), auto(params)           # compiled; auto checks and chooses its layout here
  again = auto(params)
  n = int(chunked.n.sum())
  facts = {'clients': len(ids), 'examples': n, 'eval_batch': chunked.batch_size, 'chunk': chunked.chunk,
           'layout_check': auto.layout_check, 'layout': auto.layout,
           'same_bits': all(np.array_equal(ref[k], first[k]) and np.array_equal(ref[k], again[k]) for k in ref),
           'train_examples_per_round': per_round, 'test_images': int(len(ty)), 'strategy': p.strategy,
           'rounds_per_call': p.rounds_per_call}
  glob(params)
  facts['global_choice'] = glob.batch_choice
  k = a.timed_rounds
  fns = {'train': _timed(lambda: (t.train(num_rounds=k), jax.block_until_ready(t.server_state)), int(k * per_round)),
         'clients': _timed(lambda: chunked(params), n), 'auto': _timed(lambda: auto(params), n),
         'global': _timed(lambda: glob(params), len(ty))}
  for fn in fns.values():      # warm-up
    fn()
  return fns, facts


def _markdown(res):
  f = res['facts']
  L = [f"# Every client evaluated against training examples/s: {res['cpu']} x{res['cpus']} ({res['backend']}), "
       f"jax {res['jax']}", '', f"`{res['command']}`  ",
       f"median of {res['repeats']}, interleaved; {res['host_devices'].get('devices', '?')} host device(s)  ",
       f"fp32 GEMM 2048^3: {res['gemm_gflops_2048'][0]:.0f} / {res['gemm_gflops_2048'][1]:.0f} GFLOP/s "
       f"(before / after)  ", f"uptime before: {res['uptime'][0]}  ", f"uptime after: {res['uptime'][1]}  ",
       'SMOKE RUN (not a measurement)' if res['smoke'] else '', '',
       '| variant | examples/s | x train | note |', '|---|---:|---:|---|']
  notes = {'train': f"quickstart, {f['train_examples_per_round']:.0f} examples/round, {f['strategy']}",
           'clients': f"{f['clients']} clients, {f['examples']} examples, B={f['eval_batch']}, chunks of {f['chunk']}",
           'auto': f"layout {f['layout']}; check: {f['layout_check']}",
           'global': f"{f['test_images']} test images, batch {f['global_choice']['batch_size']}"}
  for v, row in res['rows'].items():
    L.append(f"| {v} | {row['per_s']:.0f} | {row['x_train']:.2f} | {notes[v]} |")
  L += ['', f"auto's per-client accuracies and losses equal the chunked layout's bit for bit: {f['same_bits']}"]
  return '\n'.join(L) + '\n'


def main(argv=None):
  a = _args(argv)
  logging.set_verbosity(logging.WARNING)
  print(f'building ... ({bench_util.uptime()})', file=sys.stderr, flush=True)
  fns, facts = variants(a)
  info = bench_util.machine_info()
  gemm, up = [bench_util.gemm_gflops()], [bench_util.uptime()]
  times = bench_util.interleave(fns, a.repeats)
  up.append(bench_util.uptime())
  gemm.append(bench_util.gemm_gflops())
  rows = {v: {'per_s': 1 / statistics.median(times[v]), 's_per_item_all': times[v]} for v in fns}
  for r in rows.values():
    r['x_train'] = r['per_s'] / rows['train']['per_s']
  res = {**info, 'smoke': a.smoke, 'repeats': a.repeats, 'uptime': up, 'gemm_gflops_2048': gemm, 'rows': rows,
         'facts': facts, 'command': 'python -m benchmarks.speed.client_eval_rate ' + ' '.join(
             argv if argv is not None else sys.argv[1:])}
  return bench_util.write_report(a.out, res, _markdown)


if __name__ == '__main__':
  main()
