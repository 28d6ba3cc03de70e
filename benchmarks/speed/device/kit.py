r"""The device kit's driver: issue 34's accelerator table within a hard wall budget (run.sh calls it).

  python -m benchmarks.speed.device.kit [--out=DIR] [--budget_s=450] [--groups=paper100,pfl,runs,paper10,resnet]
      [--repeats=3] [--smoke]

Groups, in this order (the issue's target comparisons first, so a run cut short still has them):
  paper100  the paper's CIFAR-100 CNN round, 100 clients x 500 synthetic 32x32x3 examples, B=64, E=1:
            engine.strategy vmap / chunked (10 a chunk) / sequential x float32 / bfloat16 x SGD / SAM (rho 0.05),
            ours as a user runs it (the trainer), and the torch peer (SGD, SAM) on the same device
  pfl       pfl-research's CIFAR10 protocol (configs/pfl_cifar10.py: 1000 users x 50, 50 a round, B=10):
            the trainer as a user runs it (engine 'auto'), the torch peer, then strategy vmap / chunked /
            sequential and bfloat16
  runs      the runs axis: R = 32, 8, 1 paper-CNN runs (10 clients a round out of 100 x 500, B=64, seeds 0..R-1)
            in one program (training/batched.py, as `sweep.py --batch_runs=R` runs them) vs one run alone
  paper10   paper100's grid at 10 clients a round (5 a chunk)
  resnet    ResNet18-GN at 10 clients x 500, B=64: vmap / chunked / sequential, float32 and bfloat16, torch
Every row: peak device memory, compile time (first call - steady state), s/round, examples/s, rounds/s.

Budget: each group runs in its own process (measuring side: kit_rows.py), given a share of the wall time that
is left (weights GROUP_WEIGHT over the groups still to run: time a group does not use passes to the next) and
killed with its process group at its deadline; its rows not finished are recorded as skipped with the reason.
No jax in this process: the groups' processes own the device one at a time (XLA_PYTHON_CLIENT_PREALLOCATE=false
unless set: the torch peer shares the device with them).

Writes into --out (default $OUT, else benchmarks/speed/device/out_<time>): rows.jsonl (each row as it
finishes), plan_<group>.json, <group>.log (the group process's output), and after each group kit.json (every
row, the device, the ratios) and kit.md (the tables in benchmarks/README.md's format). --smoke: the same code
path at tiny sizes (a couple of rows a group, conv 'lax'), a check of the kit on a CPU, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from benchmarks.paths import REPO

GROUPS = ('paper100', 'pfl', 'runs', 'paper10', 'resnet')
GROUP_WEIGHT = {'paper100': 0.28, 'pfl': 0.17, 'runs': 0.23, 'paper10': 0.14, 'resnet': 0.18}
FINAL_RESERVE_S = 10.0          # kept for the report after the last group
STRATEGIES = ('vmap', 'chunked', 'sequential')
TARGETS = {'paper100': 10.0, 'pfl': 5.0, 'runs': 10.0}
RUNS_ROUNDS = 1000              # the run length of the runs/hour figures


# --- The plan: every row of a group, in order. ---

def _sizes(smoke: bool) -> dict:
  if smoke:
    return dict(examples=8, batch=4, chunk=2, K=1, conv='lax', paper100=3, paper10=2, resnet_clients=2,
                resnet_shape=[8, 8, 3], runs_pool=4, runs_clients=2, runs_R=(2,), pfl_K=1)
  return dict(examples=500, batch=64, chunk=None, K=2, conv='auto', paper100=100, paper10=10, resnet_clients=10,
              resnet_shape=[32, 32, 3], runs_pool=100, runs_clients=10, runs_R=(32, 8, 1), pfl_K=5)


def _paper_rows(group, model, clients, shape, chunk, sz, smoke, resnet=False):
  base = dict(group=group, protocol='paper', model=model, clients=clients, pool=clients, examples=sz['examples'],
              batch=sz['batch'], chunk=chunk, input_shape=shape, conv=sz['conv'], K=sz['K'], smoke=smoke,
              examples_per_round=clients * sz['examples'])
  rows = []
  opts = ('sgd',) if resnet else ('sgd', 'sam')
  for opt in opts:       # float32 SGD (the targets: vmap, the default off a CPU, and torch) first, bf16, then SAM
    for dtype in ('float32', 'bfloat16'):
      for s in ('vmap', 'torch', 'sequential', 'chunked'):
        if s == 'torch' and dtype != 'float32':
          continue
        rows.append({**base, 'id': f'{group}/{s}/{dtype}/{opt}', 'kind': 'torch' if s == 'torch' else 'trainer',
                     'strategy': s, 'dtype': dtype, 'opt': opt})
  if smoke:   # one or two rows a group (compilation dominates on a CPU): vmap f32 + the torch peer; vmap bf16 SAM
    keep = {'paper100': ('vmap/float32/sgd', 'torch/float32/sgd'),
            'paper10': ('vmap/bfloat16/sam',), 'resnet': ('vmap/float32/sgd',)}[group]
    rows = [r for r in rows if r['id'].split('/', 1)[1] in keep]
  return rows


def _pfl_rows(sz, smoke):
  base = dict(group='pfl', protocol='pfl', model='pfl_cnn', conv=sz['conv'], K=sz['pfl_K'], smoke=smoke,
              examples_per_round=(4 * 20 if smoke else 50 * 50), opt='sgd')
  rows = [{**base, 'id': 'pfl/trainer/float32/sgd', 'kind': 'trainer', 'strategy': 'auto', 'dtype': 'float32'},
          {**base, 'id': 'pfl/torch/float32/sgd', 'kind': 'torch', 'strategy': 'torch', 'dtype': 'float32'}]
  for s in STRATEGIES:
    over = {'engine.strategy': s}
    if s == 'chunked':
      over['engine.clients_per_chunk'] = 10
    rows.append({**base, 'id': f'pfl/{s}/float32/sgd', 'kind': 'trainer', 'strategy': s, 'dtype': 'float32',
                 'overrides': over})
  rows.append({**base, 'id': 'pfl/trainer/bfloat16/sgd', 'kind': 'trainer', 'strategy': 'auto',
               'dtype': 'bfloat16'})
  return rows[:2] if smoke else rows


def _runs_rows(sz, smoke):
  base = dict(group='runs', protocol='paper', model='cifar_cnn', clients=sz['runs_clients'], pool=sz['runs_pool'],
              examples=sz['examples'], batch=sz['batch'], chunk=0, input_shape=[32, 32, 3], conv=sz['conv'],
              K=sz['K'] if smoke else 5, smoke=smoke, examples_per_round=sz['runs_clients'] * sz['examples'],
              strategy='auto', dtype='float32', opt='sgd')
  rows = [{**base, 'id': 'runs/one', 'kind': 'runs_one', 'R': 1}]
  rows += [{**base, 'id': f'runs/R{r}', 'kind': 'runs_batched', 'R': r} for r in sz['runs_R']]
  return rows


def plan(group: str, smoke: bool) -> list:
  sz = _sizes(smoke)
  if group == 'paper100':
    return _paper_rows(group, 'cifar_cnn', sz['paper100'], [32, 32, 3], sz['chunk'] or 10, sz, smoke)
  if group == 'paper10':
    return _paper_rows(group, 'cifar_cnn', sz['paper10'], [32, 32, 3], sz['chunk'] or 5, sz, smoke)
  if group == 'resnet':
    return _paper_rows(group, 'resnet18_gn', sz['resnet_clients'], sz['resnet_shape'], sz['chunk'] or 5, sz, smoke,
                       resnet=True)
  if group == 'pfl':
    return _pfl_rows(sz, smoke)
  if group == 'runs':
    return _runs_rows(sz, smoke)
  raise ValueError(group)


# --- Running the groups. ---

def _read_rows(out):
  path = os.path.join(out, 'rows.jsonl')
  recs = []
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        line = line.strip()
        if line:
          try:
            recs.append(json.loads(line))
          except json.JSONDecodeError:   # a line cut by the kill at the deadline
            pass
  return recs


def _append(out, rec):
  with open(os.path.join(out, 'rows.jsonl'), 'a') as f:
    f.write(json.dumps(rec) + '\n')


def run_group(group, rows, out, deadline, a):
  """The group's process until it ends or its deadline; rows it did not write are recorded as skipped."""
  plan_path = os.path.join(out, f'plan_{group}.json')
  with open(plan_path, 'w') as f:
    json.dump(rows, f, indent=1)
  env = dict(os.environ)
  env.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  env['PYTHONPATH'] = REPO + (os.pathsep + env['PYTHONPATH'] if env.get('PYTHONPATH') else '')
  cmd = [sys.executable, '-m', 'benchmarks.speed.device.kit_rows', f'--plan={plan_path}', f'--out={out}',
         f'--deadline={deadline}', f'--reserve_s={0 if a.smoke else 10}', f'--repeats={a.repeats}']
  t0 = time.time()
  with open(os.path.join(out, f'{group}.log'), 'w') as log:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
      rc = proc.wait(timeout=max(1.0, deadline - time.time()))
      why = f'group process exited with status {rc} before this row' if rc else None
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)    # its own session: the group process and its torch peer
      proc.wait()
      why = f'group budget of {deadline - t0:.0f} s reached (the process was stopped)'
  done = {r['id'] for r in _read_rows(out) if r.get('kind') == 'row' and r.get('group') == group}
  for r in rows:
    if r['id'] not in done:
      _append(out, {'id': r['id'], 'group': group, 'kind': 'row', 'status': 'skipped',
                    'reason': why or 'group process ended without this row'})
  return time.time() - t0


