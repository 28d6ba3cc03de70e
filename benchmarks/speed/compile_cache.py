"""XLA's persistent compilation cache at work: a second invocation of the same run, cold vs warm vs off.

One invocation measures, for each config, `experiments/train.py` runs in fresh processes, repetitions
interleaved (cold, warm, off, then again) so that the machine's drift hits the three alike:
  cold   --compilation_cache=<a new empty directory>      (the first run of a config: compiles and writes)
  warm   --compilation_cache=<that directory again>        (a resume, another seed, a sweep's next cell)
  off    --compilation_cache=off
Each run is `--fresh` in its own workdir, `--config.progress_every_s=0 --config.engine.rounds_per_call=1`
(a progress line on stderr as each round ends) and `--config.eval_every=<rounds>` (one evaluation, at the
end; default 3 rounds). Reported, from the process's start (just before the spawn): when round 1 ends (its
`round 1/R` line), when it starts (that minus one round's time, measured as the time between the lines of
rounds 1 and 2: round 2 runs the same, already loaded program), the CPU seconds the process used before
round 1 started (/proc/<pid>/stat at those lines: less swayed by other jobs than wall time), and the
process's wall time.
The metrics of the three kinds are compared number for number (the cache must not change a bit;
`elapsed_s` / `rounds_per_s` excluded).

Configs: `quickstart` (configs/quickstart.py, the embedded digits) and `pfl_cifar10` (configs/pfl_cifar10.py,
pfl-research's protocol, 1000 users x 50, cohort 50) on generated CIFAR10 files in the official layout
(random images, 50,000 + 10,000; written once into a temporary directory).

  python -m benchmarks.speed.compile_cache [--configs=quickstart,pfl_cifar10] [--repeats=2] [--rounds=2]
      [--min_compile_secs=...] [--out=benchmarks/speed/compile_cache.json]

Results and the machine record: benchmarks/speed/README.compile_cache.md, compile_cache.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import re
import tempfile
import threading
import time

from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

from benchmarks.speed import bench_util  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {
    'quickstart': ['--config=configs/quickstart.py'],
    'pfl_cifar10': ['--config=configs/pfl_cifar10.py'],
}
TIMING_KEYS = ('elapsed_s', 'rounds_per_s')
PROGRESS = re.compile(r'\] round (\d+)/\d+ ')


def make_cifar10(root: str) -> str:
  """CIFAR10's official python layout with random images (tests/fixtures/data_files.py): 50,000 train, 10,000 test."""
  from tests.fixtures import data_files
  d = os.path.join(root, 'cifar10')
  data_files.make_cifar10(d, per_batch=10_000, n_test=10_000, as_tar=False)
  return d


