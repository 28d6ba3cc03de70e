"""The hostile-user trials: issue 13's against experiments/train.py, issue 22's against the tools around a run.

Each trial runs the binary (quickstart config, MLP, a few rounds) in a fresh temporary workdir and records the
exit status, the wall seconds of the process and its `error:` line (or the line that matters). Faults that
root cannot produce with chmod come from tests/fixtures/fault_inject.py. Prints a Markdown table.

  .venv/bin/python -m benchmarks.robustness.hardening_trials [--issue=13|22]
  .venv/bin/python -m benchmarks.robustness.hardening_trials --issue=22 --repo=/tmp/before   # another checkout

Issue 22 (`trials_22`): every entry point's error cases (tests/fixtures/entry_cases.py), malformed LEAF JSON /
StackOverflow SQLite / params files through train.py (tests/fixtures/hostile.py), a FEMNIST run reloaded by
hessian.py and init.checkpoint, report.py on a torn metrics.jsonl and a NaN seed, and sweep.py's driver killed,
a child killed, two drivers at once and a full disk. `--repo` runs the binaries of another checkout (its
PYTHONPATH), e.g. the code before the issue; the malformed files are written by this checkout's fixtures.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.paths import REPO

QUICK = ['--config.model=mlp', '--config.eval_every=2', '--config.progress_every_s=0']
ENV = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONUNBUFFERED': '1'}


def cmd(wd, *flags, config='configs/quickstart.py', inject=()):
  pre = ['-m', 'tests.fixtures.fault_inject', *inject, '--'] if inject else []
  return [sys.executable, *pre, os.path.join(REPO, 'experiments', 'train.py'), f'--config={config}',
          f'--workdir={wd}', *flags]


def run(wd, *flags, timeout=600, **kw):
  t = time.time()
  try:
    r = subprocess.run(cmd(wd, *flags, **kw), capture_output=True, text=True, timeout=timeout, env=ENV, cwd=REPO)
  except subprocess.TimeoutExpired:
    return None, time.time() - t, f'still running after {timeout} s'
  return r, time.time() - t, None


def summary(r, secs, extra=''):
  if r is None:
    return ('timeout', secs, extra)
  err = [ln for ln in r.stderr.splitlines() if ln.startswith(('error: ', 'FATAL'))]
  line = err[0] if err else ([ln for ln in r.stdout.splitlines() if ln.startswith(('done:', 'stopped'))] or [''])[0]
  tb = ' [TRACEBACK]' if 'Traceback' in r.stderr else ''
  return (r.returncode, secs, (line[:230] + tb + (' ' + extra if extra else '')).strip())


def cifar_root(d, *, batch1=None, labels=None):
  from tests.fixtures.data_files import make_cifar10, py2_pickle
  make_cifar10(d, per_batch=10, n_test=10, as_tar=False)
  p = os.path.join(d, 'cifar-10-batches-py', 'data_batch_1')
  if labels is not None:
    with open(p, 'rb') as f:
      b = pickle.loads(f.read(), encoding='bytes')
    b[b'labels'] = labels
    batch1 = py2_pickle(b)
  if batch1 is not None:
    with open(p, 'wb') as f:
      f.write(batch1)
  return d


CIFAR = ['--config.data.check_official_sizes=False', '--config.data.num_clients=2',
         '--config.data.examples_per_client=5', '--config.rounds=1']


class _Evil:
  def __reduce__(self):
    return os.system, ('true',)


def trials(tmp):
  wd = lambda name: os.path.join(tmp, name)  # noqa: E731
  out = []

  def add(name, res):
    out.append((name,) + res)
    print(f'{name}: {res}', file=sys.stderr, flush=True)

  # 1. bit rot
  w = wd('bitrot')
  run(w, *QUICK, '--config.rounds=4', '--config.checkpoint_every=1')
  d = os.path.join(w, 'checkpoints', '4', 'server')
  files = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if os.path.basename(r) == 'd']
  big = max(files, key=os.path.getsize)
  raw = bytearray(open(big, 'rb').read())
  raw[len(raw) // 2] ^= 0x5A
  open(big, 'wb').write(bytes(raw))
  r, s, _ = run(w, *QUICK, '--config.rounds=5', '--config.checkpoint_every=1')
  warn = [ln[ln.index('checkpoint '):][:150] for ln in r.stderr.splitlines() if 'is corrupt' in ln]
  add('1 one flipped byte in the newest checkpoint array data',
      summary(r, s, '| ' + (warn[0] if warn else 'no warning')))
  # 2. two runs together
  w = wd('together')
  flags = [*QUICK, '--config.rounds=8', '--config.checkpoint_every=1']
  t = time.time()
  ps = [subprocess.Popen(cmd(w, *flags), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
        for _ in range(2)]
  res = [(p.pid, p.wait(timeout=600), p.stderr.read(), time.time() - t) for p in ps]
  rounds = [json.loads(ln)['round'] for ln in open(os.path.join(w, 'metrics.jsonl'))]
  refused = [x for x in res if x[1] != 0]
  msg = ([ln for ln in refused[0][2].splitlines() if ln.startswith('error:')] or [''])[0] if refused else ''
  add('2 two runs started together on one workdir',
      (f'{res[0][1]} / {res[1][1]}', max(x[3] for x in res),
       f'{msg} | pids {[x[0] for x in res]}; metrics rounds {rounds}'))
  # 3. checkpoints/ not writable (from the start; and after the first save)
  w = wd('ro')
  add('3 checkpoints/ not writable',
      summary(*run(w, *QUICK, '--config.rounds=2', inject=[f'--deny={w}/checkpoints'])[:2]))
  w = wd('ro2')
  add('3 checkpoints/ turns read-only after the first save',
      summary(*run(w, *QUICK, '--config.rounds=4', '--config.checkpoint_every=2',
                   inject=[f'--deny={w}/checkpoints', '--deny_after=1'])[:2]))
  # 4. NaN / inf
  for f in ('--config.client.lr=nan', '--config.client.lr=inf', '--config.client.lr=1e400', '--config.data.alpha=nan'):
    add(f'4 {f}', summary(*run(wd('nan'), *QUICK, '--config.rounds=2', f)[:2]))
  add('4 --config.data.alpha=inf (IID, allowed)', summary(*run(wd('inf'), *QUICK, '--config.rounds=2',
                                                                '--config.data.alpha=inf')[:2]))
  # 5. one line and exit 2
  for f in ('--config.clent.lr=0.1', '--config.data.alpha=-1', '--config.data.num_clients=0',
            '--config.client.lr=abc'):
    add(f'5 {f}', summary(*run(wd('bad'), *QUICK, f)[:2]))
  add('5 missing config file', summary(*run(wd('bad'), config='configs/nope.py')[:2]))
  bad = os.path.join(tmp, 'syntax.py')
  open(bad, 'w').write('def get_config(:\n')
  add('5 config file with a syntax error', summary(*run(wd('bad'), config=bad)[:2]))
  add('5 --config.algo.mu (no value) --config.rounds=2',
      summary(*run(wd('bad'), '--config.algorithm=fedprox', '--config.algo.mu', '--config.rounds=2')[:2]))
  root = cifar_root(os.path.join(tmp, 'c_unsafe'), batch1=pickle.dumps({b'data': _Evil()}, protocol=2))
  add('5 UnsafePickleError (CIFAR batch calls os.system)',
      summary(*run(wd('c'), f'--config.data.data_dir={root}', *CIFAR, config='configs/fedsam_cifar.py')[:2]))
  root = cifar_root(os.path.join(tmp, 'c_trunc'))
  p = os.path.join(root, 'cifar-10-batches-py', 'data_batch_1')
  raw = open(p, 'rb').read()
  open(p, 'wb').write(raw[:len(raw) - 100])
  add('5 CifarFormatError (truncated batch)',
      summary(*run(wd('c'), f'--config.data.data_dir={root}', *CIFAR, config='configs/fedsam_cifar.py')[:2]))
  add('5 --config.data.split_json=/nonexistent.json (CIFAR config)',
      summary(*run(wd('c'), '--config.data.split_json=/nonexistent.json', config='configs/fedsam_cifar.py')[:2]))
  add('5 divergence (client.lr=1e30)',
      summary(*run(wd('div'), *QUICK, '--config.rounds=3', '--config.client.lr=1e30')[:2]))
  add('5 ENOSPC in the metrics writer', summary(*run(wd('full'), *QUICK, '--config.rounds=3',
                                                      inject=['--enospc=metrics.jsonl'])[:2]))
  # 7. smaller ones
  w = wd('fresh')
  run(w, *QUICK, '--config.rounds=2')
  r, s, _ = run(w, *QUICK, '--config.rounds=2', '--config.clients_per_round=50', '--fresh')
  add('7 --fresh with a config rejected against the data',
      summary(r, s, f'| checkpoints kept: {sorted(os.listdir(os.path.join(w, "checkpoints")))}, metrics kept: '
                    f'{os.path.getsize(os.path.join(w, "metrics.jsonl")) > 0}'))
  w = wd('term')
  t = time.time()
  p = subprocess.Popen(cmd(w, *QUICK, '--config.rounds=2'), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=ENV, cwd=REPO)
  for line in p.stdout:
    if line.startswith('done:'):
      p.send_signal(signal.SIGTERM)
      break
  p.communicate(timeout=120)
  add('7 SIGTERM right after done:', (p.returncode, time.time() - t, ''))
  w = wd('int')
  t = time.time()
  p = subprocess.Popen(cmd(w, *QUICK, '--config.rounds=100000', inject=['--slow_rename=60']),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
  while not (os.path.exists(os.path.join(w, 'metrics.jsonl')) and open(os.path.join(w, 'metrics.jsonl')).read()):
    time.sleep(0.05)
  p.send_signal(signal.SIGINT)
  while 'slow rename' not in p.stderr.readline():
    pass
  t2 = time.time()
  p.send_signal(signal.SIGINT)
  _, err = p.communicate(timeout=120)
  add('7 second Ctrl-C while the final checkpoint is written',
      (p.returncode, time.time() - t, f'{time.time() - t2:.1f} s after the 2nd SIGINT; '
                                      + ([ln for ln in err.splitlines() if 'second SIGINT' in ln] or [''])[0]))
  root = cifar_root(os.path.join(tmp, 'c_float'), labels=[i % 10 + 0.7 for i in range(10)])
  add('7 float CIFAR labels', summary(*run(wd('c'), f'--config.data.data_dir={root}', *CIFAR,
                                           config='configs/fedsam_cifar.py')[:2]))
  root = cifar_root(os.path.join(tmp, 'c_big'), batch1=b'c__builtin__\nbytes\n(I4000000000\ntR.')
  add('7 pickle asking for bytes(4e9)', summary(*run(wd('c'), f'--config.data.data_dir={root}', *CIFAR,
                                                     config='configs/fedsam_cifar.py')[:2]))
  w = wd('fallback')
  run(w, *QUICK, '--config.rounds=3', '--config.checkpoint_every=1')
  for r_, _, fs in os.walk(os.path.join(w, 'checkpoints', '3', 'server')):
    for f in fs:
      if os.path.basename(r_) == 'd':
        open(os.path.join(r_, f), 'wb').close()
  r, s, _ = run(w, *QUICK, '--config.rounds=3', '--config.checkpoint_every=1')
  add('7 checkpoint fallback (truncated array files)',
      summary(r, s, f'| "Event loop is closed" in stderr: {"Event loop is closed" in r.stderr}'))
  r, s, _ = run(wd('quiet'), *QUICK, '--config.rounds=2')
  r2, s2, _ = run(wd('verbose'), *QUICK, '--config.rounds=2', '--verbosity=0')
  add('7 terminal log lines (default / --verbosity=0)',
      (f'{r.returncode} / {r2.returncode}', s + s2,
       f'{len(r.stderr.splitlines())} / {len(r2.stderr.splitlines())} stderr lines'))
  return out


def _first_line(res, extra=''):
  """(exit status, the error line / the line that matters, with [TRACEBACK] when stderr holds one)."""
  err = [ln for ln in res.stderr.splitlines() if ln.startswith(('error: ', 'ERROR: ', 'FATAL'))]
  tail = [ln for ln in res.stderr.splitlines() if ln.strip()]
  line = err[0] if err else (tail[-1] if tail else ([ln for ln in res.stdout.splitlines() if ln.strip()] or [''])[-1])
  tb = ' [TRACEBACK]' if 'Traceback' in res.stderr else ''
  return res.returncode, (line[:230] + tb + (' ' + extra if extra else '')).strip()


def _timed(fn):
  t = time.time()
  out = fn()
  return out, time.time() - t


def _pid_alive(pid):
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


SECTIONS_22 = ('entry', 'files', 'femnist', 'report', 'interpolate', 'busy', 'sweep')


def trials_22(tmp, repo, out, only=SECTIONS_22):
  """Appends (trial, exit status, seconds, message) rows to `out` (kept if a trial itself breaks); `only`: the
  sections to run."""
  from tests.fixtures import entry_cases, hostile
  run_bin = lambda name, *a, **kw: entry_cases.run_binary(name, *a, repo=repo, **kw)   # noqa: E731
  env = entry_cases._env(repo)

  def add(name, code, secs, msg):
    out.append((name, code, secs, msg))
    print(f'{name}: {code} {secs:.1f} {msg}', file=sys.stderr, flush=True)

  tiny = (entry_cases.make_tiny_run(os.path.join(tmp, 'tiny'), repo)
          if {'entry', 'report', 'interpolate'} & set(only) else None)
  # 1. every entry point's error cases
  entry = sorted({**entry_cases.FAST, **entry_cases.MATRIX}.items()) if 'entry' in only else []
  for name, (binary, args, _, _) in entry:
    d = tempfile.mkdtemp(dir=tmp)
    try:
      res, secs = _timed(lambda: run_bin(binary, *args(d, tiny), cwd=d, timeout=120))
      code, msg = _first_line(res)
    except subprocess.TimeoutExpired:
      code, secs, msg = 'killed', 120.0, 'no exit within 120 s (killed)'
    if 'empty --workdir' in name:
      left = sorted(f for f in os.listdir(d) if f not in ('s', 'r', 'params', 'leaf'))
      msg += f' / written to the current directory: {left}'
    add(f'1 {binary}: {name.split(": ", 1)[-1]}', code, secs, msg)
  # 1b. malformed data files through train.py
  femnist = os.path.join(repo, 'configs', 'quickstart_femnist.py')
  for case in hostile.LEAF_CASES if 'files' in only else ():
    root = hostile.femnist_root(tempfile.mkdtemp(dir=tmp), case)
    res, secs = _timed(lambda: run_bin('train', f'--config={femnist}', f'--workdir={tmp}/w_leaf',
                                       f'--config.data.data_dir={root}', '--config.progress_every_s=0'))
    add(f'1 train: LEAF JSON {case}', res.returncode, secs, _first_line(res)[1])
  so_cfg = os.path.join(repo, 'configs', 'quickstart_stackoverflow.py')
  for case in hostile.SQLITE_CASES if 'files' in only else ():
    d = hostile.stackoverflow_dir(tempfile.mkdtemp(dir=tmp), case)
    res, secs = _timed(lambda: run_bin('train', f'--config={so_cfg}', f'--workdir={tmp}/w_so',
                                       f'--config.data.data_dir={d}', '--config.data.vocab_size=5',
                                       '--config.data.test_examples=10', '--config.progress_every_s=0'))
    add(f'1 train: StackOverflow SQLite {case}', res.returncode, secs, _first_line(res)[1])
  qs = os.path.join(repo, 'configs', 'quickstart.py')
  params_dir = os.path.join(tmp, 'params')
  for case in ('truncated msgpack', 'msgpack of a list', 'wrong shapes', 'missing keys', 'unexpected keys',
               'NaN values', 'string values', 'object arrays', 'not a params file', 'empty file') \
      if 'files' in only else ():
    path = entry_cases._params(params_dir, case)
    res, secs = _timed(lambda: run_bin('train', f'--config={qs}', f'--workdir={tmp}/w_pre_{len(out)}',
                                       *entry_cases.QUICK, '--config.rounds=1', f'--config.init.pretrained={path}'))
    add(f'1 train: init.pretrained {case}', res.returncode, secs, _first_line(res)[1])
  # 2. a FEMNIST run (config.data without num_clients) reloaded
  if 'femnist' in only:
    _femnist_trials(tmp, repo, run_bin, add)
  # 4. report.py, 2b. hessian.py --interpolate_with, 3. sweep.py: each trial guarded (a broken one is a row)
  for section, trial in (('report', _report_trials), ('interpolate', _interpolate_trials), ('busy', _busy_trials),
                         ('sweep', _sweep_trials)):
    if section not in only:
      continue
    try:
      trial(tmp, repo, tiny, run_bin, env, add)
    except Exception as e:  # noqa: BLE001 -- a trial that breaks is recorded, the next one still runs
      add(f'{trial.__name__} stopped', '-', 0.0, f'{type(e).__name__}: {e}')
  return out


def _femnist_trials(tmp, repo, run_bin, add):
  from tests.fixtures import hostile
  femnist = os.path.join(repo, 'configs', 'quickstart_femnist.py')
  root = hostile.femnist_root(os.path.join(tmp, 'femnist'))
  fw = os.path.join(tmp, 'femnist_run')
  res, secs = _timed(lambda: run_bin('train', f'--config={femnist}', f'--workdir={fw}',
                                     f'--config.data.data_dir={root}',
                                     '--config.data.fraction=1.0', '--config.rounds=1', '--config.eval_every=1',
                                     '--config.clients_per_round=2', '--config.client.batch_size=4',
                                     '--config.summary_last_k=1', '--config.progress_every_s=0'))
  add('2 train: FEMNIST run (1 round)', res.returncode, secs, _first_line(res)[1])
  res, secs = _timed(lambda: run_bin('hessian', f'--workdir={fw}', '--num_examples=20', '--batch_size=10',
                                     '--top_k=1', '--lanczos_steps=4'))
  add('2 hessian.py on the FEMNIST run', res.returncode, secs, _first_line(res)[1])
  res, secs = _timed(lambda: run_bin('train', f'--config={femnist}', f'--workdir={tmp}/femnist_init',
                                     f'--config.data.data_dir={root}', '--config.data.fraction=1.0',
                                     '--config.rounds=1',
                                     '--config.clients_per_round=2', '--config.client.batch_size=4',
                                     '--config.summary_last_k=1', '--config.progress_every_s=0',
                                     f'--config.init.checkpoint={fw}'))
  add('2 train: init.checkpoint = the FEMNIST run', res.returncode, secs, _first_line(res)[1])


def _table_rows(md):
  """The data rows of the first Markdown table of a report (after its header and |---| lines)."""
  lines = md.splitlines()
  for i, ln in enumerate(lines[:-1]):
    if ln.startswith('|') and lines[i + 1].startswith('|---'):
      rows = []
      for row in lines[i + 2:]:
        if not row.startswith('|'):
          break
        rows.append(row)
      return rows
  return []


def _report_outcome(res, out_dir):
  """A report.py run: its summary line (stdout: rows, runs, and the flagged counts), its warnings, and the
  data row the report shows."""
  path = os.path.join(out_dir, 'report.md')
  rows = _table_rows(open(path).read()) if os.path.exists(path) else []
  said = [ln for ln in res.stdout.splitlines() if ' rows from ' in ln]
  warn = [ln for ln in res.stderr.splitlines() if ln.startswith(('warning:', 'error:'))]
  tb = ' [TRACEBACK]' if 'Traceback' in res.stderr else ''
  return ' / '.join(x for x in [(said[0].split(':')[0] if said else ''), *(w[:200] for w in warn[:2]),
                                'row: ' + (rows[0] if rows else '(no report)')] if x) + tb


def _report_trials(tmp, repo, tiny, run_bin, env, add):
  from tests.fixtures import hostile
  rep = os.path.join(tmp, 'rep')
  for s in (0, 1):
    shutil.copytree(tiny, os.path.join(rep, 'cell', f'seed={s}'))
  # seed 0: five records with accuracy 0.1 r, the middle one (round 3) torn: the target 0.35 is first reached at
  # round 4, after the torn line (a reader that stops there finds it never reached)
  path = os.path.join(rep, 'cell', 'seed=0', 'metrics.jsonl')
  first = json.loads(open(path).readline())
  with open(path, 'w') as f:
    for r in range(1, 6):
      f.write(json.dumps({**first, 'round': r, 'test_accuracy': 0.1 * r}) + '\n')
  hostile.torn_metrics(path)
  res, secs = _timed(lambda: run_bin('report', f'--workdirs={rep}/cell/seed=0', f'--out_dir={tmp}/rep_out',
                                     '--target=0.35', '--noplots'))
  add('4 report.py: torn middle line of metrics.jsonl (5 records, target 0.35 first reached at round 4)',
      res.returncode, secs, _report_outcome(res, os.path.join(tmp, 'rep_out')))
  # seed 1: NaN accuracies in summary.json and an inf accuracy record in metrics.jsonl
  summ = os.path.join(rep, 'cell', 'seed=1', 'summary.json')
  doc = json.load(open(summ))
  doc = {k: (float('nan') if k.startswith('mean_last_') or k == 'final_test_accuracy' else v) for k, v in doc.items()}
  json.dump(doc, open(summ, 'w'))
  path = os.path.join(rep, 'cell', 'seed=1', 'metrics.jsonl')
  recs = [json.loads(ln) for ln in open(path)]
  recs[0]['test_accuracy'] = float('inf')
  with open(path, 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in recs))
  res, secs = _timed(lambda: run_bin('report', f'--workdirs={rep}/cell/seed=*', f'--out_dir={tmp}/rep_out2',
                                     '--target=0.99', '--noplots'))
  add('4 report.py: one seed of two with NaN accuracy and an inf record (target 0.99, reached by no finite value)',
      res.returncode, secs, _report_outcome(res, os.path.join(tmp, 'rep_out2')))


def _interpolate_trials(tmp, repo, tiny, run_bin, env, add):
  qs = os.path.join(repo, 'configs', 'quickstart.py')
  other = os.path.join(tmp, 'tiny_seed1')
  res = run_bin('train', f'--config={qs}', f'--workdir={other}', '--config.model=mlp', '--config.progress_every_s=0',
                '--config.rounds=1', '--config.seed=1')
  cnn = os.path.join(tmp, 'tiny_cnn')
  res2 = run_bin('train', f'--config={qs}', f'--workdir={cnn}', '--config.progress_every_s=0', '--config.rounds=1')
  if res.returncode or res2.returncode:
    add('2b hessian.py --interpolate_with: the other runs', f'{res.returncode} / {res2.returncode}', 0.0,
        f'{_first_line(res)[1]} / {_first_line(res2)[1]}')
    return
  hess = ['--num_examples=20', '--batch_size=10', '--top_k=1', '--lanczos_steps=4']
  for name, oth in (('another MLP run (seed 1)', other), ('a run of another model (the digits CNN)', cnn)):
    out_dir = os.path.join(tmp, 'hess_' + os.path.basename(oth))
    res, secs = _timed(lambda: run_bin('hessian', f'--workdir={tiny}', *hess, f'--interpolate_with={oth}',
                                       f'--out_dir={out_dir}'))
    code, msg = _first_line(res)
    rep = os.path.join(out_dir, 'hessian_global.json')
    doc = json.load(open(rep)) if os.path.exists(rep) else None
    wrote = ('nothing written' if doc is None else
             f"hessian_global.json written (lambda_max {doc.get('lambda_max', float('nan')):.4g}, "
             f"interpolation: {'yes' if 'interpolation' in doc else 'no'})")
    eigen = 'lambda_max' in res.stderr
    add(f'2b hessian.py --interpolate_with {name}', code, secs,
        f'{msg} / {wrote}; eigenvalue work done: {eigen}')


def _wait_metrics(sd, t, cell='base', limit=300):
  """Until the run <sd>/<cell>/seed=0 has written its first record (a one-value grid's cell is 'base')."""
  metrics = os.path.join(sd, cell, 'seed=0', 'metrics.jsonl')
  while not (os.path.exists(metrics) and open(metrics).read().strip()) and time.time() - t < limit:
    time.sleep(0.2)


def _said_of(text, keys=('FAILED', 'waiting', 'interrupted', 'runs done')):
  """What a sweep driver said: its error line, then the first lines holding one of `keys`."""
  lines = text.splitlines()
  picked = [ln for ln in lines if ln.startswith('error:')] + [ln for k in keys for ln in lines if k in ln][:3]
  return ' // '.join(dict.fromkeys(ln.strip()[:200] for ln in picked))


def _busy_trials(tmp, repo, tiny, run_bin, env, add):
  """A live train.py holds a sweep run's workdir (started by hand, or a child of another driver): the sweep waits
  for it (process-parallel and --batch_runs), it does not mark the run failed. The live run is stopped (SIGTERM:
  it checkpoints) once the sweep has said what it does; the sweep then resumes the run, and is stopped too."""
  qs = os.path.join(repo, 'configs', 'quickstart.py')
  sweep = [sys.executable, os.path.join(repo, 'experiments', 'sweep.py')]
  popen = lambda args: subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # noqa: E731
                                        text=True, env=env, cwd=repo)
  for mode in ([], ['--batch_runs=2']):
    sd = os.path.join(tmp, 'sweep_busy' + ('_batched' if mode else ''))
    args = [f'--config={qs}', '--grid=client.lr=0.05', '--seeds=0', '--set=model=mlp', '--set=rounds=100000',
            '--set=eval_every=1', '--set=progress_every_s=0', f'--sweep_dir={sd}']
    wd = os.path.join(sd, 'base', 'seed=0')        # the sweep's workdir of its one run
    t = time.time()
    live = popen([sys.executable, os.path.join(repo, 'experiments', 'train.py'), f'--config={qs}',
                  '--config.model=mlp', '--config.rounds=100000', '--config.eval_every=1',
                  '--config.progress_every_s=0', '--config.client.lr=0.05', '--config.seed=0', f'--workdir={wd}'])
    _wait_metrics(sd, t)
    p = popen(sweep + args + mode)
    manifest = os.path.join(sd, 'sweep.json')

    def status():
      try:
        return json.load(open(manifest))['runs'][0].get('status')
      except (OSError, ValueError, LookupError):
        return None
    seen = []
    t1 = time.time()
    while p.poll() is None and time.time() - t1 < 300 and status() not in ('waiting', 'failed'):
      time.sleep(0.5)
    seen.append(status())
    live.send_signal(signal.SIGTERM)       # the holder ends (checkpoints and stops)
    live.communicate(timeout=300)
    t2 = time.time()
    while p.poll() is None and time.time() - t2 < 180 and status() != 'running':
      time.sleep(0.5)
    seen.append(status())
    if p.poll() is None:
      time.sleep(10)
      p.send_signal(signal.SIGTERM)
    o, e = p.communicate(timeout=300)
    add(f'3 sweep.py{" " + mode[0] if mode else ""}: its run\'s workdir held by a live train.py (stopped once the '
        'sweep has said what it does; the sweep stopped 10 s after it starts the run)', p.returncode, time.time() - t,
        f'sweep.json status while held / after: {seen[0]} / {seen[1]}; {_said_of(o + e)}')