# --- The report. ---

def _fmt(v, spec='.3f'):
  return '-' if v is None else format(v, spec)


def _best(rows, pred):
  ok = [r for r in rows if r.get('status') == 'ok' and pred(r)]
  return max(ok, key=lambda r: r['rounds_per_s']) if ok else None


def ratios(plans, results) -> list:
  """The issue's target comparisons: ours (best strategy) over the torch peer; R = 32 over one at a time."""
  by_id = {r['id']: r for r in results}
  out = []
  for group, label in (('paper100', 'paper CNN round, 100 clients x 500, B=64, SGD, float32'),
                       ('pfl', "pfl-research's CIFAR10 protocol, 50 x 50, B=10")):
    rows = [{**by_id.get(p['id'], {}), **p} for p in plans.get(group, [])]
    ours = _best(rows, lambda r: r['kind'] == 'trainer' and r['opt'] == 'sgd' and r['dtype'] == 'float32')
    ours_any = _best(rows, lambda r: r['kind'] == 'trainer' and r['opt'] == 'sgd')
    torch = _best(rows, lambda r: r['kind'] == 'torch' and r['opt'] == 'sgd')
    out.append({'group': group, 'regime': label, 'ours': ours and ours['id'], 'ours_rounds_per_s':
                ours and ours['rounds_per_s'], 'ours_any_dtype': ours_any and ours_any['id'],
                'ours_any_dtype_rounds_per_s': ours_any and ours_any['rounds_per_s'],
                'torch_rounds_per_s': torch and torch['rounds_per_s'],
                'ratio': (ours['rounds_per_s'] / torch['rounds_per_s']) if (ours and torch) else None,
                'ratio_any_dtype': (ours_any['rounds_per_s'] / torch['rounds_per_s']) if (ours_any and torch) else None,
                'target': TARGETS[group], 'unit': 'rounds/s'})
  rows = {p['id']: {**by_id.get(p['id'], {}), **p} for p in plans.get('runs', [])}
  one = rows.get('runs/one')
  big = max((r for r in rows.values() if r['kind'] == 'runs_batched' and r.get('status') == 'ok'),
            key=lambda r: r['R'], default=None)
  rec = {'group': 'runs', 'regime': 'runs axis: R paper-CNN runs in one program vs one at a time', 'target':
         TARGETS['runs'], 'unit': f'runs/hour ({RUNS_ROUNDS}-round runs)', 'ratio': None}
  if one and one.get('status') == 'ok' and big:
    per_run = lambda r: RUNS_ROUNDS * r['s_per_round'] / r['R']            # steady state, seconds per run  # noqa: E731
    with_compile = lambda r: (r['compile_s'] + RUNS_ROUNDS * r['s_per_round']) / r['R']   # noqa: E731
    rec.update({'ours': big['id'], 'R': big['R'], 'ours_runs_per_hour': 3600 / per_run(big),
                'one_runs_per_hour': 3600 / per_run(one), 'ratio': per_run(one) / per_run(big),
                'ratio_with_compile': with_compile(one) / with_compile(big)})
  out.append(rec)
  return out


