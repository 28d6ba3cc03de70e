r"""Many runs in one program (core/runs.py) vs today's process-parallel sweep, as users run them.

  .venv/bin/python -m benchmarks.speed.runs_axis [--modes=parallel2,batch4,batch8,batch16] [--rounds=150]
      [--workloads=flat_minima,rho_grid] [--repeats=1] [--out=benchmarks/runs_axis_cpu]

Part 1 (sweeps): for each workload, every mode runs the same sweep command from scratch, interleaved
(workload-major, modes round-robin, `--repeats` times), then `experiments/report.py` on it:
  flat_minima  configs/sweeps/flat_minima_digits.py:cells=fedavg+fedsam+fedasam  (3 cells x 3 seeds; three
               programs when batched: the client optimizer kinds differ)
  rho_grid     configs/quickstart.py, FedSAM at alpha = 0, client.rho in {0.01, 0.02, 0.05, 0.1} x 3 seeds
               (one compatibility group of 12 runs)
  modes        parallel2 = `--parallel=2` (one train.py process per run, 2 at a time: today's sweep);
               batchR = `--batch_runs=R` (this process, R runs per program, one host device per core)
Reported: wall of sweep + report, runs/hour, peak RSS of the sweep's processes (os.wait4), the runs' final
accuracy (mean over runs) and the largest difference of a run's final accuracy from the parallel2 run.

Part 2 (scaling, `--scaling_rs=1,2,4,8,16`): the quickstart's FedSAM program at alpha = 0 with R lanes on the
machine's host devices: compile time, XLA's memory analysis of the compiled program (arguments + temporaries),
and the steady wall per run-round.

Writes OUT.json and OUT.md. Both parts record `uptime` before / after and the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.paths import REPO

BENCH = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable

WORKLOADS = {
    'flat_minima': lambda rounds: ['--sweep=configs/sweeps/flat_minima_digits.py:cells=fedavg+fedsam+fedasam,'
                                   f'rounds={rounds}'],
    'rho_grid': lambda rounds: ['--config=configs/quickstart.py', '--grid=client.rho=0.01,0.02,0.05,0.1',
                                '--set=client.optimizer=sam', '--set=data.alpha=0.0', f'--set=rounds={rounds}',
                                '--set=eval_every=5', '--set=summary_last_k=6', '--seeds=0,1,2'],
}


def uptime() -> str:
  return subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()


def _run(argv, env=None):
  """(wall s, exit status, peak RSS MB of the process tree's largest process) of one command."""
  t = time.perf_counter()
  proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  _, status, ru = os.wait4(proc.pid, 0)
  wall = time.perf_counter() - t
  err = proc.stderr.read().decode(errors='replace')[-2000:]
  proc.stderr.close()
  proc.returncode = os.waitstatus_to_exitcode(status)
  return wall, proc.returncode, ru.ru_maxrss / 1024.0, err


def _final_accuracies(sweep_dir):
  out = {}
  with open(os.path.join(sweep_dir, 'sweep.json')) as f:
    for r in json.load(f)['runs']:
      try:
        with open(os.path.join(sweep_dir, r['workdir'], 'summary.json')) as g:
          out[f"{r['cell']}/seed={r['seed']}"] = json.load(g).get('final_test_accuracy')
      except OSError:
        out[f"{r['cell']}/seed={r['seed']}"] = None
  return out


def sweeps(args, root):
  rows = []
  env = dict(os.environ, PYTHONPATH=REPO)
  for workload in args.workloads.split(','):
    for rep in range(args.repeats):
      for mode in args.modes.split(','):
        d = os.path.join(root, f'{workload}_{mode}_{rep}')
        shutil.rmtree(d, ignore_errors=True)
        flag = ['--parallel=2'] if mode == 'parallel2' else [f'--batch_runs={mode[len("batch"):]}']
        load0 = uptime()
        w1, rc1, rss, err = _run([PY, 'experiments/sweep.py', *WORKLOADS[workload](args.rounds),
                                  f'--sweep_dir={d}', *flag], env)
        w2, rc2, _, err2 = _run([PY, 'experiments/report.py', f'--sweep_dir={d}', f'--out_dir={d}/report'], env)
        acc = _final_accuracies(d)
        rows.append({'workload': workload, 'mode': mode, 'repeat': rep, 'runs': len(acc),
                     'finished': sum(v is not None for v in acc.values()), 'sweep_s': w1, 'report_s': w2,
                     'wall_s': w1 + w2, 'runs_per_hour': 3600.0 * len(acc) / (w1 + w2), 'peak_rss_mb': rss,
                     'exit': [rc1, rc2], 'final_accuracy': acc, 'uptime_before': load0, 'uptime_after': uptime(),
                     'error': (err if rc1 else '') + (err2 if rc2 else '')})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != 'final_accuracy'}), flush=True)
  return rows