def _sweep_trials(tmp, repo, tiny, run_bin, env, add):
  qs = os.path.join(repo, 'configs', 'quickstart.py')
  sweep = [sys.executable, os.path.join(repo, 'experiments', 'sweep.py')]
  popen = lambda args: subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # noqa: E731
                                        text=True, env=env, cwd=repo)
  long = [f'--config={qs}', '--grid=client.lr=0.05', '--seeds=0', '--set=model=mlp', '--set=rounds=100000',
          '--set=eval_every=1', '--set=checkpoint_every=1', '--set=progress_every_s=0']
  # the driver alone SIGKILLed, then the same command again
  sd = os.path.join(tmp, 'sweep_kill')
  t = time.time()
  p = popen(sweep + long + [f'--sweep_dir={sd}'])
  _wait_metrics(sd, t)
  child = json.load(open(os.path.join(sd, 'sweep.json')))['runs'][0].get('pid')
  p.send_signal(signal.SIGKILL)
  p.communicate()
  time.sleep(15)
  alive = child is not None and _pid_alive(child)
  p2 = popen(sweep + long + [f'--sweep_dir={sd}'])
  try:
    o2, e2 = p2.communicate(timeout=60)
  except subprocess.TimeoutExpired:
    p2.send_signal(signal.SIGTERM)
    o2, e2 = p2.communicate(timeout=180)
  if child is not None and _pid_alive(child):
    os.kill(child, signal.SIGTERM)     # the orphan this trial made (the old code leaves it running)
  add('3 sweep.py: driver SIGKILLed; the same command again (stopped by SIGTERM after 60 s)',
      f'{p.returncode} / {p2.returncode}', time.time() - t,
      f'child alive 15 s after the driver died: {alive}; rerun says: {_said_of(o2 + e2)}')
  # a child SIGKILLed
  sd = os.path.join(tmp, 'sweep_child')
  t = time.time()
  p = popen(sweep + long + [f'--sweep_dir={sd}'])
  _wait_metrics(sd, t)
  child = json.load(open(os.path.join(sd, 'sweep.json')))['runs'][0].get('pid')
  os.kill(child, signal.SIGKILL)
  o, e = p.communicate(timeout=180)
  failed = json.load(open(os.path.join(sd, 'sweep.json')))['runs'][0]
  add('3 sweep.py: its child SIGKILLed', p.returncode, time.time() - t,
      f'{_said_of(o, keys=("FAILED",))} / sweep.json error: {str(failed.get("error"))[:200]}')
  # two drivers at once on one sweep directory
  sd = os.path.join(tmp, 'sweep_two')
  short = [f'--config={qs}', '--grid=client.lr=0.05,0.1', '--seeds=0', '--set=model=mlp', '--set=rounds=2',
           '--set=eval_every=1', '--set=progress_every_s=0', f'--sweep_dir={sd}']
  t = time.time()
  ps = [popen(sweep + short) for _ in range(2)]
  res = [pp.communicate(timeout=600) for pp in ps]
  states = {x['cell']: x.get('status') for x in json.load(open(os.path.join(sd, 'sweep.json')))['runs']}
  done = sum(os.path.exists(os.path.join(sd, c, 'seed=0', 'summary.json')) for c in ('client.lr=0.05', 'client.lr=0.1'))
  msg = ([ln for o, e in res for ln in e.splitlines() if ln.startswith('error:')] or [''])[0]
  add('3 sweep.py: two drivers at once on one sweep directory', f'{ps[0].returncode} / {ps[1].returncode}',
      time.time() - t, f'{msg[:200]} / runs finished: {done}/2; sweep.json statuses {states}')
  # disk full for sweep.json (ENOSPC in the driver only), then the same command on a healthy disk
  sd = os.path.join(tmp, 'sweep_full')
  short[-1] = f'--sweep_dir={sd}'
  t = time.time()
  r = subprocess.run([sys.executable, '-m', 'tests.fixtures.fault_inject', '--enospc=sweep.json', '--'] + sweep[1:] +
                     short, capture_output=True, text=True, env=env, cwd=repo, timeout=600)
  runs_done = sum(os.path.exists(os.path.join(sd, c, 'seed=0', 'summary.json'))
                  for c in ('client.lr=0.05', 'client.lr=0.1'))
  r2 = subprocess.run(sweep + short, capture_output=True, text=True, env=env, cwd=repo, timeout=600)
  add('3 sweep.py: disk full for sweep.json; then the same command again', f'{r.returncode} / {r2.returncode}',
      time.time() - t, f'{_first_line(r)[1]} / runs finished: {runs_done}/2 / rerun says: {_said_of(r2.stdout)}')