def markdown(doc) -> str:
  dev = doc.get('device') or {}
  name = f"{dev.get('device_kind', '?')} ({dev.get('backend', '?')}), jax {dev.get('jax', '?')}"
  L = [f'# Device kit: {name}', '',
       f"Command: `{doc['command']}`; budget {doc['budget_s']:.0f} s, wall {doc.get('wall_s', 0):.0f} s; "
       f"{doc['started']}; devices {dev.get('devices', '?')}; torch peer: its own process on the same device.  ",
       'SMOKE RUN (tiny sizes on this machine: a check of the kit, not a measurement)' if doc['smoke'] else '', '',
       '## Targets (issue 34)', '',
       '| regime | command | ours (best) | torch peer | target | status | machine |', '|---|---|---:|---:|---|---|---|']
  for r in doc['ratios']:
    if r['group'] == 'runs':
      ours = (f"R={r['R']}: {r['ours_runs_per_hour']:.0f} runs/h (one at a time {r['one_runs_per_hour']:.0f}; "
              f"with compilation {r['ratio_with_compile']:.2f}x)" if r['ratio'] is not None else '-')
      peer = '-'
    else:
      ours = (f"{r['ours']}: {r['ours_rounds_per_s']:.3f} rounds/s" if r['ours'] else '-')
      if r.get('ours_any_dtype') and r['ours_any_dtype'] != r['ours']:
        ours += (f"; any dtype {r['ours_any_dtype']}: {r['ours_any_dtype_rounds_per_s']:.3f} "
                 f"({_fmt(r['ratio_any_dtype'], '.2f')}x torch)")
      peer = f"{r['torch_rounds_per_s']:.3f} rounds/s" if r['torch_rounds_per_s'] else '-'
    status = ('not measured' if r['ratio'] is None else
              f"**{'met' if r['ratio'] >= r['target'] else 'missed'}: {r['ratio']:.2f}x**")
    L.append(f"| {r['regime']} | `bash benchmarks/speed/device/run.sh --groups={r['group']}` | {ours} | {peer} | "
             f">= {r['target']:.0f}x | {status} | {name} |")
  L += ['', '## Rows', '',
        'x ref: rounds/s over the torch peer of the same group and optimizer (runs: run-rounds/s over one at a time). '
        'Peak MiB: the device peak after the row (cumulative in the group\'s process); compile s: first call - '
        'K x steady round.', '',
        '| row | model | clients x examples, B | s/round | examples/s | rounds/s | x ref | compile s | peak MiB | '
        'status / note |', '|---|---|---|---:|---:|---:|---:|---:|---:|---|']
  for group in doc['groups']:
    plans = doc['plans'][group]
    res = {r['id']: r for r in doc['rows'] if r.get('group') == group}
    for p in plans:
      r = {'status': 'skipped', 'reason': 'not reached', **res.get(p['id'], {}), **p}
      shape = (f"{p.get('clients', 50)} x {p.get('examples', 50)}, B={p.get('batch', 10)}" if p['protocol'] == 'paper'
               else 'pfl protocol')
      if r['kind'].startswith('runs'):
        shape += f", R={p['R']}"
      if r['status'] != 'ok':
        L.append(f"| {p['id']} | {p['model']} | {shape} | - | - | - | - | - | - | {r['status']}: "
                 f"{r.get('reason', '')[:160]} |")
        continue
      ref = None
      if r['kind'].startswith('runs'):
        one = res.get('runs/one', {})
        ref = r['run_rounds_per_s'] / one['run_rounds_per_s'] if one.get('status') == 'ok' else None
      elif r['kind'] != 'torch':
        t = res.get(f"{group}/torch/float32/{p['opt']}", {})
        ref = r['rounds_per_s'] / t['rounds_per_s'] if t.get('status') == 'ok' else None
      mib = r['peak_device_bytes'] / 2**20 if r.get('peak_device_bytes') else None
      note = r.get('note', '') + ('' if mib is not None else f"; peak: {r.get('peak_device_note', '')}")
      L.append(f"| {p['id']} | {p['model']} | {shape} | {r['s_per_round']:.4f} | {r['examples_per_s']:.0f} | "
               f"{r['rounds_per_s']:.3f} | {_fmt(ref, '.2f')} | {_fmt(r.get('compile_s'), '.1f')} | "
               f"{_fmt(mib, '.0f')} | {note} |")
  return '\n'.join(L) + '\n'