SCALING_WORKER = r'''
import json, sys, time
import jax, numpy as np
from fedjax_flat.training import loop, batched_trainer, sweep as sweep_lib
rs, rounds = [int(x) for x in sys.argv[1].split(',')], int(sys.argv[2])
run = sweep_lib.Run('x', 0, 'configs/quickstart.py', {'client.optimizer': 'sam', 'client.rho': 0.05,
                    'data.alpha': 0.0, 'rounds': 1000, 'eval_every': 1000}, '')
base = sweep_lib.run_config(run)
data = None
out = []
for r in rs:
  trainers = []
  for i in range(r):
    c = sweep_lib.run_config(sweep_lib.Run('x', i, run.config, run.overrides, ''))
    t = loop.Trainer(c, None, data=data, shard_clients=False)
    data = t.data
    trainers.append(t)
  bt = batched_trainer.BatchedTrainer(trainers)
  lanes = bt._lane_runs()
  stack = batched_trainer.runs_lib.stack
  args = lambda: (bt.values, batched_trainer.runs_lib.place(stack([trainers[i].server_state for i in lanes]), bt.mesh),
                  None, None, bt.data_runs, bt.data_shared, bt.keys, np.int32(0), np.int32(rounds))
  t0 = time.perf_counter()
  compiled = bt.fn.lower(*args()).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  walls = []
  for rep in range(3):
    a = args()
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*a))
    walls.append(time.perf_counter() - t0)
  w = sorted(walls)[1]
  out.append({'R': r, 'lanes': bt.lanes, 'devices': len(jax.local_devices()), 'compile_s': compile_s,
              'argument_mb': mem.argument_size_in_bytes / 2**20, 'temp_mb': mem.temp_size_in_bytes / 2**20,
              'output_mb': mem.output_size_in_bytes / 2**20, 'block_s': w, 'rounds': rounds,
              'ms_per_run_round': 1e3 * w / (rounds * r)})
  print(json.dumps(out[-1]), flush=True)
print('RESULT ' + json.dumps(out))
'''


def scaling(args):
  env = dict(os.environ, PYTHONPATH=REPO)
  if 'xla_force_host_platform_device_count' not in env.get('XLA_FLAGS', ''):
    env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count='
                        f'{len(os.sched_getaffinity(0))}').strip()
  res = subprocess.run([PY, '-c', SCALING_WORKER, args.scaling_rs, str(args.scaling_rounds)], cwd=REPO, env=env,
                       capture_output=True, text=True)
  line = [l for l in res.stdout.splitlines() if l.startswith('RESULT ')]
  if not line:
    raise RuntimeError(res.stderr[-3000:])
  return json.loads(line[0][len('RESULT '):])


