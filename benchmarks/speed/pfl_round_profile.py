r"""Where one round of pfl-research's CIFAR10 protocol spends its time: a per-op profile of the trainer's program.

The protocol's trainer as `pfl_cifar10.py` times it (configs/pfl_cifar10.py, evaluation left out), warmed up,
then one call of --rounds rounds under `jax.profiler.trace`. Each XLA:CPU thunk's self time (its nested
thunks' time removed, summed over XLA's threads) is joined with the optimized HLO of the block program (dumped
by XLA: each instruction's shape and jax op name) and put in a category: GEMM (YNNPACK / dot), forward and
backward elementwise work of the model, dropout's mask, the per-step parameter update, copies, the thunk
runtime, the rest (sampling, gather, aggregation, server update). Reported in ms per round (CPU time of
XLA's threads, not wall: two threads overlap), with the wall and process CPU seconds of the timed calls.

  .venv/bin/python -m benchmarks.speed.pfl_round_profile [--rounds=2] [--smoke]
      [--out=benchmarks/speed/pfl_round_profile_cpu]

Writes PREFIX.json and PREFIX.md. The profiler adds its own overhead;
compare categories within one profile, and rounds/s with pfl_cifar10.py.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import sys
import tempfile
import time


def _dump_hlo_flags() -> str:
  """Before jax starts: XLA dumps the optimized HLO of the trainer's block program (the names the trace shows)."""
  d = tempfile.mkdtemp(prefix='pfl_round_hlo_')
  os.environ['XLA_FLAGS'] = ' '.join([os.environ.get('XLA_FLAGS', ''), f'--xla_dump_to={d}', '--xla_dump_hlo_as_text',
                                      '--xla_dump_hlo_pass_re=NONE', '--xla_dump_hlo_module_re=jit_block']).strip()
  return d


_DUMP = _dump_hlo_flags() if __name__ == '__main__' else None   # imported (tests): no dump, no XLA_FLAGS change

from absl import logging  # noqa: E402
import jax  # noqa: E402

from benchmarks.speed import bench_util  # noqa: E402
from benchmarks.speed import pfl_cifar10  # noqa: E402

CATEGORIES = ('GEMM', 'forward (elementwise, im2col)', 'backward (elementwise)', 'dropout mask',
              'parameter update', 'copies', 'thunk runtime', 'other (sampling, gather, aggregation, server)')


def category(name: str, op: str) -> str:
  """An op's category from its HLO instruction name and jax op name (metadata)."""
  if name.startswith(('ThunkExecutor', 'SlinkyThreadPool')):
    return 'thunk runtime'
  if any(s in op for s in ('Dropout', 'bernoulli', '_uniform', 'threefry')):
    return 'dropout mask'
  if name.startswith(('ynn_fusion', 'dot', 'custom-call')):
    return 'GEMM'
  if name.startswith('copy'):
    return 'copies'
  if 'transpose(' in op:
    return 'backward (elementwise)'
  if 'jvp(' in op:
    return 'forward (elementwise, im2col)'
  if re.search(r'/(vmap\(\)/)?(add|sub)$', op) and 'closed_call/cond/branch_1_fun' in op:
    return 'parameter update'       # the client step's params + update, inside the padded-step cond
  return 'other (sampling, gather, aggregation, server)'


def self_times(trace_dir: str) -> tuple:
  """{op name: self time in us} and {op name: count} over every non-Python thread of the trace."""
  path = sorted(glob.glob(os.path.join(trace_dir, '**', 'perfetto_trace.json.gz'), recursive=True))[-1]
  tr = json.load(gzip.open(path))
  ev = tr['traceEvents'] if isinstance(tr, dict) else tr
  names = {(e['pid'], e['tid']): e['args']['name'] for e in ev
           if e.get('ph') == 'M' and e.get('name') == 'thread_name'}
  per = collections.defaultdict(list)
  for e in ev:
    if e.get('ph') == 'X' and not names.get((e['pid'], e['tid']), '').startswith('python'):
      per[(e['pid'], e['tid'])].append(e)
  selft, count = collections.Counter(), collections.Counter()
  for es in per.values():
    es.sort(key=lambda e: (e['ts'], -e.get('dur', 0)))
    stack = []
    for e in es:
      s, d = e['ts'], e.get('dur', 0)
      while stack and stack[-1][0] + stack[-1][1] <= s:
        stack.pop()
      if stack:                         # the enclosing thunk's self time excludes this one
        selft[stack[-1][2]] -= d
      selft[e['name']] += d
      count[e['name']] += 1
      stack.append((s, d, e['name']))
  return selft, count