def write_report(doc, out):
  doc['ratios'] = ratios(doc['plans'], doc['rows'])
  with open(os.path.join(out, 'kit.json'), 'w') as f:
    json.dump(doc, f, indent=1)
  md = markdown(doc)
  with open(os.path.join(out, 'kit.md'), 'w') as f:
    f.write(md)
  return md


def _args(argv):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--out', default=None, help='results folder (default $OUT, else benchmarks/speed/device/out_<time>)')
  ap.add_argument('--budget_s', type=float, default=None,
                  help='hard wall budget of the kit, seconds (default 450; smoke 300, a cap)')
  ap.add_argument('--groups', default=','.join(GROUPS), help=f'comma list of {",".join(GROUPS)} (run in this order)')
  ap.add_argument('--rows', default='', help='comma list of substrings: keep only the rows whose id holds one '
                  '(e.g. /sam,runs/R8 for a rerun of the rows a first run skipped)')
  ap.add_argument('--repeats', type=int, default=None, help='timed calls per row, median (default 3; smoke 1)')
  ap.add_argument('--smoke', action='store_true', help='tiny sizes: a check of the kit on a CPU')
  a = ap.parse_args(argv)
  a.groups = [g for g in a.groups.split(',') if g]
  bad = [g for g in a.groups if g not in GROUPS]
  if bad or not a.groups:
    ap.error(f'--groups: unknown {bad or "(none given)"}; allowed: {",".join(GROUPS)}')
  a.groups = [g for g in GROUPS if g in a.groups]
  a.budget_s = a.budget_s if a.budget_s is not None else (300.0 if a.smoke else 450.0)
  if a.budget_s <= 0:
    ap.error(f'--budget_s={a.budget_s}: must be > 0 seconds')
  a.repeats = a.repeats or (1 if a.smoke else 3)
  a.out = a.out or os.environ.get('OUT') or os.path.join(REPO, 'benchmarks', 'speed', 'device',
                                                         time.strftime('out_%Y%m%d_%H%M%S'))
  return a