def markdown(doc) -> str:
  lines = [f"# Runs axis: batched sweeps vs `--parallel=2` ({doc['machine']['cpu']}, {doc['machine']['cpus']} "
           'CPUs)', '', f"Command: `{doc['command']}`", '']
  if doc['sweeps']:
    lines += ['| workload | mode | runs | wall s (sweep + report) | runs/hour | vs parallel2 | peak RSS MB | '
              'mean final acc | max |acc - parallel2| | load before -> after |', '|---|---|---:|---:|---:|---:|---:|'
              '---:|---:|---|']
    base = {(r['workload'], r['repeat']): r for r in doc['sweeps'] if r['mode'] == 'parallel2'}
    for r in doc['sweeps']:
      b = base.get((r['workload'], r['repeat']))
      accs = [v for v in r['final_accuracy'].values() if v is not None]
      diff = (max(abs(v - b['final_accuracy'][k]) for k, v in r['final_accuracy'].items()
                  if v is not None and b['final_accuracy'].get(k) is not None) if b and accs else float('nan'))
      ratio = r['runs_per_hour'] / b['runs_per_hour'] if b else float('nan')
      la = lambda u: u.split('load average:')[-1].split(',')[0].strip()
      lines.append(f"| {r['workload']} | {r['mode']} | {r['finished']}/{r['runs']} | {r['wall_s']:.1f} "
                   f"({r['sweep_s']:.1f} + {r['report_s']:.1f}) | {r['runs_per_hour']:.0f} | {ratio:.2f}x | "
                   f"{r['peak_rss_mb']:.0f} | {sum(accs) / max(len(accs), 1):.4f} | {diff:.4f} | "
                   f"{la(r['uptime_before'])} -> {la(r['uptime_after'])} |")
  if doc['scaling']:
    lines += ['', 'Scaling with R (quickstart FedSAM, alpha = 0, one program; XLA memory analysis of the compiled '
              'program):', '', '| R | lanes | devices | compile s | arguments MB | temporaries MB | block s '
              f"({doc['scaling'][0]['rounds']} rounds) | ms per run-round |",
              '|---:|---:|---:|---:|---:|---:|---:|---:|']
    for s in doc['scaling']:
      lines.append(f"| {s['R']} | {s['lanes']} | {s['devices']} | {s['compile_s']:.1f} | "
                   f"{s['argument_mb']:.2f} | {s['temp_mb']:.2f} | {s['block_s']:.2f} | "
                   f"{s['ms_per_run_round']:.1f} |")
  lines += ['', f"Load: {doc['uptime_before']} -> {doc['uptime_after']}"]
  return '\n'.join(lines) + '\n'


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--modes', default='parallel2,batch4,batch8,batch16')
  ap.add_argument('--workloads', default='flat_minima,rho_grid')
  ap.add_argument('--rounds', type=int, default=150)
  ap.add_argument('--repeats', type=int, default=1)
  ap.add_argument('--scaling_rs', default='1,2,4,8,16', help='R values of part 2 (empty: skip)')
  ap.add_argument('--scaling_rounds', type=int, default=10)
  ap.add_argument('--out', default=os.path.join(BENCH, 'runs_axis_cpu'))
  ap.add_argument('--work_dir', default='', help='sweep dirs (default: a temporary directory, removed)')
  args = ap.parse_args()
  root = args.work_dir or tempfile.mkdtemp(prefix='runs_axis_')
  doc = {'command': ' '.join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]), 'uptime_before': uptime(),
         'machine': {'cpu': next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo')
                                  if l.startswith('model name')), ''), 'cpus': len(os.sched_getaffinity(0))}}
  doc['sweeps'] = sweeps(args, root) if args.modes and args.workloads else []
  try:
    doc['scaling'] = scaling(args) if args.scaling_rs else []
  except RuntimeError as e:           # the sweep table is still written
    doc['scaling'], doc['scaling_error'] = [], str(e)[-2000:]
  doc['uptime_after'] = uptime()
  with open(args.out + '.json', 'w') as f:
    json.dump(doc, f, indent=1)
  with open(args.out + '.md', 'w') as f:
    f.write(markdown(doc))
  print(markdown(doc))
  if not args.work_dir:
    shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
  main()