def cpu_seconds(pid: int) -> float:
  """CPU seconds (user + system, every thread) a live process has used so far (Linux /proc): less swayed by
  other jobs on the machine than wall time."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')
  except (OSError, IndexError, ValueError):
    return float('nan')


def run_once(name: str, args: list, cache: str, workdir: str, rounds: int, env: dict) -> dict:
  """One train.py process: seconds to its progress lines `round 1/R` and `round 2/R` (one round per call, each
  logged as it ends) and to its exit, its header line and its metrics."""
  cmd = [sys.executable, os.path.join(REPO, 'experiments', 'train.py'), *args, f'--workdir={workdir}', '--fresh',
         f'--config.rounds={rounds}', f'--config.eval_every={rounds}', '--config.progress_every_s=0',
         '--config.engine.rounds_per_call=1', f'--compilation_cache={cache}']
  t0 = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  seen, cpu, err_lines = {}, {}, []

  def read_stderr():
    for line in proc.stderr:
      m = PROGRESS.search(line)
      if m and int(m.group(1)) not in seen:
        seen[int(m.group(1))] = time.perf_counter() - t0
        cpu[int(m.group(1))] = cpu_seconds(proc.pid)
      err_lines.append(line)

  reader = threading.Thread(target=read_stderr, daemon=True)
  reader.start()
  out = proc.stdout.read()
  proc.wait()
  total = time.perf_counter() - t0
  reader.join()
  if proc.returncode != 0 or 1 not in seen or 2 not in seen:
    raise RuntimeError(f'{name} ({cache}) exited {proc.returncode}: {"".join(err_lines[-3:]).strip()}')
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  round_s = seen[2] - seen[1]          # round 2: the same program, already loaded (no evaluation before it)
  cpu_round = cpu[2] - cpu[1]
  return {'cpu_round1_starts_s': cpu[1] - cpu_round, 'cpu_round_s': cpu_round,
          'to_round1_s': seen[1], 'round_s': round_s, 'round1_starts_s': seen[1] - round_s, 'total_s': total,
          'header': out.splitlines()[0] if out else '',
          'metrics': [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--configs', default='quickstart,pfl_cifar10')
  ap.add_argument('--repeats', type=int, default=2)
  ap.add_argument('--rounds', type=int, default=3)
  ap.add_argument('--min_compile_secs', default='',
                  help=f'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS for the runs (default: {devices.MIN_COMPILE_SECS}, '
                       f'the binaries\' own default)')
  ap.add_argument('--out', default=os.path.join(REPO, 'benchmarks', 'speed', 'compile_cache.json'))
  a = ap.parse_args(argv)
  names = [n for n in a.configs.split(',') if n]
  for n in names:
    if n not in CONFIGS:
      sys.exit(f'error: --configs: {n!r} is not one of {sorted(CONFIGS)}')
  root = tempfile.mkdtemp(prefix='compile_cache_bench_')
  env = {k: v for k, v in os.environ.items()
         if k not in (devices.CACHE_ENV, devices.JAX_CACHE_ENV, devices.ENABLE_ENV, devices.MIN_COMPILE_ENV)}
  if a.min_compile_secs:
    env[devices.MIN_COMPILE_ENV] = a.min_compile_secs
  record = {'machine': bench_util.machine_info(), 'load_before': bench_util.uptime(),
            'gemm_gflops': round(bench_util.gemm_gflops(), 1), 'rounds': a.rounds, 'repeats': a.repeats,
            'min_compile_secs': a.min_compile_secs or devices.MIN_COMPILE_SECS, 'configs': {}}
  try:
    extra = {'quickstart': [], 'pfl_cifar10': [f'--config.data.data_dir={make_cifar10(root)}']
             if 'pfl_cifar10' in names else []}
    for name in names:
      runs = {'cold': [], 'warm': [], 'off': []}
      cache_entries = []
      for rep in range(a.repeats):
        cache = os.path.join(root, f'{name}_cache_{rep}')
        for kind in ('cold', 'warm', 'off'):
          wd = os.path.join(root, f'{name}_{kind}_{rep}')
          r = run_once(name, CONFIGS[name] + extra[name], 'off' if kind == 'off' else cache, wd, a.rounds, env)
          runs[kind].append(r)
          print(f'{name} rep {rep} {kind:4s}: round 1 starts after {r["cpu_round1_starts_s"]:6.2f} CPU s, at '
                f'~{r["round1_starts_s"]:6.2f} s, done at '
                f'{r["to_round1_s"]:6.2f} s (a round {r["round_s"]:.2f} s), exit at {r["total_s"]:6.2f} s', flush=True)
          shutil.rmtree(wd, ignore_errors=True)
          if kind == 'cold':
            files = [os.path.join(cache, f) for f in os.listdir(cache)]
            cache_entries.append({'entries': len(files), 'bytes': sum(os.path.getsize(f) for f in files)})
      ref = runs['off'][0]['metrics']
      identical = all(r['metrics'] == ref for k in runs for r in runs[k])
      med = {k: sorted(r['to_round1_s'] for r in v)[len(v) // 2] for k, v in runs.items()}
      starts = {k: sorted(r['round1_starts_s'] for r in v)[len(v) // 2] for k, v in runs.items()}
      cpu_starts = {k: sorted(r['cpu_round1_starts_s'] for r in v)[len(v) // 2] for k, v in runs.items()}
      record['configs'][name] = {
          'round1_starts_s': {k: [round(r['round1_starts_s'], 2) for r in v] for k, v in runs.items()},
          'round_s': {k: [round(r['round_s'], 2) for r in v] for k, v in runs.items()},
          'median_round1_starts_s': {k: round(v, 2) for k, v in starts.items()},
          'starts_cold_over_warm': round(starts['cold'] / starts['warm'], 2),
          'cpu_round1_starts_s': {k: [round(r['cpu_round1_starts_s'], 2) for r in v] for k, v in runs.items()},
          'median_cpu_round1_starts_s': {k: round(v, 2) for k, v in cpu_starts.items()},
          'cpu_starts_cold_over_warm': round(cpu_starts['cold'] / cpu_starts['warm'], 2),
          'to_round1_s': {k: [round(r['to_round1_s'], 2) for r in v] for k, v in runs.items()},
          'total_s': {k: [round(r['total_s'], 2) for r in v] for k, v in runs.items()},
          'median_to_round1_s': {k: round(v, 2) for k, v in med.items()},
          'cold_over_warm': round(med['cold'] / med['warm'], 2), 'off_over_warm': round(med['off'] / med['warm'], 2),
          'cache': cache_entries, 'metrics_identical': identical, 'header_warm': runs['warm'][0]['header'],
          'metrics_off': ref}
      print(f'{name}: median CPU s before round 1: cold {cpu_starts["cold"]:.2f}, warm {cpu_starts["warm"]:.2f}, '
            f'off {cpu_starts["off"]:.2f} -> cold/warm {cpu_starts["cold"] / cpu_starts["warm"]:.2f}x', flush=True)
      print(f'{name}: median round 1 start: cold {starts["cold"]:.2f} s, warm {starts["warm"]:.2f} s, off '
            f'{starts["off"]:.2f} s -> cold/warm {starts["cold"] / starts["warm"]:.2f}x', flush=True)
      print(f'{name}: median to round 1: cold {med["cold"]:.2f} s, warm {med["warm"]:.2f} s, off {med["off"]:.2f} s '
            f'-> cold/warm {med["cold"] / med["warm"]:.2f}x; cache {cache_entries[0]}; metrics identical: '
            f'{identical}', flush=True)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  record['load_after'] = bench_util.uptime()
  if a.out:
    with open(a.out, 'w') as f:
      json.dump(record, f, indent=1)
    print(f'wrote {a.out}')
  return record


if __name__ == '__main__':
  main()
