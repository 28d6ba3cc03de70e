r"""What a user waits for, end to end (issue 39 part 4): whole runs and whole tables, ours beside the peers.

One invocation, three parts (each a set of fresh processes timed from spawn to exit, as a user would wait):

  (a) pfl    pfl-research's CIFAR10 protocol (configs/pfl_cifar10.py: 1000 users x 50, cohort 50, B=10, the
             evaluation of the 10,000 test images every 10 rounds) as each stack's user runs it:
               ours       experiments/train.py --config=configs/pfl_cifar10.py, a fresh compilation cache (the
                          first run of a config: compilation included), the config's evaluation batch (1000)
               ours_auto  the same with eval_batch_size='auto' (measured once per run: evaluation/evaluator.py)
               ours_noeval  the same evaluating only at the end (not the protocol: its b is the training rounds
                          alone, the bound on any stack's ratio if its evaluations were free)
               torch      benchmarks/speed/peers/torch_peer.py --whole_run (the reference pattern: sequential
                          users; evaluation in eval mode under no_grad, batches of 1000)
               torch_1t   the same with one torch thread (x torch: against the faster torch row)
               fedjax     benchmarks/speed/peers/fedjax_peer.py --whole_run (fed_avg; fedjax.evaluate_model)
             Each stack runs K1 and K2 rounds (--pfl_rounds, multiples of 10: the same share of evaluations);
             wall = a + b K fits start-up a (interpreter, imports, data, compilation) and b (a round plus a
             tenth of an evaluation). The 1500-round run is EXTRAPOLATED as a + 1500 b (no stack ran it).
             The data: random images in CIFAR10's official layout (throughput does not depend on pixels); the
             peers read the same users and test images, normalized as our on-device preprocessing does.
  (b) table  the digits flat-minima table (configs/sweeps/flat_minima_digits.py, cells fedavg / fedsam /
             fedasam x seeds 0, 1, 2; --table_rounds rounds, evaluation every 5) as users run it:
               batched    experiments/sweep.py --batch_runs=auto (next program compiled ahead) + report.py
               parallel2  experiments/sweep.py --parallel=2 (one train.py process per run, two at a time)
                          + report.py
               torch      the reference pattern: one torch process per run, one after another (the FedSAM
                          reference code's way: a `main.py` per run), same clients, rounds and evaluations;
                          torch_1t the same with one torch thread ("x torch" is against the faster)
             Both sweeps start from an empty compilation cache of their own; with --table_warm (default) both
             run again (batched_warm, parallel2_warm) with the cache their first run filled: a second table
             run, and the bound on the cold ratio once compilation is paid.
  (c) again  the same train.py run twice with one cache directory (configs/pfl_cifar10.py, 3 rounds; and the
             quickstart): when round 1 starts in the first and in the second invocation
             (benchmarks/speed/compile_cache.run_once), and the CPU seconds spent before it; the floor is a
             process that only starts the interpreter, the host devices and a run's imports (FLOOR_CODE):
             first / floor is the most a second invocation could gain.

Targets (issue 39): (a) >= 1.5x torch's whole run and >= 3x FedJAX's; (b) >= 3x the one-process-per-run
reference pattern and >= 2.5x --parallel=2; (c) the second invocation's round 1 starts >= 5x sooner.

  .venv/bin/python -m benchmarks.speed.end_to_end [--parts=pfl,table,again] [--pfl_rounds=10,30]
      [--table_rounds=100] [--stacks=ours,ours_auto,ours_noeval,torch,torch_1t,fedjax]
      [--out=benchmarks/speed/end_to_end_cpu] [--smoke]

--smoke: tiny sizes (2 users' worth of rounds, 2 table rounds, one cell): a check of the script, not a
measurement. Writes OUT.json and OUT.md with the machine record (CPU, GEMM rate, uptime before and after).
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

from fedjax_flat import devices

HOST_DEVICES = devices.configure_or_exit() if __name__ == '__main__' else None

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.paths import REPO  # noqa: E402
from benchmarks.speed import bench_util  # noqa: E402
from benchmarks.speed import compile_cache  # noqa: E402
from benchmarks.speed import pfl_cifar10  # noqa: E402
from benchmarks.speed import runs_axis  # noqa: E402
from benchmarks.speed.peers import protocol  # noqa: E402
from fedjax_flat.config import families as config_strings  # noqa: E402
from fedjax_flat.data import registry as data_registry  # noqa: E402
from fedjax_flat.sweeps import grid as grid_lib  # noqa: E402

PY = sys.executable
FEDJAX_PY = bench_util.FEDJAX_PYTHON
PEER_MODULES = {'torch': (bench_util.torch_python(), 'benchmarks.speed.peers.torch_peer'),
                'torch_1t': (bench_util.torch_python(), 'benchmarks.speed.peers.torch_peer'),
                'fedjax': (FEDJAX_PY, 'benchmarks.speed.peers.fedjax_peer')}
# torch_1t: the torch peer with one thread. On a loaded 2-core machine torch's two OpenMP threads spin-wait
# (pfl_cifar10.py measured 10x slower than one thread there); "x torch" is against the faster torch row.
THREADS = {'torch_1t': 1}
TABLE_SWEEP = 'configs/sweeps/flat_minima_digits.py'
TABLE_CELLS = 'fedavg+fedsam+fedasam'


def _clean_env(cache: str) -> dict:
  """The environment of a timed process: PYTHONPATH at the repository, the compilation cache named explicitly."""
  env = {k: v for k, v in os.environ.items()
         if k not in (devices.CACHE_ENV, devices.JAX_CACHE_ENV, devices.ENABLE_ENV, devices.MIN_COMPILE_ENV)}
  env['PYTHONPATH'] = REPO
  env[devices.CACHE_ENV] = cache
  return env


def fit(points):
  """Least-squares wall = a + b K over (K, wall) points -> (a, b)."""
  k = np.array([p[0] for p in points], float)
  w = np.array([p[1] for p in points], float)
  b, a = np.polyfit(k, w, 1)
  return float(a), float(b)


# ------------------------------------------------------------------------------------------------ (a) pfl

def pfl_part(a, root) -> dict:
  c = config_strings.load_config(pfl_cifar10.CONFIG)
  if a.smoke:
    c.data.num_clients, c.data.examples_per_client, c.clients_per_round = 40, 20, 4
  cifar = compile_cache.make_cifar10(root)
  data = data_registry.get_dataset('cifar10', **{**c.data.to_dict(), 'data_dir': cifar})
  ks = [int(x) for x in a.pfl_rounds.split(',')]
  stacks = [s for s in a.stacks.split(',') if s]
  for peer in ('torch', 'torch_1t', 'fedjax'):
    if peer in stacks and peer.split('_')[0] not in bench_util.available_peers():
      print(f'{peer}: not installed (bash benchmarks/speed/peers/make_{peer.split("_")[0]}_venv.sh); left out',
            flush=True)
      stacks.remove(peer)
  problem = test = None
  if any(s in PEER_MODULES for s in stacks):
    problem, test = os.path.join(root, 'pfl_users.npz'), os.path.join(root, 'pfl_test.npz')
    protocol.write_problem(problem, [(pfl_cifar10.normalized(data.x[data.client_indices(k)]),
                                      data.y[data.client_indices(k)]) for k in range(data.num_clients)])
    tx, ty = data.test_examples()
    protocol.write_problem(test, [(pfl_cifar10.normalized(tx), ty)])
  del data
  runs = {s: [] for s in stacks}
  for k in ks:                      # interleaved: every stack at K1, then every stack at K2
    for s in stacks:
      print(f'(a) {s}: {k} rounds ... ({bench_util.uptime()})', flush=True)
      if s in ('ours', 'ours_auto', 'ours_noeval'):
        wd = os.path.join(root, f'pfl_{s}_{k}')
        argv = [PY, os.path.join(REPO, 'experiments', 'train.py'), f'--config={pfl_cifar10.CONFIG}',
                f'--config.data.data_dir={cifar}', f'--config.rounds={k}', f'--workdir={wd}', '--fresh']
        if a.smoke:
          argv += ['--config.data.num_clients=40', '--config.data.examples_per_client=20',
                   '--config.clients_per_round=4']
        if s == 'ours_auto':
          argv.append('--config.eval_batch_size=auto')
        if s == 'ours_noeval':      # one evaluation, at the end: b is the training rounds alone (a bound, not a run)
          argv.append(f'--config.eval_every={k}')
        cache = os.path.join(root, f'cache_pfl_{s}_{k}')      # empty: the first run of the config
        wall, rc, rss, err = runs_axis._run(argv, _clean_env(cache))   # pylint: disable=protected-access
        if rc != 0:
          raise RuntimeError(f'{s} exited {rc}: {err[-1500:]}')
        with open(os.path.join(wd, 'summary.json')) as f:
          summ = json.load(f)
        with open(os.path.join(wd, 'metrics.jsonl')) as f:
          timed = [(r['round'], r['elapsed_s']) for r in map(json.loads, filter(str.strip, f)) if 'elapsed_s' in r]
        rec = {'rounds': k, 'wall_s': wall, 'peak_rss_mb': rss,
               'final_test_accuracy': summ.get('final_test_accuracy'),
               'eval_batch_size': (summ.get('evaluation') or {}).get('batch_size'),
               # In-process seconds a round between the last two evaluations (one evaluation included).
               'inproc_round_s': ((timed[-1][1] - timed[-2][1]) / (timed[-1][0] - timed[-2][0])
                                  if len(timed) > 1 else None)}
        shutil.rmtree(wd, ignore_errors=True)
      else:
        py, mod = PEER_MODULES[s]
        spec = dict(pfl_cifar10.peer_spec(c, problem), rounds=k, eval_every=c.eval_every, test=test,
                    eval_batch=int(c.eval_batch_size), threads=THREADS.get(s, 0))
        r = protocol.run_whole(py, mod, spec, os.path.join(root, f'spec_{s}_{k}.json'), env={'PYTHONPATH': REPO},
                               cwd=REPO)
        rec = {'rounds': k, 'wall_s': r['wall_s'], 'setup_s': r['setup_s'],
               'median_round_s': float(np.median(r['round_s'][1:] or r['round_s'])),
               'eval_s': [e['s'] for e in r['evals']], 'final_test_accuracy': r['evals'][-1]['accuracy']}
        rec['inproc_round_s'] = rec['median_round_s'] + float(np.mean(rec['eval_s'])) / c.eval_every
      runs[s].append(rec)
      print(f'    {json.dumps({k2: v for k2, v in rec.items()})}', flush=True)
  total = c.rounds
  out = {'rounds_measured': ks, 'rounds_extrapolated': total, 'stacks': {}}
  for s, recs in runs.items():
    a0, b0 = fit([(r['rounds'], r['wall_s']) for r in recs])
    out['stacks'][s] = {'runs': recs, 'startup_s': a0, 'per_round_s': b0, 'whole_run_min': (a0 + total * b0) / 60}
    # The second estimate, less exposed to one process's noise than a two-point fit: the longest process's wall
    # plus its in-process rate a round (ours: between its last two evaluations; peers: median round + their
    # evaluation's share) for the remaining rounds.
    last = recs[-1]
    if last.get('inproc_round_s') is not None:
      out['stacks'][s].update(inproc_round_s=last['inproc_round_s'],
                              whole_run_inproc_min=(last['wall_s'] + (total - last['rounds'])
                                                    * last['inproc_round_s']) / 60)
  ref = out['stacks']
  for key, suffix in (('whole_run_min', ''), ('whole_run_inproc_min', '_inproc')):
    best = {'torch': min((ref[t][key] for t in ('torch', 'torch_1t') if key in ref.get(t, {})), default=None),
            'fedjax': ref['fedjax'].get(key) if 'fedjax' in ref else None}
    for s, v in ref.items():
      for peer, minutes in best.items():
        if minutes is not None and s not in PEER_MODULES and key in v:
          v[f'x_{peer}{suffix}'] = minutes / v[key]
  return out


# ----------------------------------------------------------------------------------------------- (b) table

def _table_runs(rounds: int, cells: str):
  spec = grid_lib.load_sweep_file(f'{TABLE_SWEEP}:cells={cells},rounds={rounds}')
  return [(r, grid_lib.run_config(r)) for r in grid_lib.expand(spec, '/nonexistent')]


def torch_per_run(rounds: int, cells: str, root: str, threads: int = 0) -> dict:
  """The reference pattern: one torch process per run of the table, one after another (threads: torch's, 0 =
  its default)."""
  walls, accs = [], {}
  py, mod = PEER_MODULES['torch']
  for r, c in _table_runs(rounds, cells):
    data = data_registry.get_dataset(c.dataset, **{**c.data.to_dict(), 'seed': c.data.seed
                                                   if c.data.seed is not None else c.seed})
    path, test = os.path.join(root, f'digits_{r.seed}.npz'), os.path.join(root, 'digits_test.npz')
    protocol.write_problem(path, [(data.x[data.client_indices(k)], data.y[data.client_indices(k)])
                                  for k in range(data.num_clients)])
    protocol.write_problem(test, [data.test_examples()])
    spec = dict(model=c.model, num_classes=data.num_classes, data=path, clients_per_round=c.clients_per_round,
                batch_size=c.client.batch_size, epochs=c.client.local_epochs, lr=c.client.lr,
                weight_decay=c.client.weight_decay, optimizer=c.client.optimizer, rho=c.client.rho,
                asam_eta=c.client.asam_eta, seed=c.seed, rounds=rounds, eval_every=c.eval_every, test=test,
                eval_batch=256, threads=threads)
    rec = protocol.run_whole(py, mod, spec, os.path.join(root, 'spec_table.json'), env={'PYTHONPATH': REPO},
                             cwd=REPO)
    walls.append(rec['wall_s'])
    accs[f'{r.cell}/seed={r.seed}'] = rec['evals'][-1]['accuracy']
  return {'wall_s': sum(walls), 'per_run_wall_s': walls, 'final_accuracy': accs}


def table_part(a, root) -> dict:
  rounds = a.table_rounds
  cells = 'fedavg' if a.smoke else TABLE_CELLS
  modes = {}
  kinds = ['batched', 'parallel2'] + [t for t in ('torch', 'torch_1t') if t in a.stacks.split(',')]
  if 'torch' not in bench_util.available_peers() and len(kinds) > 2:
    print('(b) torch: no torch here (bash benchmarks/speed/peers/make_torch_venv.sh); left out', flush=True)
    kinds = kinds[:2]
  # The same two sweeps again, each with the cache its first invocation filled: what a second table run waits
  # for, and the bound on the cold ratio (compilation is what the runs axis does not multiply away).
  kinds += ['batched_warm', 'parallel2_warm'] if a.table_warm else []
  for mode in kinds:
    print(f'(b) {mode}: the table at {rounds} rounds ... ({bench_util.uptime()})', flush=True)
    load0 = bench_util.uptime()
    if mode.startswith('torch'):
      rec = torch_per_run(rounds, cells, root, THREADS.get(mode, 0))
      rec.update(sweep_s=rec['wall_s'], report_s=0.0)
    else:
      d = os.path.join(root, f'table_{mode}')
      flag = ['--batch_runs=auto'] if mode.startswith('batched') else ['--parallel=2']
      env = _clean_env(os.path.join(root, f"cache_table_{mode.split('_')[0]}"))
      w1, rc1, rss, err = runs_axis._run([PY, 'experiments/sweep.py', f'--sweep={TABLE_SWEEP}:cells={cells},'
                                          f'rounds={rounds}', f'--sweep_dir={d}', *flag], env)
      w2, rc2, _, err2 = runs_axis._run([PY, 'experiments/report.py', f'--sweep_dir={d}', f'--out_dir={d}/report'],
                                        env)
      if rc1 or rc2:
        raise RuntimeError(f'{mode}: sweep exit {rc1}, report exit {rc2}: {(err + err2)[-1500:]}')
      rec = {'sweep_s': w1, 'report_s': w2, 'wall_s': w1 + w2, 'peak_rss_mb': rss,
             'final_accuracy': runs_axis._final_accuracies(d)}      # pylint: disable=protected-access
      shutil.rmtree(d, ignore_errors=True)
    rec.update(uptime_before=load0, uptime_after=bench_util.uptime(), runs=len(rec['final_accuracy']))
    modes[mode] = rec
    print(f"    {mode}: {rec['wall_s']:.1f} s for {rec['runs']} runs", flush=True)
  torch_s = min((modes[t]['wall_s'] for t in ('torch', 'torch_1t') if t in modes), default=float('nan'))
  for name, m in modes.items():
    m['x_torch'] = torch_s / m['wall_s']
    m['x_parallel2'] = modes['parallel2' + ('_warm' if name.endswith('_warm') else '')]['wall_s'] / m['wall_s']
  return {'rounds': rounds, 'cells': cells, 'seeds': [0, 1, 2], 'modes': modes}


# ----------------------------------------------------------------------------------------------- (c) again

# What no second invocation of train.py can skip: the interpreter, the host devices and the imports a run makes
# before its first round (the packages and this one). Round 1 cannot start sooner than this in a fresh process.
FLOOR_CODE = ('from fedjax_flat import devices; devices.configure_or_exit([]); import jax; jax.devices(); '
              'import fedjax_flat.config.algo_flags, fedjax_flat.training.cli, fedjax_flat.training.api, '
              'fedjax_flat.training.run, fedjax_flat.training.loop')


def import_floor(env, repeats: int = 3) -> float:
  walls = []
  for _ in range(repeats):
    t = time.perf_counter()
    subprocess.run([PY, '-c', FLOOR_CODE], cwd=REPO, env=env, check=True)
    walls.append(time.perf_counter() - t)
  return min(walls)


def again_part(a, root) -> dict:
  out = {}
  cifar = compile_cache.make_cifar10(root) if 'pfl_cifar10' in a.again_configs else ''
  for name in a.again_configs.split(','):
    args = compile_cache.CONFIGS[name] + ([f'--config.data.data_dir={cifar}'] if name == 'pfl_cifar10' else [])
    if a.smoke and name == 'pfl_cifar10':
      args += ['--config.data.num_clients=40', '--config.data.examples_per_client=20', '--config.clients_per_round=4']
    cache = os.path.join(root, f'cache_again_{name}')
    env = {k: v for k, v in _clean_env(cache).items() if k != devices.CACHE_ENV}
    recs = {}
    for kind in ('first', 'second'):
      print(f'(c) {name}: {kind} invocation ... ({bench_util.uptime()})', flush=True)
      wd = os.path.join(root, f'again_{name}_{kind}')
      r = compile_cache.run_once(name, args, cache, wd, 3, env)
      shutil.rmtree(wd, ignore_errors=True)
      recs[kind] = {k: r[k] for k in ('round1_starts_s', 'cpu_round1_starts_s', 'round_s', 'total_s')}
      recs[kind]['metrics'] = r['metrics']
    floor = import_floor(env)
    out[name] = {**recs, 'starts_sooner_x': recs['first']['round1_starts_s'] / recs['second']['round1_starts_s'],
                 'floor_s': floor, 'floor_x': recs['first']['round1_starts_s'] / floor,
                 'cpu_before_round1_x': recs['first']['cpu_round1_starts_s'] / recs['second']['cpu_round1_starts_s'],
                 'metrics_identical': recs['first']['metrics'] == recs['second']['metrics']}
    for kind in recs:
      del recs[kind]['metrics']
  return out


# -------------------------------------------------------------------------------------------------- report

def markdown(res) -> str:
  m = res['machine']
  lines = [f"# End to end: what a user waits for ({m['cpu']}, {m['cpus']} CPUs, jax {m.get('jax', '')})", '',
           f"Command: `{res['command']}`  ", f"fp32 GEMM 2048^3: {res['gemm_before']} / {res['gemm_after']} GFLOP/s "
           '(before / after)  ', f"uptime before: {res['uptime_before']}  ", f"uptime after: {res['uptime_after']}",
           '']
  if 'pfl' in res:
    p = res['pfl']
    lines += [f"## (a) pfl-research's CIFAR10 protocol, the whole {p['rounds_extrapolated']}-round run",
              '', f"Measured: fresh processes of {p['rounds_measured']} rounds per stack (interleaved); "
              f"wall = a + b K; the {p['rounds_extrapolated']}-round run is **extrapolated** as "
              f"a + {p['rounds_extrapolated']} b.", '',
              '| stack | walls (s) at K rounds | start-up a (s) | b (s/round, evaluations included) | whole run '
              '(min, extrapolated) | x torch | x fedjax | in-process s/round | whole run, in-process rate (min) | '
              'x torch | x fedjax | final acc (random labels) |',
              '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
    nan = float('nan')
    for s, v in p['stacks'].items():
      walls = ', '.join(f"{r['wall_s']:.1f} @ {r['rounds']}" for r in v['runs'])
      lines.append(f"| {s} | {walls} | {v['startup_s']:.1f} | {v['per_round_s']:.3f} | {v['whole_run_min']:.1f} | "
                   f"{v.get('x_torch', nan):.2f} | {v.get('x_fedjax', nan):.2f} | {v.get('inproc_round_s', nan):.3f} | "
                   f"{v.get('whole_run_inproc_min', nan):.1f} | {v.get('x_torch_inproc', nan):.2f} | "
                   f"{v.get('x_fedjax_inproc', nan):.2f} | {v['runs'][-1]['final_test_accuracy']} |")
    lines += ['', 'In-process rate: the longest process\'s wall plus, for the remaining rounds, its own seconds a '
              'round (ours: between its last two evaluations; the peers: their median round plus their evaluation\'s '
              'share), an estimate less exposed to one process\'s noise than the two-point fit.', '']
  if 'table' in res:
    t = res['table']
    lines += [f"## (b) the digits flat-minima table ({t['cells']}, seeds 0-2, {t['rounds']} rounds)", '',
              '| mode | runs | wall s (sweep + report) | x torch per run | x parallel2 | mean final acc | load before '
              '-> after |', '|---|---:|---:|---:|---:|---:|---|']
    la = lambda u: u.split('load average:')[-1].split(',')[0].strip()
    for mode, v in t['modes'].items():
      accs = [x for x in v['final_accuracy'].values() if x is not None]
      lines.append(f"| {mode} | {v['runs']} | {v['wall_s']:.1f} ({v['sweep_s']:.1f} + {v['report_s']:.1f}) | "
                   f"{v['x_torch']:.2f} | {v['x_parallel2']:.2f} | {sum(accs) / max(len(accs), 1):.4f} | "
                   f"{la(v['uptime_before'])} -> {la(v['uptime_after'])} |")
    lines.append('')
  if 'again' in res:
    lines += ['## (c) the same run invoked twice (one compilation cache)', '',
              '| config | round 1 starts: first / second (s) | sooner | CPU s before round 1: first / second | '
              'floor: interpreter + imports (s) | first / floor | metrics identical |',
              '|---|---|---:|---|---:|---:|---|']
    for name, v in res['again'].items():
      lines.append(f"| {name} | {v['first']['round1_starts_s']:.2f} / {v['second']['round1_starts_s']:.2f} | "
                   f"{v['starts_sooner_x']:.2f}x | {v['first']['cpu_round1_starts_s']:.2f} / "
                   f"{v['second']['cpu_round1_starts_s']:.2f} ({v['cpu_before_round1_x']:.2f}x) | "
                   f"{v.get('floor_s', float('nan')):.2f} | {v.get('floor_x', float('nan')):.2f}x | "
                   f"{v['metrics_identical']} |")
    lines += ['', 'floor: a fresh process that only starts the interpreter, the host devices and the imports of a '
              'run (`FLOOR_CODE`); "first / floor" is the most any second invocation could gain.', '']
  return '\n'.join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--parts', default='pfl,table,again')
  ap.add_argument('--pfl_rounds', default='10,30')
  ap.add_argument('--stacks', default='ours,ours_auto,ours_noeval,torch,torch_1t,fedjax')
  ap.add_argument('--table_rounds', type=int, default=100)
  ap.add_argument('--again_configs', default='quickstart,pfl_cifar10')
  ap.add_argument('--out', default=os.path.join(REPO, 'benchmarks', 'speed', 'end_to_end_cpu'))
  ap.add_argument('--table_warm', type=int, default=1,
                  help='(b): also run both sweeps a second time with the caches their first runs filled')
  ap.add_argument('--smoke', action='store_true')
  a = ap.parse_args(argv)
  if a.smoke:
    a.pfl_rounds, a.table_rounds = '2,4', 2
  parts = [p for p in a.parts.split(',') if p]
  bad = [p for p in parts if p not in ('pfl', 'table', 'again')]
  if bad:
    sys.exit(f'error: --parts: {bad} are not parts; use pfl, table, again')
  res = {'command': 'python -m benchmarks.speed.end_to_end ' + ' '.join(sys.argv[1:] if argv is None else argv),
         'machine': {**bench_util.machine_info(), 'jax': jax.__version__},
         'uptime_before': bench_util.uptime(), 'gemm_before': round(bench_util.gemm_gflops(), 1), 'smoke': a.smoke}
  root = tempfile.mkdtemp(prefix='end_to_end_')
  t0 = time.time()
  try:
    if 'pfl' in parts:
      res['pfl'] = pfl_part(a, root)
    if 'table' in parts:
      res['table'] = table_part(a, root)
    if 'again' in parts:
      res['again'] = again_part(a, root)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  res.update(uptime_after=bench_util.uptime(), gemm_after=round(bench_util.gemm_gflops(), 1),
             wall_s=time.time() - t0)
  return bench_util.write_report(a.out, res, markdown)


if __name__ == '__main__':
  main()