def hlo_ops(dump_dir: str) -> dict:
  """{instruction name: (shape, jax op name)} of the largest dumped block program."""
  files = glob.glob(os.path.join(dump_dir, '*jit_block*after_optimizations.txt'))
  if not files:
    return {}
  out = {}
  for line in open(max(files, key=os.path.getsize)):
    m = re.match(r'\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ', line)
    if m:
      op = re.search(r'op_name="([^"]*)"', line)
      out[m.group(1)] = (m.group(2)[:48], op.group(1) if op else '')
  return out


def _args(argv):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--rounds', type=int, default=2, help='rounds in the profiled call')
  ap.add_argument('--smoke', action='store_true', help='tiny sizes: checks the script end to end')
  ap.add_argument('--top', type=int, default=25, help='ops listed')
  ap.add_argument('--out', default=None, help='PREFIX of PREFIX.json / PREFIX.md')
  a = ap.parse_args(argv)
  a.out = a.out or os.path.join(bench_util.SPEED,
                                f"pfl_round_profile_{jax.default_backend()}{'_smoke' if a.smoke else ''}")
  return a


def main(argv=None):
  a = _args(argv)
  logging.set_verbosity(logging.WARNING)
  c = pfl_cifar10.protocol_config(a.smoke)
  prob = pfl_cifar10.TrainerProblem(c, pfl_cifar10.make_data(c, a.smoke), a.rounds)
  prob.round()                               # compile
  prob.sync()
  prob.round()                               # warm
  prob.sync()
  up = [bench_util.uptime()]
  trace_dir = tempfile.mkdtemp(prefix='pfl_round_trace_')
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    t, cpu = time.perf_counter(), time.process_time()
    prob.round()
    prob.sync()
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
  up.append(bench_util.uptime())
  selft, count = self_times(trace_dir)
  ops = hlo_ops(_DUMP) if _DUMP else {}
  shutil.rmtree(trace_dir, ignore_errors=True)
  if _DUMP:
    shutil.rmtree(_DUMP, ignore_errors=True)
  r = a.rounds
  by_cat = collections.Counter()
  rows = []
  for name, us in selft.items():
    if 'wait for completion' in name:          # the caller's thread waiting on the program: not work
      continue
    shape, op = ops.get(name, ('', ''))
    cat = category(name, op)
    by_cat[cat] += us
    rows.append({'op': name, 'ms_per_round': us / 1e3 / r, 'per_round': count[name] / r, 'shape': shape,
                 'category': cat, 'jax_op': op[-120:]})
  rows.sort(key=lambda x: -x['ms_per_round'])
  total = sum(by_cat.values())
  res = {**bench_util.machine_info(), 'smoke': a.smoke, 'rounds': r,
         'uptime': up, 'wall_s_per_round': wall / r, 'process_cpu_s_per_round': cpu / r,
         'xla_thread_ms_per_round': total / 1e3 / r, 'hlo_found': bool(ops),
         'categories': {k: by_cat.get(k, 0) / 1e3 / r for k in CATEGORIES},
         'top_ops': rows[:a.top],
         'command': 'python -m benchmarks.speed.pfl_round_profile '
                    + ' '.join(argv if argv is not None else sys.argv[1:])}
  return bench_util.write_report(a.out, res, _markdown)


def _markdown(res):
  tot = res['xla_thread_ms_per_round']
  L = [f"# One round of the pfl CIFAR10 protocol, per op: {res['cpu']} x{res['cpus']}, jax {res['jax']}", '',
       f"{res['rounds']} rounds traced; wall {res['wall_s_per_round']:.2f} s/round, process CPU "
       f"{res['process_cpu_s_per_round']:.2f} s/round (under the profiler)  ",
       f"uptime: {res['uptime'][0]} / {res['uptime'][1]}  ",
       'SMOKE RUN (tiny sizes, not a measurement)' if res['smoke'] else '', '',
       '| category | ms / round (XLA threads) | share |', '|---|---:|---:|']
  for k, v in res['categories'].items():
    L.append(f'| {k} | {v:.0f} | {100 * v / max(tot, 1e-9):.1f}% |')
  L += [f'| total | {tot:.0f} | 100% |', '', '| op | shape | ms / round | per round | category | jax op |',
        '|---|---|---:|---:|---|---|']
  for x in res['top_ops']:
    L.append(f"| {x['op']} | {x['shape']} | {x['ms_per_round']:.1f} | {x['per_round']:.0f} | {x['category']} | "
             f"{x['jax_op'][-70:]} |")
  return '\n'.join(L) + '\n'


if __name__ == '__main__':
  main()