def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--keep', action='store_true', help='keep the temporary workdirs')
  ap.add_argument('--issue', choices=['13', '22'], default='22')
  ap.add_argument('--repo', default=REPO, help='the checkout whose binaries run (issue 22)')
  ap.add_argument('--only', default=','.join(SECTIONS_22), help=f'issue 22: sections to run, of {SECTIONS_22}')
  args = ap.parse_args()
  tmp = tempfile.mkdtemp(prefix='hardening_trials_')
  rows = []
  try:
    if args.issue == '13':
      rows = trials(tmp)
    else:
      only = tuple(args.only.split(','))
      if set(only) - set(SECTIONS_22):
        ap.error(f'--only={args.only}: sections are {",".join(SECTIONS_22)}')
      trials_22(tmp, os.path.abspath(args.repo), rows, only)
  except Exception as e:  # noqa: BLE001 -- a broken trial ends the run, the rows so far are printed
    rows.append(('trials stopped', '-', 0.0, f'{type(e).__name__}: {e}'))
  finally:
    if not args.keep:
      shutil.rmtree(tmp, ignore_errors=True)
  print('| trial | exit | s | what it prints |\n|---|---|---|---|')
  for name, code, secs, msg in rows:
    msg = msg.replace(tmp, 'TMP').replace(args.repo if args.issue == '22' else REPO, 'REPO')
    print(f'| {name} | {code} | {secs:.1f} | {msg.replace("|", "/")} |')


if __name__ == '__main__':
  main()