def main(argv=None):
  a = _args(argv)
  start = time.time()
  deadline = start + a.budget_s
  os.makedirs(a.out, exist_ok=True)
  if os.path.exists(os.path.join(a.out, 'rows.jsonl')):
    os.remove(os.path.join(a.out, 'rows.jsonl'))
  plans = {g: plan(g, a.smoke) for g in GROUPS}     # every group: those not asked for are listed as skipped
  if a.rows:   # a rerun of what a first run skipped: only the rows whose id holds one of these strings
    plans = {g: [r for r in rows if any(k in r['id'] for k in a.rows.split(','))] for g, rows in plans.items()}
  doc = {'command': 'bash benchmarks/speed/device/run.sh ' + ' '.join(sys.argv[1:] if argv is None else argv),
         'smoke': a.smoke, 'budget_s': a.budget_s, 'repeats': a.repeats, 'groups': list(GROUPS),
         'started': time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(start)), 'plans': plans, 'group_wall_s': {}}
  for g in GROUPS:
    if g not in a.groups:
      for r in plans[g]:
        _append(a.out, {'id': r['id'], 'group': g, 'kind': 'row', 'status': 'skipped',
                        'reason': f'group not in --groups={",".join(a.groups)}'})
  md = ''
  for i, g in enumerate(a.groups):
    left = deadline - FINAL_RESERVE_S - time.time()
    weights = [GROUP_WEIGHT[h] for h in a.groups[i:]]
    share = left * GROUP_WEIGHT[g] / sum(weights)
    if share < (5 if a.smoke else 20):
      for r in plans[g]:
        _append(a.out, {'id': r['id'], 'group': g, 'kind': 'row', 'status': 'skipped',
                        'reason': f'kit budget of {a.budget_s:.0f} s spent before this group ({max(share, 0):.0f} s '
                                  'share left)'})
    else:
      print(f'[kit] group {g}: {len(plans[g])} rows, {share:.0f} s', file=sys.stderr, flush=True)
      doc['group_wall_s'][g] = run_group(g, plans[g], a.out, time.time() + share, a)
    recs = _read_rows(a.out)
    doc['device'] = next((r for r in recs if r.get('kind') == 'device'), None)
    doc['rows'] = [r for r in recs if r.get('kind') == 'row']
    doc['wall_s'] = time.time() - start
    md = write_report(doc, a.out)
  print(md)
  print(f"wrote {a.out}/kit.json, kit.md, rows.jsonl ({doc['wall_s']:.0f} s)")
  return doc


if __name__ == '__main__':
  main()
